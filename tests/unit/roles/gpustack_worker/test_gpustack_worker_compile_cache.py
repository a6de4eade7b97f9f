# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Role gpustack_worker keeps the engines' compile caches on the node (issue 13, item 4): the
directories it creates (owner, mode), the worker environment and units that point the engines
there, for both runtimes, and the refusal of a root the role cannot use, naming the variable.
Real ansible-playbook on localhost (tasks_from desired_state.yml, role vars made public);
nothing outside tmp_path is written."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from role_plays import desired_state_play

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
PLAYBOOK = os.path.join(os.path.dirname(sys.executable), 'ansible-playbook')
TOKEN = 'gpustack-token-compilecache-5678'

KEEP = ("{'desired': gpustack_worker_desired_state, 'env': _gpustack_worker_env_content, "
        "'unit': _gpustack_worker_unit_content, 'rows': _gpustack_worker_dir_files} | to_json")

BASE = {
    'gpustack_worker_server_url': 'http://127.0.0.1:30080',
    'gpustack_worker_token': TOKEN,
    'gpustack_worker_plans': [{'system_reserved_bytes': 3 * 2 ** 30 + 1}],
}
ENV_NAMES = ('VLLM_CACHE_ROOT', 'TORCHINDUCTOR_CACHE_DIR', 'TRITON_CACHE_DIR')


