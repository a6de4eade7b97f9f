# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""vLLM pipeline parallelism: vLLM's layer split, the bytes of each stage (hand-computed
below), the smallest stage bounding the KV, an uneven VLLM_PP_LAYER_PARTITION across an RTX
A6000 and an RTX 4090 next to llama-box's offload plan, TP x PP, and every refusal."""

from __future__ import annotations

import dataclasses
import os

import pytest
import yaml

from model_specs import llama_70b  # pylint: disable=import-error
from ansible_collections.kvpin.fleet.plugins.module_utils.plan import vllm_memory as vm
from ansible_collections.kvpin.fleet.plugins.module_utils.plan import vllm_pipeline as vp
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.model_spec import (
    LAYER_FULL, LAYER_SLIDING, ModelSpec)
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.plan_types import PlanInputError, Traffic
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.serving_plan import (
    SERVING_PLAN_ARGUMENT_SPEC, plan_vllm_engine, serving_plan_result)
from ansible_collections.kvpin.fleet.plugins.modules import serving_plan as module

A6000 = ('NVIDIA RTX A6000', 51527024640)
RTX4090 = ('NVIDIA GeForce RTX 4090', 25757220864)
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))


def qwen_14b(**over):
    # Qwen2.5-14B-Instruct config.json: 48 layers, hidden 5120, 40 heads / 8 KV heads, vocab 152064
    fields = dict(
        name='Qwen/Qwen2.5-14B-Instruct', source='test', architecture='Qwen2ForCausalLM', num_layers=48,
        hidden_size=5120, intermediate_size=13824, num_attention_heads=40, num_kv_heads=8, head_dim=128,
        vocab_size=152064, max_position_embeddings=32768, tie_word_embeddings=False, dtype_bytes=2,
        layer_kinds=[LAYER_FULL] * 48, param_count=14770033664, weight_bytes=29540067328)
    fields.update(over)
    return ModelSpec(**fields)


def qwen_32b():
    # Qwen2.5-32B-Instruct config.json: 64 layers, hidden 5120, FFN 27648, 40 / 8 heads
    return ModelSpec(
        name='Qwen/Qwen2.5-32B-Instruct', source='test', architecture='Qwen2ForCausalLM', num_layers=64,
        hidden_size=5120, intermediate_size=27648, num_attention_heads=40, num_kv_heads=8, head_dim=128,
        vocab_size=152064, max_position_embeddings=32768, tie_word_embeddings=False, dtype_bytes=2,
        layer_kinds=[LAYER_FULL] * 64, param_count=32763876352, weight_bytes=65527752704)


def gpus(*cards):
    return [dict(index=i, name=name, memory_total=total, memory_used=0, memory_free=total)
            for i, (name, total) in enumerate(cards)]


TRAFFIC = Traffic(prompt_tokens_p99=2000, max_output_tokens=500, max_concurrency=4)
LONG_ONE = Traffic(prompt_tokens_p99=3000, max_output_tokens=1000, max_concurrency=1)
MIXED = gpus(A6000, RTX4090)


# ------------------------------------------------------------------ vLLM's split
@pytest.mark.parametrize('layers, pp, expected', [
    (48, 2, [24, 24]),
    (47, 2, [24, 23]),                   # remainder to partitions[-2]: the first of two
    (61, 4, [15, 15, 16, 15]),           # vllm PR #46217's table, "before"
    (94, 4, [23, 24, 24, 23]),           # same table: the middle stages
    (61, 8, [7, 7, 8, 8, 8, 8, 8, 7]),   # sglang PR #6666, "adapt the new get_pp_indices from vllm"
    (7, 4, [2, 2, 2, 1]),                # r = pp - 1: all but the last
])
def test_default_partition_is_vllms_get_pp_indices(layers, pp, expected):
    partition = vp.default_partition(layers, pp)
    assert partition == expected and sum(partition) == layers
    assert vp.stage_ranges(partition)[-1] == (layers - expected[-1], layers)


