# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The gpustack_worker role on the four-node lab fleet (needs root, podman and runc; skipped
otherwise): the token never shows in -vvv output or diffs, the container runtime's unit passes
systemd-analyze verify (and one it rejects is never written), and the molecule scenarios hardware_change and bad_node pass.

The fleet is brought up once for the module (scripts/lab.sh up) and removed afterwards unless
it was already running. The scenarios run with --destroy=never so they leave the fleet to
this module; each of them puts back what it changed (hardware_change's cleanup restores the
NVML fixture). Every node's worker is a real GPUStack 0.7.1 worker under the role's unit
(inventory/lab/group_vars/gpu_nodes/gpustack_worker.yml), registered with the lab's GPUStack
server (scripts/lab.sh); the servers are inside the lab containers, probed on podman's bridge
and the nodes' own loopback.
"""

import base64
import json
import os
import sys
import uuid

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lab_fleet  # noqa: E402
from lab_fleet import REPO_ROOT, VENV_BIN, playbook, recap, run  # noqa: E402

pytestmark = pytest.mark.lab

LAB_VARS = '@' + os.path.join(REPO_ROOT, 'inventory', 'lab', 'group_vars', 'gpu_nodes', 'gpustack_worker.yml')
WORKER_PLAYBOOK = os.path.join(REPO_ROOT, 'playbooks', 'worker.yml')
SITE_PLAYBOOK = os.path.join(REPO_ROOT, 'playbooks', 'site.yml')
# The node whose worker these tests touch directly (a vLLM node whose plan always succeeds).
NODE = 'lab-4090x4'


@pytest.fixture(scope='module')
def fleet(fleet):  # pylint: disable=redefined-outer-name
    """The lab fleet of conftest.py with the site playbook run once on it for this module."""
    site = playbook(SITE_PLAYBOOK)
    assert site.returncode == 0, site.stdout[-4000:] + site.stderr[-2000:]
    return fleet


def _worker(*args):
    return playbook('--extra-vars', LAB_VARS, WORKER_PLAYBOOK, *args)


def _module(node, module, args):
    """(rc, result) of one module run ad hoc on ``node`` through the inventory's connection
    (json callback: the default one prints command results as text)."""
    env = lab_fleet.ansible_env()
    env['ANSIBLE_LOAD_CALLBACK_PLUGINS'] = '1'
    env['ANSIBLE_STDOUT_CALLBACK'] = 'ansible.builtin.json'
    proc = run([os.path.join(VENV_BIN, 'ansible'), '-i', lab_fleet.INVENTORY, node, '-m', module, '-a', args], env=env)
    try:
        return proc.returncode, json.loads(proc.stdout)['plays'][0]['tasks'][0]['hosts'][node]
    except (ValueError, KeyError, IndexError):
        raise AssertionError('unexpected ansible output:\n%s%s' % (proc.stdout, proc.stderr))


def _on(node, command):
    """stdout of ``command`` (argv string) run on ``node``."""
    rc, result = _module(node, 'ansible.builtin.command', command)
    assert rc == 0, result
    return result['stdout']


def _lab_token():
    state = os.path.join(os.environ.get('KVPIN_LAB_DIR') or os.path.join(REPO_ROOT, '.lab'),
                         os.environ.get('KVPIN_LAB_PREFIX', '') + 'gpustack')
    with open(os.path.join(state, 'token')) as handle:
        return handle.read().strip()


def test_token_never_in_vvv_output_diff_or_worker_log(fleet):
    # The real registration token (the real server accepts no other): another RAM reservation
    # changes config.yaml, so the template, the restart, the health check (the worker registered
    # with that token) and the cleanup of the token-bearing backup all run, at -vvv and --diff.
    token = _lab_token()
    assert len(token) >= 16
    changed = _worker('--limit', NODE, '-vvv', '--diff', '--extra-vars', 'gpustack_worker_system_reserved_ram_gib=3')
    output = changed.stdout + changed.stderr
    assert changed.returncode == 0, changed.stdout[-4000:]
    assert recap(changed.stdout)[NODE]['changed'] > 0
    assert token not in output
    # Check mode with yet another token: the would-be diff of config.yaml must not show it either.
    other = 'kvpin-token-%s' % uuid.uuid4().hex
    checked = _worker('--limit', NODE, '-vvv', '--check', '--diff', '--extra-vars', 'gpustack_worker_token=' + other)
    assert checked.returncode == 0, checked.stdout[-4000:]
    assert other not in checked.stdout + checked.stderr
    assert token not in checked.stdout + checked.stderr
    # The worker does not log its token.
    assert token not in _on(NODE, 'journalctl --unit=gpustack --no-pager --output=cat')
    # Put the lab token back.
    restored = _worker('--limit', NODE)
    assert restored.returncode == 0, restored.stdout[-4000:]


def test_environment_reaches_the_worker_exactly_and_only_through_a_0600_file(fleet):
    """gpustack_worker_environment with a secret and a quote-newline injection: the worker
    process (the stand-in, started by the real systemd) sees each value byte for byte, the unit
    holds no value and no injected line, the file is 0600, and -vvv --diff shows no value."""
    secret = 'hf_%s' % uuid.uuid4().hex
    injection = 'x"\nExecStartPre=/bin/touch /tmp/kvpin-pwned\n"'
    environment = {'HF_TOKEN': secret, 'INJECTED': injection, 'PERCENT': '%n 100%', 'DOLLAR': '$HOME `id` \\'}
    changed = _worker('--limit', NODE, '-vvv', '--diff', '--extra-vars',
                      json.dumps({'gpustack_worker_environment': environment}))
    output = changed.stdout + changed.stderr
    try:
        assert changed.returncode == 0, changed.stdout[-4000:]
        assert secret not in output and 'kvpin-pwned' not in output
        unit = _on(NODE, 'cat /etc/systemd/system/gpustack.service')
        assert secret not in unit and 'kvpin-pwned' not in unit
        assert 'EnvironmentFile=/var/lib/gpustack/worker.env' in unit
        assert _on(NODE, 'stat -c %a:%U /var/lib/gpustack/worker.env') == '600:root'
        pid = _on(NODE, 'systemctl show --value --property=MainPID gpustack')
        rc, environ = _module(NODE, 'ansible.builtin.slurp', 'src=/proc/%s/environ' % pid)
        assert rc == 0, environ
        seen = dict(entry.split('=', 1) for entry in
                    base64.b64decode(environ['content']).decode('utf-8').split('\0') if '=' in entry)
        for name, value in environment.items():
            assert seen.get(name) == value, name
        rc, _pwned = _module(NODE, 'ansible.builtin.stat', 'path=/tmp/kvpin-pwned')
        assert not _pwned['stat']['exists']
    finally:
        restored = _worker('--limit', NODE)
        assert restored.returncode == 0, restored.stdout[-4000:]


def test_engine_compile_caches_persist_and_reach_the_worker_environment(fleet):
    """gpustack_worker_compile_cache_dir (default the cache dir): the engines' compile-cache
    directories exist (root, 0700) and the running worker's environment, which GPUStack 0.7.1
    copies into every engine it starts (get_inference_running_env), points there, so a recycled
    engine instance finds its compile cache warm."""
    expected = {'VLLM_CACHE_ROOT': '/var/lib/gpustack/cache/vllm',
                'TORCHINDUCTOR_CACHE_DIR': '/var/lib/gpustack/cache/inductor',
                'TRITON_CACHE_DIR': '/var/lib/gpustack/cache/triton'}
    for path in expected.values():
        assert _on(NODE, 'stat -c %a:%U:%F ' + path) == '700:root:directory'
    pid = _on(NODE, 'systemctl show --value --property=MainPID gpustack')
    rc, environ = _module(NODE, 'ansible.builtin.slurp', 'src=/proc/%s/environ' % pid)
    assert rc == 0, environ
    seen = dict(entry.split('=', 1) for entry in
                base64.b64decode(environ['content']).decode('utf-8').split('\0') if '=' in entry)
    assert {name: seen.get(name) for name in expected} == expected


# What the role's preflight reads on a podman node (the edge of the test: the lab node has no
# container engine and no GPU): a podman that answers `version --format {{.Client.Version}}`
# with a release GPUStack's podman deployer supports (>= 4.9), and a CDI spec declaring
# nvidia.com/gpu=all, as nvidia-ctk writes it.
FAKE_PODMAN = """#!/bin/sh
[ "$1" = version ] && { echo 5.0.3; exit 0; }
echo "fake podman (integration test): $*" >&2
exit 1
"""
NVIDIA_CDI_SPEC = """cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
  - name: all
    containerEdits:
      deviceNodes: [{path: /dev/nvidia0}]
