# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""systemd_env: EnvironmentFile bodies read back exactly (through a port of systemd's own
parser, src/basic/env-file.c parse_env_file_internal), whatever quotes, newlines, backslashes,
dollars or unit-file syntax a value holds; bad names and values named, never shown."""

import pytest

from systemd_env_oracle import systemd_parse

from ansible_collections.kvpin.fleet.plugins.module_utils.facts.systemd_env import (
    SystemdEnvError, env_file_content, env_names, quote_env_value,
)

HOSTILE_VALUES = [
    'plain', '', ' leading and trailing ', 'a "quoted" word', "it's", 'x"\nExecStartPre=/bin/sh -c "id >/tmp/pwned',
    'line1\nline2\n', 'back\\slash', 'ends in a backslash\\', 'backslash before newline\\\nnext',
    '$HOME and ${PATH} and `id`', '100%', '%n %h %%', '\r\n', '\t', '#not a comment', ';not either',
    "'single' \"double\"", 'é ü 漢字', '=', 'NAME=other', '\\"', '\\\\\\"\\n',
]


@pytest.mark.parametrize('value', HOSTILE_VALUES)
def test_every_value_reads_back_exactly_through_systemds_parser(value):
    content = env_file_content({'V': value, 'OTHER': 'kept'}, header='managed\nsecond line')
    assert systemd_parse(content) == {'OTHER': 'kept', 'V': value}


def test_header_is_comments_and_lines_are_sorted_by_name():
    content = env_file_content({'B': 2, 'A': True, 'C': 0.5}, header='Ansible managed')
    assert content == '# Ansible managed\nA="true"\nB="2"\nC="0.5"\n'
    assert env_file_content({}) == ''
    assert quote_env_value('a"b$c`d\\e') == '"a\\"b\\$c\\`d\\\\e"'


@pytest.mark.parametrize('environment,message', [
    ({'BAD NAME': 'x'}, "'BAD NAME' is not a variable name"),
    ({'1ST': 'x'}, "'1ST' is not a variable name"),
    ({'A\nExecStartPre': 'x'}, 'is not a variable name'),
    ({'A=B': 'x'}, 'is not a variable name'),
    ({'': 'x'}, 'is not a variable name'),
    (['A=1'], 'must be a dict of NAME: value, got list'),
])
def test_bad_names_are_refused(environment, message):
    with pytest.raises(SystemdEnvError, match=message):
        env_file_content(environment)
    with pytest.raises(SystemdEnvError):
        env_names(environment)


@pytest.mark.parametrize('value,message', [
    (None, 'must be a string or a number, got NoneType'), ({'a': 1}, 'got dict'), (['x'], 'got list'),
    ('se\x00cret', 'NUL character'), ('x' * (128 * 1024 + 1), 'more than 131072'), ('\ud800', 'not valid UTF-8'),
])
def test_bad_values_are_named_not_shown(value, message):
    with pytest.raises(SystemdEnvError, match=message) as error:
        env_file_content({'TOKEN': value}, what='gpustack_worker_environment')
    assert error.value.name == 'TOKEN' and 'gpustack_worker_environment.TOKEN' in str(error.value)
    assert 'se\x00cret' not in str(error.value) and 'xxxx' not in str(error.value)
