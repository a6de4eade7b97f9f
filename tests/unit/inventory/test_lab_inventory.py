# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""inventory/lab/lab_nodes.py: the lab's inventory at any size (issue 16), run as Ansible runs
an inventory script (--list) and as scripts/lab.sh runs it (--names), plus ansible-inventory on
the inventory directory: the node count comes from KVPIN_LAB_NODES, else lab.sh's record, else 4."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SCRIPT = os.path.join(ROOT, 'inventory', 'lab', 'lab_nodes.py')
LAYOUTS = ['lab-a6000x4', 'lab-4090x4', 'lab-4090x2', 'lab-mixed']


def script(*args, **environ):
    env = {'PATH': os.environ.get('PATH', '/usr/bin:/bin')}
    env.update(environ)
    return subprocess.run([sys.executable, SCRIPT] + list(args), env=env, capture_output=True, text=True,
                          timeout=60, check=False)


def test_names_cycle_the_four_layouts(tmp_path):
    assert script('--names', '4', KVPIN_LAB_DIR=str(tmp_path)).stdout.split() == LAYOUTS
    names = script('--names', '16', KVPIN_LAB_DIR=str(tmp_path)).stdout.split()
    assert names[:4] == LAYOUTS and len(names) == len(set(names)) == 16
    assert names[4:8] == [name + '-2' for name in LAYOUTS] and names[-1] == 'lab-mixed-4'


def test_default_is_four_then_the_record_then_the_environment(tmp_path):
    assert script('--names', KVPIN_LAB_DIR=str(tmp_path)).stdout.split() == LAYOUTS
    (tmp_path / 'scale-nodes').write_text('6\n')
    assert len(script('--names', KVPIN_LAB_DIR=str(tmp_path), KVPIN_LAB_PREFIX='scale-').stdout.split()) == 6
    # Another prefix's record is not this fleet's.
    assert len(script('--names', KVPIN_LAB_DIR=str(tmp_path), KVPIN_LAB_PREFIX='other-').stdout.split()) == 4
    assert len(script('--names', KVPIN_LAB_DIR=str(tmp_path), KVPIN_LAB_PREFIX='scale-',
                      KVPIN_LAB_NODES='9').stdout.split()) == 9


def test_list_groups_the_nodes_and_renames_the_copies_deployments(tmp_path):
    data = json.loads(script('--list', KVPIN_LAB_DIR=str(tmp_path), KVPIN_LAB_NODES='8').stdout)
    assert data['gpu_nodes']['children'] == ['lab_vllm', 'lab_llama_box']
    assert data['lab_llama_box']['hosts'] == ['lab-mixed', 'lab-mixed-2']
    assert len(data['lab_vllm']['hosts']) == 6
    copy = data['_meta']['hostvars']['lab-4090x2-2']
    assert copy['kvpin_lab_layout'] == 'lab-4090x2'
    assert [d['name'] for d in copy['kvpin_deployments']] == ['llama-3.1-8b-2']
    # A first-round node takes its host_vars file as any host does: nothing duplicated here.
    assert 'kvpin_deployments' not in data['_meta']['hostvars']['lab-4090x2']
    # Every deployment name is unique across the fleet (GPUStack names them fleet-wide).
    names = [d['name'] for host in data['_meta']['hostvars'].values() for d in host.get('kvpin_deployments', [])]
    assert len(names) == len(set(names))


@pytest.mark.parametrize('value', ['0', '65', 'x', '-1', '4.0', '1e3', ' '])
def test_bad_counts_are_refused_naming_the_variable(tmp_path, value):
    if not value.strip():
        # Blank means unset: the default.
        assert len(script('--names', KVPIN_LAB_DIR=str(tmp_path), KVPIN_LAB_NODES=value).stdout.split()) == 4
        return
    proc = script('--list', KVPIN_LAB_DIR=str(tmp_path), KVPIN_LAB_NODES=value)
    assert proc.returncode == 2 and 'KVPIN_LAB_NODES' in proc.stderr and '1..64' in proc.stderr
    assert 'Traceback' not in proc.stderr


def test_a_bad_record_or_prefix_is_refused(tmp_path):
    (tmp_path / 'nodes').write_text('lots')
    proc = script('--list', KVPIN_LAB_DIR=str(tmp_path))
    assert proc.returncode == 2 and str(tmp_path / 'nodes') in proc.stderr and 'Traceback' not in proc.stderr
    proc = script('--list', KVPIN_LAB_DIR=str(tmp_path), KVPIN_LAB_PREFIX='../x')
    assert proc.returncode == 2 and 'KVPIN_LAB_PREFIX' in proc.stderr


def test_ansible_inventory_follows_the_count(tmp_path):
    inventory = os.path.join(os.path.dirname(sys.executable), 'ansible-inventory')
    if not os.path.exists(inventory):
        pytest.skip('ansible-inventory not beside sys.executable (the controller venv)')
    env = dict(os.environ, KVPIN_LAB_DIR=str(tmp_path), KVPIN_LAB_NODES='5', ANSIBLE_NOCOLOR='1')
    proc = subprocess.run([inventory, '-i', os.path.join(ROOT, 'inventory', 'lab'), '--list'], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    hosts = data['lab_vllm']['hosts'] + data['lab_llama_box']['hosts']
    assert sorted(hosts) == sorted(LAYOUTS + ['lab-a6000x4-2'])
    # The group_vars of gpu_nodes apply to the copies too (the podman connection).
    assert data['_meta']['hostvars']['lab-a6000x4-2']['ansible_connection'] == 'containers.podman.podman'
    assert data['_meta']['hostvars']['lab-a6000x4-2']['kvpin_deployments'][0]['name'] == 'llama-3.3-70b-2'


def test_each_node_is_reached_at_its_container_through_the_chosen_connection(tmp_path):
    data = json.loads(script('--list', KVPIN_LAB_DIR=str(tmp_path), KVPIN_LAB_NODES='5', KVPIN_LAB_PREFIX='me-').stdout)
    hostvars = data['_meta']['hostvars']
    assert {node: v['ansible_host'] for node, v in hostvars.items()} == {node: 'me-' + node for node in hostvars}
    assert {v['ansible_connection'] for v in hostvars.values()} == {'containers.podman.podman'}
    # The short name, for mitogen (docs/rollout-scale.md); anything else is refused by name.
    data = json.loads(script('--list', KVPIN_LAB_DIR=str(tmp_path), KVPIN_LAB_CONNECTION='podman').stdout)
    assert {v['ansible_connection'] for v in data['_meta']['hostvars'].values()} == {'podman'}
    proc = script('--list', KVPIN_LAB_DIR=str(tmp_path), KVPIN_LAB_CONNECTION='ssh')
    assert proc.returncode == 2 and 'KVPIN_LAB_CONNECTION' in proc.stderr and 'Traceback' not in proc.stderr