"""


def test_container_runtime_unit_passes_systemd_analyze_verify(fleet, tmp_path):
    # No container engine in the lab: the 2.x unit is rendered (and verified by the role itself)
    # but not started. verify needs ExecStart's binary and the engine unit it Requires= to
    # exist: a podman for the preflight (FAKE_PODMAN) and the host's podman.socket unit are copied
    # into the node, with a CDI spec for the GPUs.
    node = 'lab-a6000x4'
    (tmp_path / 'podman').write_text(FAKE_PODMAN)
    (tmp_path / 'nvidia.yaml').write_text(NVIDIA_CDI_SPEC)
    _on(node, 'mkdir -p /etc/cdi')
    copies = ((str(tmp_path / 'podman'), '/usr/local/bin/podman', '0755'),
              (str(tmp_path / 'nvidia.yaml'), '/etc/cdi/nvidia.yaml', '0644'),
              ('/usr/lib/systemd/system/podman.socket', '/etc/systemd/system/podman.socket', '0644'))
    for src, dummy_dest, dummy_mode in copies:
        if not os.path.exists(src):
            pytest.skip('%s missing on the host' % src)
    container_vars = json.dumps({
        'gpustack_worker_runtime': 'container', 'gpustack_worker_container_engine': 'podman',
        'gpustack_worker_container_engine_executable': '/usr/local/bin/podman',
        'gpustack_worker_service_started': False, 'gpustack_worker_service_enabled': False})
    config_before = _on(node, 'sha1sum /var/lib/gpustack/config.yaml')
    rc, native_before = _module(node, 'ansible.builtin.systemd_service', 'name=gpustack')
    assert rc == 0, native_before
    try:
        for src, dest, mode in copies[:2]:
            rc, result = _module(node, 'ansible.builtin.copy', 'src=%s dest=%s mode=%s' % (src, dest, mode))
            assert rc == 0, result
        # Without the podman.socket it Requires=, systemd-analyze verify rejects the new unit in
        # the configure call: the node fails there with nothing written, its worker untouched.
        rejected = _worker('--limit', node, '--extra-vars', container_vars)
        assert rejected.returncode != 0
        assert recap(rejected.stdout)[node]['failed'] == 1
        assert 'systemd-analyze verify: ' in rejected.stdout and 'podman.socket' in rejected.stdout
        assert 'nothing written' in rejected.stdout
        rc, unit_stat = _module(node, 'ansible.builtin.stat', 'path=/etc/systemd/system/gpustack-worker.service')
        assert rc == 0 and unit_stat['stat']['exists'] is False, unit_stat
        assert _on(node, 'sha1sum /var/lib/gpustack/config.yaml') == config_before
        rc, native = _module(node, 'ansible.builtin.systemd_service', 'name=gpustack')
        assert rc == 0 and native_before['status']['UnitFileState'] == native['status']['UnitFileState'] == 'enabled'
        assert native['status']['MainPID'] == native_before['status']['MainPID'] != '0', native['status']

        src, dest, mode = copies[2]
        rc, result = _module(node, 'ansible.builtin.copy', 'src=%s dest=%s mode=%s' % (src, dest, mode))
        assert rc == 0, result
        proc = _worker('--limit', node, '--extra-vars', container_vars)
        assert proc.returncode == 0, proc.stdout[-4000:]
        rc, verify = _module(node, 'ansible.builtin.command',
                                   'systemd-analyze verify /etc/systemd/system/gpustack-worker.service')
        assert rc == 0, verify
        assert 'gpustack-worker.service' not in verify['stderr'], verify['stderr']
        unit = _on(node, 'cat /etc/systemd/system/gpustack-worker.service')
        for line in ('Requires=podman.socket', '--network=host', '--name gpustack-worker',
                     '-e GPUSTACK_RUNTIME_DEPLOY_MIRRORED_NAME=gpustack-worker',
                     '--volume /run/podman/podman.sock:/run/podman/podman.sock',
                     '--config-file=/var/lib/gpustack/config.yaml', 'gpustack/gpustack:v2.3.0',
                     '--device nvidia.com/gpu=all',
                     'ExecStartPre=-/usr/local/bin/podman rm -f gpustack-worker',
                     'ExecStop=/usr/local/bin/podman stop -t 30 gpustack-worker', 'LimitNOFILE=65535'):
            assert line in unit, line
        config = _on(node, 'cat /var/lib/gpustack/config.yaml')
        assert 'worker_metrics_port: 10151' in config and '\nmetrics_port' not in config
        # One worker per node: the native one was stopped for the container one.
        rc, native = _module(node, 'ansible.builtin.systemd_service', 'name=gpustack')
        assert rc == 0 and native['status']['UnitFileState'] == 'disabled', native['status']['UnitFileState']
        # Stopped: GPUStack 0.7.1's worker ends a stop with a non-zero status, which systemd
        # records as 'failed'; either way no process of it is left.
        assert native['status']['ActiveState'] in ('inactive', 'failed'), native['status']['ActiveState']
        assert native['status']['MainPID'] == '0', native['status']['MainPID']
    finally:
        _on(node, 'rm -f /etc/systemd/system/gpustack-worker.service /usr/local/bin/podman '
                  '/etc/systemd/system/podman.socket /etc/cdi/nvidia.yaml')
        back = _worker('--limit', node)
        assert back.returncode == 0, back.stdout[-4000:]


def _molecule(scenario):
    env = lab_fleet.ansible_env()
    proc = run([os.path.join(VENV_BIN, 'molecule'), 'test', '-s', scenario, '--destroy=never'], env=env, timeout=1800)
    assert proc.returncode == 0, '%s\n%s' % (proc.stdout[-6000:], proc.stderr[-6000:])
    return proc


def test_molecule_hardware_change(fleet):
    _molecule('hardware_change')


def test_molecule_bad_node(fleet):
    _molecule('bad_node')
