# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A role's table of managed files -> node_state file checks (content as sha1, never echoed)."""
from __future__ import annotations

import hashlib

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.kvpin.fleet.plugins.filter.kvpin import FilterModule
from ansible_collections.kvpin.fleet.plugins.module_utils.facts.managed_files import ManagedFileError, file_checks, lifecycle
from ansible_collections.kvpin.fleet.plugins.module_utils.facts.node_state import parse_checks

SECRET = 'token: verysecret\n'


def test_content_becomes_its_sha1_and_everything_else_passes_through():
    table = [{'path': '/var/lib/gpustack', 'state': 'directory', 'owner': 'root', 'group': 'root', 'mode': '0750'},
             {'path': '/var/lib/gpustack/config.yaml', 'content': SECRET, 'owner': 'root', 'group': 'root',
              'mode': '0600'},
             {'path': '/etc/kvpin-watchdog', 'state': 'directory', 'entries': ['a.json']}]
    checks = file_checks(table)
    assert checks == [table[0],
                      {'path': '/var/lib/gpustack/config.yaml', 'sha1': hashlib.sha1(SECRET.encode()).hexdigest(),
                       'owner': 'root', 'group': 'root', 'mode': '0600'},
                      table[2]]
    assert SECRET not in repr(checks)
    # What node_state accepts as a check.
    parse_checks([{'name': 'role', 'files': checks}])


def test_the_sha1_is_the_utf8_of_the_content_like_ansibles_hash_filter():
    assert file_checks([{'path': '/x', 'content': 'é\n'}])[0]['sha1'] == hashlib.sha1('é\n'.encode('utf-8')).hexdigest()
    assert file_checks([{'path': '/x', 'content': ''}])[0]['sha1'] == hashlib.sha1(b'').hexdigest()


@pytest.mark.parametrize('table, message', [
    ('not a list', 'expected a list of file entries, got str'),
    ([['/x']], r'files\[0\]: must be a dict, got list'),
    ([{'path': '/x', 'sha1': 'ab'}], r'files\[0\] \(/x\): unknown key\(s\) sha1'),
    ([{'path': 'relative', 'mode': '0600'}], r"files\[0\] \(relative\): path must be an absolute path, got 'relative'"),
    ([{'mode': '0600'}], r'files\[0\]: path must be an absolute path, got None'),
    ([{'path': '/x', 'content': 5}], r'files\[0\] \(/x\): content must be a string, got int'),
    ([{'path': '/d', 'state': 'directory', 'content': SECRET}], r'files\[0\] \(/d\): content only applies to state file'),
    ([{'path': '/x'}, {'path': '/x', 'mode': '0600'}], r'files\[1\] \(/x\): the table already has an entry'),
])
def test_bad_tables_are_refused_naming_the_entry(table, message):
    with pytest.raises(ManagedFileError, match=message) as info:
        file_checks(table)
    assert 'verysecret' not in str(info.value)


def test_the_filter_is_the_function_and_names_itself_in_errors():
    kvpin_file_checks = FilterModule().filters()['kvpin_file_checks']
    assert kvpin_file_checks([{'path': '/x', 'content': 'a'}]) == file_checks([{'path': '/x', 'content': 'a'}])
    with pytest.raises(AnsibleFilterError, match=r'kvpin_file_checks: files\[0\]: must be a dict'):
        kvpin_file_checks([3])


class _ContentNeverRead(dict):
    """A table row as Ansible 2.19 hands it to a filter (lazy): reading ``content`` would
    render its template; here it fails the test."""

    def __getitem__(self, key):
        if key == 'content':
            raise AssertionError('paths_only read the content')
        return dict.__getitem__(self, key)

    def get(self, key, default=None):
        if key == 'content':
            raise AssertionError('paths_only read the content')
        return dict.get(self, key, default)

    def items(self):
        raise AssertionError('items() reads every value, the content too')

    def values(self):
        raise AssertionError('values() reads every value, the content too')


