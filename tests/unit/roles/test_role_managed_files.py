# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Each role's declared state (desired_state.yml, what site.yml's rerun check compares with a
node) and what its tasks write must be the same facts: a file the tasks write with another mode,
owner, group or content than declared would be "changed" on every run; a file written but not
declared would never be repaired; one declared but never written would never converge.

How: every file-writing task of the role (copy with content, file with a present state, user,
group, and each row, group and user of a kvpin.fleet.managed_files call), wherever it sits in
tasks/, is rewritten into a set_fact that records what that task would write (path, state, owner, group, mode, sha1 of the content) with the task's own
arguments, loop, loop_control, vars and when. The recorder runs inside a copy of the role (same
vars, defaults, templates), next to the role's own desired_state.yml, with ansible-playbook on
localhost: nothing is written outside tmp_path. Hand-editing either side (a task's mode, a row
left out of the declared files) makes the two disagree, and the last tests show that it does.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
PLAYBOOK = os.path.join(os.path.dirname(sys.executable), 'ansible-playbook')
SECRET = 'kvpin-managed-files-verysecret'

# The arguments of a file write that the declared state checks.
ATTRS = ('path', 'state', 'owner', 'group', 'mode')
# Modules that change files. A task using any other of these fails the test until it is
# taught here (so a new kind of write cannot slip past the comparison).
UNSUPPORTED_WRITERS = ('ansible.builtin.template', 'ansible.builtin.lineinfile', 'ansible.builtin.blockinfile',
                       'community.general.ini_file', 'ansible.builtin.replace', 'ansible.builtin.get_url',
                       'ansible.builtin.unarchive')

# The watchdog program's package as the role deploys it: every module of files/kvpin_watchdog_lib/
# and the two files it shares with the collection (plugins/module_utils), shipped into it.
WATCHDOG_PACKAGE_FILES = tuple(sorted(
    [name for name in os.listdir(os.path.join(ROOT, 'roles', 'serving_watchdog', 'files', 'kvpin_watchdog_lib'))
     if name.endswith('.py')] + ['http_deadline.py', 'gpustack_api.py']))

ROLES = {
    'gpustack_worker': {
        'desired': 'gpustack_worker_desired_state',
        'vars': {'gpustack_worker_server_url': 'http://127.0.0.1:30080', 'gpustack_worker_token': SECRET,
                 'gpustack_worker_plans': [{'system_reserved_bytes': 3 * 2 ** 30 + 1}],
                 'gpustack_worker_environment': {'HF_TOKEN': SECRET}},
    },
    'serving_watchdog': {
        'desired': 'serving_watchdog_desired_state',
        'vars': {'serving_watchdog_targets': [
            # systemd actuator: a polkit rule; another user owns its files.
            {'name': 'gpustack', 'unit': 'gpustack.service', 'user': 'kvpin-other'},
            # What site.yml derives for a deployment: an API key file.
            {'name': 'llama-3.1-8b', 'gpustack_deployment': 'llama-3.1-8b', 'gpustack_server': 'http://127.0.0.1:9',
             'gpustack_api_key': SECRET, 'gpustack_worker_name': 'lab-4090x2', 'engine_runtime': 'native'},
            # Scheduled traffic classes: a profile switch service and timer.
            {'name': 'llama-70b', 'gpustack_deployment': 'llama-70b', 'gpustack_server': 'http://127.0.0.1:9',
             'gpustack_api_key': SECRET, 'gpustack_worker_name': 'lab-4090x2',
             'profiles': {'chat': ['--max-num-seqs=64'], 'batch': ['--max-num-seqs=4']},
             'profile_schedule': [{'at': '07:00', 'profile': 'chat'}, {'at': '00:00', 'profile': 'batch'}]},
        ]},
    },
}


def _task_files(role_dir):
    tasks_dir = os.path.join(role_dir, 'tasks')
    return sorted(name for name in os.listdir(tasks_dir) if name.endswith('.yml'))


def _flatten(tasks, when=()):
    """(task, the `when`s of the blocks around it) for every task, blocks opened."""
    for task in tasks or []:
        own = task.get('when')
        own = list(own) if isinstance(own, list) else ([own] if own is not None else [])
        if 'block' in task:
            for key in ('block', 'rescue', 'always'):
                yield from _flatten(task.get(key), tuple(when) + tuple(own))
        else:
            yield task, list(when)


