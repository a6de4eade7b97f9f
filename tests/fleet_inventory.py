# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A fleet of any size for planning offline (playbooks/plan.yml with kvpin_gpu_facts_file):
node ``fleet-NNN`` takes the card layout and the deployments of one of the four lab nodes in
turn, and its GPUs from that layout's saved gpu_facts output. The saved output is made by the
real kvpin.fleet.gpu_facts module run with ``ansible --tree`` on localhost over the NVML stub
(tests/fixtures/nvml/<layout>.json), exactly as an operator saves a real node's.

Every host has ``ansible_host: 127.0.0.1`` and ``ansible_port: 9`` over ssh: nothing listens
there, so a task that connected would fail the host as unreachable.

Used by tests/unit/test_plan_fleet_offline.py and benchmarks/bench_plan_fleet.py; on its own:
    .venv/bin/python tests/fleet_inventory.py DIR HOSTS   # writes DIR/inventory.yml + DIR/saved/
"""

from __future__ import annotations

import os
import subprocess
import sys

import yaml

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAYOUTS = ('lab-a6000x4', 'lab-4090x4', 'lab-4090x2', 'lab-mixed')
ANSIBLE = os.path.join(os.path.dirname(sys.executable), 'ansible')
PLAYBOOK = os.path.join(os.path.dirname(sys.executable), 'ansible-playbook')
PLAN_YML = os.path.join(REPO_ROOT, 'playbooks', 'plan.yml')

# The collection's import path: benchmarks/_setup.py computes it (and makes the .cache link
# when missing) for the benchmarks, and for this module, which the benchmarks and tests share.
sys.path.insert(0, os.path.join(REPO_ROOT, 'benchmarks'))
from _setup import COLLECTIONS_ROOT  # noqa: E402  pylint: disable=wrong-import-position


def ansible_env(work, **extra):
    """The environment of ansible/ansible-playbook runs under ``work`` (a private HOME and tmp)."""
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO_ROOT, 'ansible.cfg'),
               ANSIBLE_COLLECTIONS_PATH=COLLECTIONS_ROOT, HOME=str(work), ANSIBLE_NOCOLOR='1',
               ANSIBLE_LOCAL_TEMP=os.path.join(str(work), 'local_tmp'),
               ANSIBLE_REMOTE_TMP=os.path.join(str(work), 'remote_tmp'),
               ANSIBLE_RETRY_FILES_ENABLED='0', ANSIBLE_HOST_KEY_CHECKING='0', PWD=str(work))
    env.update(extra)
    return env


def save_layout_facts(work, saved_dir):
    """Run kvpin.fleet.gpu_facts once per lab layout over the NVML stub and save its output
    as ``saved_dir/<layout>.json`` (what ``ansible ... --tree`` writes). Returns the paths."""
    sys.path.insert(0, os.path.join(REPO_ROOT, 'tests'))
    from nvml_stub_pynvml import stub_library_path  # pylint: disable=import-outside-toplevel
    library_dir = os.path.dirname(stub_library_path())
    os.makedirs(saved_dir, exist_ok=True)
    inventory = os.path.join(str(work), 'localhost.ini')
    with open(inventory, 'w', encoding='utf-8') as handle:
        handle.write('localhost ansible_connection=local ansible_python_interpreter=%s\n' % sys.executable)
    paths = {}
    for layout in LAYOUTS:
        tree = os.path.join(str(work), 'tree-' + layout)
        env = ansible_env(work, LD_LIBRARY_PATH=library_dir,
                          KVPIN_NVML_STUB_CONFIG=os.path.join(REPO_ROOT, 'tests', 'fixtures', 'nvml', layout + '.json'))
        proc = subprocess.run([ANSIBLE, 'localhost', '-i', inventory, '-m', 'kvpin.fleet.gpu_facts', '--tree', tree],
                              env=env, cwd=str(work), capture_output=True, text=True, timeout=120, check=False)
        if proc.returncode != 0:
            raise RuntimeError('gpu_facts over the stub for %s failed:\n%s%s' % (layout, proc.stdout, proc.stderr))
        paths[layout] = os.path.join(saved_dir, layout + '.json')
        os.replace(os.path.join(tree, 'localhost'), paths[layout])
    return paths


def lab_deployments(layout):
    """The lab node's deployments (inventory/lab/host_vars), without the lab-only GPUStack source."""
    with open(os.path.join(REPO_ROOT, 'inventory', 'lab', 'host_vars', layout + '.yml'), encoding='utf-8') as handle:
        deployments = (yaml.safe_load(handle) or {}).get('kvpin_deployments', [])
    return [{k: v for k, v in d.items() if k != 'gpustack'} for d in deployments]


def write_fleet(work, hosts, saved=None):
    """``work``/inventory.yml with ``hosts`` nodes planned offline; returns (path, host names)."""
    saved = saved or save_layout_facts(work, os.path.join(str(work), 'saved'))
    names = ['fleet-%03d' % (i + 1) for i in range(hosts)]
    host_vars = {}
    for i, name in enumerate(names):
        layout = LAYOUTS[i % len(LAYOUTS)]
        host_vars[name] = {'kvpin_gpu_facts_file': saved[layout], 'kvpin_deployments': lab_deployments(layout),
                           'gpustack_worker_runtime': 'native'}
    inventory = {'all': {'children': {'gpu_nodes': {
        'vars': {'ansible_connection': 'ssh', 'ansible_host': '127.0.0.1', 'ansible_port': 9,
                 'ansible_user': 'nobody', 'ansible_python_interpreter': '/usr/bin/python3'},
        'hosts': host_vars}}}}
    path = os.path.join(str(work), 'inventory.yml')
    with open(path, 'w', encoding='utf-8') as handle:
        yaml.safe_dump(inventory, handle, sort_keys=False)
    return path, names


def run_plan(work, inventory, report, *options, timeout=1800):
    """playbooks/plan.yml over ``inventory``, writing the HTML report to ``report``."""
    return subprocess.run([PLAYBOOK, '-i', inventory, PLAN_YML, '-e', 'kvpin_plan_report_path=%s' % report]
                          + list(options), env=ansible_env(work), cwd=str(work), capture_output=True, text=True,
                          timeout=timeout, check=False)


if __name__ == '__main__':
    if len(sys.argv) != 3:
        sys.exit('usage: fleet_inventory.py DIR HOSTS')
    os.makedirs(sys.argv[1], exist_ok=True)
    print(write_fleet(os.path.abspath(sys.argv[1]), int(sys.argv[2]))[0])