def test_paths_only_says_read_the_sha1_and_never_reads_the_content():
    table = [_ContentNeverRead(path='/var/lib/gpustack', state='directory', mode='0750'),
             _ContentNeverRead(path='/var/lib/gpustack/config.yaml', content=SECRET, owner='root', mode='0600')]
    checks = file_checks(table, paths_only=True)
    assert checks == [{'path': '/var/lib/gpustack', 'state': 'directory', 'mode': '0750'},
                      {'path': '/var/lib/gpustack/config.yaml', 'read_sha1': True, 'owner': 'root', 'mode': '0600'}]
    [check] = parse_checks([{'name': 'role', 'files': checks}])
    assert check.files[1].read_sha1 and check.files[1].sha1 is None
    # The full checks of the same table (what the comparison gets) still read and hash it.
    assert file_checks([dict(row) for row in table])[1]['sha1'] == hashlib.sha1(SECRET.encode()).hexdigest()
    # Content on a directory is refused either way.
    with pytest.raises(ManagedFileError, match=r'content only applies to state file'):
        file_checks([_ContentNeverRead(path='/d', state='directory', content='x')], paths_only=True)


def test_the_filter_takes_paths_only_as_a_bool():
    kvpin_file_checks = FilterModule().filters()['kvpin_file_checks']
    assert kvpin_file_checks([{'path': '/x', 'content': 'a'}], paths_only=True) == [{'path': '/x', 'read_sha1': True}]
    with pytest.raises(AnsibleFilterError, match=r"kvpin_file_checks: paths_only must be true or false, got 'yes'"):
        kvpin_file_checks([{'path': '/x', 'content': 'a'}], paths_only='yes')


# -- the lifecycle columns (issue 35, item 5) -----------------------------------------------

TABLE = [
    {'path': '/var/lib/gpustack', 'state': 'directory', 'owner': 'root', 'group': 'root', 'mode': '0750'},
    {'path': '/var/lib/gpustack/config.yaml', 'content': SECRET, 'owner': 'root', 'group': 'root', 'mode': '0600',
     'backup': True, 'restart': 'worker restart'},
    {'path': '/etc/systemd/system/w.service', 'content': '[Unit]\n', 'owner': 'root', 'group': 'root', 'mode': '0644',
     'backup': True, 'restart': 'worker restart', 'verify_unit': True},
    {'path': '/etc/systemd/system/s.timer', 'content': '[Timer]\n', 'mode': '0644', 'restart': 'daemon-reload'},
    {'path': '/etc/k.json', 'content': '{}', 'mode': '0640', 'validate': 'check %s'},
]


def _written(changed=(), created=(), backups=True):
    paths = [row['path'] for row in TABLE]
    return {'changed_paths': [p for p in paths if p in changed or p in created],
            'files': [{'path': p, 'changed': p in changed or p in created, 'created': p in created,
                       'backup_file': p + '.bak' if backups and p in changed else ''} for p in paths]}


def test_file_checks_leave_the_lifecycle_columns_out():
    checks = file_checks(TABLE)
    assert all(set(check) <= {'path', 'state', 'sha1', 'mode', 'owner', 'group'} for check in checks)
    parse_checks([{'name': 'role', 'files': checks}])


def test_the_lifecycle_lists_come_from_the_columns():
    assert lifecycle(TABLE) == {
        'restart': {'worker restart': ['/var/lib/gpustack/config.yaml', '/etc/systemd/system/w.service'],
                    'daemon-reload': ['/etc/systemd/system/s.timer']},
        'backup': ['/var/lib/gpustack/config.yaml', '/etc/systemd/system/w.service'],
        'verify_unit': ['/etc/systemd/system/w.service'],
        'restart_needed': [], 'restore': [], 'created': [], 'backup_files': []}


