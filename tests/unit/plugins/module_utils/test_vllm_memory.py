# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The vLLM memory model and plan_vllm: the field report's numbers, version rules,
derivations and every refusal. Specs are built from the models' real config.json values."""

from __future__ import annotations

import dataclasses

import pytest

from model_specs import (  # pylint: disable=import-error
    A6000_TOTAL, FIELD_TRAFFIC, RTX4090_TOTAL, field_plan, gpus, llama_70b, llama_8b)
from ansible_collections.kvpin.fleet.plugins.module_utils.plan import attention_kinds as ak
from ansible_collections.kvpin.fleet.plugins.module_utils.plan import vllm_memory as vm
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.model_spec import (
    LAYER_FULL, LAYER_MLA, LAYER_NO_KV, LAYER_SLIDING, ModelSpec)
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.plan_types import PlanInputError, Traffic
from ansible_collections.kvpin.fleet.plugins.module_utils.units import GiB
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.vllm_memory import plan_vllm


def deepseek_v3():
    # config.json: 61 layers, kv_lora_rank 512, qk_rope_head_dim 64, 128 heads
    return ModelSpec(
        name='deepseek-ai/DeepSeek-V3', source='test', architecture='DeepseekV3ForCausalLM',
        num_layers=61, hidden_size=7168, intermediate_size=18432, num_attention_heads=128,
        num_kv_heads=128, head_dim=192, vocab_size=129280, max_position_embeddings=163840,
        tie_word_embeddings=False, dtype_bytes=2, layer_kinds=[LAYER_MLA] * 61,
        kv_lora_rank=512, qk_rope_head_dim=64, param_count=671026419200, weight_bytes=689 * 10 ** 9)


def gemma2_9b():
    # config.json: 42 layers alternating sliding (4096) / global, 8 KV heads, head_dim 256
    return ModelSpec(
        name='google/gemma-2-9b', source='test', architecture='Gemma2ForCausalLM',
        num_layers=42, hidden_size=3584, intermediate_size=14336, num_attention_heads=16,
        num_kv_heads=8, head_dim=256, vocab_size=256000, max_position_embeddings=8192,
        tie_word_embeddings=True, dtype_bytes=2,
        layer_kinds=[LAYER_SLIDING if i % 2 == 0 else LAYER_FULL for i in range(42)],
        sliding_window=4096, param_count=9241705984, weight_bytes=18483411968)


# ------------------------------------------------------------------ the field report's numbers
def test_kv_per_token_is_320_kib_for_llama_70b_bf16():
    assert vm.kv_bytes_per_token(llama_70b(), 1, 2) == 327680 == 320 * 1024


def test_kv_per_token_per_gpu_at_tp4():
    assert vm.kv_bytes_per_token(llama_70b(), 4, 2) == 81920


def test_32k_sequence_is_10_7_gb():
    assert 32768 * vm.kv_bytes_per_token(llama_70b(), 1, 2) == 10737418240


def test_weights_per_card_at_tp4_are_about_35_gb():
    weights, terms, explain = vm.weights_per_gpu(llama_70b(), 4)
    assert weights == 141107412992 // 4 == 35276853248
    assert abs(weights - 35.27e9) < 0.01e9
    assert '/ TP 4' in explain


def test_util_092_refused_on_a6000_tp4_graphs_outside():
    plan = field_plan(gpu_memory_utilization=0.92)
    assert plan.feasible is False
    assert any('CUDA graph pool' in line and 'more than total x (1 - 0.92)' in line for line in plan.not_fitting)
    assert any(line.startswith('gpu_memory_utilization <= 0.') for line in plan.suggestions)
    # the outside terms exceed 8 % of the card
    mem = plan.memory[0]
    assert mem.terms['outside_required'] > A6000_TOTAL - vm.util_bytes(A6000_TOTAL, 0.92)


def test_util_088_accepted_on_a6000_tp4():
    plan = field_plan(gpu_memory_utilization=0.88)
    assert plan.feasible is True
    assert '--gpu-memory-utilization=0.88' in plan.args
    assert plan.memory[0].headroom >= plan.memory[0].terms['safety_margin'] + vm.PROFILER_UNDERESTIMATE_BYTES


@pytest.mark.parametrize('version', ['0.10.1.1', '0.11.0'])
def test_derived_util_at_most_090_and_088_accepted(version):
    plan = field_plan(version)
    assert plan.feasible
    util = plan.settings['gpu_memory_utilization']
    assert 0.88 <= util <= 0.90
    assert 'total - outside terms' in plan.reasons['gpu_memory_utilization']
    assert field_plan(version, gpu_memory_utilization=0.88).feasible
    assert not field_plan(version, gpu_memory_utilization=0.92).feasible


def test_graphs_inside_from_020_allow_a_higher_util():
    old = field_plan('0.10.1.1')
    new = field_plan('0.20.0')
    assert new.settings['gpu_memory_utilization'] > old.settings['gpu_memory_utilization']
    assert field_plan('0.20.0', gpu_memory_utilization=0.92).feasible


