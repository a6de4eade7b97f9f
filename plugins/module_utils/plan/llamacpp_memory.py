# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Memory planner for llama-box / llama.cpp layer offload (``plan_llamacpp``).

Per GPU, in bytes (every term named in ``GpuMemory.terms``):

* model buffer: bytes of the GGUF tensors of the units (blocks, output layer) placed on it;
* KV buffer: per offloaded block, ``cells * (n_embd_k_gqa * b_k + n_embd_v_gqa * b_v)``;
* compute buffer: the worst-case graph llama.cpp reserves at load for
  ``n_tokens = min(ctx, n_ubatch)`` against a full cache, as the peak of live tensors at
  attention / FFN / output time (see ``compute_buffer_terms``);
* CUDA pool growth: NOT printed at load; it appears with the first long prompt
  (ggml-org/llama.cpp#4712, ollama/ollama#5913): the F16 copy of the attention
  probabilities for the batched cuBLAS KQV product without flash attention, the q8_1
  copy of the activations for MMQ, and, for weights MMQ does not serve (GPUs without int8
  tensor cores, or a type without an MMQ kernel such as IQ1_M: ``dequant_reason``), the F16
  dequantization of the largest such weight matrix (``pool_growth_terms``);
* CUDA context / driver: ``CUDA_CONTEXT_BYTES``.

The plan keeps ``total - reserve`` (``DEFAULT_VRAM_RESERVE_BYTES``) as its budget.
Facts that depend on the engine build come from ``llamacpp_profile``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Dict, List, Optional

from ansible_collections.kvpin.fleet.plugins.module_utils.plan import cuda_total as ct
from ansible_collections.kvpin.fleet.plugins.module_utils.plan import gguf_reader
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.model_spec import ModelSpecError
from ansible_collections.kvpin.fleet.plugins.module_utils.plan import llamacpp_profile as prof
from ansible_collections.kvpin.fleet.plugins.module_utils.plan import term_kinds as tk
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.attention_kinds import kind_of
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.model_spec import LAYER_MLA, GGUFLayout, ModelSpec
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.plan_types import (
    GpuMemory, Plan, PlanInputError, Traffic, check_gpu_totals, type_name)
from ansible_collections.kvpin.fleet.plugins.module_utils.units import GiB, MiB, ceil_div, fmt_bytes
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.fitted import (
    BYTES, Fitted, describe_together, source_rows_of)


# ---------------------------------------------------------------- named constants

# CUDA context + cuBLAS handles + driver: the "unaccounted" column of llama.cpp's memory
# breakdown on an RTX 4090 in ggml-org/llama.cpp PR #15860
# (24080 = 9436 + (14193 = 13169 + 38 + 985) + 451 MiB). gguf-parser assumes 250 MiB.
CUDA_CONTEXT_BYTES = 450 * MiB
CUDA_CONTEXT_SOURCE = 'ggml-org/llama.cpp PR #15860 memory breakdown, RTX 4090: 451 MiB unaccounted'

# What the plan keeps free on every GPU beyond its own terms: GPUStack 0.7.x reserved
# 1 GiB VRAM per GPU by default (system_reserved vram: 1; gpustack#2101), and llama.cpp's
# own --fit keeps a 1024 MiB margin per device (common.h fit_params_target).
DEFAULT_VRAM_RESERVE_BYTES = 1 * GiB
RESERVE_SOURCE = 'GPUStack 0.7.x system_reserved vram 1 GiB default; llama.cpp --fit margin 1024 MiB'

CUDA_GRAPH_NOTE = ('0: ggml-cuda captures CUDA graphs only for single-token batches (disabled '
                   '"due to batch size > 1", ggml-cuda.cu); no measured size, not confirmed')

# Hidden-state-sized F32 tensors live while attention runs: the residual stream, the
# attn_norm output, Q, and the attention output. Counted from the llama graph; with the
# KQ scores and mask it gives 1104 MiB for the 80-layer model of ggml-org/llama.cpp#8035
# (n_ctx 8192, ubatch 512, 64 heads, no flash attention), logged 1108.5 MiB.
HIDDEN_LIVE_AT_ATTENTION = 4
# At FFN time: residual + ffn_norm output; at output time: residual + output_norm output.
HIDDEN_LIVE_AT_FFN = 2
HIDDEN_LIVE_AT_OUTPUT = 2
# The live-tensor counts above were fitted on the compute buffers of these rows of
# benchmarks/data/llamacpp_public.json (llama.cpp#8035 CUDA0 1108.5 MiB; #17715 398 / 2210 MiB).
COMPUTE_BUFFER_SOURCE_ROWS = ('llamacpp-8035-70b-4060ti-3060', 'llamacpp-17715-gpt-oss-20b-fa1',
                              'llamacpp-17715-gpt-oss-20b-fa0')

# GGML types that ggml-cuda multiplies with MMQ (quantized kernels, no F16 dequant) on GPUs
# with int8 tensor cores, compute capability >= 7.5. Read in ggml-org/llama.cpp:
# * ggml/src/ggml-cuda/mmq.cu (commit 027ef8769913), ggml_cuda_should_use_mmq: a switch on the
#   weight type sets mmq_supported for exactly these types (and Q1_0, NVFP4, newer than the
#   builds planned here: left out, which charges them the F16 copy, the larger side); any
#   other type (IQ1_M, TQ1_0, TQ2_0, ...) returns false before the compute capability is
#   looked at; a supported type returns true when turing_mma_available(cc).
# * ggml/src/ggml-cuda/ggml-cuda.cu (commit 00108827d879), ggml_cuda_mul_mat: MMVF/MMF (float
#   weights only), then MMVQ while ne11 (the batch) <= MMVQ_MAX_BATCH_SIZE, then MMQ when
#   ggml_cuda_should_use_mmq, else ggml_cuda_mul_mat_cublas: a quantized weight gets compute
#   type F16 and ggml_cuda_mul_mat_cublas_impl converts it to a pool buffer of
#   ggml_nelements(src0) halves (src0_alloc). So a batch above the MMVQ limit dequantizes a
#   weight without an MMQ kernel on every GPU. Below cc 7.5 the planner charges the copy for
#   every quantized weight, the larger side: there ggml_cuda_should_use_mmq still picks MMQ on
#   NVIDIA GPUs without FP16 tensor cores (Pascal) or for ne11 < MMQ_DP4A_MAX_BATCH_SIZE.
# Which type a file's weights have: main_weight_type (llama-quant.cpp).
MMQ_TYPES = frozenset(('Q4_0', 'Q4_1', 'Q5_0', 'Q5_1', 'Q8_0', 'MXFP4', 'Q2_K', 'Q3_K',
                       'Q4_K', 'Q5_K', 'Q6_K', 'IQ2_XXS', 'IQ2_XS', 'IQ2_S', 'IQ3_XXS',
                       'IQ3_S', 'IQ1_S', 'IQ4_XS', 'IQ4_NL'))
MMQ_MIN_COMPUTE_CAPABILITY = (7, 5)
UNQUANTIZED_TYPES = frozenset(('F32', 'F16', 'BF16'))
Q8_1_BLOCK = (32, 36)     # MMQ quantizes the activations to ggml block_q8_1: 32 int8 + half2

# Fitted constant -> the benchmarks/data/llamacpp_public.json rows ("id"s) it was read from
# (the one place for it: bench_accuracy_llamacpp.py scores them as the "fit" split,
# tests/unit/test_validation_split.py checks the data file against it).
_COMPUTE_BUFFER_FITTED_ON = ('the compute buffers of llama.cpp#8035 (CUDA0 1108.5 MiB) and #17715 '
                             '(398 / 2210 MiB)')
HIDDEN_LIVE = (
    Fitted('llamacpp_memory.HIDDEN_LIVE_AT_ATTENTION', HIDDEN_LIVE_AT_ATTENTION,
           '{} hidden-sized F32 tensors live at attention', _COMPUTE_BUFFER_FITTED_ON,
           COMPUTE_BUFFER_SOURCE_ROWS),
    Fitted('llamacpp_memory.HIDDEN_LIVE_AT_FFN', HIDDEN_LIVE_AT_FFN, '{} at FFN',
           _COMPUTE_BUFFER_FITTED_ON, COMPUTE_BUFFER_SOURCE_ROWS),
    Fitted('llamacpp_memory.HIDDEN_LIVE_AT_OUTPUT', HIDDEN_LIVE_AT_OUTPUT, '{} at output',
           _COMPUTE_BUFFER_FITTED_ON, COMPUTE_BUFFER_SOURCE_ROWS),
)
CUDA_CONTEXT = Fitted('llamacpp_memory.CUDA_CONTEXT_BYTES', CUDA_CONTEXT_BYTES, BYTES,
                      CUDA_CONTEXT_SOURCE + ' (not a data row)')
FITTED_SOURCE_ROWS = source_rows_of(CUDA_CONTEXT, *HIDDEN_LIVE)

# (values per block, bytes per block): GGML_QUANT_SIZES of gguf-py, used when the gguf
# package is not installed. test_llamacpp_memory checks this table against gguf's.
_BUILTIN_TYPE_SIZES = {
    'F32': (1, 4), 'F16': (1, 2), 'BF16': (1, 2), 'Q4_0': (32, 18), 'Q4_1': (32, 20),
    'Q5_0': (32, 22), 'Q5_1': (32, 24), 'Q8_0': (32, 34), 'Q2_K': (256, 84),
    'Q3_K': (256, 110), 'Q4_K': (256, 144), 'Q5_K': (256, 176), 'Q6_K': (256, 210),
    'IQ2_XXS': (256, 66), 'IQ2_XS': (256, 74), 'IQ3_XXS': (256, 98), 'IQ1_S': (256, 50),
    'IQ4_NL': (32, 18), 'IQ3_S': (256, 110), 'IQ2_S': (256, 82), 'IQ4_XS': (256, 136),
    'IQ1_M': (256, 56), 'MXFP4': (32, 17),
}


def ggml_type_size(type_name):
    """(values per block, bytes per block) of a GGML type name ('Q4_K', 'q8_0', 'f16')."""
    name = str(type_name).upper()
    if name in _BUILTIN_TYPE_SIZES:
        return _BUILTIN_TYPE_SIZES[name]
    # A type newer than the built-in table: the gguf package's, imported only then (it pulls
    # numpy in, which a plan of known types never needs), by gguf_reader's one lazy import.
    try:
        gguf = gguf_reader.require_gguf()
    except ModelSpecError:
        raise KeyError(name)
    try:
        return tuple(gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[name]])
    except KeyError:
        raise KeyError(name)


