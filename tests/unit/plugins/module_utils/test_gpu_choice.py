# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The planner's GPU choice for a vLLM deployment that pins no GPUs (module_utils/gpu_choice.py,
through serving_plan.build_plan with the real planner): on a node of mixed cards it picks the
single card or the group of identical cards that fits best, says what it compared, never
overrides a pin, and refuses only when no candidate fits."""

import json

import pytest

from ansible_collections.kvpin.fleet.plugins.module_utils.plan import gpu_choice
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.plan_types import PlanInputError, Traffic
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.serving_plan import (
    build_plan, plan_report, serving_plan_result)
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.vllm_memory import plan_vllm
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.model_loaders import resolve_model

RTX4090 = ('NVIDIA GeForce RTX 4090', 25757220864, '8.9')    # NVML totals of the lab fixtures
A6000 = ('NVIDIA RTX A6000', 51527024640, '8.6')
MODEL_8B = 'meta-llama/Llama-3.1-8B-Instruct'
MODEL_70B = 'meta-llama/Llama-3.3-70B-Instruct'


def gpu(index, card):
    name, total, capability = card
    return dict(index=index, uuid='GPU-%d' % index, name=name, memory_total=total, memory_used=0,
                memory_free=total, compute_capability=capability)


def node(*cards):
    return [gpu(index, card) for index, card in enumerate(cards)]


def params(gpus, model=MODEL_8B, **changes):
    base = dict(backend='vllm', backend_version='0.10.1.1', model=model, gpus=gpus,
                prompt_tokens_p99=4096, max_output_tokens=512, max_concurrency=32, gpu_memory_utilization=0.91)
    base.update(changes)
    return base


def test_8b_on_a_4090_next_to_an_a6000_runs_on_the_a6000_alone_and_says_why():
    # The lab node lab-4090x2 after its card 1 was swapped: 4090 at 0, A6000 at 1.
    plan = build_plan(params(node(RTX4090, A6000)))
    assert plan.feasible, plan.not_fitting
    assert plan.gpu_indexes == [1]
    assert [row.index for row in plan.memory] == [1] and plan.memory[0].name == A6000[0]
    assert '--tensor-parallel-size=1' in plan.args
    choice = plan.gpu_choice
    assert choice['gpu_indexes'] == [1]
    # Both single cards fit the 8B model; there is no TP group (no two cards of one kind).
    assert [(c['gpu_indexes'], c['feasible']) for c in choice['candidates']] == [([1], True), ([0], True)]
    a6000, rtx = choice['candidates']
    # Why the A6000: same number of GPUs, the larger KV pool; the 4090's pool is short of the
    # declared 32 x 4608 tokens (negative headroom), the A6000's holds them.
    assert a6000['kv_cache_tokens'] > rtx['kv_cache_tokens'] > 0
    assert a6000['kv_headroom_bytes'] > 0 > rtx['kv_headroom_bytes']
    assert a6000['kv_cache_bytes'] == plan.memory[0].kv_cache
    needed = 32 * 4608
    assert a6000['kv_headroom_bytes'] == a6000['kv_cache_bytes'] - -(-needed * a6000['kv_cache_bytes']
                                                                     // a6000['kv_cache_tokens'])
    reason = plan.reasons['gpu_indexes']
    assert 'GPUs [1] (NVIDIA RTX A6000, TP 1)' in reason and 'largest KV pool' in reason
    assert 'KV headroom %d B' % rtx['kv_headroom_bytes'] in reason
    assert 'auto: 1' in plan.reasons['tensor_parallel_size']
    assert 'gpu_indexes: [1]' in plan_report(plan)


def test_the_chosen_plan_is_the_engine_planners_plan_on_those_gpus():
    gpus = node(RTX4090, A6000)
    plan = build_plan(params(gpus))
    direct = plan_vllm(resolve_model(MODEL_8B), [gpus[1]], Traffic(4096, 512, 32),
                       {'gpu_memory_utilization': 0.91, 'tensor_parallel_size': 1}, '0.10.1.1')
    assert plan.args == direct.args and plan.memory == direct.memory
    assert plan.vram_claim_bytes == direct.vram_claim_bytes


def test_a_node_of_one_kind_keeps_the_plan_it_had():
    """2 x 4090 (the lab node before the swap): the smallest group that fits, the first card,
    as vLLM's own auto TP planned it on the node's GPUs."""
    gpus = node(RTX4090, RTX4090)
    plan = build_plan(params(gpus))
    before = plan_vllm(resolve_model(MODEL_8B), gpus, Traffic(4096, 512, 32),
                       {'gpu_memory_utilization': 0.91}, '0.10.1.1')
    assert plan.gpu_indexes == [0]
    assert plan.args == before.args and plan.memory == before.memory
    assert [c['gpu_indexes'] for c in plan.gpu_choice['candidates']] == [[0], [0, 1]]


def test_70b_fits_only_on_the_group_of_four_identical_cards():
    gpus = node(RTX4090, A6000, A6000, A6000, A6000)
    plan = build_plan(params(gpus, model=MODEL_70B, prompt_tokens_p99=11000, max_output_tokens=1024,
                             gpu_memory_utilization=None))
    assert plan.feasible, plan.not_fitting
    assert plan.gpu_indexes == [1, 2, 3, 4]
    assert '--tensor-parallel-size=4' in plan.args
    assert [row.index for row in plan.memory] == [1, 2, 3, 4]
    verdicts = {tuple(c['gpu_indexes']): c['feasible'] for c in plan.gpu_choice['candidates']}
    assert verdicts == {(1, 2, 3, 4): True, (1, 2): False, (0,): False, (1,): False}


def test_a_tp_size_the_user_set_is_planned_on_identical_cards_only():
    gpus = node(A6000, RTX4090, RTX4090)
    plan = build_plan(params(gpus, tensor_parallel_size=2, gpu_memory_utilization=None))
    assert plan.feasible and plan.gpu_indexes == [1, 2]
    assert plan.reasons['tensor_parallel_size'] == 'set by the user (2)'
    assert [c['gpu_indexes'] for c in plan.gpu_choice['candidates']] == [[1, 2]]


def test_a_tp_size_no_kind_has_cards_for_is_refused_naming_the_kinds():
    with pytest.raises(PlanInputError) as raised:
        build_plan(params(node(RTX4090, A6000), tensor_parallel_size=2))
    assert raised.value.field == 'gpus'
    assert 'one kind' in str(raised.value) and 'index 0' in str(raised.value) and 'index 1' in str(raised.value)


def test_nothing_fits_is_an_infeasible_plan_listing_every_candidate():
    result = serving_plan_result(params(node(RTX4090, A6000), model='meta-llama/Llama-3.1-405B',
                                        gpu_memory_utilization=None))
    assert result['failed'] and not result['plan']['feasible']
    candidates = result['plan']['gpu_choice']['candidates']
    assert sorted(c['gpu_indexes'] for c in candidates) == [[0], [1]]
    assert all(not c['feasible'] and c['verdict'].startswith('does not fit') for c in candidates)
    first = result['plan']['not_fitting'][0]
    assert first.startswith('no GPU choice of NVIDIA GeForce RTX 4090 25757220864 B x1 (index 0); '
                            'NVIDIA RTX A6000 51527024640 B x1 (index 1) fits')
    assert 'GPUs [0] (NVIDIA GeForce RTX 4090, TP 1): does not fit' in first
    assert 'GPUs [1] (NVIDIA RTX A6000, TP 1): does not fit' in first
    assert 'no GPU choice of' in result['msg']
    # The plan shown is the candidate with the most memory.
    assert result['plan']['gpu_indexes'] == [1]


def test_a_pin_is_never_re_chosen():
    gpus = node(RTX4090, A6000)
    plan = build_plan(params(gpus, gpu_indexes=[0]))
    assert plan.gpu_indexes == [0] and plan.gpu_choice is None
    assert [row.index for row in plan.memory] == [0]
    assert plan.reasons['gpu_indexes'].startswith('pinned by the deployment (gpu_indexes [0])')


def test_a_pinned_group_of_mixed_cards_is_refused_naming_gpus_and_kinds():
    with pytest.raises(PlanInputError) as raised:
        build_plan(params(node(RTX4090, A6000), gpu_indexes=[0, 1]))
    message = str(raised.value)
    assert raised.value.field == 'gpu_indexes'
    assert message.startswith('gpu_indexes: pins [0, 1] to GPUs of different kinds: '
                              'NVIDIA GeForce RTX 4090 25757220864 B x1 (index 0); '
                              'NVIDIA RTX A6000 51527024640 B x1 (index 1); vLLM tensor parallelism needs GPUs of one kind')
    assert 'leave gpu_indexes out' in message and 'llama-box' in message
    # Even when one of the pinned cards alone would hold the model (the 8B fits either).
    with pytest.raises(PlanInputError):
        build_plan(params(node(RTX4090, A6000), gpu_indexes=[1, 0], tensor_parallel_size=1))


def test_a_pinned_llama_box_plan_carries_its_pin_and_an_unpinned_one_none():
    gpus = node(A6000, RTX4090)
    base = dict(backend='llama-box', backend_version='v0.0.171', model=MODEL_70B, gpus=gpus,
                prompt_tokens_p99=11000, max_output_tokens=1024, max_concurrency=4, quantization='Q4_K_M')
    assert build_plan(dict(base, gpu_indexes=[0])).gpu_indexes == [0]
    unpinned = build_plan(base)
    assert unpinned.gpu_indexes is None and unpinned.gpu_choice is None


def test_the_choice_does_not_depend_on_the_order_of_the_gpu_list():
    gpus = node(RTX4090, A6000, RTX4090)
    first = build_plan(params(gpus))
    second = build_plan(params(list(reversed(gpus))))
    assert first.gpu_indexes == second.gpu_indexes == [1]
    assert first.gpu_choice == second.gpu_choice


def test_a_tp_size_the_heads_do_not_divide_is_a_refused_candidate():
    # 12 attention heads: TP 8 does not divide them; the other sizes are planned.
    config = {'architectures': ['LlamaForCausalLM'], 'model_type': 'llama', 'hidden_size': 1536,
              'num_attention_heads': 12, 'num_key_value_heads': 4, 'num_hidden_layers': 16,
              'intermediate_size': 4096, 'vocab_size': 32000, 'max_position_embeddings': 8192,
              'torch_dtype': 'bfloat16'}
    plan = build_plan(params(node(*[RTX4090] * 8), model=config, max_concurrency=4))
    refused = [c for c in plan.gpu_choice['candidates'] if c['verdict'].startswith('refused')]
    assert [c['tensor_parallel_size'] for c in refused] == [8]
    assert 'not divisible by 8' in refused[0]['verdict']
    assert plan.gpu_indexes == [0]
    # Every size refused: the planner's own refusal comes back.
    with pytest.raises(PlanInputError) as raised:
        build_plan(params(node(*[RTX4090] * 8), model=config, tensor_parallel_size=8))
    assert raised.value.field == 'tensor_parallel_size'


@pytest.mark.parametrize('pin, field, text', [
    ([], 'gpu_indexes', 'non-empty list'),
    ([2], 'gpu_indexes', "GPU 2 not among the node's GPUs [0, 1]"),
    ([0, 0], 'gpu_indexes', 'names a GPU twice'),
    ([-1], 'gpu_indexes[0]', 'got -1'),
    ([True], 'gpu_indexes[0]', 'got True'),
    (['0'], 'gpu_indexes[0]', "got '0'"),
    (list(range(17)), 'gpu_indexes', '17 indexes given'),
    ('0', 'gpu_indexes', "got '0'"),
])
def test_a_bad_pin_names_the_field(pin, field, text):
    with pytest.raises(PlanInputError) as raised:
        build_plan(params(node(RTX4090, A6000), gpu_indexes=pin))
    assert raised.value.field == field
    assert text in str(raised.value)


def test_the_choice_survives_json_as_the_task_result():
    result = serving_plan_result(params(node(RTX4090, A6000)))
    assert json.loads(json.dumps(result))['plan']['gpu_indexes'] == [1]
    assert result['plan']['gpu_choice']['candidates'][0]['verdict'] == 'fits'


def test_candidate_groups_take_the_lowest_indexes_of_each_kind():
    gpus = node(A6000, RTX4090, A6000, RTX4090, RTX4090)
    groups = [(size, [g['index'] for g in group]) for size, group in gpu_choice.candidate_groups(gpus, None)]
    assert groups == [(1, [0]), (2, [0, 2]), (1, [1]), (2, [1, 3])]
    assert gpu_choice.candidate_groups(gpus, 4) == []


def test_a_gpu_listed_twice_is_refused():
    gpus = node(RTX4090, A6000) + [gpu(1, A6000)]
    with pytest.raises(PlanInputError) as raised:
        build_plan(params(gpus))
    assert raised.value.field == 'gpus[2].index'
    assert 'GPU 1 is listed twice' in str(raised.value)
