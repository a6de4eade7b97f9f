# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""llama-box / llama.cpp offload planner: sizes against public files and logs, the field
report's 48 GB card, the mixed node, and every refused input."""

from __future__ import annotations

import dataclasses

import pytest

from ansible_collections.kvpin.fleet.plugins.module_utils.plan import attention_kinds as ak
from ansible_collections.kvpin.fleet.plugins.module_utils.plan import llamacpp_memory as lm
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.model_loaders import resolve_model
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.plan_types import PlanInputError, Traffic
from ansible_collections.kvpin.fleet.plugins.module_utils.units import GB, MiB

LLAMA_70B = resolve_model('meta-llama/Llama-3.3-70B-Instruct')
# the catalog's gpt-oss-20b alternates sliding-window (128) and full-attention layers
GPT_OSS_20B = resolve_model('openai/gpt-oss-20b')

# NVML memory.total of an RTX A6000 (the field report's 48 GB card) and an RTX 4090
A6000 = {'index': 0, 'uuid': 'GPU-a6000', 'name': 'NVIDIA RTX A6000',
         'memory_total': 51527024640, 'memory_used': 0, 'memory_free': 51527024640,
         'compute_capability': '8.6'}
RTX4090 = {'index': 1, 'uuid': 'GPU-4090', 'name': 'NVIDIA GeForce RTX 4090',
           'memory_total': 25757220864, 'memory_used': 0, 'memory_free': 25757220864,
           'compute_capability': '8.9'}

Q4KM = {'quantization': 'Q4_K_M'}


def four_k(parallel):
    """The report's traffic: 4k-token prompts plus ~512 generated tokens."""
    return Traffic(prompt_tokens_p99=4096, max_output_tokens=512, max_concurrency=parallel)


def plan(knobs=None, gpus=(A6000,), traffic=None, backend='llama-box', version='v0.0.171',
         spec=LLAMA_70B):
    merged = dict(Q4KM)
    merged.update(knobs or {})
    return lm.plan_llamacpp(spec, list(gpus), traffic or four_k(4), merged, backend, version)


# ---------------------------------------------------------------- weights of a catalog model

# bartowski's Llama-3.1-70B GGUF table (same tensor shapes as 3.3): file sizes in GB
@pytest.mark.parametrize('quant,public_gb', [
    ('Q4_K_M', 42.52), ('Q4_K_S', 40.35), ('Q5_K_M', 49.95), ('Q6_K', 57.89), ('Q8_0', 74.98)])
def test_derived_gguf_size_matches_public_files(quant, public_gb):
    layout, _unused = lm.derive_gguf_layout(LLAMA_70B, quant)
    total = sum(layout.block_bytes) + layout.input_bytes + layout.output_bytes
    assert abs(total / GB - public_gb) / public_gb < 0.01


def test_q4_k_m_mixing_rule():
    _unused, types = lm.derive_gguf_layout(LLAMA_70B, 'Q4_K_M')
    # use_more_bits: first/last eighth (layers 0-9, 70-79) and every third in between
    assert types['blk.0.ffn_down.weight'] == 'Q6_K'
    assert types['blk.10.ffn_down.weight'] == 'Q4_K'
    assert types['blk.12.ffn_down.weight'] == 'Q6_K'
    assert types['blk.79.ffn_down.weight'] == 'Q6_K'
    assert types['blk.12.attn_v.weight'] == 'Q6_K'
    # 70B: attn_v bumped from Q4_K to Q5_K where use_more_bits is false
    assert types['blk.11.attn_v.weight'] == 'Q5_K'
    assert types['blk.11.attn_q.weight'] == 'Q4_K'
    assert types['output.weight'] == 'Q6_K'
    assert types['token_embd.weight'] == 'Q4_K'
    assert types['blk.0.attn_norm.weight'] == 'F32'
    assert sum(1 for n, t in types.items() if n.endswith('ffn_down.weight') and t == 'Q6_K') == 40


def test_builtin_type_table_matches_gguf_package():
    gguf = pytest.importorskip('gguf')
    for name, size in lm._BUILTIN_TYPE_SIZES.items():
        assert tuple(gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[name]]) == size


# ---------------------------------------------------------------- KV against real logs

