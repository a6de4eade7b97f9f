# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""gpu_facts end to end: the module runs in its own Python process the way Ansible runs
it (an args file holding ANSIBLE_MODULE_ARGS), with the real pynvml over the stub
libnvidia-ml.so.1, and its JSON answer is checked."""

from __future__ import annotations

import base64
import ctypes.util
import grp
import hashlib
import json
import os
import pwd
import subprocess
import sys
import zipfile

import pytest

from ansible_collections.kvpin.fleet.plugins.module_utils.units import MiB

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
MODULE = os.path.join(ROOT, 'plugins', 'modules', 'gpu_facts.py')
FIXTURES = os.path.join(ROOT, 'tests', 'fixtures', 'nvml')
BUILD_SCRIPT = os.path.join(ROOT, 'tests', 'nvml_stub', 'build.sh')
# The directory holding ansible_collections/kvpin/fleet (tests/conftest.py puts it on sys.path).
COLLECTIONS_ROOT = next(p for p in sys.path if os.path.isdir(os.path.join(p, 'ansible_collections', 'kvpin', 'fleet')))

# Runs the module with `import pynvml` failing, as on a node without nvidia-ml-py.
WITHOUT_PYNVML = (
    "import runpy, sys; sys.modules['pynvml'] = None; "
    "sys.argv = [sys.argv[1], sys.argv[2]]; runpy.run_path(sys.argv[0], run_name='__main__')"
)


@pytest.fixture(scope='module')
def stub_library():
    return subprocess.run([BUILD_SCRIPT], check=True, capture_output=True, text=True).stdout.strip()


def fixture_path(name):
    return os.path.join(FIXTURES, name + '.json')


def run_module(tmp_path, args, stub_config=None, ld_library_path=None, without_pynvml=False):
    """Run gpu_facts; returns its result dict. Only the environment given here
    reaches the module: no LD_LIBRARY_PATH or stub config leaks in from the test run."""
    args_file = tmp_path / 'args.json'
    args_file.write_text(json.dumps({'ANSIBLE_MODULE_ARGS': args}))
    env = {'PATH': os.environ.get('PATH', '/usr/bin:/bin'), 'PYTHONPATH': COLLECTIONS_ROOT,
           'HOME': str(tmp_path), 'LC_ALL': 'C.UTF-8'}
    if stub_config:
        env['KVPIN_NVML_STUB_CONFIG'] = stub_config
    if ld_library_path:
        env['LD_LIBRARY_PATH'] = ld_library_path
    if without_pynvml:
        cmd = [sys.executable, '-c', WITHOUT_PYNVML, MODULE, str(args_file)]
    else:
        cmd = [sys.executable, MODULE, str(args_file)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert 'Traceback' not in proc.stderr, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.parametrize('node, names', [
    ('lab-a6000x4', ['NVIDIA RTX A6000'] * 4),
    ('lab-4090x4', ['NVIDIA GeForce RTX 4090'] * 4),
    ('lab-4090x2', ['NVIDIA GeForce RTX 4090'] * 2),
    ('lab-mixed', ['NVIDIA RTX A6000', 'NVIDIA GeForce RTX 4090']),
])
def test_lab_node_facts(tmp_path, stub_library, node, names):
    result = run_module(tmp_path, {'library_path': stub_library}, stub_config=fixture_path(node))
    assert result.get('failed') is not True, result
    assert result['changed'] is False
    facts = result['ansible_facts']['kvpin_gpus']
    assert facts['reason'] is None
    assert [g['name'] for g in facts['gpus']] == names
    assert facts['gpu_count'] == len(names)
    assert len(facts['topology']) == len(names) * (len(names) - 1) // 2


def test_library_found_through_the_loader_path(tmp_path, stub_library):
    """How the lab nodes run it: no library_path, the stub is on the library path."""
    result = run_module(tmp_path, {}, stub_config=fixture_path('lab-a6000x4'),
                        ld_library_path=os.path.dirname(stub_library))
    facts = result['ansible_facts']['kvpin_gpus']
    assert [g['memory_total'] for g in facts['gpus']] == [49140 * MiB] * 4


def test_check_mode_returns_the_same_facts(tmp_path, stub_library):
    args = {'library_path': stub_library}
    normal = run_module(tmp_path, args, stub_config=fixture_path('lab-4090x2'))
    checked = run_module(tmp_path, dict(args, _ansible_check_mode=True), stub_config=fixture_path('lab-4090x2'))
    assert checked['changed'] is False
    assert checked['ansible_facts'] == normal['ansible_facts']


def test_edited_fixture_changes_the_facts(tmp_path, stub_library):
    with open(fixture_path('lab-4090x2')) as f:
        data = json.load(f)
    data['devices'][1]['memory_used'] = 20000 * MiB  # someone else's job on GPU 1
    edited = tmp_path / 'edited.json'
    edited.write_text(json.dumps(data))
    result = run_module(tmp_path, {'library_path': stub_library}, stub_config=str(edited))
    gpu = result['ansible_facts']['kvpin_gpus']['gpus'][1]
    assert gpu['memory_used'] == 20000 * MiB
    assert gpu['memory_free'] == (24564 - 20000) * MiB


def test_no_driver_gives_no_gpus_and_the_reason(tmp_path, stub_library):
    result = run_module(tmp_path, {'library_path': stub_library}, stub_config=fixture_path('no-gpu'))
    assert result.get('failed') is not True
    facts = result['ansible_facts']['kvpin_gpus']
    assert facts['gpus'] == [] and facts['gpu_count'] == 0
    assert 'driver not loaded' in facts['reason']


def test_no_driver_fails_when_required(tmp_path, stub_library):
    result = run_module(tmp_path, {'library_path': stub_library, 'required': True},
                        stub_config=fixture_path('no-gpu'))
    assert result['failed'] is True
    assert 'required=true' in result['msg'] and 'driver not loaded' in result['msg']


# Right even in CI: a GPU runner's real libnvidia-ml makes the no-library path untestable there.
@pytest.mark.ci_may_skip('a real libnvidia-ml on the runner')
@pytest.mark.skipif(ctypes.util.find_library('nvidia-ml') is not None,
                    reason='this machine has a real libnvidia-ml')
@pytest.mark.parametrize('required', [False, True])
def test_no_nvml_library(tmp_path, required):
    result = run_module(tmp_path, {'required': required})
    if required:
        assert result['failed'] is True and 'libnvidia-ml.so.1 not found' in result['msg']
    else:
        facts = result['ansible_facts']['kvpin_gpus']
        assert facts['gpus'] == [] and 'libnvidia-ml.so.1 not found' in facts['reason']


def test_midprobe_failure_names_the_call(tmp_path, stub_library):
    result = run_module(tmp_path, {'library_path': stub_library}, stub_config=fixture_path('fail-midprobe'))
    assert result['failed'] is True
    assert result['nvml_call'] == 'nvmlDeviceGetMemoryInfo_v2'
    assert 'nvmlDeviceGetMemoryInfo_v2 failed on GPU 1' in result['msg']
    assert 'Unknown Error' in result['msg']
    assert 'ansible_facts' not in result


def test_missing_pynvml_names_the_package(tmp_path, stub_library):
    library_dir = tmp_path / 'lib'
    result = run_module(tmp_path, {'library_path': stub_library, 'library_dir': str(library_dir)},
                        stub_config=fixture_path('lab-4090x2'), without_pynvml=True)
    assert result['failed'] is True
    assert 'nvidia-ml-py' in result['msg'] and 'Failed to import' in result['msg']
    # Where it looked, too.
    assert 'no nvidia-ml-py in %s' % library_dir in result['msg']
    # What site.yml's prereq step keys on to install the wheel and probe again.
    assert result['missing_library'] == 'nvidia-ml-py'
    # ansible-core 2.19 adds the import traceback only when traceback capture is on
    assert 'pynvml' in result.get('exception', 'pynvml')


def test_unloadable_library_path_fails(tmp_path):
    result = run_module(tmp_path, {'library_path': str(tmp_path / 'missing' / 'libnvidia-ml.so.1')})
    assert result['failed'] is True
    assert 'Cannot load the NVML library' in result['msg']


def test_facts_reach_later_tasks_through_ansible_playbook(tmp_path, stub_library):
    """The real Ansible path (AnsiballZ bundling of module_utils, fact registration),
    on localhost through the local connection: no network."""
    playbook_bin = os.path.join(os.path.dirname(sys.executable), 'ansible-playbook')
    if not os.path.exists(playbook_bin):
        pytest.skip('ansible-playbook is not next to this Python')
    playbook = tmp_path / 'play.yml'
    playbook.write_text('''
- hosts: localhost
  gather_facts: false
  tasks:
    - kvpin.fleet.gpu_facts:
        library_path: %s
    - ansible.builtin.assert:
        that:
          - kvpin_gpus.gpu_count == 2
          - ansible_facts.kvpin_gpus.gpus | map(attribute='name') | list == ['NVIDIA RTX A6000', 'NVIDIA GeForce RTX 4090']
          - ansible_facts.kvpin_gpus.topology[0].link == 'PHB'
''' % stub_library)
    env = dict(os.environ, KVPIN_NVML_STUB_CONFIG=fixture_path('lab-mixed'), ANSIBLE_COLLECTIONS_PATH=COLLECTIONS_ROOT,
               ANSIBLE_LOCALHOST_WARNING='0', ANSIBLE_INVENTORY_UNPARSED_WARNING='0', HOME=str(tmp_path))
    proc = subprocess.run([playbook_bin, '-i', 'localhost,', '-c', 'local', '-e',
                           'ansible_python_interpreter=%s' % sys.executable, str(playbook)],
                          env=env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert 'ok=2' in proc.stdout and 'failed=0' in proc.stdout


def test_observe_reads_the_named_objects_in_the_same_run(tmp_path, stub_library):
    # site.yml's one round trip: the GPUs and what the node has of every managed object.
    managed = tmp_path / 'config.yaml'
    managed.write_bytes(b'token: s3cret\n')
    managed.chmod(0o600)
    result = run_module(tmp_path, {
        'library_path': stub_library,
        'observe': [{'name': 'worker',
                     'files': [{'path': str(managed), 'sha1': '0' * 40}, {'path': str(tmp_path / 'absent')}],
                     'users': ['root', 'kvpin-surely-no-such-user'], 'groups': ['kvpin-surely-no-such-group']}],
    }, stub_config=fixture_path('lab-4090x2'))
    facts = result['ansible_facts']
    assert [gpu['name'] for gpu in facts['kvpin_gpus']['gpus']] == ['NVIDIA GeForce RTX 4090'] * 2
    observed = facts['kvpin_node_observed']
    assert observed['files'][str(managed)]['sha1'] == hashlib.sha1(b'token: s3cret\n').hexdigest()
    assert observed['files'][str(managed)]['mode'] == 0o600
    assert observed['files'][str(tmp_path / 'absent')] == {'kind': 'missing'}
    root = pwd.getpwnam('root')
    assert observed['users'] == {'root': {'group': grp.getgrgid(root.pw_gid).gr_name, 'shell': root.pw_shell,
                                          'home': root.pw_dir},
                                 'kvpin-surely-no-such-user': None}
    assert observed['groups'] == {'kvpin-surely-no-such-group': False}
    assert 's3cret' not in json.dumps(result)


def test_observe_without_it_adds_no_fact(tmp_path, stub_library):
    result = run_module(tmp_path, {'library_path': stub_library}, stub_config=fixture_path('lab-4090x2'))
    assert 'kvpin_node_observed' not in result['ansible_facts']


def test_bad_observe_input_fails_naming_the_field_before_reading(tmp_path, stub_library):
    result = run_module(tmp_path, {'library_path': stub_library,
                                   'observe': [{'name': 'worker', 'files': [{'path': 'relative/x'}]}]},
                        stub_config=fixture_path('lab-4090x2'))
    assert result['failed'] is True
    assert result['msg'].startswith("observe: check worker: files[0].path 'relative/x'")
    assert result['field'] == 'files[0].path' and 'ansible_facts' not in result


# --- nvidia-ml-py sent by the controller (library_wheel) and kept in library_dir -------------

def build_wheel(directory, name='nvidia_ml_py-13.615.71-py3-none-any.whl', members=None):
    """A wheel of the pynvml this test runs with (the module imports it for real), or of ``members``."""
    import pynvml
    if members is None:
        with open(pynvml.__file__, 'rb') as handle:
            members = {'pynvml.py': handle.read(), 'nvidia_ml_py-13.615.71.dist-info/WHEEL': b'Wheel-Version: 1.0\n'}
    path = directory / name
    with zipfile.ZipFile(path, 'w') as archive:
        for member, data in members.items():
            archive.writestr(member, data)
    return path


def wheel_arg(path, name=None):
    return {'name': name or path.name, 'content': base64.b64encode(path.read_bytes()).decode('ascii')}


def test_a_sent_wheel_is_unpacked_kept_and_imported_by_later_probes(tmp_path, stub_library):
    library_dir = tmp_path / 'lib'
    wheel = build_wheel(tmp_path)
    installed = run_module(tmp_path, {'library_path': stub_library}, stub_config=fixture_path('lab-mixed'))
    sent = run_module(tmp_path, {'library_path': stub_library, 'library_dir': str(library_dir),
                                 'library_wheel': wheel_arg(wheel)},
                      stub_config=fixture_path('lab-mixed'), without_pynvml=True)
    assert sent.get('failed') is not True, sent
    assert sent['changed'] is True and sent['pynvml_from'] == 'library_wheel'
    assert sent['ansible_facts'] == installed['ansible_facts']
    # The wheel's bytes never come back, not even in the invocation.
    assert wheel_arg(wheel)['content'][:200] not in json.dumps(sent)
    unpacked = library_dir / 'nvidia_ml_py-13.615.71'
    assert oct(library_dir.stat().st_mode & 0o777) == '0o755'
    assert oct(unpacked.stat().st_mode & 0o777) == '0o755'
    assert oct((unpacked / 'pynvml.py').stat().st_mode & 0o777) == '0o644'
    assert [p.name for p in library_dir.iterdir()] == ['nvidia_ml_py-13.615.71']  # no temporary left

    again = run_module(tmp_path, {'library_path': stub_library, 'library_dir': str(library_dir)},
                       stub_config=fixture_path('lab-mixed'), without_pynvml=True)
    assert again.get('failed') is not True, again
    assert again['changed'] is False and again['pynvml_from'] == 'library_dir'
    assert again['ansible_facts'] == installed['ansible_facts']
    # Its bytecode is kept next to it: later probes do not compile pynvml.py again.
    assert any((unpacked / '__pycache__').glob('pynvml.*.pyc'))


def test_the_wheel_sent_again_imports_the_kept_copy_and_writes_nothing(tmp_path, stub_library):
    # The same call twice: the second finds the copy the first kept and changes nothing.
    library_dir = tmp_path / 'lib'
    args = {'library_path': stub_library, 'library_dir': str(library_dir),
            'library_wheel': wheel_arg(build_wheel(tmp_path))}
    first = run_module(tmp_path, args, stub_config=fixture_path('lab-4090x2'), without_pynvml=True)
    assert first['changed'] is True and first['pynvml_from'] == 'library_wheel'
    unpacked = library_dir / 'nvidia_ml_py-13.615.71'
    before = (unpacked.stat().st_ino, (unpacked / 'pynvml.py').stat().st_mtime_ns)
    for check_mode in (False, True):
        again = run_module(tmp_path, dict(args, _ansible_check_mode=check_mode),
                           stub_config=fixture_path('lab-4090x2'), without_pynvml=True)
        assert again.get('failed') is not True, again
        assert again['changed'] is False and again['pynvml_from'] == 'library_dir'
        assert again['ansible_facts'] == first['ansible_facts']
    assert (unpacked.stat().st_ino, (unpacked / 'pynvml.py').stat().st_mtime_ns) == before
    assert sorted(p.name for p in library_dir.iterdir()) == ['nvidia_ml_py-13.615.71']


@pytest.mark.parametrize('kept', [
    'nvidia_ml_py-13.615.71',  # the sent version, damaged: replaced whole
    'nvidia_ml_py-12.0',       # another version: the controller's wheelhouse decides, not what is kept
])
def test_a_kept_copy_that_is_not_the_sent_wheel_working_does_not_stand_in_for_it(tmp_path, stub_library, kept):
    library_dir = tmp_path / 'lib'
    (library_dir / kept).mkdir(parents=True, mode=0o755)
    library_dir.chmod(0o755)
    (library_dir / kept / 'pynvml.py').write_text('raise ImportError("the kept copy was imported")\n')
    result = run_module(tmp_path, {'library_path': stub_library, 'library_dir': str(library_dir),
                                   'library_wheel': wheel_arg(build_wheel(tmp_path))},
                        stub_config=fixture_path('lab-4090x2'), without_pynvml=True)
    assert result.get('failed') is not True, result
    assert result['changed'] is True and result['pynvml_from'] == 'library_wheel'
    assert 'kept copy' not in (library_dir / 'nvidia_ml_py-13.615.71' / 'pynvml.py').read_text()


def test_the_newest_unpacked_copy_is_imported(tmp_path, stub_library):
    library_dir = tmp_path / 'lib'
    library_dir.mkdir(mode=0o755)
    (library_dir / 'nvidia_ml_py-9.0').mkdir(mode=0o755)
    (library_dir / 'nvidia_ml_py-9.0' / 'pynvml.py').write_text('raise ImportError("the old copy was imported")\n')
    sent = run_module(tmp_path, {'library_path': stub_library, 'library_dir': str(library_dir),
                                 'library_wheel': wheel_arg(build_wheel(tmp_path))},
                      stub_config=fixture_path('lab-4090x2'), without_pynvml=True)
    assert sent['changed'] is True
    again = run_module(tmp_path, {'library_path': stub_library, 'library_dir': str(library_dir)},
                       stub_config=fixture_path('lab-4090x2'), without_pynvml=True)
    assert again.get('failed') is not True, again
    assert again['pynvml_from'] == 'library_dir'


def test_check_mode_reads_the_gpus_with_the_sent_wheel_and_keeps_nothing(tmp_path, stub_library):
    library_dir = tmp_path / 'lib'
    result = run_module(tmp_path, {'library_path': stub_library, 'library_dir': str(library_dir),
                                   'library_wheel': wheel_arg(build_wheel(tmp_path)), '_ansible_check_mode': True},
                        stub_config=fixture_path('lab-4090x2'), without_pynvml=True)
    assert result.get('failed') is not True, result
    assert result['changed'] is True and result['pynvml_from'] == 'library_wheel'
    assert result['ansible_facts']['kvpin_gpus']['gpu_count'] == 2
    assert not library_dir.exists()


def test_a_sent_wheel_is_ignored_where_pynvml_is_installed(tmp_path, stub_library):
    library_dir = tmp_path / 'lib'
    result = run_module(tmp_path, {'library_path': stub_library, 'library_dir': str(library_dir),
                                   'library_wheel': {'name': 'nvidia_ml_py-1-py3-none-any.whl', 'content': 'not checked'}},
                        stub_config=fixture_path('lab-4090x2'))
    assert result.get('failed') is not True, result
    assert result['changed'] is False and result['pynvml_from'] == 'installed'
    assert not library_dir.exists()


@pytest.mark.parametrize('mode, link, reason', [
    (0o775, False, 'writable by group or others (mode 0775)'),
    (0o757, False, 'writable by group or others (mode 0757)'),
    (0o755, True, 'is a symbolic link'),
])
def test_an_unsafe_library_dir_is_not_imported_from(tmp_path, stub_library, mode, link, reason):
    # What is imported runs as root: a copy someone else could have written is refused.
    real = tmp_path / 'real'
    real.mkdir()
    copy = real / 'nvidia_ml_py-13.615.71'
    copy.mkdir(mode=0o755)
    (copy / 'pynvml.py').write_text('raise SystemExit("an untrusted copy ran")\n')
    real.chmod(mode)
    library_dir = tmp_path / 'link' if link else real
    if link:
        library_dir.symlink_to(real)
    result = run_module(tmp_path, {'library_path': stub_library, 'library_dir': str(library_dir)},
                        stub_config=fixture_path('lab-4090x2'), without_pynvml=True)
    assert result['failed'] is True and result['missing_library'] == 'nvidia-ml-py'
    assert reason in result['msg'] and 'untrusted copy ran' not in json.dumps(result)


def test_a_group_writable_module_file_is_not_imported(tmp_path, stub_library):
    library_dir = tmp_path / 'lib'
    copy = library_dir / 'nvidia_ml_py-13.615.71'
    copy.mkdir(parents=True, mode=0o755)
    library_dir.chmod(0o755)
    module_file = copy / 'pynvml.py'
    module_file.write_text('raise SystemExit("an untrusted copy ran")\n')
    module_file.chmod(0o664)
    result = run_module(tmp_path, {'library_path': stub_library, 'library_dir': str(library_dir)},
                        stub_config=fixture_path('lab-4090x2'), without_pynvml=True)
    assert result['failed'] is True
    assert '%s is writable by group or others (mode 0664)' % module_file in result['msg']


def _bad_wheels(tmp_path):
    good = build_wheel(tmp_path)
    not_zip = tmp_path / 'nvidia_ml_py-1.0-py3-none-any.whl'
    not_zip.write_bytes(b'PK not really')
    return [
        ({'name': '../../etc/nvidia_ml_py-1.0-py3-none-any.whl', 'content': wheel_arg(good)['content']},
         'library_wheel.name', 'is not a pure-Python wheel file name'),
        ({'name': 'nvidia_ml_py-1.0-cp311-cp311-linux_x86_64.whl', 'content': wheel_arg(good)['content']},
         'library_wheel.name', 'is not a pure-Python wheel file name'),
        ({'name': 'evil-1.0-py3-none-any.whl', 'content': wheel_arg(good)['content']},
         'library_wheel.name', 'is not a wheel of nvidia-ml-py'),
        ({'name': good.name, 'content': 'not base64 at all!'}, 'library_wheel.content', 'is not valid base64'),
        (wheel_arg(not_zip), 'library_wheel.content', 'is not a wheel (not a zip archive)'),
        (wheel_arg(build_wheel(tmp_path, 'nvidia_ml_py-2.0-py3-none-any.whl', {'../pynvml.py': b'x = 1\n'}), ),
         'library_wheel.content', "the wheel member '../pynvml.py' leaves the directory"),
        (wheel_arg(build_wheel(tmp_path, 'nvidia_ml_py-3.0-py3-none-any.whl', {'/etc/cron.d/x': b'x\n'})),
         'library_wheel.content', "the wheel member '/etc/cron.d/x' leaves the directory"),
        (wheel_arg(build_wheel(tmp_path, 'nvidia_ml_py-4.0-py3-none-any.whl', {'other.py': b'x = 1\n'})),
         'library_wheel.content', 'has no top-level pynvml.py'),
    ]


def test_a_bad_sent_wheel_fails_naming_the_field_and_writes_nothing(tmp_path, stub_library):
    library_dir = tmp_path / 'lib'
    for wheel, field, problem in _bad_wheels(tmp_path):
        result = run_module(tmp_path, {'library_path': stub_library, 'library_dir': str(library_dir),
                                       'library_wheel': wheel},
                            stub_config=fixture_path('lab-4090x2'), without_pynvml=True)
        assert result['failed'] is True, (field, problem)
        assert result['field'] == field and result['msg'].startswith(field + ': ') and problem in result['msg'], result['msg']
        assert 'ansible_facts' not in result
        assert not library_dir.exists()


def test_measurements_are_read_in_the_same_run(tmp_path, stub_library):
    # site.yml's probe: each deployment's measurement file, read back for the plan.
    good = tmp_path / 'chat.json'
    good.write_text(json.dumps({'traffic': {'requests': 400, 'prompt_tokens_p99_upper': 2048},
                                'kv_pool': {'kv_cache_tokens': 524288}, 'gpu': 'NVIDIA GeForce RTX 4090',
                                'backend_version': '0.32.0', 'args': ['--max-num-seqs=8'],
                                'measured_at': '2026-12-07T06:00:00Z'}))
    bad = tmp_path / 'code.json'
    bad.write_text('{"traffic": {"requests": "many"}}')
    result = run_module(tmp_path, {
        'library_path': stub_library,
        'measurements': {'chat': str(good), 'code': str(bad), 'new': str(tmp_path / 'new.json')},
    }, stub_config=fixture_path('lab-4090x2'))
    assert result['changed'] is False
    read = result['ansible_facts']['kvpin_measurements']
    assert read['chat']['state'] == 'read' and read['chat']['measurement']['kv_pool'] == {'kv_cache_tokens': 524288}
    assert read['code']['state'] == 'unusable' and 'measurement.traffic.requests' in read['code']['note']
    assert read['new']['state'] == 'missing' and read['new']['note'] is None


def test_bad_measurements_option_fails_naming_the_field(tmp_path, stub_library):
    result = run_module(tmp_path, {'library_path': stub_library, 'measurements': {'chat': 'relative.json'}},
                        stub_config=fixture_path('lab-4090x2'))
    assert result['failed'] is True and result['field'] == 'measurements'
    assert result['msg'] == "measurements: chat: path must be an absolute path, got 'relative.json'"
