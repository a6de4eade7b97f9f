# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""gpustack_model and gpustack_worker_labels against a GPUStack look-alike on 127.0.0.1 whose
routes turn hostile (issue 11, items 1-4): run as Ansible runs them - the module file with
ANSIBLE_MODULE_ARGS, and ansible-playbook at -vvv with --diff - and grepped for the key."""

import json

import pytest

from attacker_http import drip, json_body, redirect
from gpustack_attack import API_KEY, FakeGpustack, assert_no_secret, run_module, run_playbook

MODEL = dict(name='qwen3-8b', source='huggingface', huggingface_repo_id='Qwen/Qwen3-8B', backend='vLLM',
             env={'HF_HUB_OFFLINE': '1'})
WORKERS = [{'id': 1, 'name': 'node-a', 'labels': {'os': 'linux', 'old': 'x'}, 'maintenance': None},
           {'id': 2, 'name': 'node-b', 'labels': {'os': 'linux', 'old': 'x'}, 'maintenance': None}]


def model_args(gpustack, key=API_KEY, **extra):
    return dict(MODEL, server_url=gpustack.url, api_key=key, api_version='v2', timeout=5, **extra)


# -- 1. keys with whitespace, in module output ------------------------------------------------

@pytest.mark.parametrize('key', [API_KEY + '\n', '  %s\r\n' % API_KEY])
def test_a_key_with_a_trailing_newline_works_and_is_never_printed(fake_gpustack, key):
    gpustack = fake_gpustack()
    result, output = run_module('gpustack_model', model_args(gpustack, key), diff=True)
    assert result['changed'] and result['action'] == 'create', result
    assert gpustack.server.seen('POST', '/v2/models')[0]['headers']['authorization'] == 'Bearer ' + API_KEY
    assert_no_secret(output, key)


@pytest.mark.parametrize('key', [API_KEY[:24] + '\n' + API_KEY[24:], API_KEY + '\nX-Injected: 1'])
def test_a_key_with_a_newline_inside_fails_naming_api_key_only(fake_gpustack, key):
    gpustack = fake_gpustack()
    result, output = run_module('gpustack_model', model_args(gpustack, key))
    assert result['failed'] and result['field'] == 'api_key', result
    assert gpustack.server.requests == []
    assert_no_secret(output, key)
    assert 'Invalid header' not in output and 'Bearer' not in output


# -- 2. redirects through the modules ---------------------------------------------------------

def test_a_redirected_create_is_a_failure_not_a_creation(fake_gpustack, attacker):
    elsewhere = attacker()
    gpustack = fake_gpustack()
    gpustack.override('POST', '/v2/models', redirect(elsewhere.url + '/v2/models/1', 302))
    result, output = run_module('gpustack_model', model_args(gpustack))
    assert result['failed'] and not result.get('changed'), result
    assert result['status'] == 302 and 'redirects to %s/v2/models/1' % elsewhere.url in result['msg']
    assert elsewhere.requests == [] and gpustack.models == {}
    assert_no_secret(output)


def test_a_cross_origin_redirect_of_the_list_gets_no_key(fake_gpustack, attacker):
    elsewhere = attacker({('GET', '/v2/workers'): json_body(200, {'items': WORKERS})})
    gpustack = fake_gpustack(workers=WORKERS)
    gpustack.override('GET', '/v2/workers', redirect(elsewhere.url + '/v2/workers', 301))
    result, _output = run_module('gpustack_worker_labels', dict(
        server_url=gpustack.url, api_key=API_KEY, api_version='v2', workers=['node-a'], labels={'new': 'y'}))
    assert result['failed'] and 'another origin' in result['msg'] and elsewhere.url in result['msg']
    assert elsewhere.requests == []


# -- 3. label writes that partly succeeded ----------------------------------------------------

def test_a_first_write_that_fails_reports_nothing_written(fake_gpustack):
    gpustack = fake_gpustack(workers=WORKERS)
    gpustack.override('PUT', '/v2/workers/1', json_body(500, {'message': 'database is locked'}))
    # replace with only a removal: both workers need a PUT; the first one fails.
    result, _output = run_module('gpustack_worker_labels', dict(
        server_url=gpustack.url, api_key=API_KEY, api_version='v2', workers=['node-a', 'node-b'],
        labels={'old': None}, mode='replace'))
    assert result['failed'] and result['changed'] is False and result['written'] == [], result
    assert result['not_written'] == ['node-a', 'node-b'] and 'Written before the failure: nothing' in result['msg']
    assert [r['path'] for r in gpustack.server.seen('PUT')] == ['/v2/workers/1']


def test_v2_partial_write_reports_changed_true(fake_gpustack):
    workers = [dict(WORKERS[0], labels={'os': 'linux'}), dict(WORKERS[1])]
    gpustack = fake_gpustack(workers=workers)
    gpustack.override('PUT', '/v2/workers/2', json_body(422, {'message': 'labels: invalid'}))
    # replace: node-a (no extra label) only gains 'new' -> merge POST; node-b loses 'old' -> PUT 422.
    result, _output = run_module('gpustack_worker_labels', dict(
        server_url=gpustack.url, api_key=API_KEY, api_version='v2', workers=['node-a', 'node-b'],
        labels={'new': 'y'}, mode='replace'))
    assert result['failed'] and result['changed'] is True, result
    assert result['written'] == ['node-a'] and result['not_written'] == ['node-b']
    assert result['status'] == 422 and 'Written before the failure: node-a.' in result['msg']
    assert gpustack.workers[1]['labels'] == {'os': 'linux', 'new': 'y'}


@pytest.mark.parametrize('second', [json_body(500, {'message': 'boom'}), json_body(422, {'message': 'bad'})])
def test_v1_first_put_ok_second_failed_reports_changed_true(attacker, second):
    gpustack = FakeGpustack(attacker(), workers=WORKERS, version='v1')
    gpustack.override('PUT', '/v1/workers/2', second)
    result, _output = run_module('gpustack_worker_labels', dict(
        server_url=gpustack.url, api_key=API_KEY, api_version='v1', workers=['node-a', 'node-b'],
        labels={'new': 'y'}))
    assert result['failed'] and result['changed'] is True and result['written'] == ['node-a'], result
    assert gpustack.workers[1]['labels']['new'] == 'y'


def test_a_write_with_no_answer_says_it_may_have_been_applied(fake_gpustack):
    gpustack = fake_gpustack(workers=WORKERS)
    gpustack.override('PUT', '/v2/workers/1', drip(200, b'{}' * 100, interval=0.2))
    result, _output = run_module('gpustack_worker_labels', dict(
        server_url=gpustack.url, api_key=API_KEY, api_version='v2', timeout=1, workers=['node-a'],
        labels={'old': None}))
    assert result['failed'] and 'no answer came for node-a: it may have been applied' in result['msg'], result


# -- 4. malformed records through the modules -------------------------------------------------

@pytest.mark.parametrize('field,value', [('env', ['HF_HUB_OFFLINE=1']), ('env', 'HF_HUB_OFFLINE=1'),
                                         ('backend_parameters', '--max-model-len=8192'),
                                         ('worker_selector', {'gpu': None})])
def test_a_malformed_model_record_names_the_field_and_writes_nothing(fake_gpustack, field, value):
    record = dict(MODEL, id=1, backend_parameters=[], worker_selector={})
    record[field] = value
    gpustack = fake_gpustack(models=[record])
    args = model_args(gpustack, backend_parameters=['--max-model-len=8192'], worker_selector={'gpu': 'a'})
    result, _output = run_module('gpustack_model', args)
    assert result['failed'] and result['field'] == 'model.%s' % field, result
    assert gpustack.server.seen('PUT') == []


@pytest.mark.parametrize('labels', [['os=linux'], 'os=linux', {'os': 1}])
def test_malformed_worker_labels_name_the_worker(fake_gpustack, labels):
    gpustack = fake_gpustack(workers=[dict(WORKERS[0], labels=labels)])
    result, _output = run_module('gpustack_worker_labels', dict(
        server_url=gpustack.url, api_key=API_KEY, api_version='v2', workers=['node-a'], labels={'new': 'y'}))
    assert result['failed'] and result['field'] == 'workers[node-a].labels', result
    assert gpustack.server.seen('POST') == [] and gpustack.server.seen('PUT') == []


@pytest.mark.parametrize('body', [['a'], 'x', {'items': [{'name': 'qwen3-8b'}]}, {'items': [], 'pagination': {'totalPage': '3'}}])
def test_a_malformed_list_fails_the_module_with_a_message_not_a_traceback(fake_gpustack, body):
    gpustack = fake_gpustack()
    gpustack.override('GET', '/v2/models', json_body(200, body))
    result, output = run_module('gpustack_model', model_args(gpustack))
    assert result['failed'] and 'malformed answer' in result['msg'], result
    assert 'Traceback' not in output and 'exception' not in result


@pytest.mark.parametrize('option,value', [('timeout', 0), ('timeout', -5), ('ca_path', '/nonexistent/ca.pem')])
def test_bad_connection_options_name_the_option(fake_gpustack, option, value):
    gpustack = fake_gpustack()
    result, _output = run_module('gpustack_model', model_args(gpustack, **{option: value}) if option != 'timeout'
                                 else dict(model_args(gpustack), timeout=value))
    assert result['failed'] and result['field'] == option, result
    assert gpustack.server.requests == []


# -- secrets in -vvv, --diff and error output of real ansible-playbook runs -------------------

PLAYBOOK = '''
- hosts: localhost
  gather_facts: false
  vars:
    # What a "|" vault scalar gives: the key and a newline.
    key_with_newline: |
      {{ key }}
  tasks:
    - name: create with a key that ends in a newline and has spaces around it
      kvpin.fleet.gpustack_model:
        server_url: "{{ url }}"
        api_key: "  {{ key_with_newline }}"
        api_version: v2
        name: qwen3-8b
        source: huggingface
        huggingface_repo_id: Qwen/Qwen3-8B
        backend: vLLM
    - name: label the workers, one of which refuses the write
      kvpin.fleet.gpustack_worker_labels:
        server_url: "{{ url }}"
        api_key: "{{ key_with_newline }}"
        api_version: v2
        workers: [node-a, node-b]
        labels:
          new: y
        mode: replace
      ignore_errors: true
    - name: a key with a newline inside
      kvpin.fleet.gpustack_model:
        server_url: "{{ url }}"
        api_key: "{{ key[:24] }}\\n{{ key[24:] }}"
        name: qwen3-8b
      ignore_errors: true
    - name: a server that echoes the key in its error
      kvpin.fleet.gpustack_model:
        server_url: "{{ url }}"
        api_key: "{{ key }}"
        api_version: v2
        name: echo
        source: huggingface
        huggingface_repo_id: Qwen/Qwen3-8B
        backend_version: "{{ 'x' }}"
        timeout: 5
      environment:
        KVPIN_ECHO: "1"
      ignore_errors: true
'''


@pytest.mark.parametrize('mode', [('-vvv', '--diff'), ('-vvv', '--check', '--diff')], ids=['apply', 'check'])
def test_the_key_never_appears_in_vvv_or_diff_output(fake_gpustack, tmp_path, mode):
    gpustack = fake_gpustack(workers=[dict(WORKERS[0], labels={'os': 'linux'}), dict(WORKERS[1])])
    gpustack.override('PUT', '/v2/workers/2', json_body(422, {'message': 'refused key %s' % API_KEY}))
    # 'echo' is looked up by name: answer with a 401 that quotes the Authorization header.
    listing = gpustack.server.routes[('GET', '/v2/models')]

    def models(request):
        if 'search=echo' in request['query']:
            return json_body(401, {'message': 'bad credentials: %s' % request['headers'].get('authorization')})
        return listing(request)
    gpustack.server.route('GET', '/v2/models', models)
    completed = run_playbook(tmp_path, PLAYBOOK, dict(url=gpustack.url, key=API_KEY), *mode)
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, output[-4000:]
    # Check mode writes nothing, so the refused label write is not reached there.
    assert ('ignored=2' if '--check' in mode else 'ignored=3') in output, output[-2000:]
    assert_no_secret(output)
    assert 'Invalid header' not in output
    if '--check' not in mode:
        assert 'Written before the failure: node-a' in output
        assert gpustack.models and json.dumps(gpustack.models).count('qwen3-8b') == 1
    assert 'field": "api_key"' in output or "'field': 'api_key'" in output
