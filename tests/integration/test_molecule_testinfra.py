# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""`molecule verify` (the testinfra suite in tests/testinfra) on the lab fleet: it passes on a
converged lab, and each hand-made change on one node that breaks a fact the rollout left there
fails exactly that node's test for the fact: the worker config made 0644, a deployment's
watchdog stopped, the registration token copied into a world-readable file, the watchdog's
system account given a login shell. The changes are
undone afterwards (by hand, not by a rollout)."""

import os
import re
import subprocess
from xml.etree import ElementTree

import pytest

from lab_fleet import NODES, REPO_ROOT, VENV_BIN, ansible_env, node_exec, playbook, recap, run

pytestmark = pytest.mark.lab

STATE_DIR = os.path.join(os.environ.get('KVPIN_LAB_DIR') or os.path.join(REPO_ROOT, '.lab'),
                         os.environ.get('KVPIN_LAB_PREFIX', '') + 'gpustack')
CASE = re.compile(r'^(test_\w+)\[([\w.-]+)\]$')
# One change per node, each breaking one fact (node, the test that must fail, what is done).
CONFIG_NODE = 'lab-4090x2'
WATCHDOG_NODE = 'lab-a6000x4'
WATCHDOG_UNIT = 'kvpin-watchdog-llama-3.3-70b.service'
SECRET_NODE = 'lab-mixed'
LEAK_PATH = '/etc/kvpin-testinfra-leak.txt'
ACCOUNT_NODE = 'lab-4090x4'


def _molecule_verify(tmp_path):
    """`molecule verify -s default`: (process, {(test module, test, node): outcome}) with the
    outcomes from the verifier's pytest run (a JUnit XML report asked for through PYTEST_ADDOPTS:
    molecule wraps the console output)."""
    report = tmp_path / 'verify.xml'
    env = ansible_env()
    env['PYTEST_ADDOPTS'] = (env.get('PYTEST_ADDOPTS', '') + ' --junitxml=%s' % report).strip()
    proc = run([os.path.join(VENV_BIN, 'molecule'), 'verify', '-s', 'default'], env=env, timeout=1800)
    outcomes = {}
    if report.exists():
        for case in ElementTree.parse(str(report)).getroot().iter('testcase'):
            found = CASE.match(case.get('name', ''))
            assert found, case.get('name')
            failed = case.find('failure') is not None or case.find('error') is not None
            skipped = case.find('skipped') is not None
            module = case.get('classname', '').rsplit('.', 1)[-1] + '.py'
            outcomes[(module, found.group(1), found.group(2))] = (
                'failed' if failed else 'skipped' if skipped else 'passed')
    return proc, outcomes


@pytest.fixture(scope='module')
def converged(fleet):
    site = playbook(os.path.join(REPO_ROOT, 'site.yml'))
    assert site.returncode == 0, site.stdout[-6000:] + site.stderr[-2000:]
    assert all(c['failed'] == 0 for c in recap(site.stdout).values())
    return fleet


def test_molecule_verify_runs_the_testinfra_suite_and_passes(converged, tmp_path):
    proc, outcomes = _molecule_verify(tmp_path)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-8000:]
    assert 'Executing Testinfra tests' in output
    # Every check of test_node_rollout.py ran on every node, and passed.
    checks = {(module, test) for module, test, _node in outcomes}
    assert ('test_node_rollout.py', 'test_worker_config_reserves_what_the_plans_ask') in checks
    assert len(outcomes) == len(checks) * len(NODES)
    assert {node for _m, _t, node in outcomes} == set(NODES)
    assert set(outcomes.values()) == {'passed'}


def test_molecule_verify_fails_on_each_hand_made_change(converged, tmp_path):
    with open(os.path.join(STATE_DIR, 'token')) as handle:
        token = handle.read().strip()
    container = os.environ.get('KVPIN_LAB_PREFIX', '') + SECRET_NODE
    try:
        assert node_exec(CONFIG_NODE, 'chmod', '0644', '/var/lib/gpustack/config.yaml').returncode == 0
        assert node_exec(WATCHDOG_NODE, 'systemctl', 'stop', WATCHDOG_UNIT).returncode == 0
        assert node_exec(ACCOUNT_NODE, 'usermod', '-s', '/bin/bash', 'kvpin-watchdog').returncode == 0
        # The token through stdin, so that it is in no argv.
        leak = subprocess.run(['podman', 'exec', '-i', container, 'sh', '-c', 'umask 022; cat > ' + LEAK_PATH],
                              input=token + '\n', capture_output=True, text=True, timeout=60, check=False)
        assert leak.returncode == 0, leak.stderr

        proc, outcomes = _molecule_verify(tmp_path)
        output = proc.stdout + proc.stderr
        assert proc.returncode != 0, output[-6000:]
        assert outcomes, output[-6000:]
        # Exactly the broken fact on the edited node fails; everything else still passes.
        assert {case for case, outcome in outcomes.items() if outcome != 'passed'} == {
            ('test_node_rollout.py', 'test_worker_config_is_private_to_root', CONFIG_NODE),
            ('test_node_rollout.py', 'test_watchdogs_active_with_a_valid_config', WATCHDOG_NODE),
            ('test_node_rollout.py', 'test_no_secret_in_a_world_readable_file', SECRET_NODE),
            ('test_node_rollout.py', 'test_each_watchdog_runs_as_the_system_account_made_for_it', ACCOUNT_NODE),
        }, output[-8000:]
        # The suite names the leaking file, never the secret.
        assert LEAK_PATH in output
        assert token not in output
    finally:
        node_exec(CONFIG_NODE, 'chmod', '0600', '/var/lib/gpustack/config.yaml')
        node_exec(WATCHDOG_NODE, 'systemctl', 'start', WATCHDOG_UNIT)
        node_exec(ACCOUNT_NODE, 'usermod', '-s', '/usr/sbin/nologin', 'kvpin-watchdog')
        node_exec(SECRET_NODE, 'rm', '-f', LEAK_PATH)
