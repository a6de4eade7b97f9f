# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Planner type errors name the type a user wrote (int, list, str, dict, float, bool), never the
class Ansible wraps a templated value in (ansible-core 2.19 tags values: ``_AnsibleTaggedInt``
is an int, ``_AnsibleTaggedList`` a list). Issue 39, "Smaller"."""

from __future__ import annotations

import pytest

from ansible_collections.kvpin.fleet.plugins.module_utils.plan.model_spec import check_int_range, ModelSpecError
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.plan_types import (
    PlanInputError, check_gpus, type_name)
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.serving_plan import check_knob_type
from ansible_collections.kvpin.fleet.plugins.module_utils.plan import model_loaders as ml
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.gpu_ledger import LedgerInputError, deployments_from_results
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.system_reserved import (
    SystemReservedError, plans_vram_reserved_bytes)
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.traffic_classes import parse_traffic_classes

GiB = 1 << 30


# What ansible-core 2.19's tagged types look like to a planner: a subclass with a private name.
class _AnsibleTaggedInt(int):
    pass


class _AnsibleTaggedStr(str):
    pass


class _AnsibleTaggedList(list):
    pass


class _AnsibleTaggedDict(dict):
    pass


class _AnsibleTaggedFloat(float):
    pass


def _gpu(**extra):
    entry = dict(index=0, uuid='GPU-0', name='NVIDIA RTX A6000', memory_total=48 * GiB, memory_used=0,
                 memory_free=48 * GiB, compute_capability='8.6')
    entry.update(extra)
    return entry


def _tagged_by_ansible():
    """The real tagged values of the ansible-core in .venv, when it has them (2.19+)."""
    try:
        from ansible._internal._datatag._tags import Origin  # pylint: disable=import-outside-toplevel
    except ImportError:
        return None
    origin = Origin(path='/inventory/host_vars/gpu-01.yml', line_num=3)
    return dict((name, origin.tag(value)) for name, value in
                (('int', 5), ('str', 'x'), ('list', [1]), ('dict', {'a': 1}), ('float', 2.5)))


FAKE = {'int': _AnsibleTaggedInt(5), 'str': _AnsibleTaggedStr('x'), 'list': _AnsibleTaggedList([1]),
        'dict': _AnsibleTaggedDict(a=1), 'float': _AnsibleTaggedFloat(2.5)}


def _sources():
    yield 'fake', FAKE
    real = _tagged_by_ansible()
    if real is not None:
        yield 'ansible', real


@pytest.mark.parametrize('source, values', list(_sources()), ids=lambda v: v if isinstance(v, str) else '')
def test_type_name_is_the_builtin_a_user_wrote(source, values):
    for expected, value in values.items():
        assert type_name(value) == expected, (source, type(value).__name__)


@pytest.mark.parametrize('value, expected', [
    (True, 'bool'), (1, 'int'), (1.5, 'float'), ('a', 'str'), ([1], 'list'), ({}, 'dict'),
    (None, 'null'), ((1, 2), 'list')])
def test_type_name_of_plain_values(value, expected):
    assert type_name(value) == expected


def test_type_name_of_other_objects_is_their_class():
    class Traffic:   # a planner's own type, named as it is
        pass
    assert type_name(Traffic()) == 'Traffic'


@pytest.mark.parametrize('source, values', list(_sources()), ids=lambda v: v if isinstance(v, str) else '')
def test_planner_messages_name_user_types(source, values):
    messages = []
    with pytest.raises(PlanInputError) as err:
        check_knob_type('kv_cache_dtype', values['int'])
    messages.append(str(err.value))
    with pytest.raises(PlanInputError) as err:
        check_knob_type('enforce_eager', values['list'])
    messages.append(str(err.value))
    with pytest.raises(PlanInputError) as err:
        check_gpus(values['dict'])
    messages.append(str(err.value))
    with pytest.raises(PlanInputError) as err:
        check_gpus([_gpu(name=values['int'])])
    messages.append(str(err.value))
    with pytest.raises(PlanInputError) as err:
        check_gpus([values['list']])
    messages.append(str(err.value))
    with pytest.raises(ModelSpecError) as err:
        check_int_range('model', 'num_layers', values['float'], 1, 256)
    messages.append(str(err.value))
    with pytest.raises(ModelSpecError) as err:
        ml.resolve_model(dict(architectures=['LlamaForCausalLM'], hidden_size=64, num_hidden_layers=2,
                              num_attention_heads=4, vocab_size=32, intermediate_size=128,
                              quantization_config=values['list']))
    messages.append(str(err.value))
    joined = '\n'.join(messages)
    assert 'Ansible' not in joined and '_Tagged' not in joined, joined
    assert 'got 5 (int)' in messages[0], messages[0]
    assert '(list)' in messages[1], messages[1]
    assert 'got dict' in messages[2], messages[2]
    assert 'must be a string, got int' in messages[3], messages[3]
    assert 'must be a dict, got list' in messages[4], messages[4]
    assert '(float)' in messages[5], messages[5]
    assert 'got list' in messages[6], messages[6]


@pytest.mark.parametrize('source, values', list(_sources()), ids=lambda v: v if isinstance(v, str) else '')
def test_traffic_classes_reserved_and_ledger_name_user_types(source, values):
    """The planners' other entry points (traffic classes, system reserve, GPU ledger) too."""
    messages = []
    for call, error in ((lambda: parse_traffic_classes(values['dict']), PlanInputError),
                        (lambda: parse_traffic_classes([values['int']]), PlanInputError),
                        (lambda: plans_vram_reserved_bytes(values['str']), SystemReservedError),
                        (lambda: plans_vram_reserved_bytes([values['list']]), SystemReservedError),
                        (lambda: deployments_from_results(values['dict']), LedgerInputError)):
        with pytest.raises(error) as err:
            call()
        messages.append(str(err.value))
    joined = '\n'.join(messages)
    assert '_Tagged' not in joined, joined
    assert 'got dict' in messages[0], messages[0]
    assert 'int' in messages[1], messages[1]
    assert 'got str' in messages[2], messages[2]
    assert 'got list' in messages[3], messages[3]
    assert 'got dict' in messages[4], messages[4]
