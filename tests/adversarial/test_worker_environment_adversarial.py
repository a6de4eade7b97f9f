# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Role gpustack_worker, gpustack_worker_environment (issue 11, item 5): a value with a quote
and a newline must not inject unit lines (it did: ExecStartPre=), and values (secrets) stay out
of the 0644 unit, -vvv output and diffs: they live in a 0600 EnvironmentFile that the desired
state checks. Real ansible-playbook, local connection; only tmp_path is written."""

import hashlib
import json
import os
import subprocess
import sys

import pytest
from role_plays import desired_state_play

from systemd_env_oracle import systemd_parse

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLAYBOOK = os.path.join(os.path.dirname(sys.executable), 'ansible-playbook')
SECRET = 'hf_s3cr3tT0kenValue0123456789'
INJECTION = 'x"\nExecStartPre=/bin/sh -c "touch /tmp/kvpin-pwned'
ENVIRONMENT = {
    'HF_TOKEN': SECRET,
    'INJECTED': INJECTION,
    'PERCENT': '%n %h 100%',
    'DOLLAR': '$HOME `id` \\',
    'GPUSTACK_RUNTIME_DETECT_NO_PCI_CHECK': '1',
}

# After the role's desired state (public vars): the role's templates with the role's vars, whose
# sha1s must be the desired state's.
RENDER_TASKS = """
    - name: Render the unit
      ansible.builtin.template:
        src: "{roles}/gpustack_worker/templates/{{ 'gpustack-worker.service.j2' if gpustack_worker_runtime == 'container' else 'gpustack.service.j2' }}"
        dest: "{out}/unit"
        mode: "0600"
    - name: Render the environment file (test only; no_log like the role's own task)
      ansible.builtin.template:
        src: "{roles}/gpustack_worker/templates/worker.env.j2"
        dest: "{out}/env"
        mode: "0600"
      no_log: true
"""


def render(tmp_path, **extra_vars):
    if not os.path.exists(PLAYBOOK):
        pytest.skip('ansible-playbook not beside sys.executable (the controller venv)')
    tmp_path.mkdir(parents=True, exist_ok=True)
    play = desired_state_play('kvpin.fleet.gpustack_worker', tmp_path, 'gpustack_worker_desired_state | to_json', public=True)
    (tmp_path / 'play.yml').write_text(play + RENDER_TASKS.lstrip('\n').replace('{out}', str(tmp_path)).replace(
        '{roles}', os.path.join(ROOT, 'roles')))
    extra = dict({'gpustack_worker_server_url': 'http://127.0.0.1:30080', 'gpustack_worker_token': 'tok-123456789',
                  'gpustack_worker_environment': ENVIRONMENT}, **extra_vars)
    (tmp_path / 'extra.json').write_text(json.dumps(extra))
    env = dict(os.environ, ANSIBLE_NOCOLOR='1', ANSIBLE_PYTHON_INTERPRETER=sys.executable,
               ANSIBLE_CONFIG=os.path.join(ROOT, 'ansible.cfg'))
    proc = subprocess.run([PLAYBOOK, '-vvv', '--diff', '-i', 'localhost,', '-c', 'local',
                           '-e', '@%s' % (tmp_path / 'extra.json'), str(tmp_path / 'play.yml')],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    return proc, tmp_path


def rendered(tmp_path, **extra_vars):
    proc, out = render(tmp_path, **extra_vars)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    desired = json.loads((out / 'desired.json').read_text())
    unit, env_file = (out / 'unit').read_text(), (out / 'env').read_text()
    by_sha1 = {spec.get('sha1'): spec['path'] for spec in desired['files']}
    unit_path = by_sha1[hashlib.sha1(unit.encode()).hexdigest()]
    env_path = by_sha1[hashlib.sha1(env_file.encode()).hexdigest()]
    assert unit_path.startswith('/etc/systemd/system/')
    return proc.stdout + proc.stderr, desired, unit, env_file, env_path


def unit_directives(unit):
    """(key, value) of each directive line, continuation lines joined as systemd joins them."""
    logical, current = [], ''
    for line in unit.splitlines():
        if line.startswith(('#', ';')) and not current:
            continue
        if line.endswith('\\'):
            current += line[:-1] + ' '
            continue
        logical.append(current + line)
        current = ''
    return [tuple(line.split('=', 1)) for line in logical if '=' in line and not line.startswith('[')]


@pytest.mark.parametrize('runtime', ['container', 'native'])
def test_values_stay_out_of_the_unit_and_cannot_inject_lines(tmp_path, runtime):
    output, desired, unit, env_file, env_path = rendered(tmp_path, gpustack_worker_runtime=runtime)
    directives = unit_directives(unit)
    keys = [key for key, _value in directives]
    # The only ExecStartPre is the container unit's own "rm -f"; the native unit has none.
    assert keys.count('ExecStartPre') == (1 if runtime == 'container' else 0)
    assert not any('kvpin-pwned' in value or SECRET in value for _key, value in directives)
    for value in ENVIRONMENT.values():
        if len(value) > 3:
            assert value not in unit
    assert ('EnvironmentFile', env_path) in directives and env_path == '/var/lib/gpustack/worker.env'
    if runtime == 'container':
        exec_start = dict(directives)['ExecStart']
        for name in ENVIRONMENT:
            assert ' -e %s ' % name in exec_start
    else:
        assert 'Environment' not in keys
    # The file reads back as exactly the environment given (systemd's own parsing rules), next
    # to the role's own compile-cache variables (roles/gpustack_worker, compile_cache.py).
    parsed = systemd_parse(env_file)
    assert {name: parsed[name] for name in ENVIRONMENT} == ENVIRONMENT
    assert set(parsed) - set(ENVIRONMENT) == {'VLLM_CACHE_ROOT', 'TORCHINDUCTOR_CACHE_DIR', 'TRITON_CACHE_DIR'}
    assert all(parsed[name].startswith('/var/lib/gpustack/cache/') for name in set(parsed) - set(ENVIRONMENT))
    files = {spec['path']: spec for spec in desired['files']}
    assert files[env_path]['mode'] == '0600' and files[env_path]['owner'] == 'root'
    assert len(files[env_path]['sha1']) == 40
    # Nothing of a value in -vvv --diff output (the unit, which holds only names, may show).
    assert SECRET not in output and 'kvpin-pwned' not in output


def test_the_env_file_hash_follows_the_values(tmp_path):
    def env_sha1(name, **extra):
        desired = rendered(tmp_path / name, **extra)[1]
        return next(s['sha1'] for s in desired['files'] if s['path'].endswith('worker.env'))
    first = env_sha1('a')
    other = env_sha1('b', gpustack_worker_environment=dict(ENVIRONMENT, HF_TOKEN=SECRET + 'x'))
    assert first != other


@pytest.mark.parametrize('environment,named', [
    ({'BAD\nExecStartPre': 'x'}, "is not a variable name"),
    ({'A B': 'x'}, "'A B' is not a variable name"),
    ({'TOKEN': 'se\x00' + SECRET}, 'gpustack_worker_environment.TOKEN holds a NUL character'),
    ({'TOKEN': {'nested': SECRET}}, 'gpustack_worker_environment.TOKEN must be a string or a number'),
])
def test_bad_names_and_values_fail_naming_the_variable_not_the_value(tmp_path, environment, named):
    proc, _out = render(tmp_path, gpustack_worker_environment=environment)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert named in output, output[-3000:]
    assert SECRET not in output
