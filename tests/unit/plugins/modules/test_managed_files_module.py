# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""managed_files end to end: the module runs in its own Python process the way Ansible runs it
(an args file holding ANSIBLE_MODULE_ARGS) on a table under tmp_path, and what it wrote (and
answered) is checked: one call converges the whole table, a rerun changes nothing, check mode
writes nothing, a failed validate keeps the old file, a unit systemd-analyze verify rejects
is never written, contents never come back."""

from __future__ import annotations

import grp
import importlib.util
import json
import os
import pwd
import shutil
import stat
import subprocess

import pytest

from local_playbook import run_module_file  # pylint: disable=import-error

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
MODULE = os.path.join(ROOT, 'plugins', 'modules', 'managed_files.py')
NODE_STATE = os.path.join(ROOT, 'plugins', 'modules', 'node_state.py')

ME = pwd.getpwuid(os.getuid()).pw_name
MY_GROUP = grp.getgrgid(os.getgid()).gr_name
SECRET = 'token: kvpin-s3cret-value\n'


def run_module(tmp_path, module, args, check_mode=False):
    proc = run_module_file(tmp_path, module, dict(args, _ansible_check_mode=check_mode))
    assert 'kvpin-s3cret-value' not in proc.stdout + proc.stderr  # contents never come back
    return json.loads(proc.stdout)


def table(root, secret=SECRET, unit='[Unit]\nDescription=x\n', validate=None):
    config = {'path': str(root / 'data' / 'config.yaml'), 'content': secret, 'owner': ME, 'group': MY_GROUP,
              'mode': '0600', 'backup': True}
    if validate:
        config['validate'] = validate
    return [
        {'path': str(root / 'data'), 'state': 'directory', 'owner': ME, 'group': MY_GROUP, 'mode': '0750'},
        config,
        {'path': str(root / 'unit.service'), 'content': unit, 'owner': ME, 'group': MY_GROUP, 'mode': '0644'},
    ]


def mode_of(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def test_one_call_writes_the_table_and_a_rerun_changes_nothing(tmp_path):
    files = table(tmp_path)
    first = run_module(tmp_path, MODULE, {'files': files})
    assert first.get('failed') is not True, first
    assert first['changed'] is True
    assert first['changed_paths'] == [f['path'] for f in files]
    assert [r['created'] for r in first['files']] == [True, True, True]
    assert (tmp_path / 'data' / 'config.yaml').read_text() == SECRET
    assert mode_of(tmp_path / 'data') == 0o750
    assert mode_of(tmp_path / 'data' / 'config.yaml') == 0o600
    assert mode_of(tmp_path / 'unit.service') == 0o644
    # No temporary file left next to the written ones.
    assert sorted(os.listdir(tmp_path / 'data')) == ['config.yaml']
    again = run_module(tmp_path, MODULE, {'files': files})
    assert again['changed'] is False and again['changed_paths'] == []
    # What node_state (the rerun's check) says about the same table: in sync.
    checks = [dict((k, v) for k, v in f.items() if k not in ('content', 'backup', 'validate')) for f in files]
    import hashlib  # pylint: disable=import-outside-toplevel
    for check, entry in zip(checks, files):
        if 'content' in entry:
            check['sha1'] = hashlib.sha1(entry['content'].encode()).hexdigest()
    state = run_module(tmp_path, NODE_STATE, {'checks': [{'name': 'role', 'files': checks}]})
    assert state['in_sync'] is True, state


def test_only_what_differs_changes_and_a_replaced_file_is_backed_up(tmp_path):
    run_module(tmp_path, MODULE, {'files': table(tmp_path)})
    os.chmod(tmp_path / 'unit.service', 0o600)
    result = run_module(tmp_path, MODULE, {'files': table(tmp_path, secret='token: other\n')})
    assert result['changed_paths'] == [str(tmp_path / 'data' / 'config.yaml'), str(tmp_path / 'unit.service')]
    backup = result['files'][1]['backup_file']
    assert backup and open(backup).read() == SECRET and mode_of(backup) == 0o600
    assert result['files'][2]['backup_file'] == ''  # a mode change replaces nothing
    assert mode_of(tmp_path / 'unit.service') == 0o644


def test_check_mode_reports_and_writes_nothing(tmp_path):
    result = run_module(tmp_path, MODULE, {'files': table(tmp_path)}, check_mode=True)
    assert result['changed'] is True and len(result['changed_paths']) == 3
    assert not (tmp_path / 'data').exists() and not (tmp_path / 'unit.service').exists()


def test_failed_validate_keeps_the_old_file_and_names_the_entry(tmp_path):
    run_module(tmp_path, MODULE, {'files': table(tmp_path)})
    result = run_module(tmp_path, MODULE, {'files': table(tmp_path, secret='token: new\n', validate='/bin/false %s')})
    assert result['failed'] is True
    assert 'files[1]' in result['msg'] and 'config.yaml' in result['msg'] and 'validate failed' in result['msg']
    assert (tmp_path / 'data' / 'config.yaml').read_text() == SECRET
    assert sorted(os.listdir(tmp_path / 'data')) == ['config.yaml']


def test_bad_entries_fail_naming_index_and_path(tmp_path):
    (tmp_path / 'adir').mkdir()
    cases = [
        ([{'path': 'relative/file', 'content': 'x'}], 'files[0] (relative/file): path must be absolute'),
        ([{'path': str(tmp_path / 'f'), 'content': 'x'}, {'path': str(tmp_path / 'f'), 'content': 'y'}],
         'files[1]'),
        ([{'path': str(tmp_path / 'adir'), 'content': SECRET}], 'not a regular file'),
        ([{'path': str(tmp_path / 'f2')}], 'state file needs content'),
        ([{'path': str(tmp_path / 'd'), 'state': 'directory', 'content': SECRET}], 'content only applies'),
        ([{'path': str(tmp_path / 'no' / 'such' / 'f'), 'content': SECRET}], 'does not exist'),
    ]
    for files, message in cases:
        result = run_module(tmp_path, MODULE, {'files': files})
        assert result.get('failed') is True and message in result['msg'], (files, result)


def test_absent_removes(tmp_path):
    (tmp_path / 'stale.json').write_text('{}')
    result = run_module(tmp_path, MODULE, {'files': [{'path': str(tmp_path / 'stale.json'), 'state': 'absent'}]})
    assert result['changed'] is True and not (tmp_path / 'stale.json').exists()
    assert run_module(tmp_path, MODULE, {'files': [{'path': str(tmp_path / 'stale.json'), 'state': 'absent'}]})['changed'] is False


def test_a_missing_or_unrunnable_executable_fails_before_anything_is_written(tmp_path):
    # A native worker's unit must not be written around a program that is not there.
    program = tmp_path / 'bin' / 'gpustack'
    program.parent.mkdir()
    program.write_text('#!/bin/sh\n')
    program.chmod(0o644)
    link = tmp_path / 'bin' / 'linked'
    link.symlink_to(program)
    cases = [
        (str(tmp_path / 'bin' / 'nope'), '%s is missing' % (tmp_path / 'bin' / 'nope')),
        (str(program), '%s is not executable' % program),
        (str(tmp_path / 'bin'), '%s is not a regular file' % (tmp_path / 'bin')),
    ]
    for executable, problem in cases:
        result = run_module(tmp_path, MODULE, {'files': table(tmp_path), 'executables': [executable]})
        assert result['failed'] is True and result['msg'] == 'executables: %s; nothing written' % problem, result
        assert result['changed'] is False and result['files'] == []
        assert not (tmp_path / 'data').exists() and not (tmp_path / 'unit.service').exists()
    # Check mode does not look: an install that would bring the program has not run.
    checked = run_module(tmp_path, MODULE, {'files': table(tmp_path), 'executables': [str(program)]}, check_mode=True)
    assert checked.get('failed') is not True and checked['changed'] is True
    program.chmod(0o755)
    written = run_module(tmp_path, MODULE, {'files': table(tmp_path), 'executables': [str(link)]})
    assert written.get('failed') is not True, written
    assert (tmp_path / 'unit.service').exists()


# --- verify_unit: systemd-analyze verify of a changing unit, before anything is written -------

GOOD_UNIT = '[Unit]\nDescription=x\n[Service]\nExecStart=/bin/true\n'
BAD_UNITS = [
    ('[Unit]\nDescription=x\n[Service]\nExecStart=/nonexistent/kvpin-program\n',
     'unit.service: Command /nonexistent/kvpin-program is not executable'),
    ('[Unit]\nDescription=x\n[Service]\nExecStart=/bin/true\nExecStartt=/bin/true\n',
     "unit.service:5: Unknown key 'ExecStartt' in section [Service]"),
    ('[Unit]\nDescription=x\nRequires=kvpin-no-such-unit.service\n[Service]\nExecStart=/bin/true\n',
     'Unit kvpin-no-such-unit.service not found'),
]


def unit_table(root, unit):
    files = table(root, unit=unit)
    files[2]['verify_unit'] = True
    return files


def needs_systemd_analyze():
    if shutil.which('systemd-analyze') is None:
        pytest.skip('systemd-analyze not installed')


def test_a_unit_systemd_analyze_rejects_fails_the_call_before_anything_is_written(tmp_path):
    needs_systemd_analyze()
    for unit, complaint in BAD_UNITS:
        result = run_module(tmp_path, MODULE, {'files': unit_table(tmp_path, unit)})
        assert result['failed'] is True, result
        assert result['msg'].startswith('files[2] (%s): systemd-analyze verify: ' % (tmp_path / 'unit.service')), result
        assert complaint in result['msg'] and result['msg'].endswith('; nothing written'), result
        # The scratch copy's directory is not in the message, and nothing was written.
        assert 'kvpin-verify-' not in result['msg']
        assert result['changed'] is False and result['files'] == []
        assert not (tmp_path / 'data').exists() and not (tmp_path / 'unit.service').exists()
    # Check mode does not verify (the unit's program may come with an install that has not run).
    checked = run_module(tmp_path, MODULE, {'files': unit_table(tmp_path, BAD_UNITS[0][0])}, check_mode=True)
    assert checked.get('failed') is not True and checked['changed'] is True
    written = run_module(tmp_path, MODULE, {'files': unit_table(tmp_path, GOOD_UNIT)})
    assert written.get('failed') is not True, written
    assert (tmp_path / 'unit.service').read_text() == GOOD_UNIT


def test_a_unit_that_does_not_change_is_not_verified_again(tmp_path):
    # Verified when it was written: a rerun neither pays for verify nor fails on what the
    # node's systemd learned since (here: a unit written without verify_unit).
    needs_systemd_analyze()
    bad = BAD_UNITS[0][0]
    assert run_module(tmp_path, MODULE, {'files': table(tmp_path, unit=bad)})['changed'] is True
    again = run_module(tmp_path, MODULE, {'files': unit_table(tmp_path, bad)})
    assert again.get('failed') is not True and again['changed'] is False, again


def test_only_lines_naming_the_unit_are_its_complaints():
    spec = importlib.util.spec_from_file_location('managed_files_module', MODULE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    output = ('/etc/systemd/system/other.service:5: Unknown key \'Bogus\' in section [Service], ignoring.\n'
              'gpustack-worker.service: Command /usr/local/bin/gpustack is not executable: No such file\n'
              '/tmp/kvpin-verify-x/gpustack-worker.service:7: Unknown key \'Foo\'\n\n')
    assert module.unit_complaints(output, 'gpustack-worker.service') == [
        'gpustack-worker.service: Command /usr/local/bin/gpustack is not executable: No such file',
        "/tmp/kvpin-verify-x/gpustack-worker.service:7: Unknown key 'Foo'"]
    assert module.unit_complaints(output, 'watchdog.service') == []


def test_a_verify_that_does_not_finish_fails_the_call_and_a_bad_timeout_is_refused(tmp_path, monkeypatch):
    # A stand-in for systemd-analyze (tests/ only) that hangs: the call is bounded in time.
    fake_bin = tmp_path / 'fake-bin'
    fake_bin.mkdir()
    fake = fake_bin / 'systemd-analyze'
    fake.write_text('#!/bin/sh\nexec sleep 30\n')
    fake.chmod(0o755)
    monkeypatch.setenv('PATH', '%s:%s' % (fake_bin, os.environ.get('PATH', '/usr/bin:/bin')))
    result = run_module(tmp_path, MODULE, {'files': unit_table(tmp_path, GOOD_UNIT), 'verify_timeout': 1})
    assert result['failed'] is True, result
    assert result['msg'] == ('files[2] (%s): systemd-analyze verify did not finish in 1 s (verify_timeout); '
                             'nothing written' % (tmp_path / 'unit.service')), result
    assert not (tmp_path / 'data').exists() and not (tmp_path / 'unit.service').exists()
    for bad in (0, -5, 3601):
        refused = run_module(tmp_path, MODULE, {'files': unit_table(tmp_path, GOOD_UNIT), 'verify_timeout': bad})
        assert refused['failed'] is True
        assert refused['msg'] == 'verify_timeout: %d s is outside 1..3600 s; nothing written' % bad, refused
        assert not (tmp_path / 'data').exists()


# -- groups and users (the watchdog's account, created in the same call as its files) ---------

WATCHDOG_ACCOUNT = {'groups': [{'name': 'kvpin-wdtest'}], 'users': [{'name': 'kvpin-wdtest', 'group': 'kvpin-wdtest'}]}


@pytest.fixture
def private_etc(tmp_path):
    """A copy of /etc mounted over /etc in a private mount namespace for the module's process
    alone: the real groupadd/useradd/usermod change the copy, never this machine's accounts.
    Needs root (CI runs as root, where a skip fails the run)."""
    if os.geteuid() != 0 or shutil.which('unshare') is None:
        pytest.skip('needs root and unshare for a private /etc')
    etc = tmp_path / 'etc'
    proc = subprocess.run(['cp', '-a', '/etc', str(etc)], capture_output=True, text=True, check=False, timeout=60)
    assert proc.returncode == 0, proc.stderr
    wrapper = ['unshare', '--mount', '--propagation', 'private', 'sh', '-c', 'mount --bind "$0" /etc && exec "$@"', str(etc)]
    probe = subprocess.run(wrapper + ['true'], capture_output=True, text=True, check=False, timeout=60)
    if probe.returncode != 0:
        pytest.skip('no private mount namespace here: %s' % probe.stderr.strip())
    return etc, wrapper


def run_accounts(tmp_path, wrapper, args, check_mode=False):
    proc = run_module_file(tmp_path, MODULE, dict(args, _ansible_check_mode=check_mode), wrapper=wrapper)
    return json.loads(proc.stdout)


def etc_entries(etc, name):
    """{account name: fields} of the private copy's passwd or group file."""
    with open(str(etc / name)) as handle:
        return dict((line.split(':')[0], line.rstrip('\n').split(':')) for line in handle if line.strip())