# ------------------------------------------------------------------ PP=2 on 2 x 24 GB, by hand
def test_14b_does_not_fit_one_4090():
    plan = plan_vllm_engine(qwen_14b(), gpus(RTX4090), TRAFFIC, {}, '0.11.0')
    assert not plan.feasible and 'exceed the budget' in plan.not_fitting[0]


def test_pp2_on_two_4090s_stage_bytes_by_hand():
    plan = plan_vllm_engine(qwen_14b(), gpus(RTX4090, RTX4090), TRAFFIC,
                            {'pipeline_parallel_size': 2, 'max_num_seqs': 4}, '0.11.0')
    assert plan.feasible, plan.not_fitting
    assert '--pipeline-parallel-size=2' in plan.args and '--tensor-parallel-size=1' in plan.args
    assert 'environment' not in plan.settings          # 48 layers split evenly: no env needed
    first, last = plan.memory
    # embedding = lm_head = 152064 x 5120 x 2 B = 1,557,135,360; final norm 5120 x 2 = 10,240;
    # decoder layers = 29,540,067,328 - 2 x 1,557,135,360 - 10,240 = 26,425,786,368 = 48 x 550,537,216
    assert first.terms['weights_pp_layers'] == last.terms['weights_pp_layers'] == 24 * 550537216
    assert first.terms['weights_pp_embedding'] == 1557135360 and first.terms['weights_pp_lm_head'] == 0
    assert last.terms['weights_pp_embedding'] == 0 and last.terms['weights_pp_lm_head'] == 1557135360 + 10240
    assert first.weights == 14770028544 and last.weights == 14770038784
    # forward pass: 2048 tokens x 2 B x (4 x 5120 + 3 x 13824) = 253,755,392 on both stages;
    # the sampler (4 x 152064 x 38.19 B = 23,229,296 + hidden 28,521,267) only on the last,
    # below the forward pass; the last also receives 2 x 2048 x 5120 x 2 B = 41,943,040
    assert first.activation == 253755392 and first.terms['activation_sampler_warmup'] == 0
    assert last.terms['activation_sampler_warmup'] == 23229296
    assert last.terms['activation_pp_intermediate_tensors'] == 41943040
    assert last.activation == 253755392 + 41943040
    # KV per stage: 24 layers x 2 x 8 heads x 128 x 2 B = 98,304 B per token, 1,572,864 per block
    for gpu in plan.memory:
        assert gpu.terms['kv_bytes_per_token'] == 98304 and gpu.terms['kv_bytes_per_block'] == 1572864
        assert gpu.terms['kv_budget'] == gpu.budget - gpu.weights - gpu.activation - gpu.non_torch
        assert gpu.terms['kv_blocks_stage'] == gpu.terms['kv_budget'] // 1572864
    # the last stage has less left (lm_head + intermediate tensors): it bounds the engine
    assert last.terms['kv_blocks_stage'] < first.terms['kv_blocks_stage']
    assert plan.pipeline['bounding_stage'] == 1
    assert plan.kv_cache_tokens == (last.terms['kv_blocks_stage'] - 1) * 16
    # both stages allocate the engine's (smallest) block count, the null block included
    assert first.kv_cache == last.kv_cache == last.terms['kv_blocks_stage'] * 1572864


def test_pp_nccl_outside_the_budget_from_011_inside_before():
    knobs = {'pipeline_parallel_size': 2, 'max_num_seqs': 4}
    new = plan_vllm_engine(qwen_14b(), gpus(RTX4090, RTX4090), TRAFFIC, knobs, '0.11.0').memory[0]
    old = plan_vllm_engine(qwen_14b(), gpus(RTX4090, RTX4090), TRAFFIC, knobs, '0.10.2').memory[0]
    # one ring connection x 4 PCIe channels x 0.93 GiB / 32
    assert new.terms['pp_nccl_buffers'] == old.terms['pp_nccl_buffers'] == vm.nccl_buffer_bytes(2, RTX4090[0])
    assert new.terms['outside_pp_nccl_buffers'] == new.terms['pp_nccl_buffers']
    assert 'outside_pp_nccl_buffers' not in old.terms
    # what vLLM holds outside the budget is the sum of its parts, the PP group's buffers included
    totals = ('outside_resident', 'outside_required')
    parts = [v for k, v in new.terms.items() if k.startswith('outside_') and k not in totals]
    assert new.terms['outside_resident'] == sum(parts)
    assert new.headroom == new.total - new.budget - new.terms['outside_resident']
    assert new.terms['outside_required'] == (new.terms['outside_resident'] + new.terms['safety_margin']
                                             + new.terms['profiler_underestimate_buffer'])
    assert old.non_torch == new.non_torch + old.terms['pp_nccl_buffers']