def run_play(tmp_path, **extra_vars):
    if not os.path.exists(PLAYBOOK):
        pytest.skip('ansible-playbook not beside sys.executable (the controller venv)')
    tmp_path.mkdir(parents=True, exist_ok=True)
    play = tmp_path / 'play.yml'
    play.write_text(desired_state_play('kvpin.fleet.gpustack_worker', tmp_path, KEEP, 'rendered.json', public=True))
    # The role's contents are rendered lazily (template lookups); outside the role the lookup
    # searches the play's templates/ directory: the role's own, linked.
    templates = tmp_path / 'templates'
    if not templates.exists():
        templates.symlink_to(os.path.join(ROOT, 'roles', 'gpustack_worker', 'templates'))
    extra = tmp_path / 'extra.json'
    extra.write_text(json.dumps(dict(BASE, **extra_vars)))
    env = dict(os.environ, ANSIBLE_NOCOLOR='1', ANSIBLE_PYTHON_INTERPRETER=sys.executable,
               ANSIBLE_CONFIG=os.path.join(ROOT, 'ansible.cfg'))
    return subprocess.run([PLAYBOOK, '-i', 'localhost,', '-c', 'local', '-e', '@%s' % extra, str(play)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)


def rendered(tmp_path, **extra_vars):
    proc = run_play(tmp_path, **extra_vars)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((tmp_path / 'rendered.json').read_text())


def env_file(text):
    """NAME -> value of an EnvironmentFile body (the role quotes every value in double quotes)."""
    values = {}
    for line in text.splitlines():
        if line and not line.startswith('#'):
            name, _equals, quoted = line.partition('=')
            assert quoted.startswith('"') and quoted.endswith('"'), line
            values[name] = quoted[1:-1]
    return values


def test_container_runtime_exports_mounts_and_creates_the_cache(tmp_path):
    out = rendered(tmp_path)
    env = env_file(out['env'])
    assert {name: env[name] for name in ENV_NAMES} == {
        'VLLM_CACHE_ROOT': '/var/lib/gpustack/cache/vllm',
        'TORCHINDUCTOR_CACHE_DIR': '/var/lib/gpustack/cache/inductor',
        'TRITON_CACHE_DIR': '/var/lib/gpustack/cache/triton'}
    unit = out['unit']
    # names only in the unit; the worker container passes them on, GPUStack mirrors them and the
    # bind mount of the root onto the engine containers
    for name in ENV_NAMES:
        assert '    -e %s \\\n' % name in unit
    assert '--volume /var/lib/gpustack/cache:/var/lib/gpustack/cache' in unit
    dirs = {row['path']: row for row in out['desired']['files'] if row.get('state') == 'directory'}
    assert list(dirs) == ['/var/lib/gpustack', '/var/lib/gpustack/cache', '/var/lib/gpustack/log',
                          '/var/lib/gpustack/cache/vllm', '/var/lib/gpustack/cache/inductor',
                          '/var/lib/gpustack/cache/triton']
    for sub in ('vllm', 'inductor', 'triton'):
        row = dirs['/var/lib/gpustack/cache/' + sub]
        assert (row['owner'], row['group'], row['mode']) == ('root', 'root', '0700')
    assert dirs['/var/lib/gpustack/cache']['mode'] == '0750'
    # GPUStack 2.x chmods its data directory to 0711 at every start: the role wants that mode
    assert dirs['/var/lib/gpustack']['mode'] == '0711'


def test_native_runtime_own_root_is_writable_and_exported(tmp_path):
    out = rendered(tmp_path, gpustack_worker_runtime='native',
                   gpustack_worker_compile_cache_dir='/srv/kvpin/compile-cache')
    env = env_file(out['env'])
    assert env['VLLM_CACHE_ROOT'] == '/srv/kvpin/compile-cache/vllm'
    assert env['TORCHINDUCTOR_CACHE_DIR'] == '/srv/kvpin/compile-cache/inductor'
    assert env['TRITON_CACHE_DIR'] == '/srv/kvpin/compile-cache/triton'
    # ProtectSystem=strict: the engines (children of the worker) may write only listed paths
    assert 'ReadWritePaths=-/srv/kvpin/compile-cache\n' in out['unit']
    assert 'EnvironmentFile=/var/lib/gpustack/worker.env' in out['unit']
    rows = {row['path']: row for row in out['rows']}
    assert rows['/srv/kvpin/compile-cache']['mode'] == '0750'
    # the native 0.7.x worker leaves its data directory alone: it stays 0750
    assert rows['/var/lib/gpustack']['mode'] == '0750'
    assert [rows['/srv/kvpin/compile-cache/' + s]['mode'] for s in ('vllm', 'inductor', 'triton')] == ['0700'] * 3
    files = {row['path']: row for row in out['desired']['files']}
    assert files['/var/lib/gpustack/worker.env']['mode'] == '0600'


def test_the_users_environment_wins_and_secrets_stay_out_of_the_unit(tmp_path):
    out = rendered(tmp_path, gpustack_worker_environment={'TRITON_CACHE_DIR': '/data/triton', 'HF_TOKEN': TOKEN})
    env = env_file(out['env'])
    assert env['TRITON_CACHE_DIR'] == '/data/triton'
    assert env['VLLM_CACHE_ROOT'] == '/var/lib/gpustack/cache/vllm'
    assert TOKEN not in out['unit'] and '-e HF_TOKEN' in out['unit']


def test_the_cache_moves_the_env_file_hash(tmp_path):
    default = rendered(tmp_path / 'a')
    moved = rendered(tmp_path / 'b', gpustack_worker_compile_cache_dir='/srv/cc')
    sha = {name: {row['path']: row.get('sha1') for row in out['desired']['files']}
           for name, out in (('a', default), ('b', moved))}
    assert sha['a']['/var/lib/gpustack/worker.env'] != sha['b']['/var/lib/gpustack/worker.env']


@pytest.mark.parametrize('root, why', [
    ('var/lib/gpustack/cache', 'is relative'),
    ('/var/lib/gpustack/cache\nExecStartPre=/bin/false', 'control character'),
    ('/', "'/' is the root of the filesystem"),
    ('/tmp/cc', 'under /tmp'),
    ('/srv/my cache', 'would split or expand'),
    ('/srv/cc/../etc', 'not normalised'),
    ('', 'must not be empty'),
])
def test_a_root_the_role_cannot_use_is_refused_naming_the_variable(tmp_path, root, why):
    proc = run_play(tmp_path, gpustack_worker_compile_cache_dir=root)
    assert proc.returncode != 0
    output = proc.stdout + proc.stderr
    assert 'gpustack_worker_compile_cache_dir' in output and why in output, output[-2000:]
    assert TOKEN not in output
    assert not (tmp_path / 'rendered.json').exists()