def test_the_account_is_created_before_the_files_it_owns_and_a_rerun_changes_nothing(tmp_path, private_etc):
    etc, wrapper = private_etc
    args = dict(WATCHDOG_ACCOUNT, files=[
        {'path': str(tmp_path / 'conf'), 'state': 'directory', 'owner': 'kvpin-wdtest', 'group': 'kvpin-wdtest',
         'mode': '0750'}])
    first = run_accounts(tmp_path, wrapper, args)
    assert first.get('failed') is not True, first
    assert first['changed'] is True and first['changed_paths'] == [str(tmp_path / 'conf')]
    assert [(a['kind'], a['name'], a['created']) for a in first['accounts']] == [
        ('group', 'kvpin-wdtest', True), ('user', 'kvpin-wdtest', True)]
    user = etc_entries(etc, 'passwd')['kvpin-wdtest']
    group = etc_entries(etc, 'group')['kvpin-wdtest']
    assert user[3] == group[2]                                   # its primary group
    assert user[5:] == ['/nonexistent', '/usr/sbin/nologin']
    assert int(user[2]) < 1000                                   # a system account
    assert not os.path.exists('/nonexistent')                    # no home made
    assert os.stat(str(tmp_path / 'conf')).st_uid == int(user[2])
    assert 'kvpin-wdtest' not in etc_entries(type(tmp_path)('/etc'), 'passwd')   # this machine untouched
    again = run_accounts(tmp_path, wrapper, args)
    assert again['changed'] is False, again
    assert [a['changed'] for a in again['accounts']] == [False, False]


