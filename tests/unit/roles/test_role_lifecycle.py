# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The table of managed files owns each file's life (issue 35, item 5): a row's backup, restart
and verify_unit columns are all the roles need to write, restart, roll back and clean up.

The role's own task expressions (configure.yml's managed_files files and restart condition,
rollback.yml's backups and created files, finish.yml's backups to drop, desired_state.yml's
files) are read from its task files and evaluated by ansible-playbook inside a copy of the role,
against a made-up managed_files result: for the table as it is they give today's lists, and a
worker file added as ONE row (plus its template) shows up in every one of them. Nothing is
written outside tmp_path."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROOT = os.path.dirname(ROOT)
PLAYBOOK = os.path.join(os.path.dirname(sys.executable), 'ansible-playbook')
SECRET = 'kvpin-lifecycle-verysecret'

DATA = '/var/lib/gpustack'
CONFIG, ENV, UNIT = DATA + '/config.yaml', DATA + '/worker.env', '/etc/systemd/system/gpustack-worker.service'
FAKE = DATA + '/fake.conf'
WORKER_VARS = {'gpustack_worker_server_url': 'http://127.0.0.1:30080', 'gpustack_worker_token': SECRET,
               'gpustack_worker_plans': [{'system_reserved_bytes': 3 * 2 ** 30 + 1}]}

# One new worker file: a row of _gpustack_worker_node_files and a template, nothing else.
FAKE_ROW = '''_gpustack_worker_node_files:
  - path: "{{ gpustack_worker_data_dir }}/fake.conf"
    content: "{{ lookup('kvpin.fleet.template', 'fake.conf.j2') }}"
    owner: root
    group: root
    mode: "0640"
    backup: true
    restart: gpustack_worker restart
'''
FAKE_TEMPLATE = '{{ ansible_managed | comment }}\nport={{ gpustack_worker_port }}\n'


def _tasks(role_dir, name):
    with open(os.path.join(role_dir, 'tasks', name), encoding='utf-8') as handle:
        return yaml.safe_load(handle)


def _flat(tasks):
    for task in tasks:
        for key in ('block', 'rescue', 'always'):
            yield from _flat(task.get(key) or [])
        if 'block' not in task:
            yield task


def _inner(expression):
    """The Jinja expression of a "{{ ... }}" task argument."""
    text = expression.strip()
    assert text.startswith('{{') and text.endswith('}}'), expression
    return '(' + text[2:-2].strip() + ')'


def worker_expressions(role_dir):
    """name -> Jinja expression, each taken from the role's own tasks."""
    configure = list(_flat(_tasks(role_dir, 'configure.yml')))
    [write] = [t for t in configure if 'kvpin.fleet.managed_files' in t]
    [restart] = [t for t in configure if t.get('notify') == 'gpustack_worker restart']
    [remember] = [t for t in _tasks(role_dir, 'rollback.yml') if t['name'] == 'Run | rollback | remember why the change failed']
    [drop] = [t for t in _tasks(role_dir, 'finish.yml') if 'ansible.builtin.file' in t]
    [condition] = restart['when'] if isinstance(restart['when'], list) else [restart['when']]
    facts = remember['ansible.builtin.set_fact']
    return {
        'written': _inner(write['kvpin.fleet.managed_files']['files']) + " | map(attribute='path') | list",
        'restart': '(%s)' % condition,
        'restored': _inner(facts['_gpustack_worker_backups']),
        'created': _inner(facts['_gpustack_worker_created']),
        'dropped': _inner(drop['loop']),
        'declared': "gpustack_worker_desired_state.files | map(attribute='path') | list",
        'restart_paths': "_gpustack_worker_lifecycle.restart",
        'verified': "_gpustack_worker_lifecycle.verify_unit",
    }


def result_of(paths, changed, created=()):
    """A managed_files result: ``changed`` paths replaced (a backup each) or ``created``."""
    files = [{'path': p, 'changed': p in changed or p in created, 'created': p in created,
              'backup_file': (p + '.1234.bak') if p in changed else ''} for p in paths]
    return {'changed': bool(changed or created), 'changed_paths': [p for p in paths if p in changed or p in created],
            'files': files}