def _module(task):
    return next((key for key in task if key.startswith(('ansible.builtin.', 'community.', 'kvpin.'))), None)


def _recorder(task, when):
    """A set_fact task that records what ``task`` writes, or None for a task that writes no file."""
    module = _module(task)
    args = task.get(module) if module else None
    if module in UNSUPPORTED_WRITERS:
        raise AssertionError('%s in task %r: teach tests/unit/roles/test_role_managed_files.py to record it'
                             % (module, task.get('name')))
    record = None
    if module == 'ansible.builtin.copy':
        if args.get('remote_src'):
            return None          # a rollback restoring a backup on the node, not a desired write
        assert 'content' in args, 'copy without content in %r: record its src too' % task.get('name')
        record = {'kind': 'file', 'path': args['dest'], 'state': 'file', 'content': args['content']}
    elif module == 'ansible.builtin.file':
        if args.get('state') == 'absent':
            return None          # removes a leftover (a stale watchdog, a backup): nothing to declare
        record = {'kind': 'file', 'path': args['path'], 'state': args.get('state', 'file')}
    elif module == 'ansible.builtin.user':
        record = {'kind': 'user', 'name': args['name'], 'state': args.get('state', 'present')}
    elif module == 'ansible.builtin.group':
        record = {'kind': 'group', 'name': args['name'], 'state': args.get('state', 'present')}
    if record is None:
        return None
    for attr in ('owner', 'group', 'mode'):
        if attr in (args or {}):
            record[attr] = args[attr]
    content = record.pop('content', None)
    task_vars = dict(task.get('vars') or {})
    task_vars['_rec'] = record
    task_vars['_rec_content'] = content if content is not None else ''
    task_vars['_rec_has_content'] = content is not None
    recorder = {
        'name': 'record | %s' % task.get('name'),
        'ansible.builtin.set_fact': {
            '_recorded': "{{ (_recorded | default([])) + [_rec | combine({'sha1': _rec_content | hash('sha1')}"
                         " if _rec_has_content else {}) | combine({'task': %s})] }}" % json.dumps(task.get('name')),
        },
        'vars': task_vars,
        'no_log': True,
    }
    for key in ('loop', 'loop_control'):
        if key in task:
            recorder[key] = task[key]
    conditions = list(when) + (task['when'] if isinstance(task.get('when'), list)
                               else ([task['when']] if task.get('when') is not None else []))
    if conditions:
        recorder['when'] = conditions
    return recorder


def _table_recorder(task, when, set_facts):
    """For a kvpin.fleet.managed_files task (one call writing a whole table): the set_fact tasks
    before it that compute facts its ``files`` names (kept as they are: controller-only), then one
    recorder looping over the table, recording each row as the module writes it."""
    files = task['kvpin.fleet.managed_files']['files']
    kept = [fact_task for fact_task in set_facts
            if any(key in files for key in fact_task['ansible.builtin.set_fact'])]
    conditions = list(when) + (task['when'] if isinstance(task.get('when'), list)
                               else ([task['when']] if task.get('when') is not None else []))
    recorder = {
        'name': 'record | %s' % task.get('name'),
        'ansible.builtin.set_fact': {
            '_recorded': "{{ (_recorded | default([])) + [{'kind': 'file', 'path': _rec_row.path,"
                         " 'state': _rec_row.state | default('file'), 'owner': _rec_row.owner,"
                         " 'group': _rec_row.group, 'mode': _rec_row.mode}"
                         " | combine({'sha1': _rec_row.content | hash('sha1')} if _rec_row.content is defined else {})"
                         " | combine({'task': %s})] }}" % json.dumps(task.get('name')),
        },
        'loop': files,
        'loop_control': {'loop_var': '_rec_row', 'label': '{{ _rec_row.path }}'},
        'vars': dict(task.get('vars') or {}),
        'no_log': True,
    }
    if conditions:
        recorder['when'] = conditions
    # The accounts the same call creates (its groups, then its users), recorded like the
    # ansible.builtin.group / user tasks they replace.
    accounts = []
    for kind, key in (('group', 'groups'), ('user', 'users')):
        rows = task['kvpin.fleet.managed_files'].get(key)
        if not rows:
            continue
        account = {
            'name': 'record | %s | %s' % (task.get('name'), key),
            'ansible.builtin.set_fact': {
                '_recorded': "{{ (_recorded | default([])) + [_rec_account | combine({'kind': %s,"
                             " 'state': 'present', 'task': %s})] }}" % (json.dumps(kind), json.dumps(task.get('name'))),
            },
            'loop': rows,
            'loop_control': {'loop_var': '_rec_account', 'label': '{{ _rec_account.name }}'},
            'vars': dict(task.get('vars') or {}),
        }
        if conditions:
            account['when'] = conditions
        accounts.append(account)
    return kept + accounts + [recorder]