def test_remainder_split_is_pinned_in_the_environment():
    spec = qwen_14b(num_layers=47, layer_kinds=[LAYER_FULL] * 47)
    plan = plan_vllm_engine(spec, gpus(RTX4090, RTX4090), TRAFFIC, {'pipeline_parallel_size': 2}, '0.11.0')
    assert plan.pipeline['partition'] == [24, 23] == plan.settings['pp_layer_partition']
    assert plan.settings['environment'] == {'VLLM_PP_LAYER_PARTITION': '24,23'}
    assert [g.terms['pp_stage_layers'] for g in plan.memory] == [24, 23]


def test_tied_embeddings_are_built_on_the_last_stage_too():
    spec = qwen_14b(tie_word_embeddings=True, weight_bytes=29540067328 - 1557135360)
    plan = plan_vllm_engine(spec, gpus(RTX4090, RTX4090), TRAFFIC, {'pipeline_parallel_size': 2}, '0.11.0')
    first, last = plan.memory
    assert first.terms['weights_pp_embedding'] == 1557135360
    assert last.terms['weights_pp_lm_head'] == 1557135360 + 10240
    assert first.terms['weights_pp_layers'] == 24 * 550537216


# ------------------------------------------------------------------ mixed node: uneven partition
def test_32b_needs_an_uneven_partition_on_a6000_plus_4090():
    knobs = {'pipeline_parallel_size': 2, 'max_model_len': 4096}
    even = plan_vllm_engine(qwen_32b(), MIXED, LONG_ONE, dict(knobs, pp_layer_partition=[32, 32]), '0.11.0')
    assert not even.feasible
    assert any(text.startswith('stage 1 (GPU 1 NVIDIA GeForce RTX 4090, layers 32-63)') and 'exceed the budget'
               in text for text in even.not_fitting), even.not_fitting
    plan = plan_vllm_engine(qwen_32b(), MIXED, LONG_ONE, knobs, '0.11.0')
    assert plan.feasible, plan.not_fitting
    partition = plan.pipeline['partition']
    assert sum(partition) == 64 and partition[0] > partition[1] >= 1
    assert plan.settings['environment'] == {'VLLM_PP_LAYER_PARTITION': '%d,%d' % tuple(partition),
                                            'CUDA_DEVICE_ORDER': 'PCI_BUS_ID'}
    for gpu in plan.memory:                       # each stage fits its card
        assert gpu.weights + gpu.activation + gpu.non_torch + gpu.kv_cache <= gpu.budget
        assert gpu.headroom >= gpu.terms['profiler_underestimate_buffer'] + gpu.terms['safety_margin']
    # the engine promises no more than the smallest stage holds
    stages = plan.pipeline['stages']
    assert plan.kv_cache_tokens == min(st['kv_tokens'] for st in stages) >= 4096
    assert plan.kv_cache_tokens == (min(st['kv_blocks'] for st in stages) - 1) * 16
    # one layer moved either way leaves the smallest stage with fewer blocks
    for moved in ([partition[0] - 1, partition[1] + 1], [partition[0] + 1, partition[1] - 1]):
        other = plan_vllm_engine(qwen_32b(), MIXED, LONG_ONE, dict(knobs, pp_layer_partition=moved), '0.11.0')
        assert other.kv_cache_tokens <= plan.kv_cache_tokens


