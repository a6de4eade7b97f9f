# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""node_state: input checks and each comparison against real objects - files, directories and
symlinks in tmp_path, the current user's names, `systemctl show` text, a loopback HTTP server,
and this interpreter's installed packages."""

from __future__ import annotations

import copy
import grp
import hashlib
import http.server
import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import threading

import pytest

from ansible_collections.kvpin.fleet.plugins.module_utils.facts.node_state import (
    CheckSpec,
    FileSpec,
    HttpSpec,
    NodeStateInputError,
    NodeStateWaitError,
    PythonPackageSpec,
    UnitSpec,
    UnitState,
    check_wait,
    compare,
    evaluate,
    evaluate_until_in_sync,
    file_drift,
    group_drift,
    group_exists,
    http_drift,
    http_status,
    module_command_runner,
    parse_checks,
    observe,
    observe_user,
    parse_systemctl_show,
    python_package_drift,
    read_unit_states,
    run_bounded,
    sha1_of_file,
    summarize,
    unit_drift,
    unit_states_from_show,
    user_drift,
    UserSpec,
)

ME = pwd.getpwuid(os.getuid()).pw_name
MY_GROUP = grp.getgrgid(os.getgid()).gr_name
AS_ROOT = os.getuid() == 0
PYTEST_VERSION = pytest.__version__


class _ModuleEdge:
    """AnsibleModule.run_command's contract (argv list -> rc, stdout, stderr), for the
    node-side functions outside a module run: the edge, Ansible's module API."""

    def run_command(self, args, check_rc=False, expand_user_and_vars=True, handle_exceptions=True):
        proc = subprocess.run(args, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False)
        return proc.returncode, proc.stdout, proc.stderr


# The runner the modules build (module_command_runner): every command under coreutils' timeout.
RUN = module_command_runner(_ModuleEdge())

# `systemctl show --property=Id,LoadState,ActiveState,SubState,UnitFileState,NeedDaemonReload --
#  gpustack.service sshd.service nope.service kvpin-watchdog.service masked.service` as systemd 252
# (Debian 12) prints it: one block per argument, in argument order; an alias (sshd.service) is
# shown under its real Id; a unit that does not exist is not-found with an empty UnitFileState.
SYSTEMCTL_SHOW = """\
Id=gpustack.service
LoadState=loaded
ActiveState=inactive
SubState=dead
UnitFileState=disabled
NeedDaemonReload=no

Id=ssh.service
LoadState=loaded
ActiveState=active
SubState=running
UnitFileState=enabled
NeedDaemonReload=no

Id=nope.service
LoadState=not-found
ActiveState=inactive
SubState=dead
UnitFileState=
NeedDaemonReload=no

Id=kvpin-watchdog.service
LoadState=loaded
ActiveState=active
SubState=running
UnitFileState=enabled
NeedDaemonReload=yes

Id=masked.service
LoadState=masked
ActiveState=active
SubState=running
UnitFileState=masked
NeedDaemonReload=no
"""
SHOWN_UNITS = ['gpustack.service', 'sshd.service', 'nope.service', 'kvpin-watchdog.service', 'masked.service']


def observed_http_drift(spec):
    """http_drift against what this test's server answers now."""
    return http_drift(spec, http_status(spec.url, spec.timeout))


def sha1(data):
    return hashlib.sha1(data).hexdigest()


# -- input ---------------------------------------------------------------------------------

def test_defaults_fill_a_minimal_check():
    [check] = parse_checks([{'name': 'worker', 'files': [{'path': '/etc/x'}]}])
    assert check == CheckSpec(name='worker', files=(FileSpec(path='/etc/x'),))


def test_ansible_style_none_for_unset_suboptions():
    raw = {'name': 'worker', 'files': [{'path': '/etc/x', 'state': None, 'sha1': None, 'mode': None,
                                        'owner': None, 'group': None}],
           'users': None, 'groups': None, 'units': [{'name': 'a.service', 'enabled': None, 'active': True}],
           'http': [{'url': 'http://127.0.0.1/', 'status': None, 'timeout': None}], 'python_packages': None}
    [check] = parse_checks([raw])
    assert check.files == (FileSpec(path='/etc/x'),)
    assert check.units == (UnitSpec(name='a.service', active=True),)
    assert check.http == (HttpSpec(url='http://127.0.0.1/', status=200, timeout=5.0),)


@pytest.mark.parametrize('mode, value', [('0600', 0o600), ('644', 0o644), ('1777', 0o1777), (0o600, 0o600)])
def test_modes(mode, value):
    [check] = parse_checks([{'name': 'c', 'files': [{'path': '/x', 'mode': mode}]}])
    assert check.files[0].mode == value


def test_sha1_is_compared_lower_case_and_trailing_slash_dropped():
    [check] = parse_checks([{'name': 'c', 'files': [{'path': '/etc/x/', 'sha1': 'AB' * 20}]}])
    assert check.files[0] == FileSpec(path='/etc/x', sha1='ab' * 20)


@pytest.mark.parametrize('files, field_name, value', [
    ([{'path': 'etc/x'}], 'files[0].path', 'etc/x'),
    ([{'path': '/ok'}, {'path': '/x', 'mode': '644x'}], 'files[1].mode', '644x'),
    ([{'path': '/x', 'mode': '0800'}], 'files[0].mode', '0800'),
    ([{'path': '/x', 'mode': 'u=rw'}], 'files[0].mode', 'u=rw'),
    ([{'path': '/x', 'mode': 0o17777}], 'files[0].mode', 0o17777),
    ([{'path': '/x', 'state': 'link'}], 'files[0].state', 'link'),
    ([{'path': '/x', 'sha1': 'abc'}], 'files[0].sha1', 'abc'),
    ([{'path': '/x', 'state': 'directory', 'sha1': 'a' * 40}], 'files[0].sha1', 'a' * 40),
    ([{'path': '/x', 'read_sha1': 'yes'}], 'files[0].read_sha1', 'yes'),
    ([{'path': '/x', 'state': 'absent', 'read_sha1': True}], 'files[0].read_sha1', True),
])
def test_file_input_errors_name_check_field_and_value(files, field_name, value):
    with pytest.raises(NodeStateInputError) as raised:
        parse_checks([{'name': 'ok', 'files': []}, {'name': 'worker', 'files': files}])
    assert (raised.value.check, raised.value.field, raised.value.value) == ('worker', field_name, value)
    assert str(raised.value).startswith('check worker: %s %r: ' % (field_name, value))


