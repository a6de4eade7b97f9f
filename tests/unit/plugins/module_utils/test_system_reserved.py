# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import pytest

from ansible_collections.kvpin.fleet.plugins.module_utils.plan.system_reserved import (
    SystemReservedError,
    ceil_gib,
    plans_vram_reserved_bytes,
    system_reserved,
)
from ansible_collections.kvpin.fleet.plugins.module_utils.units import GiB, MiB


def test_ceil_gib_rounds_up_never_down():
    assert ceil_gib(0) == 0
    assert ceil_gib(1) == 1
    assert ceil_gib(GiB) == 1
    assert ceil_gib(GiB + 1) == 2
    assert ceil_gib(3 * GiB - MiB) == 3


def test_vram_is_the_largest_plan_reservation_rounded_up():
    plans = [{'system_reserved_bytes': 1200 * MiB}, {'system_reserved_bytes': 2 * GiB + 1}]
    assert system_reserved(plans, ram_gib=2, vram_min_gib=1) == {'ram': 2, 'vram': 3}


def test_floor_applies_when_plans_reserve_less():
    assert system_reserved([{'system_reserved_bytes': 100 * MiB}], 0, 2) == {'ram': 0, 'vram': 2}
    assert system_reserved([], 4, 1) == {'ram': 4, 'vram': 1}
    assert system_reserved(None, 4) == {'ram': 4, 'vram': 0}


def test_plans_without_a_reservation_reserve_nothing():
    # An infeasible plan may carry None; a plan from another backend may lack the key.
    plans = [{'system_reserved_bytes': None}, {'feasible': False}, {'system_reserved_bytes': GiB}]
    assert plans_vram_reserved_bytes(plans) == GiB


def test_exact_gib_is_not_rounded_past():
    assert system_reserved([{'system_reserved_bytes': 5 * GiB}], 2, 1)['vram'] == 5


def test_result_is_ints_gpustack_can_shift():
    result = system_reserved([{'system_reserved_bytes': '3221225472'}], '2', 1)
    assert result == {'ram': 2, 'vram': 3}
    assert all(isinstance(v, int) and not isinstance(v, bool) for v in result.values())


@pytest.mark.parametrize('plans, ram, floor, message', [
    ([{'system_reserved_bytes': -1}], 2, 1, 'must not be negative'),
    ([{'system_reserved_bytes': 1.5}], 2, 1, 'whole number'),
    ([{'system_reserved_bytes': True}], 2, 1, 'boolean'),
    (['not a dict'], 2, 1, 'plans[0] must be a dict'),
    ({'system_reserved_bytes': 1}, 2, 1, 'must be a list'),
    ([], -1, 1, 'ram_gib must not be negative'),
    ([], 'two', 1, 'ram_gib must be an integer'),
    ([], 2, -3, 'vram_min_gib must not be negative'),
])
def test_bad_inputs_say_what_is_wrong(plans, ram, floor, message):
    with pytest.raises(SystemReservedError, match=message.replace('[', r'\[').replace(']', r'\]')):
        system_reserved(plans, ram, floor)
