# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.kvpin.fleet.plugins.filter.kvpin import FilterModule
from ansible_collections.kvpin.fleet.plugins.module_utils.units import GiB

FILTER = FilterModule().filters()['kvpin_system_reserved']


def test_filter_is_the_module_utils_computation():
    assert FILTER([{'system_reserved_bytes': GiB + 1}], 2, 1) == {'ram': 2, 'vram': 2}
    assert FILTER([], 2) == {'ram': 2, 'vram': 0}


def test_bad_input_is_a_filter_error_naming_the_filter():
    with pytest.raises(AnsibleFilterError, match='kvpin_system_reserved: plans\\[0\\].system_reserved_bytes'):
        FILTER([{'system_reserved_bytes': -5}], 2, 1)