@pytest.mark.parametrize('raw, field_name', [
    ({'units': [{'name': 'gpustack'}]}, 'units[0].name'),
    ({'units': [{'name': '--all.service'}]}, 'units[0].name'),
    ({'http': [{'url': 'file:///etc/shadow'}]}, 'http[0].url'),
    ({'http': [{'url': 'http://x/', 'status': 42}]}, 'http[0].status'),
    ({'python_packages': [{'python': 'python3', 'name': 'a', 'version': '1'}]}, 'python_packages[0].python'),
    ({'users': 'kvpin-watchdog'}, 'users'),
    ({'users': [7]}, 'users[0]'),
    ({'users': ['']}, 'users[0]'),
    ({'users': [{'group': 'g'}]}, 'users[0].name'),
    ({'users': ['a', {'name': 'u', 'shell': 5}]}, 'users[1].shell'),
    ({'users': [{'name': 'u', 'uid': 0}]}, 'users[0]'),
])
def test_other_input_errors(raw, field_name):
    with pytest.raises(NodeStateInputError) as raised:
        parse_checks([dict(raw, name='worker')])
    assert raised.value.check == 'worker' and raised.value.field == field_name


def test_duplicate_check_names_fail_naming_the_name():
    with pytest.raises(NodeStateInputError, match='check worker: name .*duplicate'):
        parse_checks([{'name': 'worker'}, {'name': 'watchdog'}, {'name': 'worker'}])


# -- files ---------------------------------------------------------------------------------

def test_matching_file_is_in_sync(tmp_path):
    path = tmp_path / 'config.yaml'
    path.write_bytes(b'token: s3cret\n')
    path.chmod(0o600)
    assert file_drift(FileSpec(path=str(path), sha1=sha1(b'token: s3cret\n'), mode=0o600,
                               owner=ME, group=MY_GROUP)) == []


def test_every_difference_of_a_file_is_a_line(tmp_path):
    path = tmp_path / 'config.yaml'
    path.write_bytes(b'token: s3cret\n')
    path.chmod(0o644)
    wanted = sha1(b'token: other\n')
    drift = file_drift(FileSpec(path=str(path), sha1=wanted, mode=0o600,
                                owner='kvpin-no-such-user', group='kvpin-no-such-group'))
    assert drift == [
        '%s: content differs (sha1 %s wanted %s)' % (path, sha1(b'token: s3cret\n'), wanted),
        '%s: mode 0644, wanted 0600' % path,
        '%s: owner %s, wanted kvpin-no-such-user' % (path, ME),
        '%s: group %s, wanted kvpin-no-such-group' % (path, MY_GROUP),
    ]
    assert 's3cret' not in ''.join(drift)


def test_special_bits_count_in_the_mode(tmp_path):
    path = tmp_path / 'shared'
    path.mkdir()
    path.chmod(0o1777)
    assert file_drift(FileSpec(path=str(path), state='directory', mode=0o777)) == [
        '%s: mode 1777, wanted 0777' % path]


@pytest.mark.skipif(not AS_ROOT, reason='chown to another uid needs root')
def test_owner_without_a_name_shows_the_uid(tmp_path):
    path = tmp_path / 'x'
    path.write_bytes(b'')
    os.chown(str(path), 54321, 54321)
    assert file_drift(FileSpec(path=str(path), owner=ME, group=MY_GROUP)) == [
        '%s: owner 54321, wanted %s' % (path, ME), '%s: group 54321, wanted %s' % (path, MY_GROUP)]


def test_sha1_streams_a_large_file(tmp_path):
    data = os.urandom(300 * 1024 + 7)
    path = tmp_path / 'program'
    path.write_bytes(data)
    assert sha1_of_file(str(path)) == sha1(data)
    assert file_drift(FileSpec(path=str(path), sha1=sha1(data))) == []


def test_missing_file_and_missing_parent(tmp_path):
    (tmp_path / 'a-file').write_bytes(b'')
    assert file_drift(FileSpec(path=str(tmp_path / 'nope'))) == ['%s/nope: missing' % tmp_path]
    # A parent that is a file (ENOTDIR): the path does not exist either.
    under_file = str(tmp_path / 'a-file' / 'x')
    assert file_drift(FileSpec(path=under_file, state='directory')) == ['%s: missing' % under_file]
    assert file_drift(FileSpec(path=under_file, state='absent')) == []


def test_wrong_type(tmp_path):
    (tmp_path / 'dir').mkdir()
    (tmp_path / 'file').write_bytes(b'x')
    assert file_drift(FileSpec(path=str(tmp_path / 'dir'))) == ['%s/dir: is a directory, wanted a file' % tmp_path]
    assert file_drift(FileSpec(path=str(tmp_path / 'file'), state='directory')) == [
        '%s/file: is a file, wanted a directory' % tmp_path]


def test_symlink_is_drift_even_to_the_right_content(tmp_path):
    target = tmp_path / 'target'
    target.write_bytes(b'x')
    (tmp_path / 'link').symlink_to(target)
    (tmp_path / 'dirlink').symlink_to(tmp_path)
    assert file_drift(FileSpec(path=str(tmp_path / 'link'), sha1=sha1(b'x'))) == [
        '%s/link: is a symlink, wanted a file' % tmp_path]
    assert file_drift(FileSpec(path=str(tmp_path / 'dirlink'), state='directory')) == [
        '%s/dirlink: is a symlink, wanted a directory' % tmp_path]
    # Given with a trailing slash, the path is still not followed.
    [check] = parse_checks([{'name': 'c', 'files': [{'path': '%s/dirlink/' % tmp_path, 'state': 'directory'}]}])
    assert file_drift(check.files[0]) == ['%s/dirlink: is a symlink, wanted a directory' % tmp_path]


def test_absent(tmp_path):
    (tmp_path / 'old.conf').write_bytes(b'x')
    (tmp_path / 'dangling').symlink_to(tmp_path / 'gone')
    assert file_drift(FileSpec(path=str(tmp_path / 'nope'), state='absent')) == []
    assert file_drift(FileSpec(path=str(tmp_path / 'old.conf'), state='absent')) == [
        '%s/old.conf: exists (a file), wanted absent' % tmp_path]
    assert file_drift(FileSpec(path=str(tmp_path / 'dangling'), state='absent')) == [
        '%s/dangling: exists (a symlink), wanted absent' % tmp_path]