def _recorders(role_dir):
    recorders = []
    for name in _task_files(role_dir):
        if name in ('main.yml', 'desired_state.yml'):
            continue
        with open(os.path.join(role_dir, 'tasks', name), encoding='utf-8') as handle:
            tasks = yaml.safe_load(handle) or []
        set_facts = []
        for task, when in _flatten(tasks):
            if _module(task) == 'ansible.builtin.set_fact':
                set_facts.append(task)
            if _module(task) == 'kvpin.fleet.managed_files':
                recorders.extend(_table_recorder(task, when, set_facts))
                continue
            recorder = _recorder(task, when)
            if recorder is not None:
                recorders.append(recorder)
    return recorders


PLAY = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: The role's declared state
      ansible.builtin.include_role:
        name: {role}
        tasks_from: desired_state.yml
    - name: What the role's tasks write
      ansible.builtin.include_role:
        name: {role}
        tasks_from: record_writes.yml
    - name: Keep both
      ansible.builtin.copy:
        content: "{{{{ {{'desired': {desired}, 'written': _recorded | default([])}} | to_json }}}}"
        dest: "{out}/result.json"
        mode: "0600"
"""


def role_copy(tmp_path, role):
    """A copy of the role under tmp_path/roles (to be edited by a test), with its recorder."""
    dest = tmp_path / 'roles' / role
    if not dest.exists():
        shutil.copytree(os.path.join(ROOT, 'roles', role), str(dest))
    return dest


def declared_and_written(tmp_path, role):
    """(declared state, recorded writes) of the role copy under tmp_path/roles."""
    if not os.path.exists(PLAYBOOK):
        pytest.skip('ansible-playbook not beside sys.executable (the controller venv)')
    role_dir = role_copy(tmp_path, role)
    recorders = _recorders(str(role_dir))
    assert recorders, 'no file-writing task found in roles/%s/tasks' % role
    (role_dir / 'tasks' / 'record_writes.yml').write_text(yaml.safe_dump(recorders, sort_keys=False))
    play = tmp_path / 'play.yml'
    play.write_text(PLAY.format(role=role, desired=ROLES[role]['desired'], out=tmp_path))
    extra = tmp_path / 'extra.json'
    extra.write_text(json.dumps(ROLES[role]['vars']))
    env = dict(os.environ, ANSIBLE_NOCOLOR='1', ANSIBLE_PYTHON_INTERPRETER=sys.executable,
               ANSIBLE_CONFIG=os.path.join(ROOT, 'ansible.cfg'), ANSIBLE_ROLES_PATH=str(tmp_path / 'roles'))
    proc = subprocess.run([PLAYBOOK, '-v', '-i', 'localhost,', '-c', 'local', '-e', '@%s' % extra, str(play)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert SECRET not in proc.stdout + proc.stderr
    result = json.loads((tmp_path / 'result.json').read_text())
    assert SECRET not in json.dumps(result)
    return result['desired'], result['written']


def disagreements(desired, written):
    """Every way the declared files/users/groups and the recorded writes differ, as sentences."""
    problems = []
    declared_files = {spec['path']: spec for spec in desired.get('files', [])}
    written_files = {}
    for rec in (r for r in written if r['kind'] == 'file' and r['state'] != 'absent'):
        if rec['path'] in written_files:
            problems.append('%s: written by two tasks (%r, %r)'
                            % (rec['path'], written_files[rec['path']]['task'], rec['task']))
        written_files[rec['path']] = rec
    for path in sorted(set(declared_files) | set(written_files)):
        spec, rec = declared_files.get(path), written_files.get(path)
        if rec is None:
            problems.append('%s: declared but no task writes it' % path)
            continue
        if spec is None:
            problems.append('%s: written by %r but not declared (never checked, never repaired)' % (path, rec['task']))
            continue
        for attr in ATTRS[1:]:
            want, got = spec.get(attr, 'file' if attr == 'state' else None), rec.get(attr)
            if str(want) != str(got):
                problems.append('%s: %s declared %r, task %r writes %r' % (path, attr, want, rec['task'], got))
        if spec.get('sha1') != rec.get('sha1'):
            problems.append('%s: content declared sha1 %s, task %r writes sha1 %s'
                            % (path, spec.get('sha1'), rec['task'], rec.get('sha1')))
    # Accounts: a declared user may be a name (it must exist) or a dict whose every attribute
    # is checked; either way the tasks must create it with exactly those attributes.
    for kind, key in (('user', 'users'), ('group', 'groups')):
        made = sorted((r['name'], json.dumps(dict((k, v) for k, v in r.items() if k in ('group', 'shell', 'home')),
                                             sort_keys=True))
                      for r in written if r['kind'] == kind and r['state'] == 'present')
        declared = sorted((d, '{}') if isinstance(d, str) else
                          (d['name'], json.dumps(dict((k, v) for k, v in d.items() if k != 'name'), sort_keys=True))
                          for d in desired.get(key, []))
        if made != declared:
            problems.append('%s: declared %r, tasks create %r' % (key, declared, made))
    return problems


@pytest.mark.parametrize('role', sorted(ROLES))
def test_declared_state_is_what_the_tasks_write(tmp_path, role):
    desired, written = declared_and_written(tmp_path, role)
    assert disagreements(desired, written) == []
    # The comparison saw real writes with real content, not two empty lists.
    contents = [r for r in written if r.get('sha1')]
    assert len(contents) >= 3 and all(len(r['sha1']) == 40 for r in contents)


def test_the_watchdog_key_file_is_declared_with_the_key_hash(tmp_path):
    desired, written = declared_and_written(tmp_path, 'serving_watchdog')
    key_path = '/etc/kvpin-watchdog/llama-3.1-8b.token'
    [rec] = [r for r in written if r.get('path') == key_path]
    assert rec['sha1'] == hashlib.sha1((SECRET + '\n').encode()).hexdigest()
    assert {s['path']: s for s in desired['files']}[key_path]['sha1'] == rec['sha1']
    # The other user's target: its key file does not exist (no key), its polkit rule does.
    assert '/etc/polkit-1/rules.d/60-kvpin-watchdog-gpustack.rules' in [r.get('path') for r in written]


def _edit(path, old, new):
    text = path.read_text()
    assert old in text, 'the test edit no longer applies: %r not in %s' % (old, path)
    path.write_text(text.replace(old, new, 1))


def test_a_task_writing_another_mode_than_declared_is_caught(tmp_path):
    role_dir = role_copy(tmp_path, 'gpustack_worker')
    _edit(role_dir / 'tasks' / 'configure.yml', 'files: "{{ _gpustack_worker_managed_files }}"',
          "files: \"{{ _gpustack_worker_managed_files[:-1]"
          " + [_gpustack_worker_managed_files[-1] | combine({'mode': '0640'})] }}\"")
    problems = disagreements(*declared_and_written(tmp_path, 'gpustack_worker'))
    assert problems == ["/etc/systemd/system/gpustack-worker.service: mode declared '0644', "
                        "task 'Configure | directories, config.yaml, worker environment and systemd unit' writes '0640'"]


def test_a_write_left_out_of_the_declared_state_is_caught(tmp_path):
    role_dir = role_copy(tmp_path, 'serving_watchdog')
    _edit(role_dir / 'tasks' / 'desired_state.yml', '(_serving_watchdog_node_files\n',
          '(_serving_watchdog_node_files[1:]\n')
    problems = disagreements(*declared_and_written(tmp_path, 'serving_watchdog'))
    assert problems == ["/usr/local/lib/kvpin: written by 'Create the watchdog user; write the program, directories, "
                        "configs, units, polkit rules, key files and switch units' but not declared (never checked, "
                        "never repaired)"]


ACCOUNT = '"group": "kvpin-watchdog", "home": "/nonexistent", "shell": "%s"'


# The watchdog's user is created by the same managed_files call that writes its files: a user the
# call creates but the state leaves out, or creates with another shell than declared, is caught.
@pytest.mark.parametrize('task_file, old, new, problem', [
    ('desired_state.yml', '      users:\n        - "{{ _serving_watchdog_account }}"\n', '      users: []\n',
     "users: declared [], tasks create [('kvpin-watchdog', '{%s}')]" % (ACCOUNT % '/usr/sbin/nologin')),
    ('configure.yml', '      - "{{ _serving_watchdog_account }}"\n',
     '      - "{{ _serving_watchdog_account | combine({\'shell\': \'/bin/sh\'}) }}"\n',
     "users: declared [('kvpin-watchdog', '{%s}')], tasks create [('kvpin-watchdog', '{%s}')]"
     % (ACCOUNT % '/usr/sbin/nologin', ACCOUNT % '/bin/sh')),
])
def test_an_account_created_otherwise_than_declared_is_caught(tmp_path, task_file, old, new, problem):
    role_dir = role_copy(tmp_path, 'serving_watchdog')
    _edit(role_dir / 'tasks' / task_file, old, new)
    assert disagreements(*declared_and_written(tmp_path, 'serving_watchdog')) == [problem]


def test_a_content_the_tasks_do_not_write_is_caught(tmp_path):
    role_dir = role_copy(tmp_path, 'serving_watchdog')
    _edit(role_dir / 'tasks' / 'configure.yml', 'files: "{{ _serving_watchdog_node_files +',
          "files: \"{{ _serving_watchdog_node_files[:3] + [_serving_watchdog_file_tmpfiles"
          " | combine({'content': _serving_watchdog_file_tmpfiles.content ~ '# edited'})] + _serving_watchdog_node_files[4:] +")
    problems = disagreements(*declared_and_written(tmp_path, 'serving_watchdog'))
    assert len(problems) == 1 and problems[0].startswith('/etc/tmpfiles.d/kvpin-watchdog.conf: content declared sha1')


STALE_PLAY = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: The role's declared state
      ansible.builtin.include_role:
        name: serving_watchdog
        tasks_from: desired_state.yml
    - name: What removing these targets would stop and delete
      ansible.builtin.include_role:
        name: serving_watchdog
        tasks_from: record_stale.yml
    - name: Keep both
      ansible.builtin.copy:
        content: >-
          {{{{ {{'desired': serving_watchdog_desired_state, 'stopped': _stopped, 'removed': _removed,
                'started': _started, 'restarted': _restarted, 'stopped_timers': _stopped_timers,
                'started_timers': _started_timers}} | to_json }}}}
        dest: "{out}/result.json"
        mode: "0600"
"""