def test_kv_per_layer_matches_llamacpp_8035():
    # 80-layer model, 8 KV heads x 128, n_ctx 8192 f16: 32 MiB per layer;
    # logged CUDA_Host 64 + CUDA0 1472 + CUDA1 1024 MiB for 2 + 46 + 32 layers
    per_layer = lm.kv_layer_bytes(ak.LayerKV(1024, 1024, False), 8192, 0, 'f16', 'f16')
    assert per_layer == 32 * MiB
    assert (2 * per_layer, 46 * per_layer, 32 * per_layer) == (64 * MiB, 1472 * MiB, 1024 * MiB)


def test_kv_per_layer_matches_gpustack_1126_and_parallel_does_not_multiply():
    # DeepSeek-R1 in llama-box v0.0.114: K 24576 / V 16384 values per token-layer,
    # --parallel 4 --ctx-size 8192: kv_size = 8192, 640 MiB per layer
    cells = lm.kv_cells(8192, 4, padding=32)
    assert cells == 8192
    per_layer = lm.kv_layer_bytes(ak.LayerKV(24576, 16384, False), cells, 0, 'f16', 'f16')
    assert per_layer == 640 * MiB
    assert 19 * per_layer == 12160 * MiB and 6 * per_layer == 3840 * MiB


def test_q8_0_kv_is_34_bytes_per_32_values():
    assert lm.kv_value_bytes('q8_0', 32) == 34
    f16 = lm.kv_layer_bytes(ak.LayerKV(1024, 1024, False), 8192, 0, 'f16', 'f16')
    q8 = lm.kv_layer_bytes(ak.LayerKV(1024, 1024, False), 8192, 0, 'q8_0', 'q8_0')
    assert q8 * 32 * 2 == f16 * 34


def test_sliding_window_kv_matches_gpt_oss_log():
    # llama.cpp#17715 (Dec 2025): gpt-oss-20b -c 16384 KV = 402 MiB with -fa 0 and -fa 1
    p = lm.plan_llamacpp(GPT_OSS_20B, [dict(A6000, memory_total=32187 * MiB)],
                         Traffic(16000, 384, 1), {'quantization': 'MXFP4_MOE', 'ctx_size': 16384},
                         'llama.cpp', 'b7250')
    assert p.settings['kv_cells_swa'] == 768        # pad(128 + 512, 256)
    assert p.memory[0].kv_cache == 402 * MiB


# ---------------------------------------------------------------- compute buffer against real logs

def _shape(n_kv, n_kv_swa, has_swa, n_embd, n_head, n_ff, n_vocab, fa):
    return lm.GraphShape(n_tokens=512, n_kv=n_kv, n_kv_swa=n_kv_swa, has_swa=has_swa,
                         n_embd=n_embd, n_head=n_head, n_ff_live=n_ff, n_vocab=n_vocab,
                         flash_attn=fa)


def test_compute_buffer_matches_llamacpp_8035():
    # 80-layer 70B, n_ctx 8192, no flash attention, output on the CPU: CUDA0 1108.5 MiB
    terms = lm.compute_buffer_terms(_shape(8192, 0, False, 8192, 64, 28672, 32000, False),
                                    attention=True, output=False)
    assert abs(max(terms.values()) / MiB - 1108.5) / 1108.5 < 0.02


def test_flash_attention_compute_buffer_is_smaller_and_matches_gpt_oss():
    # llama.cpp#17715: 398 MiB with -fa 1, 2210 MiB with -fa 0 (same model and KV)
    args = (16384, 768, True, 2880, 64, 4 * 2880, 201088)
    fa = max(lm.compute_buffer_terms(_shape(*args, fa=True), True, True).values())
    no_fa = max(lm.compute_buffer_terms(_shape(*args, fa=False), True, True).values())
    assert abs(fa / MiB - 398) / 398 < 0.05
    assert abs(no_fa / MiB - 2210) / 2210 < 0.05
    assert fa * 4 < no_fa


# ---------------------------------------------------------------- the field report

