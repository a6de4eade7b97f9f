# -*- coding: utf-8 -*-
# Copyright (c) 2026, kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""site.yml's rerun gate, without the lab: a role is included only on a node whose part differs.

The tasks that make the gate are taken verbatim from playbooks/site.yml (the probe with its
observe option, the comparison on the controller, the Worker and Watchdog include_role tasks
with their `when:`), and run with ansible-playbook on localhost (connection local) against
checks whose files live in a temp dir. The only change: each include_role names a recording
role (in the temp dir) instead of the real one, so that nothing is installed on this machine;
the gate's conditions, vars and the real gpu_facts observation and kvpin_node_drift comparison
are what runs, the probe given paths-only checks (read_sha1) as site.yml's first State pass makes
them, the comparison the full ones. Dropping the `not` of a gate, or comparing against the wrong check, fails here.
"""
from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import subprocess
import sys

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SITE = os.path.join(ROOT, 'playbooks', 'site.yml')
ANSIBLE_PLAYBOOK = os.path.join(os.path.dirname(sys.executable), 'ansible-playbook')
GATED_ROLES = {'kvpin.fleet.gpustack_worker': 'gpustack_worker', 'kvpin.fleet.serving_watchdog': 'serving_watchdog'}


def _site_tasks():
    """(probe, compare, {check name: include_role task}) as site.yml has them."""
    with open(SITE, encoding='utf-8') as handle:
        plays = yaml.safe_load(handle)
    play = next(p for p in plays if 'tasks' in p)
    tasks = play['tasks']
    [probe] = [t for t in tasks if 'kvpin.fleet.gpu_facts' in t]
    [compare] = [t for t in tasks if 'kvpin_node_state' in (t.get('ansible.builtin.set_fact') or {})]
    gates = {}
    # The watchdog's include sits in a block (its always section proves the worker healthy).
    for task in [t for task in tasks for t in [task] + task.get('block', [])]:
        role = (task.get('ansible.builtin.include_role') or {}).get('name')
        if role in GATED_ROLES:
            assert GATED_ROLES[role] not in gates, 'two include_role tasks for %s' % role
            gates[GATED_ROLES[role]] = task
    assert set(gates) == set(GATED_ROLES.values()), 'site.yml no longer includes %s' % sorted(GATED_ROLES)
    return play, probe, compare, gates


def _sha1(data):
    return hashlib.sha1(data).hexdigest()


@pytest.fixture(scope='module')
def gate_play(tmp_path_factory):
    if not os.path.exists(ANSIBLE_PLAYBOOK):
        pytest.skip('ansible-playbook is not next to this Python')
    tmp = tmp_path_factory.mktemp('gate')
    play, probe, compare, gates = _site_tasks()
    # As in site.yml, the probe is given the paths-only checks (read_sha1, no wanted content:
    # the first State pass) and the comparison the full ones (the pass after planning).
    tasks = [{'name': 'first pass', 'ansible.builtin.set_fact': {'kvpin_managed_checks': '{{ gate_probe_checks }}'}},
             copy.deepcopy(probe),
             {'name': 'second pass', 'ansible.builtin.set_fact': {'kvpin_managed_checks': '{{ gate_checks }}'}},
             copy.deepcopy(compare)]
    for check, task in sorted(gates.items()):
        task = copy.deepcopy(task)
        task['ansible.builtin.include_role']['name'] = 'record_' + check
        tasks.append(task)
        role_tasks = tmp / 'roles' / ('record_' + check) / 'tasks'
        role_tasks.mkdir(parents=True)
        observed_var = '%s_observed_state' % check
        role_tasks.joinpath('main.yml').write_text(yaml.safe_dump([{
            'name': 'record',
            'ansible.builtin.debug': {'msg': 'GATE-RAN %s: {{ %s.drift | join(" / ") }}' % (check, observed_var)},
        }]))
    test_play = {'name': 'site.yml gate', 'hosts': 'all', 'gather_facts': False,
                 'vars': copy.deepcopy(play.get('vars') or {}), 'tasks': tasks}
    playbook = tmp / 'gate.yml'
    playbook.write_text(yaml.safe_dump([test_play], sort_keys=False))
    return tmp, playbook


def _run(gate_play, worker_file, watchdog_file):
    tmp, playbook = gate_play
    checks = [
        {'name': 'gpustack_worker', 'files': [{'path': str(tmp / 'config.yaml'), 'sha1': _sha1(worker_file), 'mode': '0600'}]},
        {'name': 'serving_watchdog', 'files': [{'path': str(tmp / 'watchdog.json'), 'sha1': _sha1(watchdog_file), 'mode': '0644'}]},
    ]
    probe_checks = [dict(check, files=[dict([(k, v) for k, v in f.items() if k != 'sha1'], read_sha1=True)
                                       for f in check['files']]) for check in checks]
    extra = {'gate_checks': checks, 'gate_probe_checks': probe_checks, 'kvpin_gpu_facts_required': False,
             'kvpin_deployments': [{'name': 'fixture'}], 'ansible_python_interpreter': sys.executable}
    (tmp / 'extra.json').write_text(json.dumps(extra))
    env = dict(os.environ, ANSIBLE_ROLES_PATH=str(tmp / 'roles'), ANSIBLE_NOCOLOR='1', ANSIBLE_FORCE_COLOR='0')
    env.pop('ANSIBLE_CONFIG', None)
    proc = subprocess.run([ANSIBLE_PLAYBOOK, '-i', 'localhost,', '-c', 'local', '-e', '@%s' % (tmp / 'extra.json'),
                           str(playbook)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return dict(re.findall(r'GATE-RAN (\w+): ([^"]*)"', proc.stdout)), proc.stdout


def _write(tmp, name, data, mode):
    path = tmp / name
    path.write_bytes(data)
    path.chmod(mode)


def test_in_sync_node_includes_no_role(gate_play):
    tmp, _unused = gate_play
    _write(tmp, 'config.yaml', b'worker: 1\n', 0o600)
    _write(tmp, 'watchdog.json', b'{}\n', 0o644)
    ran, out = _run(gate_play, b'worker: 1\n', b'{}\n')
    assert ran == {}, out
    assert re.search(r'skipping: \[localhost\]', out)


def test_only_the_role_whose_part_differs_is_included(gate_play):
    tmp, _unused = gate_play
    _write(tmp, 'config.yaml', b'worker: 1\n', 0o644)            # chmod by hand on the node
    _write(tmp, 'watchdog.json', b'{}\n', 0o644)
    ran, out = _run(gate_play, b'worker: 1\n', b'{}\n')
    assert ran == {'gpustack_worker': '%s: mode 0644, wanted 0600' % (tmp / 'config.yaml')}, out

    _write(tmp, 'config.yaml', b'worker: 1\n', 0o600)
    _write(tmp, 'watchdog.json', b'{"edited": 1}\n', 0o644)      # edited by hand
    ran, out = _run(gate_play, b'worker: 1\n', b'{}\n')
    assert list(ran) == ['serving_watchdog'] and 'content differs' in ran['serving_watchdog'], out


def test_missing_files_include_both_roles(gate_play):
    tmp, _unused = gate_play
    for name in ('config.yaml', 'watchdog.json'):
        if (tmp / name).exists():
            (tmp / name).unlink()
    ran, out = _run(gate_play, b'worker: 1\n', b'{}\n')
    assert ran == {'gpustack_worker': '%s: missing' % (tmp / 'config.yaml'),
                   'serving_watchdog': '%s: missing' % (tmp / 'watchdog.json')}, out
