# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import pytest

from ansible_collections.kvpin.fleet.plugins.module_utils.rollout.batches import (
    MAX_BATCHES, RolloutBatchError, rollout_batches)


@pytest.mark.parametrize('value, expected', [
    (1, 1), (16, 16), ('2', 2), (' 3 ', 3), ('25%', '25%'), ('100%', '100%'), (' 5 % ', '5%'), ('1%', '1%'),
    ([1, '25%', '100%'], [1, '25%', '100%']), (('2', 4), [2, 4]), ([1] * MAX_BATCHES, [1] * MAX_BATCHES),
])
def test_counts_and_shares_are_kept_as_ansible_reads_them(value, expected):
    assert rollout_batches(value) == expected


@pytest.mark.parametrize('value, says', [
    (0, "1..100000 nodes, got 0 (Ansible would run a batch of 0 as the whole fleet"),
    (-1, 'got -1'),
    ('0', "got '0'"),
    (100001, 'got 100001'),
    ('0%', "1%..100%, got '0%'"),
    ('150%', "1%..100%, got '150%'"),
    ('ten', "node count (e.g. 2) or a share of the fleet (e.g. '25%'), got 'ten'"),
    ('12.5%', "got '12.5%'"),
    ('-2', "got '-2'"),
    ('', "got ''"),
    (1.5, 'got float 1.5'),
    (True, 'got bool True'),
    (None, 'got NoneType None'),
    ({'batch': 1}, 'got dict'),
    ('9' * 400, 'node count'),
])
def test_what_ansible_would_misread_is_refused_naming_the_field(value, says):
    with pytest.raises(RolloutBatchError) as err:
        rollout_batches(value)
    assert str(err.value).startswith('kvpin_serial: ')
    assert says in str(err.value)


@pytest.mark.parametrize('value, says', [
    ([], 'kvpin_serial: a list of batches must hold 1..100 entries, got 0'),
    ([1] * (MAX_BATCHES + 1), 'got 101'),
    ([1, 'x'], "kvpin_serial[1]: each batch must be"),
    (['25%', [2]], 'kvpin_serial[1]: each batch must be a node count (e.g. 2) or a share of the fleet'),
    ([1, 2, '101%'], "kvpin_serial[2]: a share of the fleet must be 1%..100%, got '101%'"),
])
def test_a_list_names_the_bad_entry(value, says):
    with pytest.raises(RolloutBatchError, match=None) as err:
        rollout_batches(value)
    assert says in str(err.value)


def test_the_field_name_is_the_callers():
    with pytest.raises(RolloutBatchError, match=r'^serial_override\[0\]: '):
        rollout_batches(['x'], 'serial_override')