def test_report_all_80_layers_load_then_die_on_the_first_4k_prompts():
    # GPUStack's 4 slots, each holding a 4k prompt + 512 output tokens, all layers requested
    p = plan({'gpu_layers': 81})
    assert not p.feasible
    text = ' '.join(p.not_fitting)
    assert 'compute' in text and 'CUDA pool growth' in text
    assert 'LOADS' in text and 'first long prompt' in text
    gpu = p.memory[0]
    load = gpu.weights + gpu.kv_cache + gpu.terms['compute_buffer'] + gpu.non_torch
    # against the CUDA-visible total (what llama.cpp can allocate: NVML total less the driver's
    # share), not the NVML total: loading needs the memory CUDA can hand out
    assert gpu.terms['nvml_total'] == A6000['memory_total'] > gpu.total
    assert load <= gpu.total < load + gpu.terms['cuda_pool_growth']
    assert any('fewer layers' in s for s in p.suggestions)


def test_report_layer_cap_for_four_4k_slots_is_below_all():
    p = plan()
    k = p.settings['gpu_layers']
    assert p.feasible and 70 <= k < 80
    assert p.settings['ctx_size'] == 4 * (4096 + 512) and p.settings['parallel'] == 4
    assert p.args[:6] == ['--gpu-layers', str(k), '--ctx-size', '18432', '--parallel', '4']
    gpu = p.memory[0]
    assert gpu.headroom >= 0
    # one more layer does not fit
    assert not plan({'gpu_layers': k + 1}).feasible


def test_report_fleet_traffic_on_gpustack_slots_caps_near_60_of_80():
    """The report's "60 of 80 layers on a 48 GB card". The fleet measured a prompt p99 of 11k
    (and pinned 16384 for vLLM); llama-box under GPUStack runs 4 slots without flash
    attention. For every slot to hold an 11k prompt + 1k output the context is 4 x 12024;
    with that KV and compute buffer the 48 GB card holds 55-65 of the 80 blocks, not all."""
    fleet = Traffic(prompt_tokens_p99=11000, max_output_tokens=1024, max_concurrency=4)
    p = plan(traffic=fleet)
    k = p.settings['gpu_layers']
    assert p.feasible and 55 <= k <= 65, k
    assert p.settings['ctx_size'] == 4 * 12024 and p.settings['parallel'] == 4
    assert not plan({'gpu_layers': 80}, traffic=fleet).feasible
    assert not plan({'gpu_layers': k + 1}, traffic=fleet).feasible


def test_one_4k_slot_fits_all_layers_on_the_48_gb_card():
    p = plan(traffic=four_k(1))
    assert p.feasible and p.settings['gpu_layers'] == 81


def test_memory_terms_add_up():
    p = plan()
    g = p.memory[0]
    assert g.activation == g.terms['compute_buffer'] + g.terms['cuda_pool_growth']
    assert g.non_torch == lm.CUDA_CONTEXT_BYTES and g.cuda_graph == 0
    # the budget is the CUDA-visible total (NVML total less what the driver keeps) - reserve
    assert g.budget == g.total - lm.DEFAULT_VRAM_RESERVE_BYTES
    assert g.total == A6000['memory_total'] - g.terms['driver_reserved'] and g.terms['driver_reserved'] > 0
    assert g.headroom == g.budget - (g.weights + g.kv_cache + g.activation + g.non_torch)
    assert p.kv_cache_tokens == p.settings['kv_cells'] == 18432
    assert p.max_concurrency_at_max_len == 4
    assert set(g.explain) >= {'model_buffer', 'kv_buffer', 'compute_buffer', 'cuda_pool_growth',
                              'cuda_context'}


def test_flash_attention_and_q8_kv_fit_more_layers():
    base = plan().settings['gpu_layers']
    fa = plan({'flash_attn': True, 'cache_type_k': 'q8_0', 'cache_type_v': 'q8_0'})
    assert fa.settings['gpu_layers'] > base
    assert '--flash-attn' in fa.args and '--cache-type-v' in fa.args


# ---------------------------------------------------------------- ctx / parallel rule

def test_parallel_derived_from_concurrency_and_ctx_from_it():
    p = plan(traffic=Traffic(3000, 1000, 3))
    assert p.settings['parallel'] == 3 and p.settings['ctx_size'] == 12000
    assert p.settings['slot_ctx'] == 4000


def test_ctx_smaller_than_parallel_times_need_is_refused():
    with pytest.raises(PlanInputError) as err:
        plan({'ctx_size': 8192, 'parallel': 4})
    assert err.value.field == 'ctx_size' and '2048' in str(err.value) and '18432' in str(err.value)


# ---------------------------------------------------------------- layer placement by version