def evaluate(tmp_path, role, expressions, cases, extra_vars):
    """{case: {name: value}} of each expression, inside the role copy, after its desired_state.yml;
    each case's vars set on the task that evaluates it."""
    if not os.path.exists(PLAYBOOK):
        pytest.skip('ansible-playbook not beside sys.executable (the controller venv)')
    role_dir = tmp_path / 'roles' / role
    record = "{{ _seen | default({}) | combine({%s: {%s}}) }}"
    tasks = [{'name': 'desired state', 'ansible.builtin.include_tasks': 'desired_state.yml'}]
    for case, case_vars in cases.items():
        pairs = ', '.join('%s: %s' % (json.dumps(name), expr) for name, expr in expressions.items())
        tasks.append({'name': 'case %s' % case, 'ansible.builtin.set_fact': {'_seen': record % (json.dumps(case), pairs)},
                      'vars': case_vars, 'no_log': True})
    tasks.append({'name': 'keep', 'ansible.builtin.copy': {
        'content': '{{ _seen | to_json }}', 'dest': str(tmp_path / 'seen.json'), 'mode': '0600'}})
    (role_dir / 'tasks' / 'lifecycle_probe.yml').write_text(yaml.safe_dump(tasks, sort_keys=False))
    play = tmp_path / 'play.yml'
    play.write_text(yaml.safe_dump([{'hosts': 'localhost', 'gather_facts': False, 'tasks': [
        {'name': 'probe', 'ansible.builtin.include_role': {'name': role, 'tasks_from': 'lifecycle_probe.yml'}}]}]))
    extra = tmp_path / 'extra.json'
    extra.write_text(json.dumps(extra_vars))
    env = dict(os.environ, ANSIBLE_NOCOLOR='1', ANSIBLE_PYTHON_INTERPRETER=sys.executable,
               ANSIBLE_CONFIG=os.path.join(ROOT, 'ansible.cfg'), ANSIBLE_ROLES_PATH=str(tmp_path / 'roles'))
    proc = subprocess.run([PLAYBOOK, '-i', 'localhost,', '-c', 'local', '-e', '@%s' % extra, str(play)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert SECRET not in proc.stdout + proc.stderr
    return json.loads((tmp_path / 'seen.json').read_text())


def role_copy(tmp_path, role):
    dest = tmp_path / 'roles' / role
    shutil.copytree(os.path.join(ROOT, 'roles', role), str(dest))
    return dest


def test_the_worker_lists_derived_from_the_table_are_todays_lists(tmp_path):
    role_dir = role_copy(tmp_path, 'gpustack_worker')
    paths = [DATA, '/var/cache/gpustack', '/var/log/gpustack']
    seen = evaluate(tmp_path, 'gpustack_worker', worker_expressions(str(role_dir)), {
        'nothing_written': {'_gpustack_worker_files_result': {}},
        'all_replaced': {'_gpustack_worker_files_result': result_of(paths + [CONFIG, ENV, UNIT], [CONFIG, ENV, UNIT])},
        'dirs_only': {'_gpustack_worker_files_result': result_of(paths + [CONFIG, ENV, UNIT], paths)},
        'all_new': {'_gpustack_worker_files_result': result_of([CONFIG, ENV, UNIT], [], [CONFIG, ENV, UNIT])},
    }, WORKER_VARS)
    every = seen['all_replaced']
    assert every['written'][-3:] == [CONFIG, ENV, UNIT] and every['written'] == every['declared']
    assert every['restart_paths'] == {'gpustack_worker restart': [CONFIG, ENV, UNIT]}
    assert every['verified'] == [UNIT]
    assert every['restart'] is True
    assert every['restored'] == [{'backup': p + '.1234.bak', 'dest': p, 'owner': 'root', 'group': 'root', 'mode': mode}
                                 for p, mode in ((CONFIG, '0600'), (ENV, '0600'), (UNIT, '0644'))]
    assert every['created'] == [] and every['dropped'] == [CONFIG + '.1234.bak', ENV + '.1234.bak', UNIT + '.1234.bak']
    # A directory's change restarts nothing and has no backup to restore (even if a result had one).
    assert (seen['dirs_only']['restart'], seen['dirs_only']['restored'], seen['dirs_only']['dropped']) == (False, [], [])
    assert (seen['all_new']['restart'], seen['all_new']['restored'], seen['all_new']['created']) == (True, [], [CONFIG, ENV, UNIT])
    assert (seen['nothing_written']['restart'], seen['nothing_written']['restored'], seen['nothing_written']['created'],
            seen['nothing_written']['dropped']) == (False, [], [], [])


def test_a_new_worker_file_is_one_row_and_its_template(tmp_path):
    role_dir = role_copy(tmp_path, 'gpustack_worker')
    vars_file = role_dir / 'vars' / 'main.yml'
    text = vars_file.read_text()
    assert text.count('_gpustack_worker_node_files:\n') == 1
    vars_file.write_text(text.replace('_gpustack_worker_node_files:\n', FAKE_ROW, 1))
    (role_dir / 'templates' / 'fake.conf.j2').write_text(FAKE_TEMPLATE)
    seen = evaluate(tmp_path, 'gpustack_worker', worker_expressions(str(role_dir)), {
        'fake_replaced': {'_gpustack_worker_files_result': result_of([FAKE, CONFIG, ENV, UNIT], [FAKE])},
        'fake_created': {'_gpustack_worker_files_result': result_of([FAKE, CONFIG, ENV, UNIT], [], [FAKE])},
    }, WORKER_VARS)
    replaced, created = seen['fake_replaced'], seen['fake_created']
    # Written by configure.yml's one call and checked by desired_state.yml ...
    assert FAKE in replaced['written'] and replaced['written'] == replaced['declared']
    # ... its change restarts the worker ...
    assert replaced['restart_paths'] == {'gpustack_worker restart': [FAKE, CONFIG, ENV, UNIT]}
    assert replaced['restart'] is True and created['restart'] is True
    # ... a failed health check restores it with the row's owner, group and mode, or removes it
    # where this run created it, and its backup is dropped at the end.
    assert replaced['restored'] == [{'backup': FAKE + '.1234.bak', 'dest': FAKE, 'owner': 'root', 'group': 'root',
                                     'mode': '0640'}]
    assert replaced['created'] == [] and replaced['dropped'] == [FAKE + '.1234.bak']
    assert created['created'] == [FAKE] and created['restored'] == [] and created['dropped'] == []
    assert replaced['verified'] == [UNIT]


WATCHDOG_VARS = {'serving_watchdog_targets': [
    {'name': 'gpustack', 'unit': 'gpustack.service'},
    {'name': 'llama', 'gpustack_deployment': 'llama', 'gpustack_server': 'http://127.0.0.1:9',
     'gpustack_api_key': SECRET, 'gpustack_worker_name': 'lab', 'engine_runtime': 'native',
     'profiles': {'chat': ['--max-num-seqs=64'], 'batch': ['--max-num-seqs=4']},
     'profile_schedule': [{'at': '07:00', 'profile': 'chat'}, {'at': '00:00', 'profile': 'batch'}]},
]}


def test_the_watchdog_handlers_derived_from_the_table_are_todays(tmp_path):
    """Today's hand lists: the program and each target's config, key file and unit restart the
    watchdogs; each profile switch service and timer reloads systemd; the rest restarts nothing."""
    role_dir = role_copy(tmp_path, 'serving_watchdog')
    configure = _tasks(str(role_dir), 'configure.yml')
    [render] = [t for t in configure if t['name'] == 'Render the table of files to write, per target']
    [reload] = [t for t in configure if t.get('notify') == 'serving_watchdog daemon-reload']
    probe = [render]
    restart_paths = ['/usr/local/lib/kvpin/kvpin_watchdog.py', '/etc/kvpin-watchdog/gpustack.json',
                     '/etc/systemd/system/kvpin-watchdog-gpustack.service', '/etc/kvpin-watchdog/llama.json',
                     '/etc/systemd/system/kvpin-watchdog-llama.service', '/etc/kvpin-watchdog/llama.token']
    # and every file of the program's package (a changed module restarts the watchdogs like the launcher)
    package = os.path.join(ROOT, 'roles', 'serving_watchdog', 'files', 'kvpin_watchdog_lib')
    restart_paths += ['/usr/local/lib/kvpin/kvpin_watchdog_lib/%s' % name for name in
                      [n for n in os.listdir(package) if n.endswith('.py')] + ['http_deadline.py', 'gpustack_api.py']]
    reload_paths = ['/etc/systemd/system/kvpin-profile-switch-llama.service',
                    '/etc/systemd/system/kvpin-profile-switch-llama.timer']
    quiet = ['/etc/polkit-1/rules.d/60-kvpin-watchdog-gpustack.rules', '/etc/tmpfiles.d/kvpin-watchdog.conf',
             '/etc/kvpin-watchdog']
    cases = dict(('changed %s' % path, {'_serving_watchdog_written': {'changed_paths': [path], 'files': []}})
                 for path in restart_paths + reload_paths + quiet)
    cases['nothing'] = {'_serving_watchdog_written': {}}
    expressions = {'restart': '(_serving_watchdog_restart_needed | bool)', 'reload': '(%s)' % reload['when'],
                   'by_handler': '_serving_watchdog_lifecycle.restart'}
    # The render task first (as configure.yml runs it), then the cases.
    desired = role_dir / 'tasks' / 'desired_state.yml'
    desired.write_text(desired.read_text() + '\n' + yaml.safe_dump(probe, sort_keys=False))
    seen = evaluate(tmp_path, 'serving_watchdog', expressions, cases, WATCHDOG_VARS)
    by_handler = seen['nothing']['by_handler']
    assert sorted(by_handler['serving_watchdog restart']) == sorted(restart_paths)
    assert by_handler['serving_watchdog daemon-reload'] == reload_paths
    assert set(by_handler) == {'serving_watchdog restart', 'serving_watchdog daemon-reload'}
    for path in restart_paths:
        assert (seen['changed %s' % path]['restart'], seen['changed %s' % path]['reload']) == (True, False), path
    for path in reload_paths:
        assert (seen['changed %s' % path]['restart'], seen['changed %s' % path]['reload']) == (False, True), path
    for path in quiet:
        assert (seen['changed %s' % path]['restart'], seen['changed %s' % path]['reload']) == (False, False), path
    assert (seen['nothing']['restart'], seen['nothing']['reload']) == (False, False)