def _as_unprivileged(function, *args):
    """function(*args) in a forked child running as nobody when we are root (CI runs as root,
    and root reads everything), else here as ourselves. Returns what it returned (JSON-able);
    an exception in the child fails the test with its text."""
    if not AS_ROOT:
        return function(*args)
    nobody = pwd.getpwnam('nobody')
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: drop root for good, run, report, never return into pytest
        status = 1
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)
            try:
                payload = {'result': function(*args)}
            except Exception as exc:  # pylint: disable=broad-except
                payload = {'error': '%s: %s' % (type(exc).__name__, exc)}
            with os.fdopen(write_end, 'w') as handle:
                json.dump(payload, handle)
            status = 0
        finally:
            os._exit(status)  # pylint: disable=protected-access
    os.close(write_end)
    with os.fdopen(read_end) as handle:
        text = handle.read()
    _unused, status = os.waitpid(pid, 0)
    assert status == 0 and text, 'child as nobody failed (status %d)' % status
    payload = json.loads(text)
    assert 'error' not in payload, payload['error']
    return payload['result']


def test_unreadable_is_drift_not_in_sync():
    """What the node's module user cannot read is drift, never in sync: run as an unprivileged
    user (forked and setuid to nobody when the tests run as root, as CI does)."""
    # tmp_path's parents are closed to others (pytest-of-root is 0700): a world-traversable
    # directory under the temp root instead, removed afterwards.
    world = tempfile.mkdtemp(prefix='kvpin-node-state-')
    try:
        os.chmod(world, 0o755)
        path = os.path.join(world, 'secret')
        with open(path, 'wb') as handle:
            handle.write(b'x')
        os.chmod(path, 0)
        closed = os.path.join(world, 'closed')
        os.mkdir(closed)
        os.chmod(closed, 0)
        inside = os.path.join(closed, 'x')
        assert _as_unprivileged(file_drift, FileSpec(path=path, sha1=sha1(b'x'))) == [
            '%s: content cannot be read (Permission denied)' % path]
        assert _as_unprivileged(file_drift, FileSpec(path=inside, state='absent')) == [
            '%s: cannot be read (Permission denied)' % inside]
        [check] = parse_checks([{'name': 'worker', 'files': [{'path': path, 'sha1': sha1(b'x')},
                                                             {'path': inside, 'state': 'absent'}]}])
        assert _as_unprivileged(lambda: summarize(evaluate([check]))['in_sync']) is False
    finally:
        os.chmod(os.path.join(world, 'closed'), 0o700)
        shutil.rmtree(world)


def test_users_and_groups():
    me = pwd.getpwuid(os.getuid())
    assert observe_user(ME) == {'group': MY_GROUP, 'shell': me.pw_shell, 'home': me.pw_dir}
    assert user_drift(UserSpec(ME), observe_user(ME)) == [] and group_drift(MY_GROUP, group_exists(MY_GROUP)) == []
    assert user_drift(UserSpec(ME, group=MY_GROUP, shell=me.pw_shell, home=me.pw_dir), observe_user(ME)) == []
    assert observe_user('kvpin-no-such-user') is None
    assert user_drift(UserSpec('kvpin-no-such-user'), None) == ['user kvpin-no-such-user: missing']
    assert group_drift('kvpin-no-such-group', group_exists('kvpin-no-such-group')) == ['group kvpin-no-such-group: missing']


def test_a_user_with_another_shell_home_or_group_is_drift_naming_both_values():
    seen = {'group': 'root', 'shell': '/bin/bash', 'home': '/root'}
    want = UserSpec('kvpin-watchdog', group='kvpin-watchdog', shell='/usr/sbin/nologin', home='/nonexistent')
    assert user_drift(want, seen) == ['user kvpin-watchdog: group root, want kvpin-watchdog',
                                      'user kvpin-watchdog: shell /bin/bash, want /usr/sbin/nologin',
                                      'user kvpin-watchdog: home /root, want /nonexistent']
    # Only the attributes a check states count; a bare name only asks that the user exist.
    assert user_drift(UserSpec('kvpin-watchdog', shell='/bin/bash'), seen) == []
    assert user_drift(UserSpec('kvpin-watchdog'), seen) == []
    # Through parse_checks and compare, as the controller runs it on the probe's observation.
    [check] = parse_checks([{'name': 'serving_watchdog', 'users': [
        {'name': 'kvpin-watchdog', 'group': 'kvpin-watchdog', 'shell': '/usr/sbin/nologin', 'home': None}]}])
    [result] = compare([check], {'users': {'kvpin-watchdog': seen}})
    assert result.drift == ['user kvpin-watchdog: group root, want kvpin-watchdog',
                            'user kvpin-watchdog: shell /bin/bash, want /usr/sbin/nologin']
    [result] = compare([check], {'users': {'kvpin-watchdog': None}})
    assert result.drift == ['user kvpin-watchdog: missing']


# -- systemd units -------------------------------------------------------------------------

def test_systemctl_show_blocks_in_argument_order():
    blocks = parse_systemctl_show(SYSTEMCTL_SHOW)
    assert [b['Id'] for b in blocks] == ['gpustack.service', 'ssh.service', 'nope.service',
                                         'kvpin-watchdog.service', 'masked.service']
    assert blocks[2] == {'Id': 'nope.service', 'LoadState': 'not-found', 'ActiveState': 'inactive',
                         'SubState': 'dead', 'UnitFileState': '', 'NeedDaemonReload': 'no'}


def test_blocks_pair_with_the_names_asked_for_not_the_ids():
    states = unit_states_from_show(SHOWN_UNITS, SYSTEMCTL_SHOW)
    assert states['sshd.service'].get('Id') == 'ssh.service'
    assert unit_drift(UnitSpec('sshd.service', enabled=True, active=True), states['sshd.service']) == []


def test_block_count_mismatch_makes_every_unit_unknown():
    states = unit_states_from_show(SHOWN_UNITS + ['extra.service'], SYSTEMCTL_SHOW)
    drift = unit_drift(UnitSpec('sshd.service', active=True), states['sshd.service'])
    assert drift == ['sshd.service: state unknown (systemctl show printed 5 unit block(s) for 6 unit(s))']