def test_same_gpu_layers_place_different_tensors_by_version():
    old = plan({'gpu_layers': 40}, backend='llama.cpp', version='b7000')
    new = plan({'gpu_layers': 40}, backend='llama.cpp', version='b7710')
    assert (old.settings['offloaded_blocks'], old.settings['output_on_gpu']) == (40, False)
    assert (new.settings['offloaded_blocks'], new.settings['output_on_gpu']) == (39, True)
    layout, _unused = lm.derive_gguf_layout(LLAMA_70B, 'Q4_K_M')
    assert old.memory[0].weights == sum(layout.block_bytes[40:])
    assert new.memory[0].weights == sum(layout.block_bytes[41:]) + layout.output_bytes
    assert old.args[:2] == ['--n-gpu-layers', '40']
    assert ['--flash-attn', 'off'] == new.args[6:8]


# ---------------------------------------------------------------- the mixed node

def test_mixed_node_split_fits_every_gpu():
    p = plan(gpus=(A6000, RTX4090))
    split = p.settings['tensor_split']
    assert p.feasible and p.settings['gpu_layers'] == 81
    assert sum(split) == 81 and split[0] > split[1] > 0
    assert p.args[p.args.index('--tensor-split') + 1] == '%d,%d' % tuple(split)
    assert all(g.headroom >= 0 for g in p.memory)
    assert p.memory[1].weights > 0 and p.memory[1].kv_cache > 0


def test_user_tensor_split_is_honoured_and_checked():
    p = plan({'tensor_split': [1, 1], 'gpu_layers': 81}, gpus=(A6000, RTX4090))
    assert p.args[p.args.index('--tensor-split') + 1] == '1,1'
    assert not p.feasible        # half of a 70B model does not fit a 24 GB card
    assert any('GPU 1' in line for line in p.not_fitting)


# ---------------------------------------------------------------- user knobs and bad input

def test_user_gpu_layers_all_on_48_gb_card_reported_with_numbers():
    p = plan({'gpu_layers': 80})
    assert not p.feasible and p.settings['gpu_layers'] == 80
    assert 'GiB' in p.not_fitting[0]


def test_llama_box_resets_quantized_v_without_flash_attention():
    p = plan({'cache_type_v': 'q8_0'})
    assert p.settings['cache_type_v'] == 'f16' and any('reset' in w for w in p.warnings)


@pytest.mark.parametrize('knobs,field', [
    ({'gpu_layers': 82}, 'gpu_layers'),
    ({'gpu_layers': -2}, 'gpu_layers'),
    ({'gpu_layers': 'many'}, 'gpu_layers'),
    ({'ctx_size': -5}, 'ctx_size'),
    ({'ctx_size': 10 ** 12}, 'ctx_size'),
    ({'parallel': 0}, 'parallel'),
    ({'ubatch_size': 0}, 'ubatch_size'),
    ({'cache_type_k': 'q3_k'}, 'cache_type_k'),
    ({'cache_type_v': 'fp8'}, 'cache_type_v'),
    ({'flash_attn': 'auto'}, 'flash_attn'),
    ({'quantization': 'Q9_Z'}, 'quantization'),
    ({'quantization': None}, 'quantization'),
    ({'tensor_split': [1, 2]}, 'tensor_split'),
    ({'vram_reserve_bytes': -1}, 'vram_reserve_bytes'),
])
def test_bad_knobs_are_refused_with_the_field(knobs, field):
    with pytest.raises(PlanInputError) as err:
        plan(knobs)
    assert err.value.field == field


def test_quantized_v_without_flash_attention_is_an_error_in_llama_cpp():
    with pytest.raises(PlanInputError) as err:
        plan({'cache_type_v': 'q8_0'}, backend='llama.cpp', version='b6000')
    assert err.value.field == 'cache_type_v'


@pytest.mark.parametrize('gpus,field', [
    ([], 'gpus'), ([{'index': 0, 'name': 'x', 'memory_total': -1}], 'gpus[0].memory_total')])
def test_bad_gpus_are_refused(gpus, field):
    with pytest.raises(PlanInputError) as err:
        lm.plan_llamacpp(LLAMA_70B, gpus, four_k(1), Q4KM, 'llama-box', 'v0.0.171')
    assert err.value.field == field


# ---------------------------------------------------------------- placement and pool details