def type_bytes(type_name, n_elements):
    """Stored bytes of ``n_elements`` values of GGML type ``type_name`` (whole blocks)."""
    block, size = ggml_type_size(type_name)
    return ceil_div(int(n_elements), block) * size


# ---------------------------------------------------------------- GGUF layout of a catalog model
# llama-quant.cpp (ggml-org/llama.cpp src/llama-quant.cpp, llama_tensor_get_type_impl):
# the base type of each quantization mix, then per-tensor overrides.
FTYPE_BASE_TYPE = {
    'F32': 'F32', 'F16': 'F16', 'BF16': 'BF16', 'Q8_0': 'Q8_0', 'Q4_0': 'Q4_0',
    'Q4_1': 'Q4_1', 'Q5_0': 'Q5_0', 'Q5_1': 'Q5_1', 'Q6_K': 'Q6_K', 'Q5_K_S': 'Q5_K',
    'Q5_K_M': 'Q5_K', 'Q4_K_S': 'Q4_K', 'Q4_K_M': 'Q4_K', 'IQ2_XXS': 'IQ2_XXS',
    'IQ4_XS': 'IQ4_XS', 'MXFP4_MOE': 'MXFP4',
}
_IQ_LOW = frozenset(('IQ2_XXS', 'IQ2_XS', 'IQ3_XXS', 'IQ1_S', 'IQ2_S', 'IQ2_M', 'IQ1_M'))
# ncols not divisible by the block size: llama-quant tensor_type_fallback.
_FALLBACK = {'IQ2_XXS': 'IQ4_NL', 'IQ2_XS': 'IQ4_NL', 'IQ2_S': 'IQ4_NL', 'IQ3_XXS': 'IQ4_NL',
             'IQ3_S': 'IQ4_NL', 'IQ1_S': 'IQ4_NL', 'IQ1_M': 'IQ4_NL', 'IQ4_XS': 'IQ4_NL',
             'Q2_K': 'Q4_0', 'Q3_K': 'Q4_0', 'Q4_K': 'Q5_0', 'Q5_K': 'Q5_1', 'Q6_K': 'Q8_0'}
# The base type of the file types whose per-tensor mix derive_gguf_layout does not model (a
# GGUF file of such a type can still be planned): with FTYPE_BASE_TYPE, the whole of
# llama_ftype_get_default_type (src/llama-quant.cpp, commit 007dbbf3fd17). Note IQ2_S -> IQ2_XS,
# IQ2_M -> IQ2_S, IQ3_XS and IQ3_M -> IQ3_S.
_FILE_ONLY_BASE_TYPE = {
    'Q2_K': 'Q2_K', 'Q2_K_S': 'Q2_K', 'Q3_K_S': 'Q3_K', 'Q3_K_M': 'Q3_K', 'Q3_K_L': 'Q3_K',
    'IQ2_XS': 'IQ2_XS', 'IQ2_S': 'IQ2_XS', 'IQ2_M': 'IQ2_S', 'IQ3_XXS': 'IQ3_XXS',
    'IQ3_XS': 'IQ3_S', 'IQ3_S': 'IQ3_S', 'IQ3_M': 'IQ3_S', 'IQ1_S': 'IQ1_S', 'IQ1_M': 'IQ1_M',
    'IQ4_NL': 'IQ4_NL', 'TQ1_0': 'TQ1_0', 'TQ2_0': 'TQ2_0', 'NVFP4': 'NVFP4', 'Q1_0': 'Q1_0',
    'Q2_0': 'Q2_0',
}


def _ftype_name(file_type):
    """'MOSTLY_Q4_K_M' / 'q4_k_m' -> 'Q4_K_M'; 'ALL_F32' -> 'F32' (as normalize_ftype, no error)."""
    name = str(file_type or '').strip().upper()
    if name.startswith('MOSTLY_'):
        name = name[len('MOSTLY_'):]
    return 'F32' if name == 'ALL_F32' else name


def main_weight_type(file_type):
    """GGML type of the main weights (the large block matrices) of GGUF file type ``file_type``
    ('MOSTLY_IQ3_M' -> 'IQ3_S', 'MOSTLY_IQ1_M' -> 'IQ1_M'); None when the file type is not
    known (None, 'GUESSED', 'file_type_99')."""
    name = _ftype_name(file_type)
    return FTYPE_BASE_TYPE.get(name) or _FILE_ONLY_BASE_TYPE.get(name)


def output_weight_type(file_type):
    """GGML type of output.weight (or the tied token_embd) in a ``file_type`` file: the output
    branch of llama_tensor_get_type_impl without --output-tensor-type (as in tensor_type):
    Q8_0 for MXFP4_MOE and Q8_0, Q5_K for the _IQ_LOW mixes, else Q6_K; all have an MMQ kernel.
    Unquantized and unknown file types: main_weight_type."""
    main = main_weight_type(file_type)
    if main is None or main in UNQUANTIZED_TYPES:
        return main
    name = _ftype_name(file_type)
    if name in ('MXFP4_MOE', 'Q8_0'):
        return 'Q8_0'
    return 'Q5_K' if name in _IQ_LOW else 'Q6_K'


def dequant_reason(weight_type, cc):
    """Why ggml-cuda multiplies a weight of GGML type ``weight_type`` (None: not known) with
    cuBLAS on an F16 copy from the pool on a GPU of compute capability ``cc`` ((major, minor) or
    None) for a batch above the MMVQ limit; None when it does not (MMQ serves it, or the weight
    is F32/F16/BF16, which cuBLAS reads as stored). See MMQ_TYPES for the source."""
    if weight_type in UNQUANTIZED_TYPES:
        return None
    if weight_type is None:
        return 'file type not known, taken as without an MMQ kernel'
    if weight_type not in MMQ_TYPES:
        return '%s has no MMQ kernel in ggml-cuda' % weight_type
    if cc is None:
        return 'compute capability not known'
    if cc < MMQ_MIN_COMPUTE_CAPABILITY:
        return 'below %d.%d: no int8 tensor cores' % MMQ_MIN_COMPUTE_CAPABILITY
    return None