@pytest.mark.parametrize('spec, drift', [
    (UnitSpec('gpustack.service', enabled=True, active=True), [
        'gpustack.service: not enabled (UnitFileState disabled)',
        'gpustack.service: ActiveState inactive (dead), wanted active']),
    (UnitSpec('gpustack.service', enabled=False, active=False), []),
    (UnitSpec('gpustack.service'), []),
    (UnitSpec('nope.service', active=True), [
        'nope.service: LoadState not-found, wanted loaded',
        'nope.service: ActiveState inactive (dead), wanted active']),
    (UnitSpec('nope.service', enabled=True), [
        'nope.service: LoadState not-found, wanted loaded',
        'nope.service: not enabled (UnitFileState empty)']),
    (UnitSpec('nope.service', enabled=False, active=False), []),
    # NeedDaemonReload is drift whatever else is wanted.
    (UnitSpec('kvpin-watchdog.service'), ['kvpin-watchdog.service: unit file changed on disk, needs daemon-reload']),
    (UnitSpec('kvpin-watchdog.service', enabled=False, active=False), [
        'kvpin-watchdog.service: unit file changed on disk, needs daemon-reload',
        'kvpin-watchdog.service: enabled (UnitFileState enabled), wanted not enabled',
        'kvpin-watchdog.service: ActiveState active (running), wanted not active']),
    # Masked but still running: wanted stopped is drift.
    (UnitSpec('masked.service', active=False), ['masked.service: ActiveState active (running), wanted not active']),
])
def test_unit_drift(spec, drift):
    states = unit_states_from_show(SHOWN_UNITS, SYSTEMCTL_SHOW)
    assert unit_drift(spec, states[spec.name]) == drift


def test_missing_systemctl_makes_every_unit_drift(tmp_path):
    states = read_unit_states(['a.service', 'b.service'], systemctl=str(tmp_path / 'systemctl'), run_command=RUN)
    assert set(states) == {'a.service', 'b.service'}
    assert all(s.error.startswith('systemctl show could not run') for s in states.values())
    assert unit_drift(UnitSpec('a.service', enabled=False), states['a.service'])[0].startswith(
        'a.service: state unknown (systemctl show could not run')


def test_failing_systemctl_makes_every_unit_drift(tmp_path):
    # What systemctl answers in a container or chroot without systemd as PID 1.
    systemctl = tmp_path / 'systemctl'
    systemctl.write_text('#!/bin/sh\necho "System has not been booted with systemd as init system (PID 1). '
                         'Can\'t operate." >&2\nexit 1\n')
    systemctl.chmod(0o755)
    states = read_unit_states(['a.service'], systemctl=str(systemctl), run_command=RUN)
    assert unit_drift(UnitSpec('a.service', active=False), states['a.service']) == [
        'a.service: state unknown (systemctl show failed (rc 1: System has not been booted with systemd '
        'as init system (PID 1). Can\'t operate.))']


def test_one_systemctl_call_for_the_units_of_all_checks(tmp_path):
    """A stand-in systemctl that logs its argv and prints the captured text."""
    log = tmp_path / 'calls'
    (tmp_path / 'show.txt').write_text(SYSTEMCTL_SHOW)
    systemctl = tmp_path / 'systemctl'
    systemctl.write_text('#!/bin/sh\necho "$@" >> %s\ncat %s\n' % (log, tmp_path / 'show.txt'))
    systemctl.chmod(0o755)
    checks = parse_checks([
        {'name': 'worker', 'units': [{'name': 'gpustack.service', 'active': True}, {'name': 'sshd.service'}]},
        {'name': 'other', 'units': [{'name': 'nope.service', 'active': False},
                                    {'name': 'kvpin-watchdog.service', 'active': True},
                                    {'name': 'masked.service'}]},
        {'name': 'same-unit-again', 'units': [{'name': 'sshd.service', 'active': True}]},
    ])
    results = evaluate(checks, systemctl=str(systemctl), run_command=RUN)
    assert log.read_text().splitlines() == [
        'show --property=Id,LoadState,ActiveState,SubState,UnitFileState,NeedDaemonReload -- ' + ' '.join(SHOWN_UNITS)]
    inactive = {'object': 'gpustack.service', 'field': 'ActiveState', 'want': 'active', 'got': 'inactive'}
    reload = {'object': 'kvpin-watchdog.service', 'field': 'NeedDaemonReload', 'want': 'no', 'got': 'yes'}
    assert summarize(results) == {
        'in_sync': False,
        'checks': {
            'worker': {'in_sync': False, 'drift': ['gpustack.service: ActiveState inactive (dead), wanted active'],
                       'drift_items': [inactive]},
            'other': {'in_sync': False, 'drift': ['kvpin-watchdog.service: unit file changed on disk, needs daemon-reload'],
                      'drift_items': [reload]},
            'same-unit-again': {'in_sync': True, 'drift': [], 'drift_items': []},
        },
        'drift': ['worker: gpustack.service: ActiveState inactive (dead), wanted active',
                  'other: kvpin-watchdog.service: unit file changed on disk, needs daemon-reload'],
        'drift_items': [dict(inactive, check='worker'), dict(reload, check='other')],
    }


def test_no_units_no_systemctl(tmp_path):
    assert read_unit_states([], systemctl=str(tmp_path / 'missing')) == {}
    assert summarize(evaluate([CheckSpec(name='empty')], systemctl=str(tmp_path / 'missing'))) == {
        'in_sync': True, 'checks': {'empty': {'in_sync': True, 'drift': [], 'drift_items': []}}, 'drift': [],
        'drift_items': []}


def test_unit_state_error_wins():
    assert unit_drift(UnitSpec('a.service'), UnitState('a.service', error='boom')) == ['a.service: state unknown (boom)']


# -- http ----------------------------------------------------------------------------------

class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # pylint: disable=invalid-name
        if self.path == '/moved':
            self.send_response(302)
            self.send_header('Location', '/healthz')
            self.send_header('Content-Length', '0')
            self.end_headers()
            return
        code = {'/healthz': 200, '/down': 503}.get(self.path, 404)
        body = b'{"status": "ok"}'
        self.send_response(code)
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format, *args):  # pylint: disable=redefined-builtin
        pass


@pytest.fixture(scope='module')
def http_server():
    server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield 'http://127.0.0.1:%d' % server.server_address[1]
    server.shutdown()
    server.server_close()


def _unused_port():
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


def test_http_status(http_server):
    assert observed_http_drift(HttpSpec(url=http_server + '/healthz')) == []
    assert observed_http_drift(HttpSpec(url=http_server + '/down')) == ['%s/down: status 503, wanted 200' % http_server]
    assert observed_http_drift(HttpSpec(url=http_server + '/down', status=503)) == []