def test_split_counts_follow_llama_cpp_upper_bound_rule():
    assert lm.split_counts([46, 32], 78) == [46, 32]
    assert lm.split_counts([1, 1], 81) == [41, 40]
    assert lm.split_counts([0, 1], 10) == [0, 10]


def test_tied_embeddings_charge_the_vocab_matrix_again_on_the_output_gpu():
    tied = dataclasses.replace(LLAMA_70B, tie_word_embeddings=True)
    layout, types = lm.derive_gguf_layout(tied, 'Q4_K_M')
    assert 'output.weight' not in types and types['token_embd.weight'] == 'Q6_K'
    p = lm.plan_llamacpp(tied, [A6000], four_k(1), dict(Q4KM, gpu_layers=81), 'llama-box', 'v0.0.171')
    assert p.memory[0].weights == sum(layout.block_bytes) + layout.output_bytes + layout.input_bytes


def test_pool_dequantizes_weights_only_without_int8_tensor_cores():
    v100 = dict(A6000, name='Tesla V100', compute_capability='7.0')
    old = plan({'gpu_layers': 40}, gpus=(v100,)).memory[0].terms
    new = plan({'gpu_layers': 40}).memory[0].terms
    assert 'pool.weight_f16_dequant' not in new
    # the largest matrix MMQ cannot serve on 7.0 is the output layer run for the host
    # (128256 x 8192 F16), else an FFN matrix (8192 x 28672 F16)
    assert old['pool.weight_f16_dequant'] >= 2 * 8192 * 28672


# ggml-cuda has no MMQ kernel for IQ1_M (mmq.cu ggml_cuda_should_use_mmq): a long prompt
# runs its weights through cuBLAS on an F16 copy even on an RTX 4090; IQ2_M's main type IQ2_S
# and IQ3_M's IQ3_S have one (llama-quant.cpp llama_ftype_get_default_type).
@pytest.mark.parametrize('file_type,main_type', [
    ('MOSTLY_Q4_K_M', 'Q4_K'), ('MOSTLY_IQ1_M', 'IQ1_M'), ('MOSTLY_IQ2_M', 'IQ2_S'),
    ('MOSTLY_IQ2_S', 'IQ2_XS'), ('MOSTLY_IQ3_M', 'IQ3_S'), ('MOSTLY_TQ1_0', 'TQ1_0'),
    ('ALL_F32', 'F32'), ('MOSTLY_F16', 'F16'), ('file_type_99', None), ('GUESSED', None), (None, None)])
def test_main_weight_type_of_file_types(file_type, main_type):
    assert lm.main_weight_type(file_type) == main_type


def test_every_gguf_file_type_has_a_main_weight_type():
    gguf = pytest.importorskip('gguf')
    ggml_types = set(t.name for t in gguf.GGMLQuantizationType)
    for file_type in gguf.LlamaFileType:
        if file_type.name != 'GUESSED':
            assert lm.main_weight_type(file_type.name) in ggml_types, file_type.name


def _pool_terms(file_type, gpu):
    """Memory terms of the first GPU for LLAMA_70B as a GGUF file of ``file_type`` (Q4_K_M
    tensor sizes: only the file type differs), 40 blocks offloaded, flash attention on (no KQ
    copy, so the pool growth is the larger of the q8_1 activations and the F16 weight copy)."""
    layout, _unused = lm.derive_gguf_layout(LLAMA_70B, 'Q4_K_M')
    spec = dataclasses.replace(LLAMA_70B, gguf=dataclasses.replace(layout, file_type=file_type))
    p = lm.plan_llamacpp(spec, [gpu], four_k(4), {'gpu_layers': 40, 'flash_attn': True},
                         'llama-box', 'v0.0.171')
    return p.memory[0].terms, p.memory[0].explain['cuda_pool_growth']