def test_an_existing_user_is_corrected_and_check_mode_only_reports(tmp_path, private_etc):
    etc, wrapper = private_etc
    assert run_accounts(tmp_path, wrapper, dict(WATCHDOG_ACCOUNT, files=[]))['changed'] is True
    # Someone gave it a login shell and another primary group.
    passwd = (etc / 'passwd').read_text().splitlines(True)
    edited = []
    for line in passwd:
        fields = line.rstrip('\n').split(':')
        if fields[0] == 'kvpin-wdtest':
            fields[3], fields[6] = '0', '/bin/bash'
        edited.append(':'.join(fields) + '\n')
    (etc / 'passwd').write_text(''.join(edited))
    checked = run_accounts(tmp_path, wrapper, dict(WATCHDOG_ACCOUNT, files=[]), check_mode=True)
    assert checked['changed'] is True and checked['accounts'][1]['corrected'] == ['group', 'shell'], checked
    assert etc_entries(etc, 'passwd')['kvpin-wdtest'][6] == '/bin/bash'
    fixed = run_accounts(tmp_path, wrapper, dict(WATCHDOG_ACCOUNT, files=[]))
    assert fixed['accounts'][1] == {'name': 'kvpin-wdtest', 'kind': 'user', 'changed': True, 'created': False,
                                    'corrected': ['group', 'shell']}, fixed
    user = etc_entries(etc, 'passwd')['kvpin-wdtest']
    assert user[3] == etc_entries(etc, 'group')['kvpin-wdtest'][2] and user[6] == '/usr/sbin/nologin'


