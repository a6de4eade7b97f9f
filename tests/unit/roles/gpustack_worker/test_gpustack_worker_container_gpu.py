# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Role gpustack_worker, container runtime (issue 18): the unit hands the NVIDIA GPUs to the
worker container as GPUStack 2.3's own command does (docker ``--runtime nvidia``, podman CDI
``--device nvidia.com/gpu=all``), and install_container.yml fails before anything changes,
naming what is missing, on a node without docker's NVIDIA runtime, without a CDI spec or with
podman < 4.9. Real ansible-playbook on localhost; the engines are fake executables written into
tmp_path (the edge: they answer ``docker info`` / ``podman version`` as a node's would and log
their argv); the CDI spec directories are tmp_path directories. Nothing outside tmp_path is written."""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import pytest
from role_plays import desired_state_play

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
PLAYBOOK = os.path.join(os.path.dirname(sys.executable), 'ansible-playbook')
TOKEN = 'gpustack-token-containergpu-9012'
BASE = {
    'gpustack_worker_server_url': 'http://127.0.0.1:30080',
    'gpustack_worker_token': TOKEN,
    'gpustack_worker_plans': [{'system_reserved_bytes': 3 * 2 ** 30 + 1}],
}
NVIDIA_CDI_SPEC = """cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
  - name: "0"
    containerEdits:
      deviceNodes: [{path: /dev/nvidia0}]
  - name: all
    containerEdits:
      deviceNodes: [{path: /dev/nvidia0}]
containerEdits:
  deviceNodes: [{path: /dev/nvidiactl}]
"""


def _env():
    return dict(os.environ, ANSIBLE_NOCOLOR='1', ANSIBLE_PYTHON_INTERPRETER=sys.executable,
                ANSIBLE_CONFIG=os.path.join(ROOT, 'ansible.cfg'))


def _play(tmp_path, play_text, extra_vars):
    if not os.path.exists(PLAYBOOK):
        pytest.skip('ansible-playbook not beside sys.executable (the controller venv)')
    tmp_path.mkdir(parents=True, exist_ok=True)
    play = tmp_path / 'play.yml'
    play.write_text(play_text)
    extra = tmp_path / 'extra.json'
    extra.write_text(json.dumps(dict(BASE, **extra_vars)))
    proc = subprocess.run([PLAYBOOK, '-i', 'localhost,', '-c', 'local', '-e', '@%s' % extra, str(play)],
                          cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300, check=False)
    assert TOKEN not in proc.stdout + proc.stderr
    return proc


# ---- the rendered unit -------------------------------------------------------------------

def unit_text(tmp_path, **extra_vars):
    templates = tmp_path / 'templates'
    tmp_path.mkdir(parents=True, exist_ok=True)
    templates.symlink_to(os.path.join(ROOT, 'roles', 'gpustack_worker', 'templates'))
    proc = _play(tmp_path, desired_state_play('kvpin.fleet.gpustack_worker', tmp_path,
                                              '_gpustack_worker_unit_content', 'unit', public=True), extra_vars)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return (tmp_path / 'unit').read_text()


def exec_start(unit):
    """The argv of ExecStart= (continuation lines joined, as systemd reads them)."""
    lines = unit.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith('ExecStart='))
    text = ''
    for line in lines[start:]:
        text += line.rstrip('\\').strip() + ' '
        if not line.endswith('\\'):
            break
    return shlex.split(text[len('ExecStart='):])


COMMON_TAIL = ['-e', 'GPUSTACK_RUNTIME_DEPLOY_MIRRORED_NAME=gpustack-worker',
               '-e', 'TORCHINDUCTOR_CACHE_DIR', '-e', 'TRITON_CACHE_DIR', '-e', 'VLLM_CACHE_ROOT']
VOLUMES = ['--volume', '/var/lib/gpustack:/var/lib/gpustack', '--volume', '/var/lib/gpustack/cache:/var/lib/gpustack/cache',
           '--volume', '/var/lib/gpustack/log:/var/lib/gpustack/log']


def test_docker_unit_passes_the_nvidia_runtime_like_gpustack(tmp_path):
    argv = exec_start(unit_text(tmp_path))
    assert argv == (['/usr/bin/docker', 'run', '--rm', '--name', 'gpustack-worker', '--network=host', '--privileged',
                     '--runtime', 'nvidia'] + COMMON_TAIL
                    + ['--volume', '/var/run/docker.sock:/var/run/docker.sock'] + VOLUMES
                    + ['gpustack/gpustack:v2.3.0', '--config-file=/var/lib/gpustack/config.yaml'])
    assert 'nvidia.com/gpu' not in ' '.join(argv)


def test_podman_unit_passes_the_cdi_device(tmp_path):
    argv = exec_start(unit_text(tmp_path, gpustack_worker_container_engine='podman'))
    assert argv == (['/usr/bin/podman', 'run', '--rm', '--name', 'gpustack-worker', '--network=host', '--privileged',
                     '--device', 'nvidia.com/gpu=all'] + COMMON_TAIL
                    + ['--volume', '/run/podman/podman.sock:/run/podman/podman.sock'] + VOLUMES
                    + ['gpustack/gpustack:v2.3.0', '--config-file=/var/lib/gpustack/config.yaml'])
    assert '--runtime' not in argv


def test_gpus_are_passed_without_privileged_too(tmp_path):
    argv = exec_start(unit_text(tmp_path, gpustack_worker_container_privileged=False))
    assert '--privileged' not in argv
    assert argv[argv.index('--runtime') + 1] == 'nvidia'


# ---- the preflight -----------------------------------------------------------------------

PREFLIGHT_PLAY = """- hosts: localhost
  gather_facts: false
  tasks:
    - name: Install (container runtime), the role's own tasks
      ansible.builtin.include_role:
        name: kvpin.fleet.gpustack_worker
        tasks_from: install_container.yml