def test_pool_dequantizes_weights_of_a_type_without_an_mmq_kernel_on_any_gpu():
    iq1_m, why = _pool_terms('MOSTLY_IQ1_M', RTX4090)
    # an FFN matrix (8192 x 28672) in F16; the output layer run for the host is Q5_K in an
    # IQ1_M mix (MMQ), so not the 128256 x 8192 vocab matrix
    assert 2 * 8192 * 28672 <= iq1_m.get('pool.weight_f16_dequant', 0) < 2 * 128256 * 8192
    assert 'MMQ not used on compute capability 8.9 (IQ1_M has no MMQ kernel' in why
    for mmq_file in ('MOSTLY_IQ2_M', 'MOSTLY_IQ3_M', 'MOSTLY_Q4_K_M'):
        terms, why = _pool_terms(mmq_file, RTX4090)
        assert 'pool.weight_f16_dequant' not in terms, mmq_file
        assert iq1_m['cuda_pool_growth'] > terms['cuda_pool_growth'], mmq_file
        assert why.endswith('MMQ used on compute capability 8.9')
    # a file type the planner does not know is charged the copy
    assert 'pool.weight_f16_dequant' in _pool_terms('file_type_99', RTX4090)[0]


def test_pool_dequantizes_every_quantized_type_below_compute_capability_7_5():
    v100 = dict(A6000, name='Tesla V100', compute_capability='7.0')
    for file_type in ('MOSTLY_IQ1_M', 'MOSTLY_IQ2_M', 'MOSTLY_IQ3_M'):
        terms, why = _pool_terms(file_type, v100)
        assert 'pool.weight_f16_dequant' in terms, file_type
        assert 'below 7.5: no int8 tensor cores' in why
    assert 'pool.weight_f16_dequant' not in _pool_terms('MOSTLY_F16', v100)[0]


def test_no_kv_offload_moves_kv_off_the_gpu():
    p = plan({'no_kv_offload': True, 'gpu_layers': 60})
    assert p.memory[0].kv_cache == 0 and '--no-kv-offload' in p.args


def test_gguf_file_bytes_are_used_as_read(tmp_path):
    gguf = pytest.importorskip('gguf')
    np = pytest.importorskip('numpy')
    path = str(tmp_path / 'tiny.gguf')
    writer = gguf.GGUFWriter(path, 'llama')
    writer.add_block_count(2)
    writer.add_context_length(4096)
    writer.add_embedding_length(64)
    writer.add_feed_forward_length(128)
    writer.add_head_count(8)
    writer.add_head_count_kv(2)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    writer.add_tensor('token_embd.weight', np.zeros((100, 64), np.float16))
    for il in range(2):
        q = gguf.quants.quantize(np.ones((64, 64), np.float32), gguf.GGMLQuantizationType.Q8_0)
        writer.add_tensor('blk.%d.attn_q.weight' % il, q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.add_tensor('output.weight', np.zeros((100, 64), np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    spec = resolve_model(path)
    p = lm.plan_llamacpp(spec, [A6000], Traffic(1000, 24, 1), {'gpu_layers': 3}, 'llama.cpp', 'b7710')
    assert p.feasible
    assert p.memory[0].weights == 2 * (64 * 64 // 32 * 34) + 100 * 64 * 2
    # 2 KV heads x 8 dims, f16 K and V, ctx 1024 cells (32-padding of 1024 is 1024; L-new 256)
    assert p.memory[0].kv_cache == 2 * 1024 * (16 * 2 + 16 * 2)


# ---------------------------------------------------------------- llama-server under GPUStack 2.x

def _value(args, flag):
    return args[args.index(flag) + 1] if flag in args else None


@pytest.mark.parametrize('version, fit', [('b7000', None), ('b7347', None), ('b7445', 'off'), ('b7710', 'off')])
def test_llama_server_pins_what_the_plan_computed_by_version(version, fit):
    """GPUStack 2.x's llama.cpp backend passes neither the scheduler's layer count nor its split,
    and llama-server's --fit (on by default where it exists) would re-fit to free VRAM: the
    backend parameters pin layers, context, slots and --fit off where the build has it."""
    p = plan(backend='llama.cpp', version=version)
    assert _value(p.args, '--n-gpu-layers') == str(p.settings['gpu_layers'])
    assert _value(p.args, '--ctx-size') == str(p.settings['ctx_size'])
    assert _value(p.args, '--parallel') == str(p.settings['parallel'])
    assert _value(p.args, '--fit') == fit
    assert p.args.count('--fit') == (1 if fit else 0)


def test_llama_server_split_is_pinned_on_two_gpus():
    p = plan(backend='llama.cpp', version='b7710', gpus=(A6000, RTX4090))
    assert _value(p.args, '--tensor-split') is not None
    assert _value(p.args, '--fit') == 'off'


def test_llama_box_gets_no_fit_flag():
    assert '--fit' not in plan().args