def use_more_bits(i_layer, n_layers):
    """llama-quant.cpp: the first and last eighth of the layers and every third in between."""
    return (i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8
            or (i_layer - n_layers // 8) % 3 == 2)


@dataclass(frozen=True)
class TensorInfo:
    name: str
    category: str            # 'token_embd' | 'output' | 'attn_q' | 'attn_k' | 'attn_v' | ...
    layer: Optional[int]
    ne0: int                 # row length (ncols): what the block size must divide
    n_elements: int
    n_expert: int = 1


def _model_tensors(spec):
    """GGUF tensors of a llama-style model (dense or MoE, GQA or MHA), in llama.cpp names."""
    if any(k == LAYER_MLA for k in spec.layer_kinds):
        raise PlanInputError('quantization', '%s uses MLA attention: per-tensor GGUF sizes are '
                             'not derived for it; give the .gguf file as model' % spec.name)
    n_embd, n_head, hd = spec.hidden_size, spec.num_attention_heads, spec.head_dim
    q_out, kv_out = n_head * hd, spec.num_kv_heads * hd
    tensors = [TensorInfo('token_embd.weight', 'token_embd', None, n_embd,
                          spec.vocab_size * n_embd)]
    for il in range(spec.num_layers):
        p = 'blk.%d.' % il
        tensors += [
            TensorInfo(p + 'attn_norm.weight', 'norm', il, n_embd, n_embd),
            TensorInfo(p + 'attn_q.weight', 'attn_q', il, n_embd, n_embd * q_out),
            TensorInfo(p + 'attn_k.weight', 'attn_k', il, n_embd, n_embd * kv_out),
            TensorInfo(p + 'attn_v.weight', 'attn_v', il, n_embd, n_embd * kv_out),
            TensorInfo(p + 'attn_output.weight', 'attn_output', il, q_out, q_out * n_embd),
            TensorInfo(p + 'ffn_norm.weight', 'norm', il, n_embd, n_embd),
        ]
        if spec.num_experts:
            n_exp, ff = spec.num_experts, spec.moe_intermediate_size
            tensors += [
                TensorInfo(p + 'ffn_gate_inp.weight', 'router', il, n_embd, n_embd * n_exp),
                TensorInfo(p + 'ffn_gate_exps.weight', 'ffn_gate', il, n_embd, n_embd * ff * n_exp, n_exp),
                TensorInfo(p + 'ffn_up_exps.weight', 'ffn_up', il, n_embd, n_embd * ff * n_exp, n_exp),
                TensorInfo(p + 'ffn_down_exps.weight', 'ffn_down', il, ff, ff * n_embd * n_exp, n_exp),
            ]
            if spec.num_shared_experts:
                sff = ff * spec.num_shared_experts
                tensors += [
                    TensorInfo(p + 'ffn_gate_shexp.weight', 'ffn_gate', il, n_embd, n_embd * sff),
                    TensorInfo(p + 'ffn_up_shexp.weight', 'ffn_up', il, n_embd, n_embd * sff),
                    TensorInfo(p + 'ffn_down_shexp.weight', 'ffn_down', il, sff, sff * n_embd),
                ]
        else:
            ff = spec.intermediate_size
            tensors += [
                TensorInfo(p + 'ffn_gate.weight', 'ffn_gate', il, n_embd, n_embd * ff),
                TensorInfo(p + 'ffn_up.weight', 'ffn_up', il, n_embd, n_embd * ff),
                TensorInfo(p + 'ffn_down.weight', 'ffn_down', il, ff, ff * n_embd),
            ]
    tensors.append(TensorInfo('output_norm.weight', 'norm', None, n_embd, n_embd))
    if not spec.tie_word_embeddings:
        tensors.append(TensorInfo('output.weight', 'output', None, n_embd,
                                  spec.vocab_size * n_embd))
    return tensors


def _is_70b(spec):
    # llama-model.cpp: LLM_ARCH_LLAMA with 80 layers and GQA is LLM_TYPE_70B, which bumps
    # attn_v from Q3_K/Q4_K to Q5_K in llama-quant.cpp.
    arch = spec.architecture.lower()
    return ('llama' in arch and spec.num_layers == 80
            and spec.num_attention_heads != spec.num_kv_heads)


def tensor_type(ftype, tensor, spec, tied):
    """GGML type llama-quantize gives ``tensor`` for mix ``ftype`` (no imatrix, not --pure)."""
    base = FTYPE_BASE_TYPE[ftype]
    if base in UNQUANTIZED_TYPES:
        return base if tensor.category != 'norm' else 'F32'
    if tensor.category in ('norm', 'router'):
        return 'F32'   # 1-D tensors and ffn_gate_inp are never quantized
    n_layer = spec.num_layers
    n_gqa = spec.num_attention_heads // max(1, spec.num_kv_heads)
    n_expert = spec.num_experts
    il = tensor.layer
    cat = tensor.category
    new = base
    if cat == 'output' or (tied and cat == 'token_embd'):
        if ftype == 'MXFP4_MOE' or tensor.ne0 % ggml_type_size(new)[0]:
            new = 'Q8_0'
        elif ftype in _IQ_LOW:
            new = 'Q5_K'
        elif new != 'Q8_0':
            new = 'Q6_K'
        return new
    if ftype == 'MXFP4_MOE':
        return 'MXFP4' if tensor.n_expert > 1 else 'Q8_0'
    if cat == 'token_embd':
        if ftype in ('IQ2_XXS', 'IQ2_XS', 'IQ1_S', 'IQ1_M'):
            new = 'Q2_K'
    elif ftype in _IQ_LOW:
        if cat == 'attn_v':
            new = 'Q4_K' if (n_gqa >= 4 or n_expert >= 4) else 'Q2_K'
        elif cat == 'attn_k' and n_expert == 8:
            new = 'Q4_K'
        elif cat == 'ffn_down' and il < n_layer // 8:
            new = 'Q2_K'
        elif cat == 'attn_output' and n_expert == 8:
            new = 'Q5_K'
    elif cat == 'attn_v':
        if ftype in ('IQ4_XS',) and n_gqa >= 4:
            new = 'Q5_K'
        elif ftype in ('Q4_K_M', 'Q5_K_M') and use_more_bits(il, n_layer):
            new = 'Q6_K'
        elif ftype == 'Q4_K_S' and il < 4:
            new = 'Q5_K'
        if _is_70b(spec) and new in ('Q3_K', 'Q4_K'):
            new = 'Q5_K'
        if n_expert == 8:
            new = 'Q8_0'
    elif cat == 'attn_k':
        if n_expert == 8:
            new = 'Q8_0'
    elif cat == 'ffn_down':
        if ftype in ('Q4_K_M', 'Q5_K_M') and use_more_bits(il, n_layer):
            new = 'Q6_K'
        elif ftype == 'Q4_K_S' and il < n_layer // 8:
            new = 'Q5_K'
        elif ftype == 'IQ4_XS' and il < n_layer // 8:
            new = 'Q5_K'
    elif cat == 'attn_output':
        if n_expert == 8 and ftype in ('Q4_K_S', 'Q4_K_M', 'IQ4_XS'):
            new = 'Q5_K'
    if tensor.ne0 % ggml_type_size(new)[0]:
        new = _FALLBACK.get(new, 'F16')
        if tensor.ne0 % ggml_type_size(new)[0]:
            new = 'F16'
    return new


def normalize_ftype(quantization):
    """'Q4_K_M', 'q4_k_m', 'MOSTLY_Q4_K_M' -> 'Q4_K_M' (PlanInputError when unknown)."""
    name = str(quantization or '').strip().upper()
    if name.startswith('MOSTLY_'):
        name = name[len('MOSTLY_'):]
    if name == 'ALL_F32':
        name = 'F32'
    if name not in FTYPE_BASE_TYPE:
        raise PlanInputError('quantization', 'GGUF quantization %r is not known; use one of %s'
                             % (quantization, ', '.join(sorted(FTYPE_BASE_TYPE))))
    return name


def derive_gguf_layout(spec, quantization):
    """GGUFLayout of ``spec`` quantized with llama-quantize mix ``quantization``.

    Per-tensor types follow llama.cpp src/llama-quant.cpp (llama_tensor_get_type_impl,
    no imatrix); sizes use GGML_QUANT_SIZES. Returns (layout, {tensor name: type})."""
    ftype = normalize_ftype(quantization)
    tied = bool(spec.tie_word_embeddings)
    blocks = [0] * spec.num_layers
    input_bytes = output_bytes = 0
    types = {}
    tensors = _model_tensors(spec)
    for tensor in tensors:
        ttype = tensor_type(ftype, tensor, spec, tied)
        types[tensor.name] = ttype
        size = type_bytes(ttype, tensor.n_elements)
        if tensor.layer is not None:
            blocks[tensor.layer] += size
        elif tensor.category == 'token_embd':
            input_bytes += size
        else:
            output_bytes += size
    kinds = spec.layer_kinds
    kv_heads = [spec.num_kv_heads if kind_of(k).caches_kv else 0 for k in kinds]
    layout = GGUFLayout(
        file_type='MOSTLY_' + ftype, block_bytes=blocks, input_bytes=input_bytes,
        output_bytes=output_bytes, output_tied=tied, key_length=spec.head_dim,
        value_length=spec.head_dim, kv_heads_per_layer=kv_heads, n_tensors=len(tensors))
    return layout, types


# ---------------------------------------------------------------- KV cache

def kv_value_bytes(cache_type, n_values):
    """Bytes of ``n_values`` KV values of ``cache_type`` (f16: 2, q8_0: 34/32 ...)."""
    if cache_type not in prof.CACHE_TYPES:
        raise PlanInputError('cache_type', 'unknown KV cache type %r; one of %s'
                             % (cache_type, ', '.join(prof.CACHE_TYPES)))
    return type_bytes(cache_type, n_values)


def pad_to(value, multiple):
    return ceil_div(int(value), multiple) * multiple


def kv_cells(ctx_size, parallel, padding, unified=False):
    """Total KV cells for -c ctx_size -np parallel (llama-model.cpp create_memory).

    Without a unified cache each of ``parallel`` streams gets pad(ceil(ctx/parallel))."""
    if unified:
        return pad_to(ctx_size, padding)
    per_stream = pad_to(ceil_div(ctx_size, parallel), padding)
    return per_stream * parallel


def swa_cells(full_cells, n_swa, parallel, n_ubatch, padding, unified=False):
    """Cells of a sliding-window layer: min(size, pad(n_swa * n_seq + n_ubatch))
    (llama-kv-cache-unified-iswa.cpp:31; n_seq is 1 unless the cache is unified)."""
    n_seq = parallel if unified else 1
    return min(full_cells, pad_to(n_swa * n_seq + n_ubatch, padding))


def layer_kv_dims(spec, layout=None):
    """Per block: K and V values per cell (llama-hparams n_embd_k_gqa / n_embd_v_gqa)."""
    return [kind_of(kind).llamacpp_dims(spec, layout, il) for il, kind in enumerate(spec.layer_kinds)]


def kv_layer_bytes(dims, cells, cells_swa, cache_type_k, cache_type_v):
    """KV buffer bytes of one block."""
    n = cells_swa if dims.sliding else cells
    return (kv_value_bytes(cache_type_k, dims.n_embd_k_gqa * n)
            + kv_value_bytes(cache_type_v, dims.n_embd_v_gqa * n))


# ---------------------------------------------------------------- compute buffer and pool

@dataclass(frozen=True)
class GraphShape:
    """What sizes the worst-case graph: tokens per ubatch and KV cells per layer kind."""
    n_tokens: int
    n_kv: int
    n_kv_swa: int
    has_swa: bool
    n_embd: int
    n_head: int
    n_ff_live: int          # widest FFN activation per token (dense n_ff or used experts)
    n_vocab: int
    flash_attn: bool


def compute_buffer_terms(shape, attention, output):
    """Named peaks of the compute buffer on one device; the buffer is their max.

    ``attention``: this device runs attention/FFN of some block; ``output``: it computes
    the logits (output layer resident, or copied from the host for a large batch)."""
    f32 = 4
    t = shape.n_tokens
    hidden = f32 * shape.n_embd * t
    mask_bytes = (f32 if not shape.flash_attn else 2) * t
    masks = mask_bytes * shape.n_kv + (mask_bytes * shape.n_kv_swa if shape.has_swa else 0)
    terms = {}
    if attention:
        kq = 0 if shape.flash_attn else f32 * shape.n_kv * t * shape.n_head
        terms['attention_peak'] = masks + kq + HIDDEN_LIVE_AT_ATTENTION * hidden
        terms['ffn_peak'] = masks + HIDDEN_LIVE_AT_FFN * hidden + 2 * f32 * shape.n_ff_live * t
    if output:
        terms['output_peak'] = HIDDEN_LIVE_AT_OUTPUT * hidden + f32 * shape.n_vocab * t
    return terms


def pool_growth_terms(shape, attention, dequant_elements, k_in):
    """CUDA pool growth (bytes) on the first long prompt, per named cause.

    * ``kq_f16_copy``: without flash attention the batched cuBLAS KQV product converts the
      F32 probabilities [n_kv, n_tokens, n_head] to F16 in the pool;
    * ``activations_q8_1``: MMQ quantizes the widest activation input to q8_1;
    * ``weight_f16_dequant``: cuBLAS path only (no int8 tensor cores or a type without MMQ):
      the largest weight matrix dequantized to F16.
    The VMM pool reuses one address range, so the growth is the largest single need."""
    terms = {}
    if attention and not shape.flash_attn:
        terms['kq_f16_copy'] = 2 * shape.n_kv * shape.n_tokens * shape.n_head
    if k_in:
        values, size = Q8_1_BLOCK
        terms['activations_q8_1'] = ceil_div(k_in * shape.n_tokens, values) * size
    if dequant_elements:
        terms['weight_f16_dequant'] = 2 * dequant_elements + 2 * k_in * shape.n_tokens
    return terms


def parse_compute_capability(value):
    if value is None:
        return None
    try:
        parts = str(value).split('.')
        return (int(parts[0]), int(parts[1]) if len(parts) > 1 else 0)
    except (TypeError, ValueError):
        return None


# ---------------------------------------------------------------- placement

@dataclass(frozen=True)
class Unit:
    """One offloadable unit: a repeating block or the output layer."""
    name: str                # 'blk.<i>' | 'output'
    layer: Optional[int]
    weight_bytes: int
    kv_bytes: int
    largest_matrix: int      # elements of its largest weight matrix
    widest_input: int        # longest row among its matrices (activation width)
    weight_type: Optional[str]  # GGML type of its largest matrix (None: not known); dequant_reason


def gpu_units(profile, units_by_layer, output_unit, gpu_layers):
    """Units placed on GPUs for -ngl gpu_layers, in llama.cpp's device order."""
    n_layer = len(units_by_layer)
    start, n_blocks, output_on = prof.gpu_blocks_and_output(profile, n_layer, gpu_layers)
    units = list(units_by_layer[start:start + n_blocks])
    if output_on:
        units.append(output_unit)   # the output is the last unit (il = n_layer) in both rules
    return units


def split_counts(fractions, n_units):
    """Units per device for tensor_split ``fractions`` (llama-model.cpp: device of unit j is
    upper_bound(cumulative normalized splits, j / n_units))."""
    total = float(sum(fractions))
    cumulative = []
    running = 0.0
    for f in fractions:
        running += f
        cumulative.append(running / total)
    counts = [0] * len(fractions)
    for j in range(n_units):
        x = float(j) / n_units
        dev = next((i for i, c in enumerate(cumulative) if c > x), len(fractions) - 1)
        counts[dev] += 1
    return counts


# ---------------------------------------------------------------- per-device memory

@dataclass(frozen=True)
class DeviceContext:
    """What each device's memory depends on besides its own units, for one placement."""
    shape: GraphShape
    no_kv_offload: bool
    weights_note: str                # how the weights were obtained (file or derived)
    cache_type_k: str
    cache_type_v: str
    pipeline_parallel: bool = False  # every unit on several GPUs: inputs kept in several copies


@dataclass
class DeviceResult:
    gpu: dict
    units: List[Unit]
    weights: int
    kv: int
    compute: int
    pool: int
    context: int
    terms: Dict[str, int]
    explain: Dict[str, str]

    @property
    def load_resident(self):
        return self.weights + self.kv + self.compute + self.context

    @property
    def runtime_resident(self):
        return self.load_resident + self.pool


def _device_memory(ctx, gpu, position, units, host_units):
    shape = ctx.shape
    blocks = [u for u in units if u.layer is not None]
    has_output = any(u.layer is None for u in units)
    first = position == 0
    large_batch = shape.n_tokens >= prof.CUDA_OFFLOAD_MIN_BATCH
    # ops on host weights with a batch >= 32 run on the first GPU (ggml_backend_sched
    # offload_op), so it also computes attention/logits for host-resident units
    host_blocks = [u for u in host_units if u.layer is not None]
    host_output = any(u.layer is None for u in host_units)
    attention = bool(blocks) or (first and large_batch and bool(host_blocks))
    output = has_output or (first and large_batch and host_output)
    weights = sum(u.weight_bytes for u in units)
    kv = 0 if ctx.no_kv_offload else sum(u.kv_bytes for u in blocks)
    cterms = compute_buffer_terms(shape, attention, output)
    extra_inputs = 0
    if ctx.pipeline_parallel and units:
        # inputs (embeddings + masks) kept in GGML_SCHED_MAX_COPIES copies
        masks = (4 if not shape.flash_attn else 2) * shape.n_tokens * (
            shape.n_kv + (shape.n_kv_swa if shape.has_swa else 0))
        extra_inputs = (prof.PIPELINE_PARALLEL_COPIES - 1) * (masks + 4 * shape.n_embd * shape.n_tokens)
    compute = (max(cterms.values()) if cterms else 0) + extra_inputs
    # matrices this device multiplies: its own units, plus host units on the first GPU
    computed = list(units) + (list(host_units) if (first and large_batch) else [])
    cc = parse_compute_capability(gpu.get('compute_capability'))
    dequant = 0
    k_in = 0
    no_mmq = set()   # why cuBLAS dequantizes some of the weights computed here
    for u in computed:
        k_in = max(k_in, u.widest_input)
        reason = dequant_reason(u.weight_type, cc)
        if reason:
            dequant = max(dequant, u.largest_matrix)
            no_mmq.add(reason)
    mmq = cc is not None and cc >= MMQ_MIN_COMPUTE_CAPABILITY and not no_mmq
    pterms = pool_growth_terms(shape, attention, dequant, k_in)
    pool = max(pterms.values()) if pterms else 0
    context = CUDA_CONTEXT_BYTES
    terms = {'model_buffer': weights, 'kv_buffer': kv, 'compute_buffer': compute,
             'cuda_pool_growth': pool, 'cuda_context': context}
    terms.update(('compute.' + k, v) for k, v in cterms.items())
    if extra_inputs:
        terms['compute.pipeline_input_copies'] = extra_inputs
    terms.update(('pool.' + k, v) for k, v in pterms.items())
    n_blocks = len(blocks)
    explain = {
        'model_buffer': '%d block(s)%s: sum of their GGUF tensor bytes%s' % (
            n_blocks, ' + output layer' if has_output else '', ctx.weights_note),
        'kv_buffer': ('0: --no-kv-offload keeps the KV cache in host memory' if ctx.no_kv_offload
                      else '%d block(s) x %d cells x (K %s + V %s) per cell' % (
                          n_blocks, shape.n_kv, ctx.cache_type_k, ctx.cache_type_v)),
        'compute_buffer': 'max of the live-tensor peaks of the worst-case graph for %d tokens '
                          'against %d KV cells (flash attention %s); peak widths %s'
                          % (shape.n_tokens, shape.n_kv, 'on' if shape.flash_attn else 'off',
                             describe_together(HIDDEN_LIVE)),
        'cuda_pool_growth': 'not printed at load; allocated by the first long prompt '
                            '(llama.cpp#4712: +6%% to +27%% VRAM by batch size; ollama#5913 '
                            'OOM after "llama runner started"): %s; MMQ %s on compute '
                            'capability %s' % (', '.join(sorted(pterms)) or 'none',
                                               'used' if mmq else 'not used',
                                               gpu.get('compute_capability'))
                            + (' (%s: cuBLAS on an F16 copy of the largest such matrix)'
                               % '; '.join(sorted(no_mmq)) if no_mmq else ''),
        'cuda_context': CUDA_CONTEXT.describe(),
    }
    return DeviceResult(gpu=gpu, units=list(units), weights=weights, kv=kv, compute=compute,
                        pool=pool, context=context, terms=terms, explain=explain)


def _evaluate(ctx, gpus, units, counts, all_units):
    on_gpu = set(u.name for u in units)
    host_units = [u for u in all_units if u.name not in on_gpu]
    results = []
    pos = 0
    for position, gpu in enumerate(gpus):
        mine = units[pos:pos + counts[position]]
        pos += counts[position]
        results.append(_device_memory(ctx, gpu, position, mine, host_units))
    return results


def _fits(result, budget):
    return result.runtime_resident <= budget


def _greedy_counts(ctx, gpus, budgets, units, all_units):
    """Units per device, filling devices in order; None when the units do not fit."""
    counts = [0] * len(gpus)
    remaining = len(units)
    on_gpu = set(u.name for u in units)
    host_units = [u for u in all_units if u.name not in on_gpu]
    for position in range(len(gpus)):
        best = 0
        # largest prefix of the remaining units this device can hold
        lo, hi = 0, remaining
        while lo <= hi:
            mid = (lo + hi) // 2
            # one device's memory depends only on its own units (and, for the first GPU, on
            # the host units), so devices are filled one after the other
            start = sum(counts[:position])
            device_units = units[start:start + mid]
            res = _device_memory(ctx, gpus[position], position, device_units, host_units)
            if _fits(res, budgets[position]):
                best = mid
                lo = mid + 1
            else:
                hi = mid - 1
        counts[position] = best
        remaining -= best
    if remaining:
        return None
    return _rebalance(ctx, gpus, budgets, units, all_units, counts)


def _min_headroom(results, budgets):
    return min(b - r.runtime_resident for r, b in zip(results, budgets))


def _rebalance(ctx, gpus, budgets, units, all_units, counts):
    """Move unit boundaries towards later GPUs while the smallest headroom grows, so a
    feasible split does not leave one GPU at the edge and another idle."""
    best = _min_headroom(_evaluate(ctx, gpus, units, counts, all_units), budgets)
    improved = True
    while improved:
        improved = False
        for position in range(len(gpus) - 1):
            if counts[position] == 0:
                continue
            trial = list(counts)
            trial[position] -= 1
            trial[position + 1] += 1
            headroom = _min_headroom(_evaluate(ctx, gpus, units, trial, all_units), budgets)
            if headroom > best:
                counts, best, improved = trial, headroom, True
    return counts


# ---------------------------------------------------------------- knobs

def _int_knob(knobs, name, low, high, default=None):
    value = knobs.get(name)
    if value is None:
        return default
    if isinstance(value, bool):
        raise PlanInputError(name, 'must be an integer, got %r' % (value,))
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):
        raise PlanInputError(name, 'must be an integer, got %r' % (value,))
    if number != value and str(number) != str(value).strip():
        raise PlanInputError(name, 'must be a whole number, got %r' % (value,))
    if number < low or number > high:
        raise PlanInputError(name, 'must be between %d and %d, got %d' % (low, high, number))
    return number


def _bool_knob(knobs, name):
    value = knobs.get(name)
    if value is None:
        return None
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ('on', 'true', 'yes', '1'):
        return True
    if text in ('off', 'false', 'no', '0'):
        return False
    raise PlanInputError(name, 'must be true/false (on/off), got %r; "auto" is not accepted '
                               'because the memory plan must know which graph runs' % (value,))


def _cache_type_knob(knobs, name):
    value = knobs.get(name)
    if value is None:
        return prof.CACHE_TYPE_DEFAULT
    text = str(value).strip().lower()
    if text not in prof.CACHE_TYPES:
        raise PlanInputError(name, 'unknown KV cache type %r; one of %s'
                             % (value, ', '.join(prof.CACHE_TYPES)))
    return text


def _tensor_split_knob(knobs, n_gpus):
    value = knobs.get('tensor_split')
    if value is None:
        return None
    if isinstance(value, str):
        value = [v for v in value.replace('/', ',').split(',') if v.strip()]
    try:
        fractions = [float(v) for v in value]
    except (TypeError, ValueError):
        raise PlanInputError('tensor_split', 'must be a list of numbers, got %r' % (value,))
    if len(fractions) != n_gpus:
        raise PlanInputError('tensor_split', 'has %d entries for %d GPUs' % (len(fractions), n_gpus))
    if not all(math.isfinite(f) for f in fractions):
        raise PlanInputError('tensor_split', 'entries must be finite numbers, got %r' % (fractions,))
    if any(f < 0 for f in fractions) or sum(fractions) <= 0:
        raise PlanInputError('tensor_split', 'entries must be >= 0 with a positive sum, got %r'
                             % (fractions,))
    for position, f in enumerate(fractions):
        # llama.cpp reads each entry with std::stof (float32: fails above ~3.4e38, subnormals
        # below ~1e-38) and normalises by their sum: keep to proportions it and the planner
        # read alike
        if f != 0 and not TENSOR_SPLIT_MIN <= f <= TENSOR_SPLIT_MAX:
            raise PlanInputError('tensor_split', 'entry %d is %r; each entry must be 0 or between %g and %g '
                                 '(proportions such as 3,1 or MiB such as 24000,48000)' % (
                                     position, f, TENSOR_SPLIT_MIN, TENSOR_SPLIT_MAX))
    return fractions


TENSOR_SPLIT_MIN = 1e-6
TENSOR_SPLIT_MAX = 1e6


MAX_CTX = 16 * 1024 * 1024
MAX_PARALLEL = 1024
MAX_UBATCH = 65536


# ---------------------------------------------------------------- the planner

def _units_for(spec, layout, dims, cells, cells_swa, ctype_k, ctype_v):
    n_embd = spec.hidden_size
    q_out = spec.num_attention_heads * spec.head_dim
    ff = spec.moe_intermediate_size if spec.num_experts else spec.intermediate_size
    largest = max(n_embd * ff, n_embd * q_out)
    widest = max(ff, q_out, n_embd)
    # the block's largest matrix has the file type's main type; the output layer its own
    main_type = main_weight_type(layout.file_type)
    units = []
    for il in range(spec.num_layers):
        units.append(Unit('blk.%d' % il, il, layout.block_bytes[il],
                          kv_layer_bytes(dims[il], cells, cells_swa, ctype_k, ctype_v),
                          largest, widest, main_type))
    out_bytes = layout.output_bytes
    if layout.output_tied:
        # no output.weight: llama.cpp loads token_embd a second time on the output device
        out_bytes += layout.input_bytes
    output = Unit('output', None, out_bytes, 0, spec.vocab_size * n_embd, n_embd,
                  output_weight_type(layout.file_type))
    return units, output


def plan_llamacpp(spec, gpus, traffic, knobs, backend, backend_version):
    """Plan a llama-box / llama.cpp deployment of ``spec`` on ``gpus``; returns a Plan.

    ``knobs`` (serving_plan option names, all optional): gpu_layers, ctx_size, parallel, flash_attn,
    cache_type_k, cache_type_v, ubatch_size, batch_size, tensor_split, quantization (GGUF
    mix for models without a GGUF file), no_kv_offload, vram_reserve_bytes."""
    return _plan(spec, gpus, traffic, knobs, backend, backend_version, with_suggestions=True)


@dataclass(frozen=True)
class _Launch:
    """The launch settings of one plan: each the user's knob or derived from the traffic."""
    parallel: int
    ctx_size: int
    batch: int
    ubatch: int
    flash_attn: bool
    cache_type_k: str
    cache_type_v: str
    no_kv_offload: bool
    reserve: int                     # bytes kept free per GPU
    split_fractions: Optional[List[float]]
    gpu_layers: Optional[int]        # the user's -ngl (n_layer + 1 for "all"), None: chosen


@dataclass(frozen=True)
class _Placement:
    """What placing layers on the GPUs needs, fixed for one plan."""
    profile: object
    gpus: List[dict]
    budgets: List[int]
    units_by_layer: List[Unit]
    output_unit: Unit
    n_layer: int
    device: DeviceContext

    @property
    def all_units(self):
        return self.units_by_layer + [self.output_unit]


def _check_inputs(spec, gpus, traffic):
    """Refuse what no plan can start from; returns the CUDA-visible total of each GPU."""
    if not isinstance(spec, ModelSpec):
        raise PlanInputError('model', 'expected a ModelSpec, got %s' % type_name(spec))
    if not isinstance(traffic, Traffic):
        raise PlanInputError('traffic', 'expected a Traffic, got %s' % type_name(traffic))
    for name in sorted(set(spec.layer_kinds)):
        if kind_of(name).llamacpp_refusal:
            raise PlanInputError('model', '%s has %d %s layers (kind %r): %s' % (
                spec.name, spec.kv_layer_count(name), kind_of(name).label, name, kind_of(name).llamacpp_refusal))
    check_gpu_totals(gpus, 'layer offload needs at least one GPU')
    # llama.cpp allocates through CUDA, which sees NVML's total less what the driver keeps
    return [ct.of_gpu(gpu, 'gpus[%d]' % position) for position, gpu in enumerate(gpus)]


def _weights_layout(spec, knobs):
    """(GGUF layout, how its weights were obtained, warnings): the file's, else derived from the
    ``quantization`` knob."""
    warnings = []
    if spec.gguf is not None:
        layout = spec.gguf
        weights_note = ' (read from the GGUF file)'
        if knobs.get('quantization') is not None:
            warnings.append('quantization=%s ignored: the GGUF file fixes the tensor types (%s)'
                            % (knobs['quantization'], layout.file_type))
    else:
        if knobs.get('quantization') is None:
            raise PlanInputError('quantization', '%s is not a GGUF file: name the GGUF '
                                 'quantization to plan for (e.g. Q4_K_M)' % spec.name)
        layout, _types = derive_gguf_layout(spec, knobs['quantization'])
        weights_note = (' (derived: %s per llama.cpp llama-quant.cpp mixing rules and '
                        'GGML_QUANT_SIZES; no file read)' % layout.file_type)
    if len(layout.block_bytes) != spec.num_layers:
        raise PlanInputError('model', 'GGUF layout has %d blocks, spec says %d layers'
                             % (len(layout.block_bytes), spec.num_layers))
    return layout, weights_note, warnings


def _slots(spec, traffic, knobs):
    """(parallel, ctx_size, reasons, warnings): one slot per concurrent request, each slot
    holding one request's tokens."""
    reasons, warnings = {}, []
    tokens_needed = traffic.tokens_per_sequence
    parallel = _int_knob(knobs, 'parallel', 1, MAX_PARALLEL)
    if parallel is None:
        parallel = min(traffic.max_concurrency, MAX_PARALLEL)
        if parallel < traffic.max_concurrency:
            reasons['parallel'] = ('min(max_concurrency %d, at most %d slots) = %d: one slot per concurrent '
                                   'request up to the limit' % (traffic.max_concurrency, MAX_PARALLEL, parallel))
            warnings.append('parallel %d is below the declared concurrency %d (at most %d slots are '
                            'planned): more requests wait in the queue' % (
                                parallel, traffic.max_concurrency, MAX_PARALLEL))
        else:
            reasons['parallel'] = 'max_concurrency %d: one slot per concurrent request' % traffic.max_concurrency
    else:
        reasons['parallel'] = 'set by the user'
    ctx_size = _int_knob(knobs, 'ctx_size', 1, MAX_CTX)
    needed_ctx = parallel * tokens_needed
    if ctx_size is None:
        ctx_size = needed_ctx
        reasons['ctx_size'] = ('parallel %d x (prompt p99 %d + output %d) = %d: each slot gets '
                               'ctx-size/parallel tokens' % (parallel, traffic.prompt_tokens_p99,
                                                             traffic.max_output_tokens, needed_ctx))
    else:
        if ctx_size < needed_ctx:
            raise PlanInputError('ctx_size', '%d gives each of %d slots %d tokens, but a request '
                                 'needs prompt p99 %d + output %d = %d; use ctx_size >= %d or '
                                 'fewer parallel slots' % (ctx_size, parallel, ctx_size // parallel,
                                                           traffic.prompt_tokens_p99,
                                                           traffic.max_output_tokens,
                                                           tokens_needed, needed_ctx))
        reasons['ctx_size'] = 'set by the user (>= parallel x tokens per request = %d)' % needed_ctx
    # a slot holds ctx_size / parallel tokens: that share, not the whole ctx_size, is what a
    # request can reach; a request itself beyond the trained context is refused (beyond_model)
    slot_share = ctx_size // parallel
    if spec.max_position_embeddings and tokens_needed <= spec.max_position_embeddings < slot_share:
        warnings.append('ctx_size %d per slot share %d exceeds the trained context %d'
                        % (ctx_size, slot_share, spec.max_position_embeddings))
    return parallel, ctx_size, reasons, warnings


def beyond_model(spec, traffic):
    """What does not fit when a request needs more tokens than the model was trained for (its
    positions past max_position_embeddings are not modelled): [] or one line naming both."""
    model_max = spec.max_position_embeddings
    if model_max and traffic.tokens_per_sequence > model_max:
        return ['requests need %d tokens (prompt p99 %d + output %d), the model supports %d '
                '(its trained context)' % (traffic.tokens_per_sequence, traffic.prompt_tokens_p99,
                                           traffic.max_output_tokens, model_max)]
    return []


def _attention_settings(knobs, profile, backend, backend_version):
    """(flash_attn, cache_type_k, cache_type_v, reasons, warnings)."""
    reasons, warnings = {}, []
    flash_attn = _bool_knob(knobs, 'flash_attn')
    if flash_attn is None:
        flash_attn = False
        reasons['flash_attn'] = ('engine default for %s %s is %s; pinned off so the plan knows '
                                 'the graph (suggested when memory is short)'
                                 % (backend, backend_version, profile.flash_attn_default))
    else:
        reasons['flash_attn'] = 'set by the user'
    ctype_k = _cache_type_knob(knobs, 'cache_type_k')
    ctype_v = _cache_type_knob(knobs, 'cache_type_v')
    if ctype_v not in ('f16', 'f32', 'bf16') and not flash_attn:
        if profile.v_quant_without_fa == 'reset_f16':
            warnings.append('cache_type_v %s needs flash attention: llama-box resets V to f16 '
                            'without -fa; planned with f16 V' % ctype_v)
            ctype_v = 'f16'
        else:
            raise PlanInputError('cache_type_v', '%s needs flash attention in llama.cpp %s '
                                 '(the engine refuses it without); set flash_attn: true or '
                                 'cache_type_v: f16' % (ctype_v, backend_version))
    return flash_attn, ctype_k, ctype_v, reasons, warnings


def _launch(spec, gpus, traffic, knobs, profile, backend, backend_version):
    """(_Launch, reasons, warnings): every knob checked, in the order the user reads them."""
    parallel, ctx_size, reasons, warnings = _slots(spec, traffic, knobs)
    batch = _int_knob(knobs, 'batch_size', 1, MAX_UBATCH, prof.DEFAULT_BATCH)
    ubatch = _int_knob(knobs, 'ubatch_size', 1, MAX_UBATCH, prof.DEFAULT_UBATCH)
    if ubatch > batch:
        warnings.append('ubatch_size %d > batch_size %d: llama.cpp clamps it to %d' % (ubatch, batch, batch))
        ubatch = batch
    flash_attn, ctype_k, ctype_v, attn_reasons, attn_warnings = _attention_settings(
        knobs, profile, backend, backend_version)
    reasons.update(attn_reasons)
    warnings.extend(attn_warnings)
    no_kv_offload = bool(_bool_knob(knobs, 'no_kv_offload'))
    reserve = _int_knob(knobs, 'vram_reserve_bytes', 0, 1 << 50, DEFAULT_VRAM_RESERVE_BYTES)
    for position, gpu in enumerate(gpus):
        if reserve >= gpu['memory_total']:
            raise PlanInputError('vram_reserve_bytes', 'the reserve %s is all of GPU %s (%s total): '
                                 'nothing is left to plan with' % (
                                     fmt_bytes(reserve), gpu.get('index', position), fmt_bytes(gpu['memory_total'])))
    split_fractions = _tensor_split_knob(knobs, len(gpus))
    gpu_layers_knob = _int_knob(knobs, 'gpu_layers', -1, spec.num_layers + 1)
    if knobs.get('gpu_layers') is not None and gpu_layers_knob == -1:
        gpu_layers_knob = spec.num_layers + 1
    launch = _Launch(parallel=parallel, ctx_size=ctx_size, batch=batch, ubatch=ubatch, flash_attn=flash_attn,
                     cache_type_k=ctype_k, cache_type_v=ctype_v, no_kv_offload=no_kv_offload, reserve=reserve,
                     split_fractions=split_fractions, gpu_layers=gpu_layers_knob)
    return launch, reasons, warnings


def _shapes(spec, layout, launch, profile):
    """(KV cells, sliding-window cells, graph shape, units per layer, output unit, warnings)."""
    warnings = []
    padding = profile.kv_padding(launch.flash_attn)
    cells = kv_cells(launch.ctx_size, launch.parallel, padding)
    has_swa = any(kind_of(k).slides for k in spec.layer_kinds)
    cells_s = swa_cells(cells, int(spec.sliding_window or 0), launch.parallel, launch.ubatch,
                        padding) if has_swa else 0
    dims = layer_kv_dims(spec, layout if spec.gguf is not None else None)
    if not all(kind_of(k).caches_kv for k in spec.layer_kinds):
        warnings.append('layers without KV (recurrent state) are charged nothing for state; '
                        'recurrent state memory is not modelled')
    ff_live = (spec.num_experts_per_tok * spec.moe_intermediate_size if spec.num_experts
               else spec.intermediate_size)
    shape = GraphShape(n_tokens=min(cells, launch.ubatch), n_kv=cells, n_kv_swa=cells_s, has_swa=has_swa,
                       n_embd=spec.hidden_size, n_head=spec.num_attention_heads,
                       n_ff_live=ff_live, n_vocab=spec.vocab_size, flash_attn=launch.flash_attn)
    units_by_layer, output_unit = _units_for(spec, layout, dims, cells, cells_s,
                                             launch.cache_type_k, launch.cache_type_v)
    return cells, cells_s, shape, units_by_layer, output_unit, warnings


def _memory_in_use_warnings(gpus, reserve):
    return ['GPU %s (%s) already has %s in use, more than the %s reserve: another '
            'process may hold memory this plan counts on'
            % (gpu.get('index', position), gpu.get('name'), fmt_bytes(gpu.get('memory_used')), fmt_bytes(reserve))
            for position, gpu in enumerate(gpus)
            if isinstance(gpu.get('memory_used'), int) and gpu.get('memory_used') > reserve]


def _device_context(placement, k):
    """The device context of ``k`` offloaded units: with every layer and the output on several
    GPUs (and the KV with them) llama.cpp runs them as a pipeline."""
    device = placement.device
    return replace(device, pipeline_parallel=(len(placement.gpus) > 1 and k >= placement.n_layer + 1
                                              and not device.no_kv_offload))


def _place(placement, k, fractions):
    """(units on GPUs, units per GPU, per-GPU results) of ``-ngl k``; counts and results are None
    when a greedy split over several GPUs does not fit."""
    gpus = placement.gpus
    units = gpu_units(placement.profile, placement.units_by_layer, placement.output_unit, k)
    ctx = _device_context(placement, k)
    if fractions is not None:
        counts = split_counts(fractions, len(units)) if units else [0] * len(gpus)
    else:
        counts = (_greedy_counts(ctx, gpus, placement.budgets, units, placement.all_units)
                  if len(gpus) > 1 else [len(units)])
        if counts is None:
            return units, None, None
    return units, counts, _evaluate(ctx, gpus, units, counts, placement.all_units)


def _choose_gpu_layers(placement, launch):
    """(k, units, counts, results, reason): the user's -ngl, else the largest that fits."""
    gpus, budgets, fractions = placement.gpus, placement.budgets, launch.split_fractions
    if launch.gpu_layers is not None:
        k = launch.gpu_layers
        units, counts, results = _place(placement, k, fractions)
        if results is None:
            # multi-GPU greedy failed: show the proportional split to name the numbers
            counts = split_counts([g['memory_total'] for g in gpus], len(units))
            results = _evaluate(_device_context(placement, k), gpus, units, counts, placement.all_units)
        return k, units, counts, results, 'set by the user'
    for k in range(placement.n_layer + 1, -1, -1):
        units, counts, results = _place(placement, k, fractions)
        if results is not None and all(_fits(r, b) for r, b in zip(results, budgets)):
            return k, units, counts, results, (
                'largest -ngl whose model + KV + compute buffers + CUDA pool growth + CUDA context '
                'fit total - %s reserve on every GPU' % fmt_bytes(launch.reserve))
    units, counts, results = _place(placement, 0, fractions)
    if results is None:
        counts = [0] * len(gpus)
        results = _evaluate(_device_context(placement, 0), gpus, units, counts, placement.all_units)
    return 0, units, counts, results, 'nothing fits, not even -ngl 0 (compute buffer on GPU 0)'


def _not_fitting(results, budgets, cudas, reserve):
    """One line per GPU over its budget, for the report's failure mode: loads, then dies on a long prompt."""
    not_fitting = []
    for position, (r, b) in enumerate(zip(results, budgets)):
        if not _fits(r, b):
            total = cudas[position].cuda_total
            line = ('GPU %s (%s): model %s + KV %s + compute %s + CUDA pool growth %s + CUDA '
                    'context %s = %s > budget %s (CUDA-visible total %s - reserve %s)' % (
                        r.gpu.get('index', position), r.gpu.get('name'), fmt_bytes(r.weights),
                        fmt_bytes(r.kv), fmt_bytes(r.compute), fmt_bytes(r.pool),
                        fmt_bytes(r.context), fmt_bytes(r.runtime_resident), fmt_bytes(b),
                        fmt_bytes(total), fmt_bytes(reserve)))
            if r.load_resident <= total < r.runtime_resident:
                line += ('; it LOADS (load-time buffers %s <= %s) and then runs out of memory on '
                         'the first long prompt, when the CUDA pool grows by %s'
                         % (fmt_bytes(r.load_resident), fmt_bytes(total), fmt_bytes(r.pool)))
            not_fitting.append(line)
    return not_fitting


def _launch_args(profile, launch, knobs, k, n_gpus, counts):
    flags = profile.flags
    args = [flags['gpu_layers'], str(k), flags['ctx_size'], str(launch.ctx_size),
            flags['parallel'], str(launch.parallel)]
    args += prof.flash_attn_args(profile, launch.flash_attn)
    args += prof.fit_args(profile)
    if launch.cache_type_k != prof.CACHE_TYPE_DEFAULT:
        args += [flags['cache_type_k'], launch.cache_type_k]
    if launch.cache_type_v != prof.CACHE_TYPE_DEFAULT:
        args += [flags['cache_type_v'], launch.cache_type_v]
    if launch.ubatch != prof.DEFAULT_UBATCH or knobs.get('ubatch_size') is not None:
        args += [flags['ubatch_size'], str(launch.ubatch)]
    if launch.batch != prof.DEFAULT_BATCH or knobs.get('batch_size') is not None:
        args += [flags['batch_size'], str(launch.batch)]
    if n_gpus > 1:
        split_values = launch.split_fractions if launch.split_fractions is not None else counts
        args += [flags['tensor_split'], ','.join(_fmt_split(v) for v in split_values)]
    if launch.no_kv_offload:
        args.append(flags['no_kv_offload'])
    args.append(flags['no_mmap'])   # GPUStack's launch; weights in pinned host memory
    return args


def _gpu_memory(results, budgets, cudas):
    memory = []
    for position, (r, b) in enumerate(zip(results, budgets)):
        memory.append(GpuMemory(
            index=int(r.gpu.get('index', position)), name=str(r.gpu.get('name', '')),
            total=cudas[position].cuda_total, budget=b, weights=r.weights,
            activation=r.compute + r.pool, non_torch=r.context,
            # CUDA graphs are captured only for single-token batches and are not in the
            # buffers above (ggml-cuda.cu disables them for batch size > 1); charged 0
            cuda_graph=0, kv_cache=r.kv, headroom=b - r.runtime_resident,
            terms=dict(r.terms, nvml_total=cudas[position].nvml_total,
                       driver_reserved=cudas[position].gap),
            explain=dict(r.explain, cuda_graph=CUDA_GRAPH_NOTE,
                         total='CUDA-visible total (what llama.cpp can allocate): %s [%s]' % (
                             cudas[position].explain, cudas[position].source)),
            term_kinds=tk.term_kinds(tk.LLAMACPP, list(r.terms) + ['nvml_total', 'driver_reserved'],
                                     cudas[position], tk.LLAMACPP_PREFIXES)))
    return memory


def _plan(spec, gpus, traffic, knobs, backend, backend_version, with_suggestions):
    cudas = _check_inputs(spec, gpus, traffic)
    knobs = dict(knobs or {})
    profile = prof.engine_profile(backend, backend_version)
    layout, weights_note, layout_warnings = _weights_layout(spec, knobs)
    launch, reasons, launch_warnings = _launch(spec, gpus, traffic, knobs, profile, backend, backend_version)
    cells, cells_s, shape, units_by_layer, output_unit, shape_warnings = _shapes(spec, layout, launch, profile)
    warnings = (list(profile.warnings) + layout_warnings + launch_warnings + shape_warnings
                + _memory_in_use_warnings(gpus, launch.reserve))
    budgets = [c.cuda_total - launch.reserve for c in cudas]
    placement = _Placement(
        profile=profile, gpus=gpus, budgets=budgets, units_by_layer=units_by_layer, output_unit=output_unit,
        n_layer=spec.num_layers, device=DeviceContext(
            shape=shape, no_kv_offload=launch.no_kv_offload, weights_note=weights_note,
            cache_type_k=launch.cache_type_k, cache_type_v=launch.cache_type_v))
    k, units, counts, results, reasons['gpu_layers'] = _choose_gpu_layers(placement, launch)
    beyond = beyond_model(spec, traffic)
    feasible = all(_fits(r, b) for r, b in zip(results, budgets)) and not beyond
    suggestions = []
    if with_suggestions and (not feasible or k < spec.num_layers + 1):
        suggestions = _suggestions(spec, gpus, traffic, knobs, backend, backend_version,
                                   launch.flash_attn, launch.parallel, feasible)
    settings = {'gpu_layers': k, 'ctx_size': launch.ctx_size, 'parallel': launch.parallel,
                'flash_attn': launch.flash_attn, 'cache_type_k': launch.cache_type_k,
                'cache_type_v': launch.cache_type_v, 'ubatch_size': launch.ubatch, 'batch_size': launch.batch,
                'no_kv_offload': launch.no_kv_offload,
                'kv_cells': cells, 'kv_cells_swa': cells_s, 'slot_ctx': launch.ctx_size // launch.parallel,
                'offloaded_blocks': sum(1 for u in units if u.layer is not None),
                'output_on_gpu': any(u.layer is None for u in units),
                'blocks_per_gpu': [sum(1 for u in r.units if u.layer is not None) for r in results],
                'gguf_file_type': layout.file_type, 'vram_reserve_bytes': launch.reserve}
    if len(gpus) > 1:
        settings['tensor_split'] = launch.split_fractions if launch.split_fractions is not None else counts
    claim = max((r.runtime_resident for r in results), default=0)
    rules = list(profile.rules) + [
        'cuda graphs charged 0: captured only for single-token batches',
        'reserve %s per GPU: %s' % (fmt_bytes(launch.reserve), RESERVE_SOURCE),
    ]
    return Plan(
        backend=backend, backend_version=str(backend_version),
        args=_launch_args(profile, launch, knobs, k, len(gpus), counts), memory=_gpu_memory(results, budgets, cudas),
        kv_cache_tokens=cells, max_concurrency_at_max_len=float(launch.parallel), feasible=feasible,
        settings=settings, reasons=reasons, warnings=warnings,
        not_fitting=_not_fitting(results, budgets, cudas, launch.reserve) + beyond,
        suggestions=suggestions, rules=rules,
        vram_claim_bytes=claim if k > 0 else 0, system_reserved_bytes=launch.reserve)


def _fmt_split(value):
    return str(int(value)) if float(value).is_integer() else ('%g' % value)


def _suggestions(spec, gpus, traffic, knobs, backend, version, flash_attn, parallel, feasible):
    """What would fit instead; every alternative is planned for real, not guessed."""
    out = []
    n_units = spec.num_layers + 1

    def try_plan(changes, label):
        trial = dict(knobs)
        trial.update(changes)
        trial = dict((n, v) for n, v in trial.items() if v is not None)
        try:
            plan = _plan(spec, gpus, traffic, trial, backend, version, with_suggestions=False)
        except PlanInputError:
            return
        if plan.feasible and plan.settings['gpu_layers'] > 0:
            out.append('%s: -ngl %d of %d fits' % (label, plan.settings['gpu_layers'], n_units))

    if knobs.get('gpu_layers') is not None and not feasible:
        try_plan({'gpu_layers': None}, 'fewer layers')
    if not flash_attn:
        try_plan({'flash_attn': True}, 'flash attention on (no F32 KQ scores, no KQ pool copy)')
        try_plan({'flash_attn': True, 'cache_type_k': 'q8_0', 'cache_type_v': 'q8_0'},
                 'flash attention + q8_0 KV cache (34/32 bytes per value)')
    if parallel > 1:
        half = max(1, parallel // 2)
        try_plan({'parallel': half, 'ctx_size': None},
                 'parallel %d (ctx %d)' % (half, half * traffic.tokens_per_sequence))
    out.append('another GPU: list the node\'s other GPUs in gpus to split the layers')
    return out