def test_redirect_is_not_followed(http_server):
    assert observed_http_drift(HttpSpec(url=http_server + '/moved')) == ['%s/moved: status 302, wanted 200' % http_server]
    assert observed_http_drift(HttpSpec(url=http_server + '/moved', status=302)) == []


def test_proxy_settings_are_ignored(http_server, monkeypatch):
    port = _unused_port()
    for name in ('http_proxy', 'HTTP_PROXY', 'all_proxy'):
        monkeypatch.setenv(name, 'http://127.0.0.1:%d' % port)
    monkeypatch.delenv('no_proxy', raising=False)
    monkeypatch.delenv('NO_PROXY', raising=False)
    assert observed_http_drift(HttpSpec(url=http_server + '/healthz')) == []


def test_refused_port_is_drift():
    url = 'http://127.0.0.1:%d/healthz' % _unused_port()
    assert observed_http_drift(HttpSpec(url=url)) == ['%s: no answer (Connection refused), wanted status 200' % url]


def test_silent_server_times_out():
    with socket.socket() as listener:
        listener.bind(('127.0.0.1', 0))
        listener.listen(1)  # the kernel completes the connection; nothing ever answers
        url = 'http://127.0.0.1:%d/healthz' % listener.getsockname()[1]
        assert observed_http_drift(HttpSpec(url=url, timeout=0.3)) == ['%s: no answer (timed out after 0.3s), wanted status 200' % url]


# -- python packages -----------------------------------------------------------------------

def test_python_packages_as_the_interpreter_sees_them(tmp_path):
    good = PythonPackageSpec(python=sys.executable, name='pytest', version=PYTEST_VERSION)
    wrong = PythonPackageSpec(python=sys.executable, name='pytest', version='0.0.1')
    missing = PythonPackageSpec(python=sys.executable, name='kvpin-no-such-package', version='1.0')
    no_python = PythonPackageSpec(python=str(tmp_path / 'venv' / 'bin' / 'python'), name='gpustack', version='0.7.1')
    drift = python_package_drift([good, wrong, missing, no_python], run_command=RUN)
    assert drift[good] == []
    assert drift[wrong] == ['pytest 0.0.1 in %s: installed %s' % (sys.executable, PYTEST_VERSION)]
    assert drift[missing] == ['kvpin-no-such-package 1.0 in %s: not installed' % sys.executable]
    assert drift[no_python] == ['gpustack 0.7.1 in %s/venv/bin/python: interpreter missing' % tmp_path]


def test_pythonpath_of_the_module_does_not_count(tmp_path, monkeypatch):
    """A distribution only on PYTHONPATH is not what the interpreter itself has installed."""
    dist_info = tmp_path / 'kvpin_shadow-9.9.dist-info'
    dist_info.mkdir()
    (dist_info / 'METADATA').write_text('Metadata-Version: 2.1\nName: kvpin-shadow\nVersion: 9.9\n')
    monkeypatch.setenv('PYTHONPATH', str(tmp_path))
    spec = PythonPackageSpec(python=sys.executable, name='kvpin-shadow', version='9.9')
    assert python_package_drift([spec], run_command=RUN)[spec] == ['kvpin-shadow 9.9 in %s: not installed' % sys.executable]


def test_interpreter_that_fails(tmp_path):
    python = tmp_path / 'python'
    python.write_text('#!/bin/sh\necho "cannot start" >&2\nexit 3\n')
    python.chmod(0o755)
    spec = PythonPackageSpec(python=str(python), name='gpustack', version='0.7.1')
    assert python_package_drift([spec], run_command=RUN)[spec] == ['gpustack 0.7.1 in %s: interpreter failed (rc 3: cannot start)' % python]


# -- everything together -------------------------------------------------------------------

def test_evaluate_and_summarize(tmp_path, http_server):
    config = tmp_path / 'config.yaml'
    config.write_bytes(b'a: 1\n')
    config.chmod(0o600)
    checks = parse_checks([
        {'name': 'gpustack_worker', 'files': [{'path': str(config), 'sha1': sha1(b'a: 1\n'), 'mode': '0600',
                                               'owner': ME, 'group': MY_GROUP},
                                              {'path': str(tmp_path), 'state': 'directory'}],
         'users': [ME], 'groups': [MY_GROUP], 'http': [{'url': http_server + '/healthz'}],
         'python_packages': [{'python': sys.executable, 'name': 'pytest', 'version': PYTEST_VERSION}]},
        {'name': 'serving_watchdog', 'users': ['kvpin-watchdog-missing'],
         'files': [{'path': str(tmp_path / 'watchdog.py'), 'mode': '0755'}]},
    ])
    assert summarize(evaluate(checks, run_command=RUN)) == {
        'in_sync': False,
        'checks': {
            'gpustack_worker': {'in_sync': True, 'drift': [], 'drift_items': []},
            'serving_watchdog': {'in_sync': False,
                                 'drift': ['%s/watchdog.py: missing' % tmp_path, 'user kvpin-watchdog-missing: missing'],
                                 'drift_items': [
                                     {'object': '%s/watchdog.py' % tmp_path, 'field': 'state', 'want': 'file',
                                      'got': 'missing'},
                                     {'object': 'user kvpin-watchdog-missing', 'field': 'state', 'want': 'present',
                                      'got': 'missing'}]},
        },
        'drift': ['serving_watchdog: %s/watchdog.py: missing' % tmp_path,
                  'serving_watchdog: user kvpin-watchdog-missing: missing'],
        'drift_items': [
            {'check': 'serving_watchdog', 'object': '%s/watchdog.py' % tmp_path, 'field': 'state', 'want': 'file',
             'got': 'missing'},
            {'check': 'serving_watchdog', 'object': 'user kvpin-watchdog-missing', 'field': 'state',
             'want': 'present', 'got': 'missing'}],
    }


def test_package_without_version_only_needs_to_be_installed():
    present = PythonPackageSpec(python=sys.executable, name='pytest')
    missing = PythonPackageSpec(python=sys.executable, name='kvpin-surely-not-installed')
    drift = python_package_drift([present, missing], run_command=RUN)
    assert drift[present] == []
    assert drift[missing] == ['kvpin-surely-not-installed (any version) in %s: not installed' % sys.executable]