def test_what_a_write_means_for_handlers_rollback_and_cleanup():
    # Every row replaced (even a directory or a file without backup reporting one: only backup rows count).
    done = lifecycle(TABLE, _written(changed=[row['path'] for row in TABLE]))
    assert done['restart_needed'] == ['worker restart', 'daemon-reload']
    assert done['restore'] == [
        {'backup': '/var/lib/gpustack/config.yaml.bak', 'dest': '/var/lib/gpustack/config.yaml', 'owner': 'root',
         'group': 'root', 'mode': '0600'},
        {'backup': '/etc/systemd/system/w.service.bak', 'dest': '/etc/systemd/system/w.service', 'owner': 'root',
         'group': 'root', 'mode': '0644'}]
    assert done['created'] == [] and done['backup_files'] == [r['backup'] for r in done['restore']]
    # A new unit: nothing to restore, removed by a rollback; only a timer: systemd reloads.
    new = lifecycle(TABLE, _written(created=['/etc/systemd/system/w.service']))
    assert (new['restart_needed'], new['restore'], new['created']) == (
        ['worker restart'], [], ['/etc/systemd/system/w.service'])
    assert lifecycle(TABLE, _written(changed=['/etc/systemd/system/s.timer']))['restart_needed'] == ['daemon-reload']
    assert lifecycle(TABLE, _written(changed=['/var/lib/gpustack', '/etc/k.json']))['restart_needed'] == []
    # The write did not run (a tag skipped it): nothing at all.
    assert lifecycle(TABLE, {}) == lifecycle(TABLE, None) == lifecycle(TABLE)


def test_a_new_row_is_picked_up_by_every_list():
    row = {'path': '/var/lib/gpustack/new.conf', 'content': 'x', 'owner': 'root', 'group': 'root', 'mode': '0640',
           'backup': True, 'restart': 'worker restart'}
    table = TABLE + [row]
    assert row['path'] in lifecycle(table)['restart']['worker restart'] and row['path'] in lifecycle(table)['backup']
    written = {'changed_paths': [row['path']],
               'files': [{'path': row['path'], 'changed': True, 'created': False, 'backup_file': '/b'}]}
    done = lifecycle(table, written)
    assert done['restart_needed'] == ['worker restart'] and done['backup_files'] == ['/b']
    assert done['restore'] == [{'backup': '/b', 'dest': row['path'], 'owner': 'root', 'group': 'root', 'mode': '0640'}]
    created = lifecycle(table, {'changed_paths': [row['path']], 'files': [{'path': row['path'], 'created': True}]})
    assert created['created'] == [row['path']]


def test_the_lifecycle_never_reads_the_content():
    table = [_ContentNeverRead(row) for row in TABLE]
    assert lifecycle(table, _written(changed=[row['path'] for row in TABLE]))['restart_needed']


@pytest.mark.parametrize('table, written, message', [
    ([{'path': '/x', 'backup': 'yes'}], None, r"files\[0\] \(/x\): backup must be true or false, got 'yes'"),
    ([{'path': '/x', 'verify_unit': 1}], None, r'files\[0\] \(/x\): verify_unit must be true or false'),
    ([{'path': '/x', 'restart': ' '}], None, r'files\[0\] \(/x\): restart must be a handler name or none'),
    ([{'path': '/d', 'state': 'directory', 'backup': True}], None, r'backup and verify_unit only apply to state file'),
    ([{'path': 'x'}], None, r'path must be an absolute path'),
    ([{'path': '/x'}], ['not', 'a', 'result'], r'written: expected the registered result of kvpin.fleet.managed_files'),
    ([{'path': '/x'}], {'files': [{'changed': True}]}, r'written: files must be a list of results with a path each'),
])
def test_bad_lifecycle_input_is_refused_naming_the_row(table, written, message):
    with pytest.raises(ManagedFileError, match=message):
        lifecycle(table, written)
    kvpin_managed_lifecycle = FilterModule().filters()['kvpin_managed_lifecycle']
    with pytest.raises(AnsibleFilterError, match='kvpin_managed_lifecycle: '):
        kvpin_managed_lifecycle(table, written)