def test_mixed_node_plan_carries_the_llama_box_offload_plan():
    plan = plan_vllm_engine(qwen_32b(), MIXED, LONG_ONE, {'pipeline_parallel_size': 2, 'max_model_len': 4096}, '0.11.0')
    cmp = plan.pipeline['offload_comparison']
    assert cmp['backend'] == 'llama-box' and cmp['quantization'] == 'F16'
    assert cmp['vllm']['layers'] == plan.pipeline['partition']
    assert cmp['vllm']['weights_bytes'] == [g.weights for g in plan.memory]
    assert cmp['vllm']['kv_cache_bytes'] == [g.kv_cache for g in plan.memory]
    assert cmp['vllm']['kv_tokens'] == plan.kv_cache_tokens
    assert len(cmp['layers']) == 2 and sum(cmp['layers']) <= 64
    assert len(cmp['weights_bytes']) == len(cmp['kv_cache_bytes']) == 2 and cmp['kv_tokens'] > 0
    # identical cards: no comparison, no device-order pin
    same = plan_vllm_engine(qwen_14b(), gpus(RTX4090, RTX4090), TRAFFIC, {'pipeline_parallel_size': 2}, '0.11.0')
    assert 'offload_comparison' not in same.pipeline


def test_gpus_are_staged_in_index_order():
    swapped = [dict(MIXED[1]), dict(MIXED[0])]
    plan = plan_vllm_engine(qwen_32b(), swapped, LONG_ONE, {'pipeline_parallel_size': 2, 'max_model_len': 4096}, '0.11.0')
    assert [g.index for g in plan.memory] == [0, 1] and plan.memory[0].name == A6000[0]


def test_no_partition_fits_names_the_stages_and_bytes():
    plan = plan_vllm_engine(llama_70b(), MIXED, LONG_ONE, {'pipeline_parallel_size': 2}, '0.11.0')
    assert not plan.feasible
    assert any('stage' in text and 'GiB' in text and 'exceed the budget' in text for text in plan.not_fitting)
    assert plan.kv_cache_tokens == 0
    assert any('llama-box' in text for text in plan.suggestions)


def test_infeasible_pp_plan_fails_the_task_naming_the_stage():
    params = dict((name, spec.get('default')) for name, spec in SERVING_PLAN_ARGUMENT_SPEC.items())
    params.update(backend='vllm', backend_version='0.11.0', model='Qwen/Qwen2.5-32B-Instruct', gpus=MIXED,
                  prompt_tokens_p99=3000, max_output_tokens=1000, max_concurrency=1,
                  pipeline_parallel_size=2, pp_layer_partition='32,32', max_model_len=4096)
    result = serving_plan_result(params)
    assert result['failed'] and 'stage 1 (GPU 1' in result['msg'] and 'GiB' in result['msg']
    params['pp_layer_partition'] = None
    result = serving_plan_result(params)
    assert not result.get('failed'), result.get('msg')
    env = result['plan']['settings']['environment']
    assert env['VLLM_PP_LAYER_PARTITION'] == ','.join(str(n) for n in result['plan']['pipeline']['partition'])
    # the report shows each stage in bytes and the llama-box alternative
    report = result['plan_report']
    assert any(line.startswith('pipeline: 2 stages x TP 1, layers %s' % env['VLLM_PP_LAYER_PARTITION'])
               for line in report)
    assert any(line.startswith('stage 1, GPU 1, layers ') and 'GiB' in line for line in report)
    assert any(line.startswith('compare llama-box v0.0.171 F16 offload: layers per GPU') for line in report)


