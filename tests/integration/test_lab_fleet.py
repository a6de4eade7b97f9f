# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The site playbook, gpu_facts and the molecule verify playbook on the four-node lab fleet.

The fleet is brought up once for the module (scripts/lab.sh up) and removed afterwards unless
it was already running. Tests that swap a node's fixture put the original back.
"""

import copy
import json
import os
import re
import sys

import pytest
import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lab_fleet  # noqa: E402
from lab_fleet import NODES, REPO_ROOT, lab, load_fixture, module_result, playbook, recap, run  # noqa: E402

SWAP_NODE = 'lab-4090x2'


@pytest.fixture
def swapped_card(fleet, tmp_path):
    """lab-4090x2 with its second RTX 4090 replaced by the first A6000 of lab-a6000x4."""
    original = load_fixture(SWAP_NODE)
    a6000 = load_fixture('lab-a6000x4')['devices'][0]
    swapped = copy.deepcopy(original)
    card = copy.deepcopy(a6000)
    # Same slot, a different card: keep the slot's bus id, take the card's own identity.
    card['pci_bus_id'] = original['devices'][1]['pci_bus_id']
    card['nvlink_active'] = None
    swapped['devices'][1] = card
    swapped['topology'] = [{'gpus': [0, 1], 'common_ancestor': 'HOSTBRIDGE',
                            'p2p': {'read': 'NOT_SUPPORTED', 'write': 'NOT_SUPPORTED', 'nvlink': 'NOT_SUPPORTED'}}]
    path = tmp_path / (SWAP_NODE + '-swapped.json')
    path.write_text(json.dumps(swapped))
    lab('set-fixture', SWAP_NODE, str(path))
    try:
        yield original, swapped
    finally:
        lab('set-fixture', SWAP_NODE, os.path.join(lab_fleet.FIXTURE_DIR, SWAP_NODE + '.json'))


def test_site_playbook_runs_and_reruns_without_changes(fleet):
    first = playbook('site.yml')
    assert first.returncode == 0, first.stdout + first.stderr
    assert set(recap(first.stdout)) == set(NODES)
    for node in NODES:
        assert lab_fleet.expected_summary(node, load_fixture(node)) in first.stdout

    second = playbook('site.yml')
    assert second.returncode == 0, second.stdout + second.stderr
    counts = recap(second.stdout)
    assert {node: counts[node]['changed'] for node in NODES} == {node: 0 for node in NODES}


def test_rerun_on_an_unchanged_fleet_is_one_remote_call_per_node(fleet):
    # The rerun's whole cost on a node in sync: gpu_facts probes the GPUs and reads every file,
    # unit, user and health URL the roles manage (observe) in one module run; planning and the
    # comparison run on the controller; no role task is even loaded.
    converged = playbook('site.yml')
    assert converged.returncode == 0, converged.stdout + converged.stderr
    rerun = playbook('site.yml', '-vvv')
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr
    sent = lab_fleet.modules_sent(rerun.stdout)
    assert {node: sent.get(node) for node in NODES} == {node: ['gpu_facts'] for node in NODES}
    # The models phase talks to the lab's GPUStack server from the controller (delegate_to:
    # localhost): one idempotent gpustack_model run per deployment, no node round trip, and
    # its action plugin runs it in the controller's process, so no module is sent at all.
    controller = [module for host, modules in sent.items() if host not in NODES for module in modules]
    assert controller == [], sent
    deployed = re.findall(r'^(ok|changed): \[(\S+) -> localhost\] => \(item=(\S+)\)', rerun.stdout, re.MULTILINE)
    assert sorted(deployed) == sorted(('ok', node, first_deployment_name(node)) for node in NODES), deployed
    assert {node: counts['changed'] for node, counts in recap(rerun.stdout).items()} == {node: 0 for node in NODES}
    for node in NODES:
        assert '%s: in sync, nothing to change' % node in rerun.stdout


def first_deployment_name(node):
    with open(os.path.join(REPO_ROOT, 'inventory', 'lab', 'host_vars', node + '.yml'), encoding='utf-8') as handle:
        return yaml.safe_load(handle)['kvpin_deployments'][0]['name']


def test_drift_is_found_and_converged_on_that_node_only(fleet):
    converged = playbook('site.yml')
    assert converged.returncode == 0, converged.stdout + converged.stderr
    worker_config = '/var/lib/gpustack/config.yaml'
    # site.yml installs one watchdog per deployment, named after it: edit the first one's config.
    watchdog_config = '/etc/kvpin-watchdog/%s.json' % first_deployment_name('lab-4090x2')
    assert lab_fleet.node_exec('lab-mixed', 'chmod', '0644', worker_config).returncode == 0
    assert lab_fleet.node_exec('lab-4090x2', 'sh', '-c', 'echo "# hand edit" >> ' + watchdog_config).returncode == 0
    # Someone gave the watchdog's system account a login shell.
    assert lab_fleet.node_exec('lab-4090x4', 'usermod', '-s', '/bin/bash', 'kvpin-watchdog').returncode == 0

    mended = playbook('site.yml')
    assert mended.returncode == 0, mended.stdout[-3000:] + mended.stderr
    assert 'lab-mixed: differs: gpustack_worker: %s: mode 0644, wanted 0600' % worker_config in mended.stdout
    assert 'lab-4090x2: differs: serving_watchdog: %s: content differs' % watchdog_config in mended.stdout
    assert ('lab-4090x4: differs: serving_watchdog: user kvpin-watchdog: shell /bin/bash, want /usr/sbin/nologin'
            in mended.stdout)
    changed = {node: counts['changed'] for node, counts in recap(mended.stdout).items()}
    assert changed['lab-mixed'] > 0 and changed['lab-4090x2'] > 0 and changed['lab-4090x4'] > 0
    assert changed['lab-a6000x4'] == 0
    mode = lab_fleet.node_exec('lab-mixed', 'stat', '-c', '%a', worker_config)
    assert mode.stdout.strip() == '600'
    edited = lab_fleet.node_exec('lab-4090x2', 'grep', '-c', 'hand edit', watchdog_config)
    assert edited.stdout.strip() == '0'
    account = lab_fleet.node_exec('lab-4090x4', 'getent', 'passwd', 'kvpin-watchdog').stdout.strip()
    assert account.split(':')[5:] == ['/nonexistent', '/usr/sbin/nologin'], account

    again = playbook('site.yml')
    assert {node: counts['changed'] for node, counts in recap(again.stdout).items()} == {node: 0 for node in NODES}


def test_a_worker_that_fails_its_health_check_after_the_watchdogs_is_rolled_back(fleet):
    """site.yml proves a restarted worker healthy after the watchdog role (it boots meanwhile):
    a change the worker rejects is still rolled back on that node alone, the watchdogs written
    in the same run stay, and a rerun finds the fleet in sync."""
    converged = playbook('site.yml')
    assert converged.returncode == 0, converged.stdout[-3000:] + converged.stderr
    node, worker_config = 'lab-4090x4', '/var/lib/gpustack/config.yaml'
    watchdog_config = '/etc/kvpin-watchdog/%s.json' % first_deployment_name(node)
    before = lab_fleet.node_exec(node, 'sha1sum', worker_config).stdout

    def backups():
        return lab_fleet.node_exec(node, 'sh', '-c', 'ls /var/lib/gpustack/ /etc/systemd/system/ | grep "~$" || true').stdout
    backups_before = backups()
    assert lab_fleet.node_exec(node, 'sh', '-c', 'echo "# hand edit" >> ' + watchdog_config).returncode == 0

    # The molecule bad_node scenario's change: a system_reserved GPUStack 0.7.1 refuses at start.
    bad = playbook('site.yml', '-e', '@' + os.path.join(REPO_ROOT, 'molecule', 'bad_node', 'vars', 'bad_change.yml'),
                   '-e', 'bad_node_node=' + node)
    assert bad.returncode == 2, bad.stdout[-4000:] + bad.stderr
    counts = recap(bad.stdout)
    assert {n: c['failed'] for n, c in counts.items()} == {n: int(n == node) for n in NODES}
    flat = re.sub(r'\s+', ' ', bad.stdout + bad.stderr)
    assert 'Restored the previous %s' % worker_config in flat
    assert 'Restarted gpustack: healthy again' in flat
    # The watchdog role ran between the restart and the health check, and its write stays.
    assert bad.stdout.index("TASK [Watchdog | memory-slope watchdog on the node's serving unit]") < bad.stdout.index(
        'TASK [Worker | prove the restarted worker healthy, or roll it back]')
    assert lab_fleet.node_exec(node, 'grep', '-c', 'hand edit', watchdog_config).stdout.strip() == '0'
    assert lab_fleet.node_exec(node, 'sha1sum', worker_config).stdout == before
    assert backups() == backups_before  # the rollback dropped the backups it restored

    again = playbook('site.yml')
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr
    assert {n: c['changed'] for n, c in recap(again.stdout).items()} == {n: 0 for n in NODES}


def test_skipping_a_phase_skips_that_phase_alone(fleet):
    """--skip-tags models still probes, plans and mends the worker; --skip-tags watchdog leaves a
    watchdog's drift alone and still converges the rest (the probe and the plans are tagged
    `always`, gated on kvpin_rollout_phases: tagged with every phase, a skipped phase used to
    skip them too and the run died on a missing fact)."""
    converged = playbook('site.yml')
    assert converged.returncode == 0, converged.stdout + converged.stderr
    worker_config = '/var/lib/gpustack/config.yaml'
    watchdog_config = '/etc/kvpin-watchdog/%s.json' % first_deployment_name('lab-4090x2')
    assert lab_fleet.node_exec('lab-mixed', 'chmod', '0644', worker_config).returncode == 0

    no_models = playbook('site.yml', '--skip-tags', 'models')
    assert no_models.returncode == 0, no_models.stdout[-3000:] + no_models.stderr
    assert 'TASK [Deploy each planned model' not in no_models.stdout
    assert 'lab-mixed: differs: gpustack_worker: %s: mode 0644, wanted 0600' % worker_config in no_models.stdout
    changed = {node: counts['changed'] for node, counts in recap(no_models.stdout).items()}
    assert changed['lab-mixed'] > 0 and {changed[n] for n in NODES if n != 'lab-mixed'} == {0}, changed
    assert lab_fleet.node_exec('lab-mixed', 'stat', '-c', '%a', worker_config).stdout.strip() == '600'

    assert lab_fleet.node_exec('lab-4090x2', 'sh', '-c', 'echo "# hand edit" >> ' + watchdog_config).returncode == 0
    no_watchdog = playbook('site.yml', '--skip-tags', 'watchdog')
    assert no_watchdog.returncode == 0, no_watchdog.stdout[-3000:] + no_watchdog.stderr
    assert 'lab-4090x2: differs: serving_watchdog: %s: content differs' % watchdog_config in no_watchdog.stdout
    assert {node: counts['changed'] for node, counts in recap(no_watchdog.stdout).items()} == {n: 0 for n in NODES}
    assert lab_fleet.node_exec('lab-4090x2', 'grep', '-c', 'hand edit', watchdog_config).stdout.strip() == '1'
    assert re.search(r'^ok: \[lab-4090x2 -> localhost\] => \(item=', no_watchdog.stdout, re.MULTILINE), 'models ran'

    # Skipping what every phase needs is refused with the reason, and nothing changes.
    no_always = playbook('site.yml', '--skip-tags', 'always')
    assert no_always.returncode != 0
    assert "ansible_skip_tags has 'always': every phase needs the steps tagged always" in no_always.stdout
    assert 'Traceback' not in no_always.stdout + no_always.stderr
    assert {node: counts['changed'] for node, counts in recap(no_always.stdout).items()} == {n: 0 for n in NODES}

    mended = playbook('site.yml')
    assert mended.returncode == 0, mended.stdout[-3000:] + mended.stderr
    assert lab_fleet.node_exec('lab-4090x2', 'grep', '-c', 'hand edit', watchdog_config).stdout.strip() == '0'


def test_a_node_without_pynvml_gets_it_and_check_mode_installs_nothing(fleet):
    converged = playbook('site.yml')
    assert converged.returncode == 0, converged.stdout + converged.stderr
    node = 'lab-mixed'
    library = '/var/lib/kvpin/python'

    def kept_copy():
        return lab_fleet.node_exec(node, 'sh', '-c', 'ls %s/nvidia_ml_py-*/pynvml.py' % library).returncode == 0

    def system_pynvml():
        return lab_fleet.node_exec(node, 'python3', '-c', 'import pynvml').returncode == 0
    # The prereq phase kept nvidia-ml-py for gpu_facts alone: the node's own Python is left as it was.
    assert kept_copy() and not system_pynvml()
    rc, probed = module_result(node, 'kvpin.fleet.gpu_facts', 'required=true')
    assert rc == 0 and probed['pynvml_from'] == 'library_dir' and probed['changed'] is False, probed
    removed = lab_fleet.node_exec(node, 'rm', '-rf', library)
    assert removed.returncode == 0, removed.stdout + removed.stderr
    assert not kept_copy()

    # --check: the wheel travels with the probe and is used from a temporary copy, so that node
    # is planned and compared like the other; nothing is kept.
    try:
        checked = playbook('site.yml', '--check', '--diff', '--limit', node + ',lab-4090x2')
        assert checked.returncode == 0, checked.stdout[-3000:] + checked.stderr
        assert '%s: in sync, nothing to change' % node in checked.stdout
        assert 'lab-4090x2: in sync, nothing to change' in checked.stdout
        assert recap(checked.stdout)[node]['changed'] == 1  # the probe that would keep the wheel
        assert not kept_copy() and not system_pynvml()
        # --skip-tags prereq: the node is left as it is and fails at the probe, naming the library.
        skipped = playbook('site.yml', '--skip-tags', 'prereq', '--limit', node)
        assert skipped.returncode != 0
        assert recap(skipped.stdout)[node] == dict(recap(skipped.stdout)[node], failed=1, changed=0)
        assert '"missing_library": "nvidia-ml-py"' in skipped.stdout
        assert not kept_copy()
        # No wheel to send: the node fails at the prereq step, saying where the wheel comes from.
        no_wheel = playbook('site.yml', '--limit', node, '--extra-vars', 'kvpin_wheelhouse_dir=/nonexistent')
        assert no_wheel.returncode != 0
        assert recap(no_wheel.stdout)[node] == dict(recap(no_wheel.stdout)[node], failed=1, changed=0)
        assert 'no nvidia_ml_py-*.whl in /nonexistent: run scripts/bootstrap.sh' in no_wheel.stdout
        assert 'Traceback' not in no_wheel.stdout + no_wheel.stderr
        assert not kept_copy()
    finally:
        if not kept_copy():  # leave the node as the next tests expect it, whatever failed above
            installed = playbook('site.yml', '--limit', node)
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr
    assert kept_copy() and not system_pynvml()
    assert '%s: in sync, nothing to change' % node in installed.stdout
    assert recap(installed.stdout)[node]['changed'] == 1
    again = playbook('site.yml', '--limit', node)
    assert recap(again.stdout)[node]['changed'] == 0


def test_each_node_reports_its_fixture_to_the_byte(fleet):
    for node in NODES:
        fixture = load_fixture(node)
        rc, result = module_result(node, 'kvpin.fleet.gpu_facts', 'required=true')
        assert rc == 0, result
        gpus = result['ansible_facts']['kvpin_gpus']
        assert [g['name'] for g in gpus['gpus']] == [d['name'] for d in fixture['devices']]
        assert [g['memory_total'] for g in gpus['gpus']] == [d['memory_total'] for d in fixture['devices']]
        assert [g['uuid'] for g in gpus['gpus']] == [d['uuid'] for d in fixture['devices']]
        assert gpus['driver_version'] == fixture['driver_version']


def test_swapping_a_card_in_the_fixture_changes_the_facts(swapped_card):
    original, swapped = swapped_card
    rc, result = module_result(SWAP_NODE, 'kvpin.fleet.gpu_facts', 'required=true')
    assert rc == 0, result
    gpus = result['ansible_facts']['kvpin_gpus']['gpus']
    assert [g['name'] for g in gpus] == ['NVIDIA GeForce RTX 4090', 'NVIDIA RTX A6000']
    assert gpus[1]['memory_total'] == swapped['devices'][1]['memory_total'] != original['devices'][1]['memory_total']

    probe = playbook('site.yml', '--tags', 'probe', '--limit', SWAP_NODE)
    assert probe.returncode == 0, probe.stdout + probe.stderr
    assert lab_fleet.expected_summary(SWAP_NODE, swapped) in probe.stdout


def _verify_gpus():
    """The GPU checks of molecule's verifier (the testinfra suite, tests/testinfra), alone: they
    need the lab nodes up, not a converged rollout."""
    return run([os.path.join(lab_fleet.VENV_BIN, 'pytest'), '-p', 'no:cacheprovider', '-rfE',
                os.path.join(REPO_ROOT, 'tests', 'testinfra', 'test_node_rollout.py'),
                '-k', 'test_gpus_are_the_fixtures or test_gpu_topology_is_the_fixtures'])


def test_molecule_verify_fails_when_a_node_disagrees_with_its_fixture(swapped_card):
    proc = _verify_gpus()
    assert proc.returncode != 0
    failed = re.findall(r'^FAILED \S+::(test_\w+)\[([\w.-]+)\]', proc.stdout, re.MULTILINE)
    assert ('test_gpus_are_the_fixtures', SWAP_NODE) in failed, proc.stdout[-4000:]
    assert {node for _test, node in failed} == {SWAP_NODE}, failed
    assert 'NVIDIA RTX A6000' in proc.stdout


def test_molecule_verify_passes_on_the_lab_fixtures(fleet):
    proc = _verify_gpus()
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert re.search(r'\b%d passed' % (2 * len(NODES)), proc.stdout), proc.stdout[-2000:]


def test_a_node_without_a_driver_fails_alone(fleet):
    """required=true on a node whose NVML says 'driver not loaded': that node fails with the
    reason, the other three still report (max_fail_percentage 25 tolerates one of four)."""
    lab('set-fixture', 'lab-mixed', os.path.join(lab_fleet.FIXTURE_DIR, 'no-gpu.json'))
    try:
        rc, result = module_result('lab-mixed', 'kvpin.fleet.gpu_facts', 'required=false')
        assert rc == 0, result
        facts = result['ansible_facts']['kvpin_gpus']
        assert facts['gpus'] == [] and facts['reason']

        proc = playbook('site.yml', '--tags', 'probe')
        counts = recap(proc.stdout)
        assert proc.returncode != 0
        assert counts['lab-mixed']['failed'] == 1
        for node in ('lab-a6000x4', 'lab-4090x4', 'lab-4090x2'):
            assert counts[node]['failed'] == 0
            assert lab_fleet.expected_summary(node, load_fixture(node)) in proc.stdout
    finally:
        lab('set-fixture', 'lab-mixed', os.path.join(lab_fleet.FIXTURE_DIR, 'lab-mixed.json'))


def test_collection_installed_from_its_tarball_runs_the_site_playbook(fleet, tmp_path):
    """ansible-galaxy build + install into an empty path, then the installed copy's playbook
    (kvpin.fleet.site) with only that path on ANSIBLE_COLLECTIONS_PATH."""
    built = lab_fleet.run([os.path.join(lab_fleet.VENV_BIN, 'ansible-galaxy'), 'collection', 'build',
                           '--output-path', str(tmp_path), REPO_ROOT])
    assert built.returncode == 0, built.stdout + built.stderr
    tarball = tmp_path / 'kvpin-fleet-{0}.tar.gz'.format(_galaxy_version())
    installed_root = tmp_path / 'collections'
    # With only the new path configured: otherwise galaxy sees the checkout's .cache link (same
    # version) and installs nothing.
    inst = lab_fleet.run([os.path.join(lab_fleet.VENV_BIN, 'ansible-galaxy'), 'collection', 'install',
                          str(tarball), '-p', str(installed_root)], env=lab_fleet.ansible_env(str(installed_root)))
    assert inst.returncode == 0, inst.stdout + inst.stderr
    assert (installed_root / 'ansible_collections' / 'kvpin' / 'fleet' / 'playbooks' / 'site.yml').is_file()

    # Control: with an empty collections path the playbook does not resolve at all, so the run
    # below can only have used the installed copy (not the checkout's .cache link).
    empty = tmp_path / 'empty'
    empty.mkdir()
    control = playbook('kvpin.fleet.site', '--syntax-check', collections_path=str(empty))
    assert control.returncode != 0

    listed = lab_fleet.run([os.path.join(lab_fleet.VENV_BIN, 'ansible-galaxy'), 'collection', 'list', 'kvpin.fleet'],
                           env=lab_fleet.ansible_env(str(installed_root)))
    assert listed.returncode == 0 and str(installed_root) in listed.stdout, listed.stdout + listed.stderr

    proc = playbook('kvpin.fleet.site', collections_path=str(installed_root))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for node in NODES:
        assert lab_fleet.expected_summary(node, load_fixture(node)) in proc.stdout


def _galaxy_version():
    with open(os.path.join(REPO_ROOT, 'galaxy.yml')) as f:
        for line in f:
            if line.startswith('version:'):
                return line.split(':', 1)[1].strip().strip('"\'')
    raise AssertionError('galaxy.yml has no version')
