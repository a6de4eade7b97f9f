# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Role gpustack_worker, tasks_from desired_state.yml: what the rerun check compares with a node,
for each runtime (real ansible-playbook, local connection; nothing outside tmp_path is written).
The lab converges only the native runtime without install (GPUStack mounted read-only), so the
container and pip-install variants are pinned here."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from role_plays import desired_state_play

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
PLAYBOOK = os.path.join(os.path.dirname(sys.executable), 'ansible-playbook')
TOKEN = 'gpustack-token-verysecret-1234'


BASE = {
    'gpustack_worker_server_url': 'http://127.0.0.1:30080',
    'gpustack_worker_token': TOKEN,
    'gpustack_worker_plans': [{'system_reserved_bytes': 3 * 2 ** 30 + 1}],
}


def desired_state(tmp_path, **extra_vars):
    if not os.path.exists(PLAYBOOK):
        pytest.skip('ansible-playbook not beside sys.executable (the controller venv)')
    tmp_path.mkdir(parents=True, exist_ok=True)
    play = tmp_path / 'play.yml'
    play.write_text(desired_state_play('kvpin.fleet.gpustack_worker', tmp_path, 'gpustack_worker_desired_state | to_json'))
    extra = tmp_path / 'extra.json'
    extra.write_text(json.dumps(dict(BASE, **extra_vars)))
    env = dict(os.environ, ANSIBLE_NOCOLOR='1', ANSIBLE_PYTHON_INTERPRETER=sys.executable,
               ANSIBLE_CONFIG=os.path.join(ROOT, 'ansible.cfg'))
    proc = subprocess.run([PLAYBOOK, '-vvv', '-i', 'localhost,', '-c', 'local', '-e', '@%s' % extra, str(play)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # The config holds the token: only its sha1 may leave the role.
    assert TOKEN not in proc.stdout + proc.stderr
    return json.loads((tmp_path / 'desired.json').read_text())


def test_container_runtime(tmp_path):
    desired = desired_state(tmp_path)
    files = {spec['path']: spec for spec in desired['files']}
    assert [p for p, spec in files.items() if spec.get('state') == 'directory'] == [
        '/var/lib/gpustack', '/var/lib/gpustack/cache', '/var/lib/gpustack/log',
        # the engines' compile caches (gpustack_worker_compile_cache_dir)
        '/var/lib/gpustack/cache/vllm', '/var/lib/gpustack/cache/inductor', '/var/lib/gpustack/cache/triton']
    config = files['/var/lib/gpustack/config.yaml']
    assert (config['mode'], config['owner']) == ('0600', 'root') and len(config['sha1']) == 40
    assert files['/etc/systemd/system/gpustack-worker.service']['mode'] == '0644'
    assert desired['units'] == [{'name': 'gpustack-worker.service', 'enabled': True, 'active': True},
                                {'name': 'gpustack.service', 'enabled': False, 'active': False}]
    assert desired['http'] == [{'url': 'http://127.0.0.1:10150/healthz', 'status': 200, 'timeout': 5}]
    assert desired['python_packages'] == []


def test_config_hash_follows_the_plans_and_the_token(tmp_path):
    first = desired_state(tmp_path / 'a', gpustack_worker_runtime='native')
    more_vram = desired_state(tmp_path / 'b', gpustack_worker_runtime='native',
                              gpustack_worker_plans=[{'system_reserved_bytes': 5 * 2 ** 30}])
    other_token = desired_state(tmp_path / 'c', gpustack_worker_runtime='native', gpustack_worker_token=TOKEN + 'x')

    def config_sha1(desired):
        return next(s['sha1'] for s in desired['files'] if s['path'].endswith('config.yaml'))
    assert len({config_sha1(first), config_sha1(more_vram), config_sha1(other_token)}) == 3


def test_native_pip_install_checks_the_pinned_packages(tmp_path):
    desired = desired_state(tmp_path, gpustack_worker_runtime='native',
                            gpustack_worker_native_extra_packages=['cachetools', 'uvloop==0.21.0'])
    assert desired['python_packages'] == [
        {'python': '/opt/gpustack/venv/bin/python', 'name': 'gpustack', 'version': '0.7.1'},
        {'python': '/opt/gpustack/venv/bin/python', 'name': 'cachetools', 'version': None},
        {'python': '/opt/gpustack/venv/bin/python', 'name': 'uvloop', 'version': '0.21.0'}]
    assert desired['units'][0]['name'] == 'gpustack.service'
    assert desired['units'][1] == {'name': 'gpustack-worker.service', 'enabled': False, 'active': False}


def test_native_without_install_checks_no_packages_and_no_executable(tmp_path):
    # The lab: GPUStack mounted read-only at the venv path, not installed by the role. The
    # executable is not a managed file (it may be a symlink); a missing one shows as a dead unit.
    desired = desired_state(tmp_path, gpustack_worker_runtime='native', gpustack_worker_native_install=False)
    paths = sorted(spec['path'] for spec in desired['files'])
    assert paths == ['/etc/systemd/system/gpustack.service', '/var/lib/gpustack', '/var/lib/gpustack/cache',
                     '/var/lib/gpustack/cache/inductor', '/var/lib/gpustack/cache/triton',
                     '/var/lib/gpustack/cache/vllm', '/var/lib/gpustack/config.yaml', '/var/lib/gpustack/log',
                     '/var/lib/gpustack/worker.env']
    assert desired['python_packages'] == []
    assert desired['units'][0]['name'] == 'gpustack.service'


def test_a_range_in_the_extra_packages_is_refused_naming_it(tmp_path):
    with pytest.raises(AssertionError, match="'uvloop>=0.21' is neither a bare name nor an exact pin"):
        desired_state(tmp_path, gpustack_worker_runtime='native', gpustack_worker_native_extra_packages=['uvloop>=0.21'])