def test_max_model_len_from_p99():
    for out, expected in ((2000, 16384), (5384, 16384), (5385, 32768)):
        plan = plan_vllm(llama_70b(), gpus(4), Traffic(11000, out, 4), {'tensor_parallel_size': 4}, '0.10.1.1')
        assert plan.settings['max_model_len'] == expected
        assert '--max-model-len=%d' % expected in plan.args
    assert 'next power of two' in plan.reasons['max_model_len']


def test_max_model_len_capped_at_model_max_and_infeasible_beyond():
    spec = llama_70b(max_position_embeddings=8192)
    plan = plan_vllm(spec, gpus(4), Traffic(6000, 1000, 4), {'tensor_parallel_size': 4}, '0.10.1.1')
    assert plan.settings['max_model_len'] == 8192 and plan.feasible
    plan = plan_vllm(spec, gpus(4), Traffic(11000, 2000, 4), {'tensor_parallel_size': 4}, '0.10.1.1')
    assert not plan.feasible
    assert any('supports at most 8192' in w for w in plan.warnings)


# ------------------------------------------------------------------ budget arithmetic
@pytest.mark.parametrize('version', ['0.10.1.1', '0.11.0', '0.18.0', '0.20.0', '0.33.0'])
def test_budget_terms_add_up(version):
    plan = field_plan(version)
    for mem in plan.memory:
        charged = mem.weights + mem.activation + mem.non_torch
        if 'INSIDE' in mem.explain['cuda_graph']:
            charged += mem.cuda_graph
        assert mem.budget == charged + mem.terms['cold_compile_margin'] + mem.terms['kv_budget']
        assert mem.kv_cache <= mem.terms['kv_budget']
        assert mem.headroom == mem.total - mem.budget - mem.terms['outside_resident']
        assert set(mem.explain) >= {'weights', 'activation', 'non_torch', 'cuda_graph', 'kv_cache', 'headroom'}
    assert plan.vram_claim_bytes == plan.memory[0].budget + plan.memory[0].terms['outside_resident']
    assert plan.system_reserved_bytes == plan.memory[0].terms['outside_required']


def test_graphs_charged_by_version():
    assert 'OUTSIDE' in field_plan('0.19.0').memory[0].explain['cuda_graph']
    assert 'INSIDE' in field_plan('0.20.0').memory[0].explain['cuda_graph']
    opt_in = field_plan('0.18.0', cudagraph_memory_estimate=True)
    assert 'INSIDE' in opt_in.memory[0].explain['cuda_graph']
    assert opt_in.settings['environment'] == {'VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS': '1'}
    with pytest.raises(PlanInputError, match='0.18.0'):
        field_plan('0.17.0', cudagraph_memory_estimate=True)


def test_nccl_outside_the_budget_from_011():
    before, after = field_plan('0.10.1.1').memory[0], field_plan('0.11.0').memory[0]
    nccl = before.terms['nccl_buffers']
    assert nccl > 0
    assert before.non_torch - after.non_torch == nccl
    assert after.terms['outside_resident'] - before.terms['outside_resident'] == nccl


def test_enforce_eager_has_no_graph_pool():
    plan = field_plan(enforce_eager=True)
    assert plan.memory[0].cuda_graph == 0
    assert '--enforce-eager' in plan.args
    assert plan.settings['gpu_memory_utilization'] > field_plan().settings['gpu_memory_utilization']


def test_activation_fit_reproduces_the_llm_d_h100_rows():
    # logged peak activation 4.76 GiB, Llama-3.1-8B, H100, max_num_seqs 1024, mnbt 8192
    act, terms, explain = vm.activation_peak(llama_8b(), 1, 1024, 8192)
    assert abs(act / GiB - 4.76) < 0.02
    assert 'fitted' in explain
    # the sampler warm-up shrinks with max_num_seqs
    assert vm.activation_peak(llama_8b(), 1, 32, 8192)[0] < act / 4