"""


def fake_engine(tmp_path, name, stdout, rc=0):
    """An executable that prints ``stdout`` and exits ``rc`` for any argv, logging each argv."""
    path = tmp_path / 'bin' / name
    path.parent.mkdir(parents=True, exist_ok=True)
    log = tmp_path / ('%s.argv' % name)
    path.write_text('#!/bin/sh\nprintf "%%s\\n" "$*" >> %s\ncat <<"EOF"\n%s\nEOF\nexit %d\n'
                    % (shlex.quote(str(log)), stdout, rc))
    path.chmod(0o755)
    return path, log


def preflight(tmp_path, engine, stdout, rc=0, specs=None):
    """(proc, argv log lines) of install_container.yml with a fake engine and CDI dirs in tmp_path."""
    executable, log = fake_engine(tmp_path, engine, stdout, rc)
    dirs = [tmp_path / 'etc-cdi', tmp_path / 'run-cdi']
    dirs[0].mkdir()
    for name, text in (specs or {}).items():
        (dirs[0] / name).write_text(text)
    proc = _play(tmp_path, PREFLIGHT_PLAY, {
        'gpustack_worker_container_engine': engine,
        'gpustack_worker_container_engine_executable': str(executable),
        '_gpustack_worker_cdi_spec_dirs': [str(d) for d in dirs]})
    return proc, log.read_text().splitlines() if log.exists() else []


def _failure(proc):
    assert proc.returncode != 0, proc.stdout[-3000:]
    return proc.stdout + proc.stderr


def test_docker_with_the_nvidia_runtime_passes_asking_only_docker_info(tmp_path):
    proc, calls = preflight(tmp_path, 'docker', json.dumps({'nvidia': {'path': 'nvidia-container-runtime'},
                                                            'runc': {'path': 'runc'}}))
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert calls == ['info --format {{json .Runtimes}}']


def test_docker_without_the_nvidia_runtime_fails_naming_it(tmp_path):
    proc, _calls = preflight(tmp_path, 'docker', json.dumps({'runc': {}, 'io.containerd.runc.v2': {}}))
    out = _failure(proc)
    assert "docker has no 'nvidia' runtime (docker info lists: io.containerd.runc.v2, runc)" in out
    assert 'Nothing was changed' in out


def test_docker_daemon_down_fails_saying_it_cannot_tell(tmp_path):
    proc, _calls = preflight(tmp_path, 'docker', 'Cannot connect to the Docker daemon', rc=1)
    assert 'docker info did not list the runtimes (is dockerd running?)' in _failure(proc)


def test_podman_with_a_cdi_spec_passes(tmp_path):
    proc, calls = preflight(tmp_path, 'podman', '4.9.3', specs={'nvidia.yaml': NVIDIA_CDI_SPEC})
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert calls == ['version --format {{.Client.Version}}']


def test_podman_without_a_cdi_spec_fails_naming_the_device_and_dirs(tmp_path):
    proc, _calls = preflight(tmp_path, 'podman', '5.0.2', specs={'other.yaml': 'kind: vendor.example/fpga\n'})
    out = _failure(proc)
    assert 'no CDI spec declares the device nvidia.com/gpu=all' in out
    assert str(tmp_path / 'etc-cdi') in out and str(tmp_path / 'etc-cdi' / 'other.yaml') in out


def test_podman_too_old_fails_naming_the_versions(tmp_path):
    proc, _calls = preflight(tmp_path, 'podman', '4.3.1', specs={'nvidia.yaml': NVIDIA_CDI_SPEC})
    out = _failure(proc)
    assert "podman is 4.3.1: GPUStack's podman deployer needs 4.9.0 or later" in out
    assert 'no CDI spec' not in out


def test_a_cdi_spec_that_is_not_yaml_counts_as_none(tmp_path):
    proc, _calls = preflight(tmp_path, 'podman', '5.0.2', specs={'nvidia.yaml': 'kind: [unclosed\n\x00'})
    assert 'no CDI spec declares the device nvidia.com/gpu=all' in _failure(proc)