# Every UnitFileState systemctl(1) documents for is-enabled. Only `enabled` is started at every
# boot by the unit's own [Install] links in /etc; `enabled-runtime` links are in /run (gone at
# the next reboot), linked/static/generated/indirect/alias are not the unit's own enablement.
UNIT_FILE_STATES = ('enabled', 'enabled-runtime', 'linked', 'linked-runtime', 'alias', 'masked',
                    'masked-runtime', 'static', 'indirect', 'disabled', 'generated', 'transient',
                    'bad', '')


def _loaded_running(unit_file_state):
    return UnitState(name='gpustack.service', properties={
        'Id': 'gpustack.service', 'LoadState': 'loaded', 'ActiveState': 'active', 'SubState': 'running',
        'UnitFileState': unit_file_state, 'NeedDaemonReload': 'no'})


@pytest.mark.parametrize('unit_file_state', UNIT_FILE_STATES)
def test_only_enabled_counts_as_enabled(unit_file_state):
    spec = UnitSpec('gpustack.service', enabled=True, active=True)
    drift = unit_drift(spec, _loaded_running(unit_file_state))
    if unit_file_state == 'enabled':
        assert drift == []
    else:
        assert drift == ['gpustack.service: not enabled (UnitFileState %s)' % (unit_file_state or 'empty')]


@pytest.mark.parametrize('unit_file_state', UNIT_FILE_STATES)
def test_wanted_disabled_is_drift_while_enabled_now(unit_file_state):
    """enabled-runtime starts the unit at this boot: drift for a unit wanted disabled."""
    drift = unit_drift(UnitSpec('gpustack.service', enabled=False), _loaded_running(unit_file_state))
    if unit_file_state in ('enabled', 'enabled-runtime'):
        assert drift == ['gpustack.service: enabled (UnitFileState %s), wanted not enabled' % unit_file_state]
    else:
        assert drift == []


@pytest.mark.parametrize('unit_file_state', ['enabled-runtime', 'linked', 'static', 'generated'])
def test_enabled_runtime_and_friends_are_drift_through_the_controller_comparison(unit_file_state):
    """The same rule where site.yml uses it: compare() over an observation gpu_facts returned."""
    [check] = parse_checks([{'name': 'gpustack_worker',
                             'units': [{'name': 'gpustack.service', 'enabled': True, 'active': True}]}])
    observation = {'units': {'gpustack.service': {'properties': dict(_loaded_running(unit_file_state).properties),
                                                  'error': None}}}
    summary = summarize(compare([check], observation))
    assert summary['in_sync'] is False
    assert summary['drift'] == ['gpustack_worker: gpustack.service: not enabled (UnitFileState %s)' % unit_file_state]
    observation['units']['gpustack.service']['properties']['UnitFileState'] = 'enabled'
    assert summarize(compare([check], observation))['in_sync'] is True


def test_read_sha1_observes_the_content_for_a_later_comparison(tmp_path):
    """site.yml's probe gets paths-only checks (read_sha1, no wanted sha1); the comparison after
    planning, on the controller, gets the full ones and must see the content."""
    path = tmp_path / 'config.yaml'
    path.write_bytes(b'worker: 1\n')
    probe_checks = parse_checks([{'name': 'worker', 'files': [{'path': str(path), 'read_sha1': True}]}])
    observation = json.loads(json.dumps(observe(probe_checks, run_command=RUN)))
    assert observation['files'][str(path)]['sha1'] == hashlib.sha1(b'worker: 1\n').hexdigest()
    full = parse_checks([{'name': 'worker', 'files': [{'path': str(path), 'sha1': hashlib.sha1(b'worker: 2\n').hexdigest()}]}])
    [result] = compare(full, observation)
    assert [line.split(' (')[0] for line in result.drift] == ['%s: content differs' % path]
    # Without read_sha1 the content is not read, and the comparison says so.
    [result] = compare(full, json.loads(json.dumps(observe(parse_checks([{'name': 'worker', 'files': [{'path': str(path)}]}])))))
    assert result.drift == ['%s: content not observed' % path]
    # read_sha1 compares nothing by itself.
    assert file_drift(probe_checks[0].files[0]) == []


# -- waiting until in sync (the worker's health wait in one round trip) -----------------------

class _Clock:
    """A clock that only moves when the wait sleeps: each try is instant."""

    def __init__(self):
        self.now = 100.0
        self.sleeps = []

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds


def _health_checks(tmp_path, path):
    return parse_checks([{'name': 'health', 'files': [{'path': str(path)}]}])


def test_wait_reads_again_until_in_sync(tmp_path):
    ready = tmp_path / 'ready'
    clock = _Clock()

    def sleep(seconds):
        clock.sleep(seconds)
        if len(clock.sleeps) == 3:
            ready.write_text('up')

    results, tries, waited = evaluate_until_in_sync(_health_checks(tmp_path, ready), 120, 2, clock=clock, sleep=sleep)
    assert summarize(results)['in_sync'] is True
    assert (tries, waited, clock.sleeps) == (4, 6.0, [2, 2, 2])


def test_wait_gives_the_last_tries_drift_when_time_runs_out(tmp_path):
    clock = _Clock()
    results, tries, waited = evaluate_until_in_sync(_health_checks(tmp_path, tmp_path / 'never'), 10, 3,
                                                    clock=clock, sleep=clock.sleep)
    # Tries at 0, 3, 6, 9 s; a fifth would start at 12 s, past the 10 s.
    assert (tries, waited) == (4, 9.0)
    assert summarize(results)['drift'] == ['health: %s: missing' % (tmp_path / 'never')]


def test_no_wait_reads_once(tmp_path):
    clock = _Clock()
    results, tries, waited = evaluate_until_in_sync(_health_checks(tmp_path, tmp_path / 'never'), 0, 2,
                                                    clock=clock, sleep=clock.sleep)
    assert (tries, waited, clock.sleeps) == (1, 0.0, [])
    assert not summarize(results)['in_sync']


def test_wait_on_a_real_url_and_real_time(http_server):
    """/healthz answers at once: one try, no sleep, whatever the timeout."""
    checks = parse_checks([{'name': 'health', 'http': [{'url': http_server + '/healthz', 'status': 200, 'timeout': 2}]}])
    results, tries, waited = evaluate_until_in_sync(checks, 60, 0.1, run_command=RUN)
    assert summarize(results)['in_sync'] is True and tries == 1 and waited < 60


