# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A role's table of managed files -> node_state file checks (content as sha1, never echoed)."""
from __future__ import annotations

import hashlib

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.kvpin.fleet.plugins.filter.kvpin import FilterModule
from ansible_collections.kvpin.fleet.plugins.module_utils.facts.managed_files import ManagedFileError, file_checks
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
