# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The TEST-ONLY stand-in worker (roles/gpustack_worker/files/kvpin-worker-standin.py): it
must read what the role writes, refuse what GPUStack refuses, never log the token, and serve
/healthz. Servers here listen on 127.0.0.1 only."""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STANDIN = os.path.join(ROOT, 'roles', 'gpustack_worker', 'files', 'kvpin-worker-standin.py')
TOKEN = 'gpustack_0123456789abcdef_SECRETSECRETSECRETSECRETSECRET12'

_spec = importlib.util.spec_from_file_location('kvpin_worker_standin', STANDIN)
standin = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(standin)


def _config(**overrides):
    config = {
        'server_url': 'http://127.0.0.1:30080',
        'token': TOKEN,
        'worker_name': 'lab-4090x2',
        'worker_port': 10150,
        'worker_metrics_port': 10151,
        'data_dir': '/var/lib/gpustack',
        'cache_dir': '/var/lib/gpustack/cache',
        'log_dir': '/var/lib/gpustack/log',
        'system_reserved': {'ram': 2, 'vram': 3},
    }
    config.update(overrides)
    return config


def _as_role_writes_it(config):
    # The role renders config.yaml with to_nice_yaml(indent=2, sort_keys=true) under a comment header.
    return '#\n# Ansible managed\n#\n# a comment\n' + yaml.safe_dump(
        config, indent=2, sort_keys=True, default_flow_style=False)


@pytest.mark.parametrize('config', [
    _config(),
    _config(worker_ip='127.0.0.1', service_port_range='40000-40063', debug=False),
    _config(extra={'nested': {'deeper': 'x: y', 'empty': {}}, 'items': ['a', 'b c', 3]}, ratio=0.5,
            empty_list=[], quoted="it's", nothing=None, number_string='10150'),
])
def test_parses_what_the_role_writes_like_yaml_does(config):
    text = _as_role_writes_it(config)
    assert standin.parse_config(text) == yaml.safe_load(text)


@pytest.mark.parametrize('change, message', [
    ({'server_url': '127.0.0.1:30080'}, 'server_url'),
    ({'token': ''}, 'Token is required'),
    ({'worker_port': 70000}, 'worker_port'),
    ({'worker_port': 'abc'}, 'worker_port'),
    ({'system_reserved': {'ram': 2, 'vram': -1}}, 'system_reserved.vram'),
    ({'system_reserved': {'ram': 1.5, 'vram': 1}}, 'system_reserved.ram'),
])
def test_rejects_what_a_worker_rejects(change, message):
    with pytest.raises(standin.ConfigError, match=message):
        standin.validate(_config(**change))


def test_redacts_the_token():
    assert TOKEN not in repr(standin.redacted(_config()))
    assert standin.redacted(_config())['worker_name'] == 'lab-4090x2'


def _free_port():
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


def _run(tmp_path, config):
    path = tmp_path / 'config.yaml'
    path.write_text(_as_role_writes_it(config))
    return subprocess.Popen([sys.executable, STANDIN, 'start', '--config-file', str(path)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_invalid_config_exits_non_zero_without_the_token(tmp_path):
    proc = _run(tmp_path, _config(system_reserved={'ram': 2, 'vram': -1}))
    output, dummy = proc.communicate(timeout=30)
    assert proc.returncode == standin.EXIT_BAD_CONFIG
    assert 'system_reserved.vram' in output
    assert TOKEN not in output


def test_serves_healthz_on_the_worker_port_and_logs_without_the_token(tmp_path):
    port = _free_port()
    proc = _run(tmp_path, _config(worker_ip='127.0.0.1', worker_port=port))
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen('http://127.0.0.1:%d/healthz' % port, timeout=2) as resp:
                    assert resp.status == 200
                    break
            except (urllib.error.URLError, ConnectionError):
                assert proc.poll() is None, proc.stdout.read()
                assert time.monotonic() < deadline, 'no /healthz within 20 s'
                time.sleep(0.2)
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen('http://127.0.0.1:%d/v1/models' % port, timeout=2)
        assert missing.value.code == 404
    finally:
        proc.terminate()
        output, dummy = proc.communicate(timeout=10)
    assert 'TEST-ONLY' in output and '"token": "********"' in output
    assert TOKEN not in output
