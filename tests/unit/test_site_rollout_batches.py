# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""site.yml and worker.yml take their batches (serial) through kvpin.fleet.kvpin_rollout_batches:
a bad kvpin_serial stops the run before any task, naming the variable, and a good one still
makes the batches Ansible lists. Runs the real playbooks with --list-hosts (Ansible templates a
play's serial there too), no connection to any host."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from local_playbook import PLAYBOOK, run_repo_playbook

PLAYBOOKS = ['site.yml', 'worker.yml']


def _list_hosts(tmp_path, playbook, serial):
    return run_repo_playbook(tmp_path, playbook, '--list-hosts', '-e', json.dumps({'kvpin_serial': serial}),
                             nodes=['node%d' % i for i in range(4)])


@pytest.fixture(autouse=True)
def _needs_ansible():
    if not os.path.exists(PLAYBOOK):
        pytest.skip('ansible-playbook is not in the repository venv')


@pytest.mark.parametrize('playbook', PLAYBOOKS)
@pytest.mark.parametrize('serial, says', [
    ('ten', "kvpin_serial: each batch must be a node count (e.g. 2) or a share of the fleet (e.g. '25%'), got 'ten'"),
    (0, 'kvpin_serial: a batch must be 1..100000 nodes, got 0'),
    ('150%', "kvpin_serial: a share of the fleet must be 1%..100%, got '150%'"),
    ([1, 'half'], "kvpin_serial[1]: each batch must be"),
])
def test_a_bad_batch_stops_the_playbook_naming_kvpin_serial(tmp_path, playbook, serial, says):
    proc = _list_hosts(tmp_path, playbook, serial)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert says in ' '.join(out.split()), out
    assert 'Traceback' not in out


@pytest.mark.parametrize('playbook', PLAYBOOKS)
def test_a_good_batch_list_still_lists_the_fleet(tmp_path, playbook):
    proc = _list_hosts(tmp_path, playbook, [1, '50%'])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert all('node%d' % i in proc.stdout for i in range(4)), proc.stdout


def test_the_collections_python_imports_without_numpy():
    """Ansible forks a worker per node and task; whatever the filters and the planner import at
    load time each worker pays again, unless the main process loaded it first (serial, above).
    gguf pulls numpy in (~150 ms), so it is imported only when a GGUF file is read."""
    code = ('import sys\n'
            'import ansible_collections.kvpin.fleet.plugins.filter.kvpin\n'
            'import ansible_collections.kvpin.fleet.plugins.action.serving_plan\n'
            'import ansible_collections.kvpin.fleet.plugins.module_utils.plan.llamacpp_memory as lm\n'
            'assert lm.type_bytes("Q4_K", 256) == 144\n'
            'print(sorted(m for m in ("numpy", "gguf") if m in sys.modules))\n')
    proc = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=120, check=False,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p)))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == '[]', proc.stdout