def test_root_is_never_changed_and_a_missing_group_fails_before_any_file(tmp_path, private_etc):
    etc, wrapper = private_etc
    before = (etc / 'passwd').read_text()
    target = str(tmp_path / 'f')
    root = run_accounts(tmp_path, wrapper, {'users': [{'name': 'root', 'group': 'root'}],
                                            'files': [{'path': target, 'content': SECRET}]})
    assert root['failed'] is True
    assert root['msg'] == ('users[0] (root): uid 0; refusing to change its shell, home (to /usr/sbin/nologin, '
                           '/nonexistent): use a dedicated account; no file written'), root
    missing = run_accounts(tmp_path, wrapper, {'users': [{'name': 'kvpin-wdtest', 'group': 'kvpin-nosuch'}],
                                               'files': [{'path': target, 'content': SECRET}]})
    assert missing['failed'] is True
    assert missing['msg'] == ('users[0] (kvpin-wdtest): group kvpin-nosuch does not exist (add it to groups); '
                              'no file written'), missing
    # Unchanged root, no user made, no file written; root as it is is no change at all.
    assert (etc / 'passwd').read_text() == before and not os.path.exists(target)
    as_is = run_accounts(tmp_path, wrapper, {'users': [{'name': 'root', 'group': 'root', 'shell': etc_entries(
        etc, 'passwd')['root'][6], 'home': etc_entries(etc, 'passwd')['root'][5]}], 'files': []})
    assert as_is['changed'] is False, as_is


