# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""node_state end to end: the module runs in its own Python process the way Ansible runs it
(an args file holding ANSIBLE_MODULE_ARGS) and its JSON answer is checked."""

from __future__ import annotations

import grp
import hashlib
import json
import os
import pwd
import subprocess
import sys

import pytest
from local_playbook import run_module_file  # pylint: disable=import-error

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
MODULE = os.path.join(ROOT, 'plugins', 'modules', 'node_state.py')
# The directory holding ansible_collections/kvpin/fleet (tests/conftest.py puts it on sys.path).
COLLECTIONS_ROOT = next(p for p in sys.path if os.path.isdir(os.path.join(p, 'ansible_collections', 'kvpin', 'fleet')))

ME = pwd.getpwuid(os.getuid()).pw_name
MY_GROUP = grp.getgrgid(os.getgid()).gr_name
SECRET = b'token: kvpin-s3cret-value\n'


def run_module(tmp_path, args):
    proc = run_module_file(tmp_path, MODULE, args)
    assert 'kvpin-s3cret-value' not in proc.stdout  # file contents never come back
    return json.loads(proc.stdout)


def config_file(tmp_path, mode=0o600):
    path = tmp_path / 'config.yaml'
    path.write_bytes(SECRET)
    path.chmod(mode)
    return str(path)


def worker_check(path, mode='0600'):
    return {'name': 'gpustack_worker',
            'files': [{'path': path, 'sha1': hashlib.sha1(SECRET).hexdigest(), 'mode': mode,
                       'owner': ME, 'group': MY_GROUP}],
            'users': [ME],
            'python_packages': [{'python': sys.executable, 'name': 'pytest', 'version': pytest.__version__}]}


def test_matching_node_is_in_sync(tmp_path):
    result = run_module(tmp_path, {'checks': [worker_check(config_file(tmp_path))]})
    assert result.get('failed') is not True, result
    assert result['changed'] is False
    assert result['in_sync'] is True
    assert result['checks'] == {'gpustack_worker': {'in_sync': True, 'drift': [], 'drift_items': []}}
    assert result['drift'] == [] and result['drift_items'] == []


def test_mismatch_is_reported_per_check(tmp_path):
    path = config_file(tmp_path, mode=0o644)
    result = run_module(tmp_path, {'checks': [
        worker_check(path),
        {'name': 'serving_watchdog', 'users': ['kvpin-no-such-user']},
        {'name': 'empty'},
    ]})
    assert result['changed'] is False
    assert result['in_sync'] is False
    mode = {'object': path, 'field': 'mode', 'want': '0600', 'got': '0644'}
    user = {'object': 'user kvpin-no-such-user', 'field': 'state', 'want': 'present', 'got': 'missing'}
    assert result['checks'] == {
        'gpustack_worker': {'in_sync': False, 'drift': ['%s: mode 0644, wanted 0600' % path], 'drift_items': [mode]},
        'serving_watchdog': {'in_sync': False, 'drift': ['user kvpin-no-such-user: missing'], 'drift_items': [user]},
        'empty': {'in_sync': True, 'drift': [], 'drift_items': []},
    }
    assert result['drift'] == ['gpustack_worker: %s: mode 0644, wanted 0600' % path,
                               'serving_watchdog: user kvpin-no-such-user: missing']
    # The same differences as data, each with its check: what the roles decide on.
    assert result['drift_items'] == [dict(mode, check='gpustack_worker'), dict(user, check='serving_watchdog')]


def test_content_difference_shows_hashes_only(tmp_path):
    path = config_file(tmp_path)
    check = worker_check(path)
    check['files'][0]['sha1'] = hashlib.sha1(b'token: rotated\n').hexdigest()
    result = run_module(tmp_path, {'checks': [check]})
    assert result['drift'] == ['gpustack_worker: %s: content differs (sha1 %s wanted %s)' % (
        path, hashlib.sha1(SECRET).hexdigest(), hashlib.sha1(b'token: rotated\n').hexdigest())]


def test_integer_mode_as_yaml_reads_unquoted_0600(tmp_path):
    result = run_module(tmp_path, {'checks': [worker_check(config_file(tmp_path), mode=0o600)]})
    assert result['in_sync'] is True, result


def test_check_mode_gives_the_same_answer(tmp_path):
    args = {'checks': [worker_check(config_file(tmp_path, mode=0o640))]}
    normal = run_module(tmp_path, args)
    checked = run_module(tmp_path, dict(args, _ansible_check_mode=True))
    assert checked['changed'] is False
    assert checked['checks'] == normal['checks'] and checked['in_sync'] is False


def test_unit_is_drift_not_a_failure(tmp_path):
    """With systemd as PID 1 the unit is not-found; in a container without it systemctl fails:
    either way the unit is drift with the reason and the module still answers."""
    result = run_module(tmp_path, {'checks': [
        {'name': 'gpustack_worker', 'units': [{'name': 'kvpin-no-such-unit.service', 'enabled': True, 'active': True}]}]})
    assert result.get('failed') is not True, result
    assert result['in_sync'] is False
    assert result['drift'] and all(line.startswith('gpustack_worker: kvpin-no-such-unit.service: ')
                                   for line in result['drift']), result['drift']


def test_relative_path_fails_naming_check_field_and_value(tmp_path):
    result = run_module(tmp_path, {'checks': [
        {'name': 'gpustack_worker', 'files': [{'path': '/etc/ok'}]},
        {'name': 'serving_watchdog', 'files': [{'path': '/etc/ok'}, {'path': 'etc/kvpin/watchdog.json'}]},
    ]})
    assert result['failed'] is True
    assert result['msg'] == "check serving_watchdog: files[1].path 'etc/kvpin/watchdog.json': must be an absolute path"
    assert result['check'] == 'serving_watchdog' and result['field'] == 'files[1].path'
    assert 'in_sync' not in result and 'checks' not in result


def test_bad_mode_and_state_fail(tmp_path):
    result = run_module(tmp_path, {'checks': [{'name': 'w', 'files': [{'path': '/x', 'mode': '644x'}]}]})
    assert result['failed'] is True and "check w: files[0].mode '644x'" in result['msg']
    result = run_module(tmp_path, {'checks': [{'name': 'w', 'files': [{'path': '/x', 'state': 'link'}]}]})
    assert result['failed'] is True and "check w: files[0].state 'link': must be one of file, directory, absent" == result['msg']


def test_duplicate_names_fail(tmp_path):
    result = run_module(tmp_path, {'checks': [{'name': 'w'}, {'name': 'w'}]})
    assert result['failed'] is True
    assert result['msg'] == "check w: name 'w': duplicate check name"


def test_through_ansible_playbook_with_templated_checks(tmp_path):
    """The real Ansible path (AnsiballZ bundling of module_utils, templated option values as the
    roles build them with set_fact), on localhost through the local connection."""
    playbook_bin = os.path.join(os.path.dirname(sys.executable), 'ansible-playbook')
    if not os.path.exists(playbook_bin):
        pytest.skip('ansible-playbook is not next to this Python')
    path = config_file(tmp_path)
    playbook = tmp_path / 'play.yml'
    playbook.write_text('''
- hosts: localhost
  gather_facts: false
  vars:
    content: "{{ lookup('ansible.builtin.file', '%(path)s') }}\\n"
  tasks:
    - ansible.builtin.set_fact:
        desired:
          name: gpustack_worker
          files: >-
            {{ [{'path': '%(path)s', 'sha1': content | hash('sha1'), 'mode': '0600', 'owner': '%(me)s'},
                {'path': '%(dir)s', 'state': 'directory'}] }}
    - kvpin.fleet.node_state:
        checks: ["{{ desired }}", {name: other, files: [{path: '%(dir)s/missing'}]}]
      register: state
    - ansible.builtin.assert:
        that:
          - state is not changed
          - state.checks.gpustack_worker.in_sync
          - not state.checks.other.in_sync
          - "state.drift == ['other: %(dir)s/missing: missing']"
''' % {'path': path, 'dir': tmp_path, 'me': ME})
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=COLLECTIONS_ROOT, ANSIBLE_LOCALHOST_WARNING='0',
               ANSIBLE_INVENTORY_UNPARSED_WARNING='0', HOME=str(tmp_path))
    proc = subprocess.run([playbook_bin, '-i', 'localhost,', '-c', 'local', '-e',
                           'ansible_python_interpreter=%s' % sys.executable, str(playbook)],
                          env=env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert 'ok=3' in proc.stdout and 'failed=0' in proc.stdout


def test_wait_timeout_reads_until_in_sync(tmp_path):
    """The module waits on the node: a file that appears 1 s in is found by a later try."""
    path = tmp_path / 'ready'
    writer = subprocess.Popen([sys.executable, '-c', 'import time, sys; time.sleep(1); open(sys.argv[1], "w").write("up")',
                               str(path)])
    try:
        result = run_module(tmp_path, {'checks': [{'name': 'health', 'files': [{'path': str(path)}]}],
                                       'wait_timeout': 30, 'wait_delay': 0.2})
    finally:
        writer.wait(timeout=30)
    assert result.get('failed') is not True, result
    # tries > 1: the file was missing at the first try and found by a later one. The module's
    # start is not timed from the writer's start (under load it can take most of the writer's
    # second), so what is checked is that it slept wait_delay between its tries: waited is
    # counted from the first try.
    assert result['in_sync'] is True and result['tries'] > 1, result
    assert (result['tries'] - 1) * 0.2 <= result['waited'] + 0.01 and result['waited'] < 30, result


def test_without_a_wait_one_try(tmp_path):
    result = run_module(tmp_path, {'checks': [{'name': 'health', 'files': [{'path': str(tmp_path / 'never')}]}]})
    assert (result['in_sync'], result['tries'], result['waited']) == (False, 1, 0.0), result


@pytest.mark.parametrize('option, value', [('wait_timeout', -5), ('wait_timeout', 86400), ('wait_delay', 0)])
def test_a_wait_out_of_range_fails_naming_the_option(tmp_path, option, value):
    result = run_module(tmp_path, {'checks': [{'name': 'health'}], option: value})
    assert result.get('failed') is True and result['field'] == option, result
    assert result['msg'].startswith('%s %r: must be ' % (option, float(value))), result
    assert 'Traceback' not in json.dumps(result)
