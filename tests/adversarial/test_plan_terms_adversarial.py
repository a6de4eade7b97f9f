# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one central check (plan_types.check_plan, applied by serving_plan.build_plan to every
plan): a plan with a negative, non-finite or impossible term is refused, naming the term and
the GPU (issue 11 item 6)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from model_files import GiB, SMALL_LLAMA, params

from ansible_collections.kvpin.fleet.plugins.module_utils.plan import model_loaders as ml
from ansible_collections.kvpin.fleet.plugins.module_utils.plan import serving_plan as sp
from ansible_collections.kvpin.fleet.plugins.module_utils.plan import vllm_memory
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.model_spec import LAYER_SLIDING
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.plan_types import (
    GpuMemory, Plan, PlanTermError, check_plan)


def plan(feasible=True, **gpu_overrides):
    memory = dict(index=2, name='NVIDIA L40S', total=48 * GiB, budget=44 * GiB, weights=30 * GiB,
                  activation=GiB, non_torch=GiB, cuda_graph=GiB, kv_cache=10 * GiB, headroom=3 * GiB,
                  terms={'kv_budget': 10 * GiB, 'cuda_context': 500 << 20})
    memory.update(gpu_overrides)
    return Plan(backend='vllm', backend_version='0.10.1.1', args=[], memory=[GpuMemory(**memory)],
                kv_cache_tokens=1000, max_concurrency_at_max_len=1.0, feasible=feasible, settings={},
                reasons={}, vram_claim_bytes=45 * GiB, system_reserved_bytes=2 * GiB)


def test_a_sound_plan_passes():
    sound = plan()
    assert check_plan(sound) is sound


@pytest.mark.parametrize('term', ['total', 'budget', 'weights', 'activation', 'non_torch', 'cuda_graph',
                                  'kv_cache'])
@pytest.mark.parametrize('feasible', [True, False])
def test_a_negative_amount_is_refused_naming_term_and_gpu(term, feasible):
    with pytest.raises(PlanTermError) as err:
        check_plan(plan(feasible=feasible, **{term: -1}))
    assert err.value.field == 'plan.memory[0].%s' % term
    assert 'GPU 2 (NVIDIA L40S): term %s is negative (-1)' % term in str(err.value)


@pytest.mark.parametrize('value', [math.nan, math.inf, -math.inf, '12', None, True])
def test_a_non_finite_or_non_numeric_term_is_refused(value):
    with pytest.raises(PlanTermError) as err:
        check_plan(plan(kv_cache=value))
    assert err.value.field == 'plan.memory[0].kv_cache'
    assert 'not a finite number' in str(err.value)


def test_a_negative_finer_term_is_refused():
    with pytest.raises(PlanTermError) as err:
        check_plan(plan(terms={'cuda_context': -5}))
    assert err.value.field == 'plan.memory[0].terms.cuda_context'


def test_headroom_and_kv_budget_may_be_negative_only_in_an_infeasible_plan():
    # an infeasible plan shows its shortfall there
    check_plan(plan(feasible=False, headroom=-GiB, terms={'kv_budget': -GiB}))
    with pytest.raises(PlanTermError) as err:
        check_plan(plan(headroom=-GiB))
    assert err.value.field == 'plan.memory[0].headroom'
    with pytest.raises(PlanTermError) as err:
        check_plan(plan(terms={'kv_budget': -1}))
    assert err.value.field == 'plan.memory[0].terms.kv_budget'


def test_a_feasible_plan_holding_more_than_the_gpu_is_refused():
    with pytest.raises(PlanTermError) as err:
        check_plan(plan(weights=47 * GiB))
    assert 'add up to' in str(err.value) and 'more than the GPU total' in str(err.value)


@pytest.mark.parametrize('name, value', [('kv_cache_tokens', -3), ('max_concurrency_at_max_len', math.nan),
                                         ('vram_claim_bytes', -1), ('system_reserved_bytes', math.inf)])
def test_plan_level_figures_are_checked(name, value):
    bad = dataclasses.replace(plan(), **{name: value})
    with pytest.raises(PlanTermError) as err:
        check_plan(bad)
    assert err.value.field == 'plan.%s' % name


@pytest.mark.parametrize('backend, version, extra', [
    ('vllm', '0.10.1.1', {}), ('vllm', '0.20.0', {}),
    ('llama.cpp', 'b6327', {'quantization': 'Q8_0'}), ('llama-box', 'v0.0.171', {'quantization': 'Q4_K_M'})])
def test_negative_window_past_the_loader_is_still_refused_by_the_central_check(backend, version, extra):
    # The loaders refuse a negative sliding_window; a spec built past them (here: handed to
    # build_plan directly) still never becomes a plan: the engines' arithmetic yields negative
    # KV terms, and the one check names them.
    spec = ml.resolve_model(dict(SMALL_LLAMA))
    bad = dataclasses.replace(spec, sliding_window=-4096, layer_kinds=[LAYER_SLIDING] * spec.num_layers)
    with pytest.raises(PlanTermError) as err:
        sp.build_plan(params(backend=backend, backend_version=version, **extra), resolve_model=lambda m: bad)
    assert 'is negative' in str(err.value)
    assert err.value.field.startswith('plan.')


def test_the_task_result_of_a_refused_plan_is_a_normal_failure(monkeypatch):
    real = vllm_memory.plan_vllm

    def planner_with_a_bad_term(*args):
        planned = real(*args)
        planned.memory[0].cuda_graph = -7
        return planned

    monkeypatch.setattr(vllm_memory, 'plan_vllm', planner_with_a_bad_term)
    result = sp.serving_plan_result(params())
    assert result['failed'] and result['field'] == 'plan.memory[0].cuda_graph'
    assert result['msg'].startswith('serving_plan: invalid plan.memory[0].cuda_graph: GPU 0 (NVIDIA RTX A6000)')
    assert 'plan' not in result   # refused: no plan is returned