def test_check_mode_on_a_node_without_the_account_creates_nothing(tmp_path, private_etc):
    etc, wrapper = private_etc
    result = run_accounts(tmp_path, wrapper, dict(WATCHDOG_ACCOUNT, files=[]), check_mode=True)
    assert result['changed'] is True and [a['created'] for a in result['accounts']] == [True, True], result
    assert 'kvpin-wdtest' not in etc_entries(etc, 'passwd') and 'kvpin-wdtest' not in etc_entries(etc, 'group')


@pytest.mark.parametrize('args, message', [
    ({'groups': [{'name': '0day'}]}, "groups[0].name: '0day' is not a valid group name"),
    ({'groups': [{'name': '-rf'}]}, "groups[0].name: '-rf' is not a valid group name"),
    ({'users': [{'name': 'a:b', 'group': 'g'}]}, "users[0].name: 'a:b' is not a valid user name"),
    ({'users': [{'name': 'u' * 33, 'group': 'g'}]}, "users[0].name: '%s' is not a valid user name" % ('u' * 33)),
    ({'users': [{'name': 'u', 'group': 'G'}]}, "users[0].group: 'G' is not a valid group name"),
    ({'users': [{'name': 'u', 'group': 'g', 'shell': 'bin/sh'}]}, "users[0].shell: 'bin/sh' is not an absolute path"),
    ({'users': [{'name': 'u', 'group': 'g', 'home': '/a b'}]}, "users[0].home: '/a b' is not an absolute path"),
    ({'users': [{'name': 'u', 'group': 'g', 'home': '/x:/bin/sh'}]}, "users[0].home: '/x:/bin/sh' is not"),
    ({'users': [{'name': 'u', 'group': 'g', 'shell': '/bin/sh\nroot'}]}, "users[0].shell: '/bin/sh\\nroot' is not"),
])
def test_bad_account_fields_are_refused_naming_them_before_anything_changes(tmp_path, args, message):
    # Refused before any command runs: safe without a private /etc.
    target = str(tmp_path / 'f')
    result = run_module(tmp_path, MODULE, dict(args, files=[{'path': target, 'content': SECRET}]))
    assert result['failed'] is True and message in result['msg'] and result['msg'].endswith('; nothing changed'), result
    assert result['accounts'] == [] and not os.path.exists(target)