# ------------------------------------------------------------------ TP x PP
def test_tp2_x_pp2_on_four_a6000s():
    plan = plan_vllm_engine(llama_70b(), gpus(A6000, A6000, A6000, A6000), TRAFFIC,
                            {'pipeline_parallel_size': 2, 'tensor_parallel_size': 2}, '0.11.0')
    assert plan.feasible, plan.not_fitting
    assert '--tensor-parallel-size=2' in plan.args and '--pipeline-parallel-size=2' in plan.args
    assert 'environment' not in plan.settings
    assert [g.terms['pp_stage'] for g in plan.memory] == [0, 0, 1, 1]
    # per rank: 141,107,412,992 / 2 = 70,553,706,496; embedding = lm_head = 128256 x 8192 x 2 / 2
    # = 1,050,673,152; norm 16,384; layers 68,452,343,808 / 80 x 40 = 34,226,171,904 per stage
    assert plan.memory[0].weights == 34226171904 + 1050673152
    assert plan.memory[3].weights == 34226171904 + 1050673152 + 16384
    # KV per token per GPU: 40 layers x 2 x (8 / 2) heads x 128 x 2 B
    assert {g.terms['kv_bytes_per_token'] for g in plan.memory} == {81920}
    assert plan.memory[0].terms['tp_workspaces'] == vm.TP_WORKSPACE_BYTES
    assert plan.pipeline['stages'][1]['gpus'] == [2, 3]
    assert plan.reasons['tensor_parallel_size'].startswith('set by the user (2 per stage)')
    auto = plan_vllm_engine(llama_70b(), gpus(A6000, A6000, A6000, A6000), TRAFFIC, {'pipeline_parallel_size': 2}, '0.11.0')
    assert auto.settings['tensor_parallel_size'] == 2 and 'GPUs given // stages' in auto.reasons['tensor_parallel_size']


def test_tp_inside_a_stage_needs_one_kind():
    mixed4 = gpus(A6000, RTX4090, A6000, RTX4090)
    with pytest.raises(PlanInputError, match='stage 0 .* mixes') as err:
        plan_vllm_engine(llama_70b(), mixed4, TRAFFIC, {'pipeline_parallel_size': 2, 'tensor_parallel_size': 2}, '0.11.0')
    assert err.value.field == 'gpus'


def test_pp1_is_the_plain_plan():
    plain = plan_vllm_engine(qwen_14b(), gpus(A6000), TRAFFIC, {}, '0.11.0')
    one = plan_vllm_engine(qwen_14b(), gpus(A6000), TRAFFIC, {'pipeline_parallel_size': 1}, '0.11.0')
    assert one.args == plain.args and one.pipeline is None and one.kv_cache_tokens == plain.kv_cache_tokens


def test_sliding_window_model_stages_have_their_own_layout():
    spec = ModelSpec(
        name='google/gemma-2-9b', source='test', architecture='Gemma2ForCausalLM', num_layers=42,
        hidden_size=3584, intermediate_size=14336, num_attention_heads=16, num_kv_heads=8, head_dim=256,
        vocab_size=256000, max_position_embeddings=8192, tie_word_embeddings=True, dtype_bytes=2,
        layer_kinds=[LAYER_SLIDING if i % 2 == 0 else LAYER_FULL for i in range(42)],
        sliding_window=4096, param_count=9241705984, weight_bytes=18483411968)
    plan = plan_vllm_engine(spec, gpus(RTX4090, RTX4090), TRAFFIC, {'pipeline_parallel_size': 2}, '0.11.0')
    stages = plan.pipeline['stages']
    assert [st['num_layers'] for st in stages] == [21, 21]
    max_len, usable = plan.settings['max_model_len'], plan.pipeline['engine_kv_blocks']
    assert usable == min(st['kv_blocks'] for st in stages) - 1
    # hybrid pools: tokens = the concurrency the smallest stage allows x max_model_len
    per_request = [vm.kv_layout(vp.stage_spec(spec, a, b), 1, 2, 16, plan.settings['max_num_batched_tokens'])
                   .blocks_per_request(max_len) for a, b in vp.stage_ranges([21, 21])]
    assert plan.kv_cache_tokens == int(min(usable / n for n in per_request) * max_len)


