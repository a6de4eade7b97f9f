# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Helpers of the testinfra suite (conftest.py, test_*.py): where the lab is, its nodes as
testinfra hosts, the lab's GPUStack secrets and the state a scenario's side_effect left."""

import json
import os
import shutil
import subprocess
import sys
import tempfile

import testinfra

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.environ.get('MOLECULE_PROJECT_DIRECTORY') or os.path.dirname(os.path.dirname(HERE))
# KVPIN_LAB_ROOT: the scenarios' way to run against another copy of the lab (its inventory/lab).
LAB_ROOT = os.environ.get('KVPIN_LAB_ROOT') or REPO_ROOT
INVENTORY = os.path.join(LAB_ROOT, 'inventory', 'lab')
PREFIX = os.environ.get('KVPIN_LAB_PREFIX', '')
LAB_DIR = os.environ.get('KVPIN_LAB_DIR') or os.path.join(LAB_ROOT, '.lab')
SERVER_STATE_DIR = os.path.join(LAB_DIR, PREFIX + 'gpustack')
# Where the NVML stub reads its fixture on a lab node (scripts/lab.sh NODE_FIXTURE_PATH).
NODE_FIXTURE_PATH = '/etc/kvpin/nvml-stub.json'
# The file each scenario's side_effect writes in molecule's ephemeral directory.
STATE_FILE = 'kvpin_testinfra_state.json'


def venv_tool(name):
    candidate = os.path.join(os.path.dirname(sys.executable), name)
    return candidate if os.path.exists(candidate) else name


def ansible_env():
    env = dict(os.environ)
    env['PATH'] = os.path.dirname(sys.executable) + os.pathsep + env.get('PATH', '')
    env['ANSIBLE_NOCOLOR'] = '1'
    env['ANSIBLE_FORCE_COLOR'] = '0'
    # The repository's ansible.cfg (its collections path), whoever started pytest.
    env.pop('ANSIBLE_CONFIG', None)
    return env


def scenario_name():
    return os.environ.get('MOLECULE_SCENARIO_NAME', 'default')


def inventory_nodes():
    """The inventory's gpu_nodes, in inventory order."""
    proc = subprocess.run([venv_tool('ansible-inventory'), '-i', INVENTORY, '--list'], cwd=REPO_ROOT,
                          env=ansible_env(), capture_output=True, text=True, timeout=120, check=False)
    if proc.returncode != 0:
        raise RuntimeError('ansible-inventory -i %s failed: %s' % (INVENTORY, proc.stderr[-2000:]))
    groups = json.loads(proc.stdout)
    nodes = []

    def walk(group):
        entry = groups.get(group, {})
        for host in entry.get('hosts', []):
            if host not in nodes:
                nodes.append(host)
        for child in entry.get('children', []):
            walk(child)
    walk('gpu_nodes')
    return nodes


def node_plans():
    """{node: {'node', 'gpus', 'deployments', 'plans', 'plan_error', 'system_reserved_ram_gib',
    'system_reserved_vram_min_gib', 'watchdogs'}}: tests/testinfra/plans.yml, run once."""
    out = tempfile.mkdtemp(prefix='kvpin-testinfra-')
    try:
        proc = subprocess.run([venv_tool('ansible-playbook'), '-i', INVENTORY,
                               '--extra-vars', json.dumps({'kvpin_testinfra_out': out}),
                               os.path.join(HERE, 'plans.yml')],
                              cwd=REPO_ROOT, env=ansible_env(), capture_output=True, text=True, timeout=600,
                              check=False)
        if proc.returncode != 0:
            raise AssertionError('plans.yml failed:\n%s%s' % (proc.stdout[-6000:], proc.stderr[-2000:]))
        found = {}
        for name in os.listdir(out):
            with open(os.path.join(out, name)) as handle:
                data = json.load(handle)
            found[data['node']] = data
        return found
    finally:
        shutil.rmtree(out, ignore_errors=True)


def repo_fixture(name):
    """The repository's NVML fixture for a node (what scripts/lab.sh gives its stub)."""
    directory = os.environ.get('KVPIN_NVML_FIXTURE_DIR') or os.path.join(REPO_ROOT, 'tests', 'fixtures', 'nvml')
    with open(os.path.join(directory, name + '.json')) as handle:
        return json.load(handle)


def read_lab_secret(name):
    """One of the files scripts/lab.sh keeps for the lab's GPUStack server (server_url, token,
    api_key, bootstrap_password)."""
    with open(os.path.join(SERVER_STATE_DIR, name)) as handle:
        return handle.read().strip()


def scenario_state():
    """What the scenario's side_effect recorded before its change (STATE_FILE)."""
    directory = os.environ.get('MOLECULE_EPHEMERAL_DIRECTORY')
    assert directory, 'MOLECULE_EPHEMERAL_DIRECTORY is not set: run this suite through molecule verify'
    path = os.path.join(directory, STATE_FILE)
    assert os.path.exists(path), '%s is missing: the scenario\'s side_effect writes it (run it first)' % path
    with open(path) as handle:
        return json.load(handle)


class Node:
    """One lab node: its inventory name, its testinfra host, its plans and its NVML fixture."""

    def __init__(self, name, plan_data):
        self.name = name
        self.container = PREFIX + name
        self.host = testinfra.get_host('podman://' + self.container)
        self.gpus = plan_data['gpus']
        self.deployments = plan_data['deployments']
        self.plans = plan_data['plans']
        self.plan_error = plan_data['plan_error']
        self.system_reserved_ram_gib = plan_data['system_reserved_ram_gib']
        self.system_reserved_vram_min_gib = plan_data['system_reserved_vram_min_gib']
        self.watchdogs = plan_data['watchdogs']
        self._fixture = None

    @property
    def served_fixture(self):
        """The NVML fixture this node's stub serves now."""
        return json.loads(self.host.file(NODE_FIXTURE_PATH).content_string)

    @property
    def fixture(self):
        """The NVML fixture the node must report: the repository's for it (KVPIN_NVML_FIXTURE_DIR
        overrides the directory), except on the node whose cards molecule/hardware_change
        swapped, which must report the fixture the scenario put there."""
        if self._fixture is None:
            if scenario_name() == 'hardware_change' and scenario_state()['node'] == self.name:
                self._fixture = self.served_fixture
            else:
                self._fixture = repo_fixture(self.name)
        return self._fixture

    def systemd_show(self, unit, *properties):
        out = self.host.check_output('systemctl show --property=%s %s', ','.join(properties), unit)
        shown = {}
        for line in out.splitlines():
            key, _sep, value = line.partition('=')
            shown[key] = value
        return shown

    def unix_time(self, unit, prop):
        """A unit's timestamp property in whole seconds since the epoch."""
        value = self.host.check_output('systemctl show --timestamp=unix --property=%s --value %s', prop, unit)
        assert value.startswith('@'), '%s %s: %r' % (unit, prop, value)
        return int(value[1:])

    def __repr__(self):
        return 'Node(%s)' % self.name