def test_a_removed_target_takes_every_file_and_unit_it_was_declared_with(tmp_path):
    """configure.yml's stale-target tasks, run for the names of the current targets (as if they
    had left the inventory): they must stop exactly the units and delete every per-target file
    the declared state names for them (plus the program's metrics file). The start task and
    the restart handler name the same units (one place makes the unit name)."""
    if not os.path.exists(PLAYBOOK):
        pytest.skip('ansible-playbook not beside sys.executable (the controller venv)')
    role_dir = role_copy(tmp_path, 'serving_watchdog')
    with open(str(role_dir / 'tasks' / 'configure.yml'), encoding='utf-8') as handle:
        tasks = {task['name']: task for task in yaml.safe_load(handle)}
    names = [target['name'] for target in ROLES['serving_watchdog']['vars']['serving_watchdog_targets']]
    recorders = []
    for task_name, module, arg, fact in (
            ('Stop and disable the watchdogs of removed targets', 'ansible.builtin.systemd_service', 'name', '_stopped'),
            ('Stop and disable the profile switch timers of removed targets', 'ansible.builtin.systemd_service',
             'name', '_stopped_timers'),
            ('Remove the units, configs, key files, polkit rules, metrics and profile switch units of removed targets',
             'ansible.builtin.file', 'path', '_removed')):
        task = dict(tasks[task_name])
        value = task.pop(module)[arg]
        task.pop('register', None)
        task.pop('failed_when', None)
        task['vars'] = dict(task.get('vars') or {}, _serving_watchdog_stale_names=names, _rec=value)
        task['ansible.builtin.set_fact'] = {fact: '{{ (%s | default([])) + [_rec] }}' % fact}
        recorders.append(task)
    # The start tasks and the restart handler, for the current targets: the same unit names.
    with open(str(role_dir / 'tasks' / 'run.yml'), encoding='utf-8') as handle:
        run = {t['name']: t for t in yaml.safe_load(handle)}
    with open(str(role_dir / 'handlers' / 'main.yml'), encoding='utf-8') as handle:
        [restart] = [h for h in yaml.safe_load(handle) if h.get('listen') == 'serving_watchdog restart']
    unit_results = {'results': [{'serving_watchdog_target': {'name': name}, 'changed': True} for name in names]}
    scheduled = [t['name'] for t in ROLES['serving_watchdog']['vars']['serving_watchdog_targets'] if t.get('profile_schedule')]
    timer_results = {'results': [{'serving_watchdog_target': {'name': name}, 'changed': True} for name in scheduled]}
    for task, fact in ((run['Enable and start the watchdogs'], '_started'), (restart, '_restarted'),
                       (run['Enable and start the profile switch timers'], '_started_timers')):
        task = dict(task)
        value = task.pop('ansible.builtin.systemd_service')['name']
        task.pop('listen', None)
        task['vars'] = dict(task.get('vars') or {}, _serving_watchdog_units=unit_results,
                            _serving_watchdog_timers=timer_results, _rec=value)
        task['ansible.builtin.set_fact'] = {fact: '{{ (%s | default([])) + [_rec] }}' % fact}
        recorders.append(task)
    (role_dir / 'tasks' / 'record_stale.yml').write_text(yaml.safe_dump(recorders, sort_keys=False))
    play = tmp_path / 'play.yml'
    play.write_text(STALE_PLAY.format(out=tmp_path))
    extra = tmp_path / 'extra.json'
    extra.write_text(json.dumps(ROLES['serving_watchdog']['vars']))
    env = dict(os.environ, ANSIBLE_NOCOLOR='1', ANSIBLE_PYTHON_INTERPRETER=sys.executable,
               ANSIBLE_CONFIG=os.path.join(ROOT, 'ansible.cfg'), ANSIBLE_ROLES_PATH=str(tmp_path / 'roles'))
    proc = subprocess.run([PLAYBOOK, '-i', 'localhost,', '-c', 'local', '-e', '@%s' % extra, str(play)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((tmp_path / 'result.json').read_text())
    desired = result['desired']
    units = sorted(unit['name'] for unit in desired['units'] if unit['name'].endswith('.service'))
    timers = sorted(unit['name'] for unit in desired['units'] if unit['name'].endswith('.timer'))
    assert units == ['kvpin-watchdog-gpustack.service', 'kvpin-watchdog-llama-3.1-8b.service',
                     'kvpin-watchdog-llama-70b.service']
    assert timers == ['kvpin-profile-switch-llama-70b.timer']
    assert sorted(result['stopped']) == sorted(result['started']) == sorted(result['restarted']) == units
    assert result['started_timers'] == timers
    # A removed target's timer is stopped whether it had one or not (failed_when false: no such unit).
    assert sorted(result['stopped_timers']) == ['kvpin-profile-switch-%s.timer' % name for name in sorted(names)]
    node_level = ('/usr/local/lib/kvpin', '/usr/local/lib/kvpin/kvpin_watchdog.py', '/var/lib/prometheus/node-exporter',
                  '/etc/tmpfiles.d/kvpin-watchdog.conf', '/run/kvpin-watchdog', '/etc/kvpin-watchdog')
    # and the program's package: its directory, each of its files and the two it shares with the collection
    package = '/usr/local/lib/kvpin/kvpin_watchdog_lib'
    node_level += (package,) + tuple('%s/%s' % (package, name) for name in WATCHDOG_PACKAGE_FILES)
    per_target = {spec['path'] for spec in desired['files'] if spec['path'] not in node_level}
    # three configs, three units, one polkit rule, two key files, one switch service and its timer
    assert len(per_target) == 11
    removed = set(result['removed'])
    assert per_target <= removed, sorted(per_target - removed)
    assert removed - per_target == {'/var/lib/prometheus/node-exporter/kvpin_watchdog_%s.prom' % name for name in names} | {
        '/etc/kvpin-watchdog/gpustack.token', '/etc/polkit-1/rules.d/60-kvpin-watchdog-llama-3.1-8b.rules',
        '/etc/polkit-1/rules.d/60-kvpin-watchdog-llama-70b.rules'} | {
        '/etc/systemd/system/kvpin-profile-switch-%s.%s' % (name, kind)
        for name in ('gpustack', 'llama-3.1-8b') for kind in ('service', 'timer')}