# ------------------------------------------------------------------ refusals
@pytest.mark.parametrize('value, match', [
    ([40, 23], 'sums to 63 layers, the model has 64'),
    ('40,25', 'sums to 65'),
    ([70, -6], 'entry 1 is -6'),
    ([64, 0], 'entry 1 is 0'),
    ('40,x', 'integers separated by commas'),
    ('4O,24', 'integers separated by commas'),
    ('40;24', 'integers separated by commas'),
    ([40.5, 23.5], 'entry 0 must be an integer'),
    ([True, 63], 'entry 0 must be an integer'),
    ([float('nan'), 63], 'entry 0 must be an integer'),
    ([None, 63], 'entry 0 must be an integer'),
    ([32, 16, 16], '3 entries'),
    ({'a': 1}, 'must be a list'),
    (','.join(['1'] * 100000), 'at most 16 stages'),
    ([1] * 1000, 'at most 16 stages'),
    ('99999999999999999999,-99999999999999999935', 'entry 1 is'),
    (64, 'must be a list'),
])
def test_bad_partition_refused_naming_the_field(value, match):
    with pytest.raises(PlanInputError, match=match) as err:
        plan_vllm_engine(qwen_32b(), MIXED, LONG_ONE, {'pipeline_parallel_size': 2, 'pp_layer_partition': value}, '0.11.0')
    assert err.value.field == 'pp_layer_partition'


def test_partition_forms_accepted():
    assert vp.parse_partition('40, 24', 64, 2) == [40, 24]
    assert vp.parse_partition(['40', 24.0], 64, 2) == [40, 24]


@pytest.mark.parametrize('knobs, version, field, match', [
    ({'pipeline_parallel_size': 0}, '0.11.0', 'pipeline_parallel_size', '>= 1'),
    ({'pipeline_parallel_size': 'two'}, '0.11.0', 'pipeline_parallel_size', 'whole number'),
    ({'pipeline_parallel_size': True}, '0.11.0', 'pipeline_parallel_size', 'whole number'),
    ({'pipeline_parallel_size': 2.5}, '0.11.0', 'pipeline_parallel_size', 'whole number'),
    ({'pipeline_parallel_size': 17}, '0.11.0', 'pipeline_parallel_size', '<= 16'),
    ({'pipeline_parallel_size': 4}, '0.11.0', 'pipeline_parallel_size', 'needs 4 GPUs, 2 given'),
    ({'pipeline_parallel_size': 2}, '0.9.0', 'pipeline_parallel_size', 'V0 engine'),
    ({'pipeline_parallel_size': 2, 'kv_cache_memory_bytes': 1 << 30}, '0.11.0', 'kv_cache_memory_bytes',
     'not modelled'),
    ({'pipeline_parallel_size': 2, 'tensor_parallel_size': 3}, '0.11.0', 'tensor_parallel_size', 'divisible'),
    ({'pipeline_parallel_size': 2, 'gpu_memory_utilization': 1.5}, '0.11.0', 'gpu_memory_utilization', r'\(0, 1\]'),
])
def test_bad_pp_knobs_refused(knobs, version, field, match):
    with pytest.raises(PlanInputError, match=match) as err:
        plan_vllm_engine(qwen_32b(), MIXED, LONG_ONE, knobs, version)
    assert err.value.field == field


def test_bad_partition_through_the_task_names_the_field():
    params = dict((name, spec.get('default')) for name, spec in SERVING_PLAN_ARGUMENT_SPEC.items())
    params.update(backend='vllm', backend_version='0.11.0', model='Qwen/Qwen2.5-32B-Instruct', gpus=MIXED,
                  prompt_tokens_p99=3000, max_output_tokens=1000, max_concurrency=1,
                  pipeline_parallel_size=2, pp_layer_partition='40,-16')
    result = serving_plan_result(params)
    assert result['failed'] and result['field'] == 'pp_layer_partition' and 'Traceback' not in result['msg']
    params.update(backend='llama-box', backend_version='v0.0.171', pp_layer_partition=None)
    result = serving_plan_result(params)
    assert result['failed'] and result['field'] == 'pipeline_parallel_size'


def test_mixed_cards_without_pp_name_pipeline_parallelism():
    with pytest.raises(PlanInputError, match='pipeline_parallel_size') as err:
        plan_vllm_engine(qwen_32b(), MIXED, LONG_ONE, {}, '0.11.0')
    assert err.value.field == 'gpus'


