# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""gpustack_model's action plugin: on the controller it runs the module's function in
Ansible's own process (no module file is sent), with the module's result and the module's
masking of the key; elsewhere (here: a task environment) the module runs as before. Against
the GPUStack look-alike on 127.0.0.1, through ansible-playbook -vvv."""

import json
import re

import pytest
from ansible.release import __version__ as ansible_version

from gpustack_attack import API_KEY, assert_no_secret, json_body, run_playbook

MODULE_SENT = re.compile(r'PUT \S+ TO \S+/AnsiballZ_gpustack_model\.py')

TASK = '''
    - name: {name}
      kvpin.fleet.gpustack_model:
        server_url: "{{{{ url }}}}"
        api_key: "{{{{ key }}}}"
        api_version: v2
        name: {model}
        source: huggingface
        huggingface_repo_id: Qwen/Qwen3-8B
        backend: vLLM
        backend_parameters: ["--max-model-len=16384"]
        timeout: 5
{args}      register: {register}
{extra}'''


def playbook(*tasks):
    results = ', '.join("'%s': %s" % (t['register'], t['register']) for t in tasks)
    return ('- hosts: localhost\n  gather_facts: false\n  tasks:\n'
            + ''.join(TASK.format(**dict({'extra': '', 'args': '', 'model': 'qwen3-8b'}, **t)) for t in tasks)
            + '    - name: results\n      ansible.builtin.copy:\n        dest: "{{ out }}"\n'
            + '        content: "{{ {%s} | to_json }}"\n' % results)


# ansible-core 2.21 added INJECT_INVOCATION (default off): a module's result then carries no
# ``invocation``, and the in-process run must not either. Before 2.21 every result carried it.
INVOCATION_OPTIONAL = tuple(int(part) for part in ansible_version.split('.')[:2]) >= (2, 21)


@pytest.mark.parametrize('inject_invocation', [None, 'true', 'false'])
def test_on_the_controller_it_runs_in_process_with_the_modules_result(fake_gpustack, tmp_path, inject_invocation):
    gpustack = fake_gpustack()
    out = tmp_path / 'results.json'
    text = playbook(
        dict(name='create, in process', register='created'),
        # An environment: the module must see it, so the module runs.
        dict(name='again, as the module', register='as_module',
             extra='      environment:\n        HTTPS_PROXY: ""\n'),
        dict(name='again, in process', register='in_process'))
    environment = {} if inject_invocation is None else {'ANSIBLE_INJECT_INVOCATION': inject_invocation}
    completed = run_playbook(tmp_path, text, dict(url=gpustack.url, key=API_KEY, out=str(out)), '-vvv', '--diff',
                             environment=environment)
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, output[-4000:]
    injected = inject_invocation == 'true' or not INVOCATION_OPTIONAL
    # One module file sent: for the task with an environment only.
    assert len(MODULE_SENT.findall(output)) == 1, output[-4000:]
    results = json.loads(out.read_text())
    assert results['created']['changed'] and results['created']['action'] == 'create'
    assert len(gpustack.server.seen('POST', '/v2/models')) == 1
    # The same answer both ways (Ansible's own bookkeeping keys aside), the key masked alike.
    own = ('_ansible_no_log', 'warnings', 'deprecations', '_ansible_verbose_always', '_ansible_delegated_vars')
    as_module, in_process = ({k: v for k, v in results[name].items() if k not in own} for name in ('as_module', 'in_process'))
    assert as_module == in_process
    assert in_process['changed'] is False and in_process['action'] == 'none'
    # -vvv prints each task's invocation: the key masked there, in process as by the module.
    # (On 2.21 with it on, the registered results keep their invocation too, so the task that
    # writes them out shows three more: at least one per gpustack_model task, all masked.)
    invocations = re.findall(r'"api_key": "([^"]*)"', output)
    if injected:
        assert len(invocations) >= 3 and set(invocations) == {'VALUE_SPECIFIED_IN_NO_LOG_PARAMETER'}, invocations
    else:
        assert invocations == []
    assert_no_secret(output)
    assert_no_secret(out.read_text())


def test_in_process_a_server_that_echoes_the_key_gets_it_masked(fake_gpustack, tmp_path):
    gpustack = fake_gpustack()
    gpustack.server.route('GET', '/v2/models', lambda request: json_body(
        401, {'message': 'bad credentials: %s' % request['headers'].get('authorization')}))
    out = tmp_path / 'results.json'
    text = playbook(dict(name='echoed', register='echoed', extra='      ignore_errors: true\n'))
    # A key with a trailing newline (a "|" vault scalar): the key as sent is masked too.
    completed = run_playbook(tmp_path, text, dict(url=gpustack.url, key=API_KEY + '\n', out=str(out)), '-vvv')
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0 and 'ignored=1' in output, output[-4000:]
    assert MODULE_SENT.findall(output) == []
    echoed = json.loads(out.read_text())['echoed']
    assert echoed['failed'] and echoed['status'] == 401, echoed
    assert 'bad credentials' in echoed['msg']
    assert_no_secret(output)
    assert_no_secret(out.read_text())


def test_in_process_bad_options_fail_like_the_module_and_mask_the_key(fake_gpustack, tmp_path):
    gpustack = fake_gpustack()
    out = tmp_path / 'results.json'
    bad = '        state: sideways\n        vram_claim_bytes: lots\n'
    text = playbook(dict(name='bad, in process', register='in_process', args=bad, extra='      ignore_errors: true\n'),
                    dict(name='bad, as the module', register='as_module', args=bad,
                         extra='      ignore_errors: true\n      environment:\n        HTTPS_PROXY: ""\n'))
    completed = run_playbook(tmp_path, text, dict(url=gpustack.url, key=API_KEY, out=str(out)), '-vvv')
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0 and 'ignored=2' in output, output[-4000:]
    results = json.loads(out.read_text())
    assert results['in_process']['failed'] and results['as_module']['failed'], results
    assert results['in_process']['msg'] == results['as_module']['msg'], results
    assert "vram_claim_bytes" in results['in_process']['msg']
    assert gpustack.server.requests == []
    assert_no_secret(output)
