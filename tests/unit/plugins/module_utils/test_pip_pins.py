# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import pytest

from ansible_collections.kvpin.fleet.plugins.module_utils.facts.pip_pins import PipPinError, pip_pins


def test_exact_pins_and_bare_names_in_order():
    assert pip_pins(['gpustack==0.7.1', 'cachetools', ' vllm == 0.10.1.1 ']) == [
        {'name': 'gpustack', 'version': '0.7.1'},
        {'name': 'cachetools', 'version': None},
        {'name': 'vllm', 'version': '0.10.1.1'},
    ]


def test_empty():
    assert pip_pins([]) == [] and pip_pins(None) == []


@pytest.mark.parametrize('requirement', ['gpustack>=0.7', 'gpustack[audio]==0.7.1', 'x==1; python_version<"3.9"',
                                         'https://example.invalid/x.whl', 'a==1==2', '', 7])
def test_anything_else_is_refused_naming_it(requirement):
    with pytest.raises(PipPinError) as error:
        pip_pins(['gpustack==0.7.1', requirement])
    assert repr(requirement) in str(error.value)