@pytest.mark.parametrize('timeout, delay, field_name', [
    (-1, 2, 'wait_timeout'), (3601, 2, 'wait_timeout'), (float('nan'), 2, 'wait_timeout'), (True, 2, 'wait_timeout'),
    ('10', 2, 'wait_timeout'), (None, 2, 'wait_timeout'), (10, 0, 'wait_delay'), (10, 301, 'wait_delay'),
    (10, float('inf'), 'wait_delay'), (10, False, 'wait_delay'),
])
def test_wait_bounds_name_the_option(timeout, delay, field_name):
    with pytest.raises(NodeStateWaitError) as err:
        check_wait(timeout, delay)
    assert err.value.field == field_name and str(err.value).startswith(field_name + ' ')


def test_wait_bounds_accept_the_edges():
    assert check_wait(0, 0.1) == (0.0, 0.1) and check_wait(3600, 300) == (3600.0, 300.0)


# -- drift items: each difference as data, next to its line (issue 35) ---------------------

_SHA_NODE = '1' * 40
_SHA_WANT = '2' * 40
_FILE = {'kind': 'a file', 'mode': 0o600, 'owner': 'root', 'group': 'root', 'sha1': _SHA_WANT}
_DIR = {'kind': 'a directory', 'mode': 0o750, 'owner': 'root', 'group': 'kvpin-watchdog', 'entries': ['a.json']}
_WANT_FILE = {'path': '/etc/x', 'sha1': _SHA_WANT, 'mode': '0600', 'owner': 'root', 'group': 'root'}
_WANT_DIR = {'path': '/etc/d', 'state': 'directory', 'mode': '0750', 'owner': 'root', 'group': 'kvpin-watchdog',
             'entries': ['a.json']}
_PY = '/opt/venv/bin/python'


def _unit_seen(file_state='disabled', active='inactive', load='loaded', reload='no'):
    return {'properties': {'LoadState': load, 'UnitFileState': file_state, 'ActiveState': active,
                           'SubState': 'dead', 'NeedDaemonReload': reload}, 'error': None}


@pytest.mark.parametrize('check, observation, line, item', [
    # files: missing, not observed, unreadable, another kind, content, mode, owner, group, entries
    ({'files': [_WANT_FILE]}, {'files': {'/etc/x': {'kind': 'missing'}}},
     '/etc/x: missing', ('/etc/x', 'state', 'file', 'missing')),
    ({'files': [_WANT_FILE]}, {},
     '/etc/x: not observed', ('/etc/x', 'state', 'file', None)),
    ({'files': [_WANT_FILE]}, {'files': {'/etc/x': {'error': 'Permission denied'}}},
     '/etc/x: cannot be read (Permission denied)', ('/etc/x', 'state', 'file', None)),
    ({'files': [_WANT_FILE]}, {'files': {'/etc/x': {'kind': 'a symlink', 'mode': 0o777, 'owner': 'root', 'group': 'root'}}},
     '/etc/x: is a symlink, wanted a file', ('/etc/x', 'state', 'file', 'symlink')),
    ({'files': [{'path': '/etc/x', 'state': 'absent'}]}, {'files': {'/etc/x': _FILE}},
     '/etc/x: exists (a file), wanted absent', ('/etc/x', 'state', 'absent', 'file')),
    ({'files': [_WANT_FILE]}, {'files': {'/etc/x': dict(_FILE, sha1=_SHA_NODE)}},
     '/etc/x: content differs (sha1 %s wanted %s)' % (_SHA_NODE, _SHA_WANT), ('/etc/x', 'sha1', _SHA_WANT, _SHA_NODE)),
    ({'files': [_WANT_FILE]}, {'files': {'/etc/x': dict(_FILE, sha1=None, sha1_error='Permission denied')}},
     '/etc/x: content cannot be read (Permission denied)', ('/etc/x', 'sha1', _SHA_WANT, None)),
    ({'files': [_WANT_FILE]}, {'files': {'/etc/x': dict(_FILE, mode=0o644)}},
     '/etc/x: mode 0644, wanted 0600', ('/etc/x', 'mode', '0600', '0644')),
    ({'files': [_WANT_FILE]}, {'files': {'/etc/x': dict(_FILE, owner='nobody')}},
     '/etc/x: owner nobody, wanted root', ('/etc/x', 'owner', 'root', 'nobody')),
    ({'files': [_WANT_FILE]}, {'files': {'/etc/x': dict(_FILE, group='adm')}},
     '/etc/x: group adm, wanted root', ('/etc/x', 'group', 'root', 'adm')),
    ({'files': [_WANT_DIR]}, {'files': {'/etc/d': dict(_DIR, entries=['a.json', 'old.json'])}},
     '/etc/d: unexpected entries old.json', ('/etc/d', 'entries', ['a.json'], ['a.json', 'old.json'])),
    ({'files': [_WANT_DIR]}, {'files': {'/etc/d': dict(_DIR, entries=None, entries_error='Permission denied')}},
     '/etc/d: entries cannot be read (Permission denied)', ('/etc/d', 'entries', ['a.json'], None)),
    # users and groups
    ({'users': ['kvpin-watchdog']}, {'users': {'kvpin-watchdog': None}},
     'user kvpin-watchdog: missing', ('user kvpin-watchdog', 'state', 'present', 'missing')),
    ({'users': [{'name': 'w', 'shell': '/usr/sbin/nologin'}]},
     {'users': {'w': {'group': 'w', 'shell': '/bin/bash', 'home': '/nonexistent'}}},
     'user w: shell /bin/bash, want /usr/sbin/nologin', ('user w', 'shell', '/usr/sbin/nologin', '/bin/bash')),
    ({'users': [{'name': 'w', 'home': '/nonexistent'}]}, {'users': {'w': {'group': 'w', 'shell': '/bin/sh', 'home': '/home/w'}}},
     'user w: home /home/w, want /nonexistent', ('user w', 'home', '/nonexistent', '/home/w')),
    ({'users': [{'name': 'w', 'group': 'w'}]}, {'users': {'w': {'group': 'users', 'shell': '/bin/sh', 'home': '/'}}},
     'user w: group users, want w', ('user w', 'group', 'w', 'users')),
    ({'groups': ['kvpin-watchdog']}, {'groups': {'kvpin-watchdog': False}},
     'group kvpin-watchdog: missing', ('group kvpin-watchdog', 'state', 'present', 'missing')),
    # units
    ({'units': [{'name': 'a.service', 'enabled': True}]}, {'units': {'a.service': _unit_seen('enabled-runtime')}},
     'a.service: not enabled (UnitFileState enabled-runtime)', ('a.service', 'UnitFileState', 'enabled', 'enabled-runtime')),
    ({'units': [{'name': 'a.service', 'enabled': False}]}, {'units': {'a.service': _unit_seen('enabled')}},
     'a.service: enabled (UnitFileState enabled), wanted not enabled',
     ('a.service', 'UnitFileState', 'not enabled', 'enabled')),
    ({'units': [{'name': 'a.service', 'active': True}]}, {'units': {'a.service': _unit_seen()}},
     'a.service: ActiveState inactive (dead), wanted active', ('a.service', 'ActiveState', 'active', 'inactive')),
    ({'units': [{'name': 'a.service', 'active': False}]}, {'units': {'a.service': _unit_seen(active='activating')}},
     'a.service: ActiveState activating (dead), wanted not active', ('a.service', 'ActiveState', 'not active', 'activating')),
    ({'units': [{'name': 'a.service'}]}, {'units': {'a.service': _unit_seen(reload='yes')}},
     'a.service: unit file changed on disk, needs daemon-reload', ('a.service', 'NeedDaemonReload', 'no', 'yes')),
    ({'units': [{'name': 'a.service', 'enabled': False}]}, {'units': {'a.service': {'error': 'systemctl not found'}}},
     'a.service: state unknown (systemctl not found)', ('a.service', 'state', 'readable', None)),
    # health URLs
    ({'http': [{'url': 'http://127.0.0.1:10150/healthz'}]},
     {'http': {'http://127.0.0.1:10150/healthz': {'status': 503, 'error': None}}},
     'http://127.0.0.1:10150/healthz: status 503, wanted 200', ('http://127.0.0.1:10150/healthz', 'status', 200, 503)),
    ({'http': [{'url': 'http://127.0.0.1:10150/healthz'}]},
     {'http': {'http://127.0.0.1:10150/healthz': {'status': None, 'error': 'Connection refused'}}},
     'http://127.0.0.1:10150/healthz: no answer (Connection refused), wanted status 200',
     ('http://127.0.0.1:10150/healthz', 'status', 200, None)),
    # package versions
    ({'python_packages': [{'python': _PY, 'name': 'gpustack', 'version': '0.7.1'}]},
     {'python_packages': {_PY: {'versions': {'gpustack': '0.7.0'}}}},
     'gpustack 0.7.1 in %s: installed 0.7.0' % _PY, ('gpustack in %s' % _PY, 'version', '0.7.1', '0.7.0')),
    ({'python_packages': [{'python': _PY, 'name': 'gpustack', 'version': '0.7.1'}]},
     {'python_packages': {_PY: {'versions': {'gpustack': None}}}},
     'gpustack 0.7.1 in %s: not installed' % _PY, ('gpustack in %s' % _PY, 'state', 'present', 'missing')),
    ({'python_packages': [{'python': _PY, 'name': 'gpustack'}]},
     {'python_packages': {_PY: {'error': 'interpreter missing'}}},
     'gpustack (any version) in %s: interpreter missing' % _PY, ('gpustack in %s' % _PY, 'version', None, None)),
])
def test_each_drift_line_comes_with_its_item(check, observation, line, item):
    [result] = compare(parse_checks([dict(check, name='c')]), observation)
    want = dict(zip(('object', 'field', 'want', 'got'), item))
    assert result.drift == [line]
    assert result.drift_items == [want]
    summary = summarize([result])
    # The lines are plain strings, byte for byte as before; the items stand next to them.
    assert summary['drift'] == ['c: ' + line] and type(summary['checks']['c']['drift'][0]).__name__ == 'str'
    assert summary['checks']['c']['drift_items'] == [want]
    assert summary['drift_items'] == [dict(want, check='c')]
    json.dumps(summary)