def test_num_blocks_tokens_and_concurrency():
    plan = field_plan(kv_cache_dtype='auto')
    mem = plan.memory[0]
    bytes_per_block = 16 * 81920
    assert mem.terms['kv_bytes_per_block'] == bytes_per_block
    blocks = min(m.terms['kv_budget'] for m in plan.memory) // bytes_per_block - 1   # null block
    assert plan.kv_cache_tokens == blocks * 16
    assert plan.max_concurrency_at_max_len == round(blocks / (16384 // 16), 2)


def test_kv_cache_memory_bytes_pins_the_budget():
    pinned = 6 * GiB
    plan = field_plan('0.11.0', kv_cache_memory_bytes=pinned, kv_cache_dtype='auto')
    assert plan.kv_cache_tokens == (pinned // (16 * 81920) - 1) * 16
    assert '--kv-cache-memory-bytes=%d' % pinned in plan.args
    assert plan.memory[0].kv_cache == pinned


def test_pin_kv_cache_memory_needs_0_10_2():
    plan = field_plan('0.10.2', pin_kv_cache_memory=True)
    pinned = plan.settings['kv_cache_memory_bytes']
    assert '--kv-cache-memory-bytes=%d' % pinned in plan.args
    assert pinned % plan.memory[0].terms['kv_bytes_per_block'] == 0
    with pytest.raises(PlanInputError, match='0.10.2') as err:
        field_plan('0.10.1.1', pin_kv_cache_memory=True)
    assert err.value.field == 'pin_kv_cache_memory'


# ------------------------------------------------------------------ version rules in the args
def test_swap_space_present_until_017_absent_from_018():
    assert '--swap-space=0' in field_plan('0.17.0').args
    plan = field_plan('0.18.0')
    assert not any(a.startswith('--swap-space') for a in plan.args)
    assert '0.18.0' in plan.reasons['swap_space']
    assert any('no --swap-space (vLLM < 0.18.0)' in rule for rule in plan.rules)


def test_args_form_and_chunked_prefill():
    plan = field_plan()
    assert plan.args[0] == '--tensor-parallel-size=4'
    assert '--enable-chunked-prefill' in plan.args
    assert all(a.startswith('--') for a in plan.args)
    assert any(a.startswith('--max-num-seqs=') for a in plan.args)


# ------------------------------------------------------------------ derivations
def test_max_num_seqs_cannot_oversubscribe_the_pool():
    plan = field_plan(kv_cache_dtype='auto')
    seqs = plan.settings['max_num_seqs']
    per_seq_blocks = -(-13000 // 16)
    usable_blocks = plan.kv_cache_tokens // 16
    assert seqs * per_seq_blocks <= usable_blocks
    assert (seqs + 1) * per_seq_blocks > usable_blocks
    assert seqs < 32 and any('below the declared concurrency 32' in w for w in plan.warnings)


def test_max_num_seqs_capped_by_declared_concurrency():
    plan = plan_vllm(llama_8b(), gpus(1, int(79.18 * GiB), 'NVIDIA H100 80GB HBM3'),
                     Traffic(2000, 500, 8), {}, '0.11.0')
    assert plan.settings['max_num_seqs'] == 8


def test_user_max_num_seqs_honoured_and_checked():
    plan = field_plan(max_num_seqs=64, kv_cache_dtype='auto')
    assert '--max-num-seqs=64' in plan.args
    assert any('preempted' in w for w in plan.warnings)


def test_fp8_switch_only_when_needed_and_warned():
    plan = field_plan(allow_fp8_kv=True)         # 32 x 13k tokens do not fit in bf16
    assert plan.settings['kv_cache_dtype'] == 'fp8'
    assert '--kv-cache-dtype=fp8' in plan.args
    assert any('long-context retrieval' in w for w in plan.warnings)
    small = plan_vllm(llama_70b(), gpus(4), Traffic(2000, 500, 2), {'tensor_parallel_size': 4, 'allow_fp8_kv': True},
                      '0.10.1.1')
    assert small.settings['kv_cache_dtype'] == 'auto'
    assert not any(a.startswith('--kv-cache-dtype') for a in small.args)


def test_fp8_halves_kv():
    assert vm.kv_bytes_per_token(llama_70b(), 4, 1) * 2 == vm.kv_bytes_per_token(llama_70b(), 4, 2)
    auto = field_plan(kv_cache_dtype='auto', max_num_seqs=8)
    fp8 = field_plan(kv_cache_dtype='fp8', max_num_seqs=8)
    assert 1.98 < fp8.kv_cache_tokens / auto.kv_cache_tokens < 2.02


def test_gqa_kv_heads_replicated_beyond_tp():
    spec = llama_70b()
    assert ak.kv_heads_per_gpu(spec, 16) == 1
    assert vm.kv_bytes_per_token(spec, 16, 2) == vm.kv_bytes_per_token(spec, 8, 2) == 80 * 2 * 128 * 2
    weights, terms, _unused = vm.weights_per_gpu(spec, 16)
    # k_proj + v_proj (8192 x 128 each, 80 layers) held whole: (16 - 8) / 16 of it extra
    assert terms['weights_kv_proj_replication'] == 2 * 8192 * 128 * 80 * 2 // 2
    assert vm.weights_per_gpu(spec, 8)[1]['weights_kv_proj_replication'] == 0


def test_mla_not_split_by_tp_and_block_64():
    spec = deepseek_v3()
    for tp in (1, 2, 8):
        assert vm.kv_bytes_per_token(spec, tp, 2) == 61 * 576 * 2 == 70272
    plan = plan_vllm(spec, gpus(8, int(139.8 * GiB), 'NVIDIA H200'), Traffic(4000, 1000, 8),
                     {'tensor_parallel_size': 8}, '0.11.0')
    assert plan.settings['block_size'] == 64
    assert '--block-size=64' in plan.args


def test_sliding_window_bounded_and_hybrid_pool():
    spec = gemma2_9b()
    layout = vm.kv_layout(spec, 1, 2, 16, 2048)
    per_layer = 2 * 8 * 256 * 2
    assert layout.bytes_per_block == 16 * 21 * per_layer     # groups of 21 layers share a block id
    full_only = -(-8192 // 16)
    sliding = -(-min(4096 - 1 + 2048, 8192) // 16) + 1
    assert layout.blocks_per_request(8192) == full_only + sliding
    assert layout.blocks_per_request(100000) - layout.blocks_per_request(50000) == -(-100000 // 16) - -(-50000 // 16)
    all_sliding = dataclasses.replace(gemma2_9b(), layer_kinds=[LAYER_SLIDING] * 42)
    bounded = vm.kv_layout(all_sliding, 1, 2, 16, 2048)
    assert bounded.blocks_per_request(8192) == bounded.blocks_per_request(7000) == sliding
    plan = plan_vllm(spec, gpus(1, RTX4090_TOTAL, 'NVIDIA GeForce RTX 4090'), Traffic(4000, 1000, 4), {}, '0.11.0')
    assert any('hybrid KV' in rule for rule in plan.rules)


def test_no_kv_layers_contribute_nothing():
    kinds = [LAYER_FULL, LAYER_NO_KV] * 40
    spec = llama_70b(layer_kinds=kinds)
    assert vm.kv_bytes_per_token(spec, 1, 2) == 327680 // 2


def test_auto_tp_picks_smallest_fitting():
    plan = plan_vllm(llama_70b(), gpus(8), FIELD_TRAFFIC, {}, '0.10.1.1')
    assert plan.settings['tensor_parallel_size'] == 4 and plan.feasible
    assert 'smallest TP' in plan.reasons['tensor_parallel_size']
    small = plan_vllm(llama_8b(), gpus(4, RTX4090_TOTAL, 'NVIDIA GeForce RTX 4090'),
                      Traffic(4000, 1000, 4), {'tensor_parallel_size': 'auto'}, '0.10.1.1')
    assert small.settings['tensor_parallel_size'] == 1 and small.feasible


def test_infeasible_is_a_plan_with_suggestions():
    plan = plan_vllm(llama_70b(), gpus(2), FIELD_TRAFFIC, {'tensor_parallel_size': 2}, '0.10.1.1')
    assert plan.feasible is False
    assert any('weights' in line and 'exceed the budget' in line for line in plan.not_fitting)
    assert any(s.startswith('tensor_parallel_size=4') for s in plan.suggestions)


def test_too_long_context_suggests_shorter_len_and_fp8():
    plan = plan_vllm(llama_70b(), gpus(4), Traffic(100000, 2000, 1),
                     {'tensor_parallel_size': 4, 'kv_cache_dtype': 'auto'}, '0.10.1.1')
    assert not plan.feasible
    assert any('max_model_len <=' in s for s in plan.suggestions)
    assert any(s.startswith('kv_cache_dtype=fp8') for s in plan.suggestions)


# ------------------------------------------------------------------ refusals
def test_mixed_gpu_sizes_refused_naming_the_fallback():
    mixed = gpus(1) + [dict(index=1, name='NVIDIA GeForce RTX 4090', memory_total=RTX4090_TOTAL)]
    with pytest.raises(PlanInputError) as err:
        plan_vllm(llama_70b(), mixed, FIELD_TRAFFIC, {}, '0.10.1.1')
    assert err.value.field == 'gpus'
    assert 'llama-box' in str(err.value) and 'llama.cpp' in str(err.value)


@pytest.mark.parametrize('knobs, field, match', [
    ({'tensor_parallel_size': 3}, 'tensor_parallel_size', '64 attention heads not divisible by 3'),
    ({'tensor_parallel_size': 8}, 'tensor_parallel_size', 'more than the 4 GPUs'),
    ({'tensor_parallel_size': 0}, 'tensor_parallel_size', '>= 1'),
    ({'gpu_memory_utilization': 0}, 'gpu_memory_utilization', r'\(0, 1\]'),
    ({'gpu_memory_utilization': 1.2}, 'gpu_memory_utilization', r'\(0, 1\]'),
    ({'gpu_memory_utilization': -0.5}, 'gpu_memory_utilization', r'\(0, 1\]'),
    ({'gpu_memory_utilization': 'lots'}, 'gpu_memory_utilization', r'\(0, 1\]'),
    ({'max_model_len': -5}, 'max_model_len', '>= 16'),
    ({'max_model_len': 10 ** 9}, 'max_model_len', 'typo'),
    ({'max_model_len': 262144}, 'max_model_len', 'model maximum 131072'),
    ({'max_num_seqs': 0}, 'max_num_seqs', '>= 1'),
    ({'max_num_seqs': 2.5}, 'max_num_seqs', 'whole number'),
    ({'max_num_batched_tokens': 64, 'max_num_seqs': 128}, 'max_num_batched_tokens', '>= max_num_seqs'),
    ({'block_size': 24}, 'block_size', 'one of'),
    ({'kv_cache_dtype': 'bfloat16'}, 'kv_cache_dtype', '0.11.0'),
    ({'kv_cache_memory_bytes': 10 * GiB}, 'kv_cache_memory_bytes', '0.10.2'),
    ({'enforce_eager': 'yes'}, 'enforce_eager', 'true or false'),
    ({'gpu_layers': 60}, 'gpu_layers', 'not a vLLM option'),
])
def test_bad_knobs_refused(knobs, field, match):
    with pytest.raises(PlanInputError, match=match) as err:
        plan_vllm(llama_70b(), gpus(4), FIELD_TRAFFIC, knobs, '0.10.1.1')
    assert err.value.field == field


def test_no_gpus_and_bad_version_refused():
    with pytest.raises(PlanInputError) as err:
        plan_vllm(llama_70b(), [], FIELD_TRAFFIC, {}, '0.10.1.1')
    assert err.value.field == 'gpus'
    with pytest.raises(PlanInputError) as err:
        plan_vllm(llama_70b(), gpus(4), FIELD_TRAFFIC, {}, '0.5.0')
    assert err.value.field == 'backend_version'
    with pytest.raises(PlanInputError) as err:
        plan_vllm(llama_70b(weight_bytes=0), gpus(4), FIELD_TRAFFIC, {}, '0.10.1.1')
    assert err.value.field == 'model'


def test_outside_terms_grow_with_tp_and_fit_the_card():
    rows = {}
    for tp in (1, 2, 4):
        spec = llama_8b()
        plan = plan_vllm(spec, gpus(4), Traffic(4000, 1000, 4), {'tensor_parallel_size': tp}, '0.11.0')
        rows[tp] = plan.memory[0].terms['outside_required']
    assert rows[1] < rows[2] < rows[4] < A6000_TOTAL * 15 // 100


def test_user_util_rendered_exactly():
    plan = field_plan(gpu_memory_utilization=0.885)
    assert '--gpu-memory-utilization=0.885' in plan.args


def test_max_num_batched_tokens_raised_to_max_num_seqs():
    plan = field_plan(max_num_seqs=4096, kv_cache_dtype='auto')      # A6000 default is 2048
    assert plan.settings['max_num_batched_tokens'] == 4096
    assert 'max_num_batched_tokens >= max_num_seqs' in plan.reasons['max_num_batched_tokens']


def test_auto_tp_says_when_nothing_fits():
    plan = plan_vllm(llama_70b(), gpus(2), FIELD_TRAFFIC, {}, '0.10.1.1')
    assert not plan.feasible
    assert plan.settings['tensor_parallel_size'] == 2
    assert plan.reasons['tensor_parallel_size'].startswith('no TP in')


def test_outside_failure_suggests_only_what_fixes_it():
    plan = field_plan(gpu_memory_utilization=0.92)
    assert plan.suggestions[0] == 'gpu_memory_utilization <= %.2f (what fits outside the budget)' % (
        field_plan().settings['gpu_memory_utilization'])
    assert any(s.startswith('enforce_eager: true') for s in plan.suggestions)
    assert not any(s.startswith('tensor_parallel_size') for s in plan.suggestions)
    assert 'fp8 does not make this plan feasible' in plan.reasons['kv_cache_dtype']


def test_cublas_handles_in_the_baseline_from_033():
    old, new = field_plan('0.26.0').memory[0], field_plan('0.33.0').memory[0]
    assert old.terms['non_torch_growth'] == vm.NON_TORCH_GROWTH_BYTES
    assert new.terms['non_torch_growth'] == 0
    assert new.terms['outside_cublas_workspaces'] == vm.NON_TORCH_GROWTH_BYTES
    assert 'outside_cublas_workspaces' not in old.terms


def test_outside_terms_named_per_version():
    parts, resident, required = vm.outside_terms(
        vm.prof.accounting(vm.prof.parse_version('0.10.1.1')), False, 4, gpus(1)[0], 3 * GiB)
    assert set(parts) == {'cuda_context', 'cuda_graph_pool'}
    assert required == resident + vm.PROFILER_UNDERESTIMATE_BYTES + vm.safety_margin_bytes(A6000_TOTAL)
    parts = vm.outside_terms(vm.prof.accounting(vm.prof.parse_version('0.20.0')), True, 4, gpus(1)[0], 3 * GiB)[0]
    assert set(parts) == {'cuda_context', 'nccl_buffers'}


def test_nccl_in_graphs_only_without_custom_allreduce():
    sizes = vm.prof.cudagraph_capture_sizes(vm.prof.parse_version('0.10.1.1'), 256, 2048)
    pcie = vm.cuda_graph_pool(llama_70b(), 4, sizes, 'NVIDIA RTX A6000')[1]
    nvlink = vm.cuda_graph_pool(llama_70b(), 4, sizes, 'NVIDIA H100 80GB HBM3')[1]
    assert pcie['cuda_graph_collectives'] == 2 * vm.GRAPH_COLLECTIVE_BYTES_PER_CONNECTION
    assert nvlink['cuda_graph_collectives'] == 0
    assert vm.cuda_graph_pool(llama_70b(), 1, sizes, 'NVIDIA RTX A6000')[1]['cuda_graph_collectives'] == 0
    assert vm.nccl_channels('NVIDIA H100 PCIe') == vm.NCCL_CHANNELS_PCIE


@pytest.mark.parametrize('traffic, field', [
    (Traffic(0, 100, 1), 'prompt_tokens_p99'),
    (Traffic(100, -5, 1), 'max_output_tokens'),
    (Traffic(100, 100, 0), 'max_concurrency'),
    (Traffic(100, 100, 10 ** 7), 'max_concurrency'),
])
def test_bad_traffic_refused(traffic, field):
    with pytest.raises(PlanInputError) as err:
        plan_vllm(llama_70b(), gpus(4), traffic, {}, '0.10.1.1')
    assert err.value.field == field


def test_mxfp4_experts_are_padded_to_256_wide_as_vllm_loads_them():
    """gpt-oss stores 2880-wide experts; vLLM pads them to 3072. With the padding the
    planned weights match both logged loads (13.47 / 64.38 GiB on H100) within 0.5 %."""
    from ansible_collections.kvpin.fleet.plugins.module_utils.plan.model_loaders import resolve_model
    for name, logged_gib in (('openai/gpt-oss-20b', 13.47), ('openai/gpt-oss-120b', 64.38)):
        spec = resolve_model(name)
        weights, terms, explain = vm.weights_per_gpu(spec, 1)
        assert terms['weights_mxfp4_expert_padding'] > 0
        assert weights / (logged_gib * GiB) == pytest.approx(1.0, abs=0.005), name
        assert 'MXFP4 experts padded' in explain
    dense = resolve_model('meta-llama/Llama-3.1-8B-Instruct')
    assert vm.weights_per_gpu(dense, 1)[1]['weights_mxfp4_expert_padding'] == 0


# ------------------------------------------------------------------ vLLM 0.34: extensible KV cache
H100_TOTAL = 85520809984           # NVML memory_total of an H100 80GB HBM3
H100_NAME = 'NVIDIA H100 80GB HBM3'
TRAFFIC_8B = Traffic(prompt_tokens_p99=4000, max_output_tokens=1000, max_concurrency=32)


def plan_034(**knobs):
    return plan_vllm(llama_8b(), gpus(1, H100_TOTAL, H100_NAME), TRAFFIC_8B, knobs, '0.34.0')


def test_0_34_single_tenant_keeps_the_extensible_kv_cache_with_an_explicit_util():
    plan = plan_034()
    assert plan.feasible
    assert '--enable-extensible-kv-cache' in plan.args
    assert not any(a.startswith('--kv-cache-memory-bytes') for a in plan.args)
    util = plan.settings['gpu_memory_utilization']
    assert '--gpu-memory-utilization=%g' % util in plan.args and util < 1.0   # never vLLM's 1.0 default
    assert plan.settings['enable_extensible_kv_cache'] is True
    assert 'extensible KV cache ON (single-tenant GPU)' in plan.reasons['kv_cache_sizing']
    assert 'vLLM 0.34.0 default would be 1.00' in plan.reasons['gpu_memory_utilization']
    assert not any(a.startswith('--block-size') for a in plan.args)   # 64 is 0.34's default


def test_0_34_single_tenant_kv_is_what_vllm_measure_kv_cache_bytes_gives_from_the_plan_terms():
    plan = plan_034()
    mem = plan.memory[0]
    t = mem.terms
    requested = vm.util_bytes(mem.total, plan.settings['gpu_memory_utilization'])
    consumed = mem.weights + mem.non_torch + mem.cuda_graph           # held after warm-up and capture
    # + the graph estimate (env default 1) + what a cold compile adds to the transient peak
    # (Model Runner V2, every model from 0.29: the plan sizes the cold start)
    transient = mem.activation + t['cold_compile_transient'] + mem.cuda_graph
    margin = max(GiB, transient * 75 // 100)
    headroom = mem.total - t['outside_resident'] - consumed            # baseline: context, cuBLAS
    expected = min(requested - consumed, headroom - margin) - transient
    assert t['extensible_margin'] == margin >= GiB
    assert t['extensible_transient_peak'] == transient
    assert expected - t['kv_bytes_per_block'] < mem.kv_cache <= expected   # whole blocks, never more
    assert mem.budget == requested                                      # the cap GPUStack books
    assert 'extensible KV cache (vLLM 0.34)' in mem.explain['kv_cache']
    assert 'skips the startup free-memory check' in mem.explain['budget']
    # the plan never promises more than the 0.33 estimate-based pool would hold on the same terms
    assert mem.kv_cache <= plan_vllm(llama_8b(), gpus(1, H100_TOTAL, H100_NAME), TRAFFIC_8B, {},
                                     '0.33.0').memory[0].kv_cache


def test_0_34_shared_gpu_pins_util_and_kv_bytes_which_turns_the_extensible_cache_off():
    plan = plan_034(pin_kv_cache_memory=True)
    assert plan.feasible
    pinned = [a for a in plan.args if a.startswith('--kv-cache-memory-bytes=')]
    assert len(pinned) == 1
    kv_bytes = int(pinned[0].split('=')[1])
    mem = plan.memory[0]
    assert kv_bytes == mem.kv_cache == plan.settings['kv_cache_memory_bytes']
    assert kv_bytes % mem.terms['kv_bytes_per_block'] == 0
    assert '--enable-extensible-kv-cache' not in plan.args
    assert plan.settings['enable_extensible_kv_cache'] is False
    assert any(a.startswith('--gpu-memory-utilization=') for a in plan.args)
    reason = plan.reasons['kv_cache_sizing']
    assert 'OFF' in reason and 'shared with another instance' in reason and 'neighbour' in reason
    # the margin: what the budget leaves free covers everything outside it
    assert mem.headroom >= mem.terms['safety_margin'] + vm.PROFILER_UNDERESTIMATE_BYTES
    assert 'extensible_margin' not in mem.terms


def test_0_34_with_kv_cache_memory_bytes_given():
    plan = plan_034(kv_cache_memory_bytes=20 * GiB)
    assert '--kv-cache-memory-bytes=%d' % (20 * GiB) in plan.args
    assert '--enable-extensible-kv-cache' not in plan.args
    assert plan.memory[0].kv_cache == 20 * GiB
    assert plan.reasons['kv_cache_memory_bytes'] == 'set by the user'
    assert 'OFF' in plan.reasons['kv_cache_sizing']
    assert any('--kv-cache-memory-bytes fixes the KV budget' in rule for rule in plan.rules)


def test_0_34_busy_gpu_warns_that_the_extensible_cache_would_start_smaller():
    busy = gpus(1, H100_TOTAL, H100_NAME)
    busy[0].update(memory_used=30 * GiB, memory_free=H100_TOTAL - 30 * GiB)
    plan = plan_vllm(llama_8b(), busy, TRAFFIC_8B, {}, '0.34.0')
    assert any('skips the startup free-memory check' in w and 'pin_kv_cache_memory' in w for w in plan.warnings)
    pinned = plan_vllm(llama_8b(), busy, TRAFFIC_8B, {'pin_kv_cache_memory': True}, '0.34.0')
    assert not any('skips the startup' in w for w in pinned.warnings)


def test_0_34_field_report_deployment_measures_the_graph_pool_inside():
    plan = field_plan('0.34.0')
    assert plan.feasible and '--enable-extensible-kv-cache' in plan.args
    # the field report's crash (0.92: the graph pool captured outside the budget) is not one on
    # 0.34, whose extensible cache is sized after graph capture
    crashed = field_plan('0.34.0', gpu_memory_utilization=0.92)
    assert crashed.feasible and 'cuda_graph_pool' not in crashed.memory[0].terms.get('outside_parts', {})
    assert not any('CUDA graph pool' in line for line in crashed.not_fitting)


# ------------------------------------------------------------------ V0 engine (0.6.x, 0.7.x)
@pytest.mark.parametrize('version, long_mnbt', [('0.6.2', 512), ('0.7.3', 2048)])
def test_v0_chunked_prefill_follows_max_model_len(version, long_mnbt):
    short = plan_vllm(llama_8b(), gpus(1, H100_TOTAL, H100_NAME), TRAFFIC_8B, {'max_model_len': 16384}, version)
    long = plan_vllm(llama_8b(), gpus(1, H100_TOTAL, H100_NAME), TRAFFIC_8B, {'max_model_len': 65536}, version)
    assert short.feasible and long.feasible
    assert '--enable-chunked-prefill=False' in short.args and '--max-num-batched-tokens=16384' in short.args
    assert short.settings['enable_chunked_prefill'] is False
    assert '--enable-chunked-prefill' in long.args and '--max-num-batched-tokens=%d' % long_mnbt in long.args
    assert long.settings['enable_chunked_prefill'] is True
    assert 'max_model_len 16384 <= 32768' in short.reasons['enable_chunked_prefill']
    assert 'max_model_len 65536 > 32768' in long.reasons['enable_chunked_prefill']
    # without chunked prefill the profile run pushes a whole 16k prompt: a larger activation peak
    assert short.memory[0].activation > long.memory[0].activation
    for plan in (short, long):
        assert not any(a.startswith(('--kv-cache-memory-bytes', '--enable-extensible')) for a in plan.args)
        assert '--swap-space=0' in plan.args
        assert any('V0 engine' in rule for rule in plan.rules)


def test_v0_usable_blocks_leave_the_one_percent_watermark():
    plan = plan_vllm(llama_8b(), gpus(1, H100_TOTAL, H100_NAME), TRAFFIC_8B, {'max_model_len': 16384}, '0.7.3')
    mem = plan.memory[0]
    blocks = mem.kv_cache // mem.terms['kv_bytes_per_block']
    assert plan.kv_cache_tokens == (blocks - blocks // 100) * 16


def test_v0_cannot_pin_kv_bytes():
    with pytest.raises(PlanInputError, match=r'--kv-cache-memory-bytes \(vLLM >= 0\.10\.2\)') as err:
        plan_vllm(llama_8b(), gpus(1), TRAFFIC_8B, {'pin_kv_cache_memory': True}, '0.6.2')
    assert err.value.field == 'pin_kv_cache_memory'


def test_v0_plans_sliding_window_layers_as_full_attention():
    v0 = plan_vllm(gemma2_9b(), gpus(1), Traffic(2000, 500, 4), {}, '0.7.3')
    assert v0.memory[0].terms['kv_bytes_per_token'] == 42 * 2 * 8 * 256 * 2
    assert 'hybrid' not in v0.memory[0].explain['kv_cache']


def test_v0_refuses_mla_models():
    with pytest.raises(PlanInputError, match='MLA') as err:
        plan_vllm(deepseek_v3(), gpus(8, 150 * GiB, 'NVIDIA H200'), TRAFFIC_8B, {}, '0.7.3')
    assert err.value.field == 'model'


def test_v0_6_4_warns_about_memory_other_processes_hold():
    busy = gpus(1)
    busy[0]['memory_used'] = 2 * GiB
    plan = plan_vllm(llama_8b(), busy, TRAFFIC_8B, {}, '0.6.4')
    assert any('counts memory other processes hold' in w for w in plan.warnings)


@pytest.mark.parametrize('version', ['0.6.0', '0.5.4'])
def test_a_release_older_than_the_oldest_supported_is_refused_naming_it(version):
    with pytest.raises(PlanInputError, match=r'oldest supported release, 0\.6\.1') as err:
        plan_vllm(llama_8b(), gpus(1), TRAFFIC_8B, {}, version)
    assert err.value.field == 'backend_version'


def test_0_8_4_is_planned_as_v1_with_its_own_batch_defaults():
    plan = plan_vllm(llama_8b(), gpus(1), TRAFFIC_8B, {}, '0.8.4')
    assert '--max-num-batched-tokens=2048' in plan.args and '--enable-chunked-prefill' in plan.args
    assert '0.8.0 - 0.8.4' in plan.reasons['max_num_batched_tokens']


def test_a_release_newer_than_the_newest_read_is_planned_with_a_warning():
    plan = plan_vllm(llama_8b(), gpus(1, H100_TOTAL, H100_NAME), TRAFFIC_8B, {}, '0.35.0')
    assert any('newer than the newest release' in w for w in plan.warnings)


@pytest.mark.parametrize('version, inside', [
    ('0.6.3.post1', False), ('0.6.4', True), ('0.6.4.post1', True), ('0.6.5', False),
    ('0.8.0', True), ('0.8.5.post1', True), ('0.10.1.1', False), ('0.34.0', False)])
def test_device_wide_non_torch_eras_charge_the_cuda_context_inside_the_budget(version, inside):
    plan = plan_vllm(llama_8b(), gpus(1), TRAFFIC_8B, {'max_model_len': 8192}, version)
    mem = plan.memory[0]
    assert ('outside_cuda_context' not in mem.terms) is inside
    assert (mem.non_torch >= vm.CUDA_CONTEXT_BYTES) is inside
    busy = gpus(1)
    busy[0]['memory_used'] = 2 * GiB
    warned = plan_vllm(llama_8b(), busy, TRAFFIC_8B, {'max_model_len': 8192}, version).warnings
    assert any('counts memory other processes hold' in w for w in warned) is inside


@pytest.mark.parametrize('version, block_size, accepted', [
    ('0.6.2', 64, False), ('0.6.2', 32, True), ('0.6.4', 128, True), ('0.8.4', 1, False),
    ('0.8.5', 1, True), ('0.34.0', 16, True)])
def test_block_size_choices_by_version(version, block_size, accepted):
    knobs = {'block_size': block_size, 'max_model_len': 8192}
    if accepted:
        plan = plan_vllm(llama_8b(), gpus(1), TRAFFIC_8B, knobs, version)
        assert '--block-size=%d' % block_size in plan.args or block_size == 16
    else:
        with pytest.raises(PlanInputError, match='must be one of .* for vLLM %s' % version) as err:
            plan_vllm(llama_8b(), gpus(1), TRAFFIC_8B, knobs, version)
        assert err.value.field == 'block_size'