# ------------------------------------------------------------------ the interface agrees
def test_options_documented_and_passed_by_the_playbook():
    options = yaml.safe_load(module.DOCUMENTATION)['options']
    for name in vp.PP_KNOBS:
        assert options[name]['type'] == SERVING_PLAN_ARGUMENT_SPEC[name]['type']
    with open(os.path.join(REPO, 'playbooks', 'tasks', 'plan_deployments.yml')) as handle:
        task = [t for t in yaml.safe_load(handle) if 'kvpin.fleet.serving_plan' in t][0]['kvpin.fleet.serving_plan']
    for name in vp.PP_KNOBS:
        assert task[name] == '{{ deployment.engine.%s | default(omit) }}' % name


def test_stage_spec_keeps_the_stage_layers():
    spec = dataclasses.replace(qwen_14b(), layer_kinds=[LAYER_SLIDING] * 8 + [LAYER_FULL] * 40)
    sub = vp.stage_spec(spec, 4, 12)
    assert sub.num_layers == 8 and sub.layer_kinds == [LAYER_SLIDING] * 4 + [LAYER_FULL] * 4


def test_four_stage_mixed_partition_is_locally_best():
    # Llama-3.3-70B geometry at 1 byte per weight (FP8-sized) on 2 x A6000 + 2 x RTX 4090
    spec = dataclasses.replace(llama_70b(), weight_bytes=70553706496, quantization='fp8')
    cards = gpus(A6000, A6000, RTX4090, RTX4090)
    knobs = {'pipeline_parallel_size': 4}
    plan = plan_vllm_engine(spec, cards, TRAFFIC, knobs, '0.11.0')
    partition = plan.pipeline['partition']
    assert plan.feasible and sum(partition) == 80 and min(partition[:2]) > max(partition[2:])
    for i in range(4):
        for j in range(4):
            if i != j:
                moved = list(partition)
                moved[i] -= 1
                moved[j] += 1
                other = plan_vllm_engine(spec, cards, TRAFFIC, dict(knobs, pp_layer_partition=moved), '0.11.0')
                assert other.kv_cache_tokens <= plan.kv_cache_tokens, moved