def test_an_in_sync_file_has_no_items():
    [result] = compare(parse_checks([{'name': 'c', 'files': [_WANT_FILE, _WANT_DIR]}]),
                       {'files': {'/etc/x': _FILE, '/etc/d': _DIR}})
    assert result.in_sync and result.drift_items == []


def test_several_differences_of_one_file_are_one_item_each_in_line_order():
    [result] = compare(parse_checks([{'name': 'c', 'files': [_WANT_FILE]}]),
                       {'files': {'/etc/x': dict(_FILE, mode=0o644, owner='nobody', sha1=_SHA_NODE)}})
    assert [(i['field'], i['got']) for i in result.drift_items] == [('sha1', _SHA_NODE), ('mode', '0644'), ('owner', 'nobody')]
    assert [line.split(': ', 1)[1].split(' ', 1)[0] for line in result.drift] == ['content', 'mode', 'owner']


def test_a_drift_line_is_its_message_and_keeps_its_item_when_copied():
    [line] = compare(parse_checks([{'name': 'c', 'files': [_WANT_FILE]}]), {'files': {'/etc/x': dict(_FILE, mode=0o644)}})[0].drift
    assert line == '/etc/x: mode 0644, wanted 0600' and str(line) == line
    assert copy.deepcopy(line).item == line.item == {'object': '/etc/x', 'field': 'mode', 'want': '0600', 'got': '0644'}


def test_a_command_is_bounded_by_timeout_and_a_hung_one_is_named(tmp_path):
    """AnsibleModule.run_command has no timeout: the runner puts coreutils' timeout(1) in front,
    so a hung systemctl or interpreter is a named reason, not a probe that never answers."""
    hung = tmp_path / 'systemctl'
    hung.write_text('#!/bin/sh\nsleep 30\n')
    hung.chmod(0o755)
    with pytest.raises(Exception, match=r'^timed out after 1 s$'):
        run_bounded(RUN, [str(hung)], 1)
    with pytest.raises(Exception, match='No such file or directory'):
        run_bounded(RUN, [str(tmp_path / 'missing')], 5)
    assert run_bounded(RUN, ['sh', '-c', 'echo out; echo err >&2; exit 3'], 5) == (3, 'out\n', 'err\n')


def test_units_without_a_runner_is_a_programming_error_not_a_silent_pass(tmp_path):
    with pytest.raises(ValueError, match='a command runner is needed'):
        read_unit_states(['a.service'], systemctl=str(tmp_path / 'systemctl'))