def test_moe_with_leading_dense_layers_charges_every_layer_the_moe_average():
    # DeepSeek-style: 3 dense layers then MoE; the planner does not know the dense layers'
    # size, so each layer is charged all layer bytes / the 45 MoE layers (never less)
    spec = qwen_14b(num_experts=64, num_experts_per_tok=8, moe_intermediate_size=1408,
                    extra={'first_k_dense_replace': 3})
    plan = plan_vllm_engine(spec, gpus(RTX4090, RTX4090), TRAFFIC, {'pipeline_parallel_size': 2}, '0.11.0')
    layers = 26425786368
    assert [g.terms['weights_pp_layers'] for g in plan.memory] == [-(-layers * 24 // 45)] * 2
    assert sum(g.terms['weights_pp_layers'] for g in plan.memory) > layers
    assert '3 leading dense layers' in plan.memory[0].explain['weights']


def test_deploy_play_passes_the_plan_environment(tmp_path):
    """deploy_models.yml hands the plan's settings.environment (VLLM_PP_LAYER_PARTITION) to
    gpustack_model's env, under the inventory's own env; no environment and no env: omitted."""
    from local_playbook import run_tasks_on_localhost
    with open(os.path.join(REPO, 'playbooks', 'deploy_models.yml')) as handle:
        plays = yaml.safe_load(handle)
    task = next(t for play in plays for t in play.get('tasks', []) if 'kvpin.fleet.gpustack_model' in t)
    expression = task['kvpin.fleet.gpustack_model']['env']
    cases = [
        ({'args': []}, {}),
        ({'settings': {'max_model_len': 4096}}, {'env': {'HF_HUB_OFFLINE': '1'}}),
        ({'settings': {'environment': {'VLLM_PP_LAYER_PARTITION': '44,20', 'CUDA_DEVICE_ORDER': 'PCI_BUS_ID'}}},
         {'env': {'CUDA_DEVICE_ORDER': 'FASTEST_FIRST'}}),
    ]
    tasks = [{'name': 'case %d' % i, 'ansible.builtin.debug': {'msg': expression},
              'vars': {'planned': {'plan': plan}, 'overrides': overrides}} for i, (plan, overrides) in enumerate(cases)]
    proc = run_tasks_on_localhost(tmp_path, tasks)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout.split('TASK [case ')
    assert '"msg": "Hello world!"' in out[1]             # omitted: the module keeps its default
    assert '"HF_HUB_OFFLINE": "1"' in out[2] and 'VLLM_PP' not in out[2]
    assert '"VLLM_PP_LAYER_PARTITION": "44,20"' in out[3] and '"CUDA_DEVICE_ORDER": "FASTEST_FIRST"' in out[3]


def test_pp_from_091_and_startup_free_memory_warned():
    cards = gpus(RTX4090, RTX4090)
    cards[1]['memory_free'] = 10 * 1024 ** 3
    plan = plan_vllm_engine(qwen_14b(), cards, TRAFFIC, {'pipeline_parallel_size': 2}, '0.9.1')
    assert plan.feasible and '--pipeline-parallel-size=2' in plan.args
    assert any(w.startswith('GPU 1 has 10.00 GiB free now') and 'stage 1' in w for w in plan.warnings)


def test_short_kv_suggests_fp8_and_a_shorter_length():
    plan = plan_vllm_engine(qwen_32b(), MIXED, LONG_ONE, {'pipeline_parallel_size': 2, 'max_model_len': 32768}, '0.11.0')
    assert not plan.feasible and 'one 32768-token sequence needs 2048 blocks' in plan.not_fitting[0]
    assert any(s.startswith('kv_cache_dtype=fp8') for s in plan.suggestions)
    assert 'max_model_len <= %d (what the smallest stage holds)' % plan.kv_cache_tokens in plan.suggestions


def test_pp_on_0_34_holds_no_more_kv_than_the_extensible_cache_leaves():
    """vLLM 0.34's extensible KV cache (on by default) sizes each stage from what is free after
    warm-up less a >= 1 GiB margin: at a utilization that leaves less than the margin free, a
    stage's KV is the extensible figure, below the util budget's rest."""
    knobs = {'pipeline_parallel_size': 2, 'max_num_seqs': 4, 'gpu_memory_utilization': 0.99}
    plan = plan_vllm_engine(qwen_14b(), gpus(RTX4090, RTX4090), TRAFFIC, knobs, '0.34.0')
    util_era = plan_vllm_engine(qwen_14b(), gpus(RTX4090, RTX4090), TRAFFIC, knobs, '0.33.0')
    for gpu in plan.memory:
        assert gpu.terms['extensible_margin'] >= 1 << 30
        util_rest = gpu.budget - gpu.weights - gpu.activation - gpu.non_torch - gpu.cuda_graph
        assert gpu.terms['kv_budget'] < util_rest
        assert 'extensible KV cache (vLLM 0.34)' in gpu.explain['kv_cache']
    assert plan.kv_cache_tokens < util_era.kv_cache_tokens
    assert all('extensible_margin' not in gpu.terms for gpu in util_era.memory)


def test_only_serving_plan_dispatches_pipeline_plans():
    # vllm_memory.plan_vllm plans tensor parallelism only (it does not import vllm_pipeline);
    # serving_plan.plan_vllm_engine, which build_plan plans through, picks the pipeline planner
    with pytest.raises(PlanInputError) as raised:
        vm.plan_vllm(qwen_14b(), gpus(RTX4090, RTX4090), TRAFFIC, {'pipeline_parallel_size': 2}, '0.11.0')
    assert raised.value.field == 'pipeline_parallel_size'
    plan = plan_vllm_engine(qwen_14b(), gpus(RTX4090, RTX4090), TRAFFIC, {'pipeline_parallel_size': 2}, '0.11.0')
    assert plan.pipeline['pipeline_parallel_size'] == 2
