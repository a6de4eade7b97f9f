# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Build ``ModelSpec`` objects from a catalog name, an HF ``config.json`` dict, a local
model directory or a GGUF file, and size the weights from what the checkpoint stores.

Weights are enumerated as named tensor groups (``weight_tensor_groups``); parameter
counts and stored bytes per quantization scheme are sums over those groups, so every
byte in a total can be traced to a named tensor family.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import struct
from dataclasses import dataclass
from typing import List, Optional

from ansible_collections.kvpin.fleet.plugins.module_utils.plan.model_spec import (
    GEOMETRY_LIMITS, GGUFLayout, LAYER_CROSS, LAYER_FULL, LAYER_MLA, LAYER_NO_KV, LAYER_SLIDING,
    MAX_WEIGHT_BYTES, ModelSpec, ModelSpecError, check_int_range, check_spec)
from ansible_collections.kvpin.fleet.plugins.module_utils.plan import gguf_reader
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.plan_types import type_name
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.model_catalog import (
    CATALOG, ALIASES)
from ansible_collections.kvpin.fleet.plugins.module_utils.units import ceil_div

# Tensor roles. Quantization schemes decide per role how a tensor is stored.
ROLE_EMBED = 'embedding'       # token embeddings
ROLE_LM_HEAD = 'lm_head'       # output projection (absent when tied)
ROLE_LINEAR = 'linear'         # attention / dense-MLP / shared-expert projections in layers
ROLE_EXPERT = 'expert'         # routed-expert projections
ROLE_ROUTER = 'router'         # MoE router (gate) matrix
ROLE_VECTOR = 'vector'         # norms, biases, attention sinks, router score biases

# Storage dtype of unquantized checkpoints (torch_dtype / dtype in config.json).
DTYPE_BYTES = {'bfloat16': 2, 'float16': 2, 'half': 2, 'float32': 4, 'float': 4}
# vLLM's dtype=auto runs fp32 checkpoints in fp16/bf16: resident weights are 2 B/param.
LOADED_FLOAT_BYTES = 2

# Sanity bounds (model_spec.GEOMETRY_LIMITS, by config.json key): a value outside these is
# a typo or a wrong file, not a model.
_LIMIT = dict((key, GEOMETRY_LIMITS[key][1]) for key in GEOMETRY_LIMITS)
DIM_LIMITS = {
    'num_hidden_layers': _LIMIT['num_layers'], 'hidden_size': _LIMIT['hidden_size'],
    'intermediate_size': _LIMIT['intermediate_size'],
    'num_attention_heads': _LIMIT['num_attention_heads'],
    'num_key_value_heads': _LIMIT['num_kv_heads'], 'head_dim': _LIMIT['head_dim'],
    'vocab_size': _LIMIT['vocab_size'], 'max_position_embeddings': _LIMIT['max_position_embeddings'],
    'sliding_window': _LIMIT['sliding_window'], 'kv_lora_rank': _LIMIT['kv_lora_rank'],
    'q_lora_rank': _LIMIT['kv_lora_rank'], 'qk_nope_head_dim': _LIMIT['head_dim'],
    'qk_rope_head_dim': _LIMIT['qk_rope_head_dim'], 'v_head_dim': _LIMIT['head_dim'],
    'num_experts': _LIMIT['num_experts'], 'num_experts_per_tok': _LIMIT['num_experts_per_tok'],
    'moe_intermediate_size': _LIMIT['moe_intermediate_size'],
    'n_shared_experts': _LIMIT['num_shared_experts'],
    'shared_expert_intermediate_size': _LIMIT['intermediate_size'],
    'first_k_dense_replace': _LIMIT['num_layers'], 'max_window_layers': _LIMIT['num_layers'],
    'sliding_window_pattern': _LIMIT['num_layers'],
    'num_nextn_predict_layers': _LIMIT['num_layers'],
    # encoder-decoder (Whisper) keys: each decoder layer is two KV layers (self + cross)
    'd_model': _LIMIT['hidden_size'], 'encoder_layers': _LIMIT['num_layers'],
    'decoder_layers': _LIMIT['num_layers'] // 2, 'encoder_attention_heads': _LIMIT['num_attention_heads'],
    'decoder_attention_heads': _LIMIT['num_attention_heads'], 'encoder_ffn_dim': _LIMIT['intermediate_size'],
    'decoder_ffn_dim': _LIMIT['intermediate_size'], 'max_source_positions': _LIMIT['max_encoder_len'],
    'max_target_positions': _LIMIT['max_position_embeddings'], 'num_mel_bins': 1024,
}
# What a config.json / index file / safetensors header may be: real ones are kilobytes
# (an index of 100k tensors about 10 MB; the safetensors format caps headers at 100 MB).
MAX_CONFIG_BYTES = 4 * 1024 * 1024
MAX_INDEX_BYTES = 64 * 1024 * 1024
MAX_SAFETENSORS_HEADER = 100 * 1000 * 1000
MAX_SHARDS = 4096
# safetensors dtypes and their bytes per element (None: sub-byte, size not checked).
SAFETENSORS_DTYPES = {
    'BOOL': 1, 'U8': 1, 'I8': 1, 'F8_E5M2': 1, 'F8_E4M3': 1, 'F8_E8M0': 1, 'I16': 2, 'U16': 2,
    'F16': 2, 'BF16': 2, 'I32': 4, 'U32': 4, 'F32': 4, 'F64': 8, 'I64': 8, 'U64': 8,
    'F4': None, 'F6_E2M3': None, 'F6_E3M2': None,
}
SHARD_NAME_RE = re.compile(r'^(?P<stem>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.safetensors$')

# How far the weights a checkpoint holds (safetensors headers, an index's total_size, the hub's
# total) may be from what its own config.json implies (parameters x bytes per parameter of the
# declared dtype / quantization, ``computed_weight_bytes``) before a plan refuses it. For every
# catalog checkpoint the two agree to the byte; the ways a real checkpoint differs from its
# config's decoder only ever add weights (a vision or audio tower, MTP layers, modules left
# unquantized), and a config whose dimensions a checkpoint does not follow is not a model this
# planner sizes. So: at least half (a partial download, a wrong config or a header that lies is
# off by far more: the 8 KiB for a 16 GB model is 1e-6), at most twice (four times for a
# multimodal model, whose towers the decoder count leaves out).
WEIGHT_CHECK_LOW = 0.5
WEIGHT_CHECK_HIGH = 2.0
WEIGHT_CHECK_HIGH_MULTIMODAL = 4.0
# A quantization this loader cannot size (weights given or read, not computed): no served format
# stores fewer bits per parameter than this (ternary BitNet 1.58, llama.cpp IQ1_S 1.56), nor more
# than fp32.
MIN_BITS_PER_WEIGHT = 1.5
MAX_BITS_PER_WEIGHT = 32
# An index's metadata.total_size against the sum of its shards' headers: both count the same
# tensors, so they agree to the byte in real checkpoints; 1 % allows for a writer that counts a
# shared tensor twice, never for a different model.
INDEX_TOTAL_TOLERANCE = 0.01

GGUF_SUFFIX = '.gguf'
SAFETENSORS_INDEX = 'model.safetensors.index.json'
# Mistral-format single file shipped next to the HF shards; engines load one or the other.
MISTRAL_CONSOLIDATED = 'consolidated.safetensors'
BLOCK_TENSOR_RE = re.compile(r'^blk\.(\d+)\.')


@dataclass(frozen=True)
class TensorGroup:
    """``count`` tensors of shape (out_features, in_features) with one role.

    1-D tensors (norms, biases) have in_features == 1. ``replicated``: vLLM keeps a whole
    copy on every tensor-parallel rank (norms, routers, row-parallel biases, MLA latent
    down-projections) instead of a 1/TP slice."""
    name: str
    role: str
    out_features: int
    in_features: int
    count: int
    replicated: bool = False

    @property
    def elements(self):
        return self.out_features * self.in_features * self.count


# ---------------------------------------------------------------- config normalization

def _text_config(config):
    """The decoder's config: ``text_config`` for multimodal wrappers, else the dict."""
    text = config.get('text_config')
    if isinstance(text, dict) and text:
        return text, True
    return config, False


def _architecture(config, text):
    archs = config.get('architectures') or text.get('architectures') or []
    if archs and isinstance(archs, list):
        return str(archs[0])
    return str(text.get('model_type') or config.get('model_type') or 'unknown')


def _positive_int(cfg, key, default=None, required=True):
    value = cfg.get(key)
    if value is None:
        # absent or null (configs write "head_dim": null): the default, if there is one
        value = default
    if value is None:
        if required:
            raise ModelSpecError('model', "config key '%s' is missing" % key)
        return None
    # bool is an int in Python and a float is no count (NaN and Infinity parse as floats).
    if isinstance(value, bool) or not isinstance(value, int):
        raise ModelSpecError('model', "config key '%s' must be an integer, got %r" % (key, value))
    limit = DIM_LIMITS.get(key)
    if value <= 0 or (limit is not None and value > limit):
        raise ModelSpecError('model', "config key '%s' = %d is out of range (1..%s)"
                             % (key, value, limit if limit else 'inf'))
    return value


def _count(cfg, key, default=0):
    """An optional config count: absent, null, 0 or false -> ``default``; else an integer in
    1..DIM_LIMITS[key] (ModelSpecError naming the key)."""
    value = cfg.get(key)
    if value is None or value is False or value == 0 and _is_plain_int(value):
        return default
    return _positive_int(cfg, key)


def _is_plain_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _sliding_window(cfg):
    """``sliding_window`` of a config: None (absent, null, 0) or a window in tokens."""
    value = cfg.get('sliding_window')
    if value is None or (_is_plain_int(value) and value == 0):
        return None
    return _positive_int(cfg, 'sliding_window')


def _model_type(config, text):
    return str(text.get('model_type') or config.get('model_type') or '').lower()


@dataclass(frozen=True)
class ArchDims:
    """The dimensions that decide tensor shapes, normalized across architectures (the figures a
    ModelSpec also carries go by the ModelSpec names)."""
    architecture: str
    model_type: str
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int                # the config's; a MLA ModelSpec caches one latent head instead
    head_dim: int                    # the config's; a MLA ModelSpec's is kv_lora_rank + qk_rope_head_dim
    vocab_size: int
    intermediate_size: int
    tie_word_embeddings: bool
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False
    norms_per_layer: int = 2
    attn_sinks: bool = False
    q_lora_rank: Optional[int] = None
    kv_lora_rank: Optional[int] = None
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    num_shared_experts: int = 0
    shared_intermediate: int = 0
    shared_expert_gate: bool = False
    dense_layers: int = 0            # first_k_dense_replace: leading layers with a dense MLP
    router_bias: bool = False        # bias on the router matrix (gpt-oss)
    router_score_bias: bool = False  # e_score_correction_bias (DeepSeek-V3 noaux_tc)
    expert_bias: bool = False        # biases on expert projections (gpt-oss)
    multimodal: bool = False


def arch_dims(config):
    """Normalize an HF config dict into ``ArchDims`` (ModelSpecError names a bad key)."""
    if not isinstance(config, dict):
        raise ModelSpecError('model', 'an HF config must be a dict, got %s' % type_name(config))
    text, multimodal = _text_config(config)
    arch = _architecture(config, text)
    mtype = _model_type(config, text)
    hidden = _positive_int(text, 'hidden_size')
    layers = _positive_int(text, 'num_hidden_layers')
    heads = _positive_int(text, 'num_attention_heads')
    kv_heads = _positive_int(text, 'num_key_value_heads', default=heads)
    head_dim = _positive_int(text, 'head_dim', default=hidden // heads)
    vocab = _positive_int(text, 'vocab_size')
    if heads % kv_heads:
        raise ModelSpecError('model', "num_attention_heads (%d) is not a multiple of "
                             "num_key_value_heads (%d)" % (heads, kv_heads))
    tie = text.get('tie_word_embeddings', config.get('tie_word_embeddings'))
    if tie is None:
        # Gemma families tie by default in transformers; the others do not.
        tie = mtype.startswith('gemma')
    is_qwen2 = mtype in ('qwen2', 'qwen2_moe') or arch.startswith('Qwen2')
    is_qwen3 = mtype.startswith('qwen3') or arch.startswith('Qwen3')
    is_gemma = mtype.startswith('gemma')
    is_gemma3 = mtype.startswith('gemma3') or arch.startswith('Gemma3')
    is_gpt_oss = mtype == 'gpt_oss' or arch.startswith('GptOss')
    attention_bias = bool(text.get('attention_bias', False))
    kw = dict(
        architecture=arch, model_type=mtype, hidden_size=hidden, num_layers=layers, num_attention_heads=heads,
        num_kv_heads=kv_heads, head_dim=head_dim, vocab_size=vocab, tie_word_embeddings=bool(tie),
        multimodal=multimodal,
        # Qwen2 has q/k/v biases without a config flag; others say attention_bias.
        qkv_bias=is_qwen2 or attention_bias,
        o_bias=attention_bias,
        qk_norm=is_qwen3 or is_gemma3,
        # Gemma 2/3: pre- and post-norms around attention and MLP.
        norms_per_layer=4 if is_gemma else 2,
        attn_sinks=is_gpt_oss,
    )
    # MLA (DeepSeek V2/V3/R1, Kimi K2 ...)
    if _count(text, 'kv_lora_rank'):
        kw.update(
            kv_lora_rank=_positive_int(text, 'kv_lora_rank'),
            q_lora_rank=_positive_int(text, 'q_lora_rank', required=False),
            qk_nope_head_dim=_positive_int(text, 'qk_nope_head_dim'),
            qk_rope_head_dim=_positive_int(text, 'qk_rope_head_dim'),
            v_head_dim=_positive_int(text, 'v_head_dim'),
        )
    experts = 0
    for key in ('num_local_experts', 'num_experts', 'n_routed_experts'):
        if text.get(key) not in (None, 0, False):
            experts = _positive_int({'num_experts': text[key]}, 'num_experts')
            break
    if experts:
        topk = _positive_int(text, 'num_experts_per_tok',
                             default=text.get('experts_per_token'))
        if topk > experts:
            raise ModelSpecError('model', "config key 'num_experts_per_tok' = %d is more than the "
                                 "%d experts" % (topk, experts))
        # Mixtral and gpt-oss give the expert width as intermediate_size.
        moe_inter = text.get('moe_intermediate_size') or text.get('intermediate_size')
        moe_inter = _positive_int({'moe_intermediate_size': moe_inter}, 'moe_intermediate_size')
        shared = _count(text, 'n_shared_experts')
        shared_inter = _count(text, 'shared_expert_intermediate_size', shared * moe_inter)
        dense_layers = _count(text, 'first_k_dense_replace')
        if dense_layers > layers:
            raise ModelSpecError('model', "config key 'first_k_dense_replace' = %d is more than "
                                 "the %d layers" % (dense_layers, layers))
        if text.get('decoder_sparse_step', 1) not in (1, None) or text.get('mlp_only_layers'):
            raise ModelSpecError('model', 'decoder_sparse_step / mlp_only_layers (MoE on some '
                                 'layers only) are not supported; give weight_bytes')
        kw.update(num_experts=experts, num_experts_per_tok=topk, moe_intermediate_size=moe_inter,
                  num_shared_experts=shared, shared_intermediate=shared_inter,
                  shared_expert_gate=bool(text.get('shared_expert_intermediate_size')),
                  dense_layers=dense_layers, router_bias=is_gpt_oss, expert_bias=is_gpt_oss,
                  router_score_bias=text.get('topk_method') == 'noaux_tc')
        dense_inter = _count(text, 'intermediate_size') if dense_layers else 0
        kw['intermediate_size'] = dense_inter if dense_layers else 0
    else:
        kw['intermediate_size'] = _positive_int(text, 'intermediate_size')
    return ArchDims(**kw)


# ---------------------------------------------------------------- tensor enumeration

def weight_tensor_groups(dims):
    """Every weight tensor family of the decoder (no vision tower, no MTP layers)."""
    h, n = dims.hidden_size, dims.num_layers
    groups = [TensorGroup('embed_tokens', ROLE_EMBED, dims.vocab_size, h, 1)]
    if not dims.tie_word_embeddings:
        groups.append(TensorGroup('lm_head', ROLE_LM_HEAD, dims.vocab_size, h, 1))
    groups.append(TensorGroup('final_norm', ROLE_VECTOR, h, 1, 1, replicated=True))
    groups.append(TensorGroup('layer_norms', ROLE_VECTOR, h, 1, dims.norms_per_layer * n,
                              replicated=True))
    if dims.kv_lora_rank:
        groups.extend(_mla_groups(dims))
    else:
        q_out, kv_out = dims.num_attention_heads * dims.head_dim, dims.num_kv_heads * dims.head_dim
        groups += [
            TensorGroup('q_proj', ROLE_LINEAR, q_out, h, n),
            TensorGroup('k_proj', ROLE_LINEAR, kv_out, h, n),
            TensorGroup('v_proj', ROLE_LINEAR, kv_out, h, n),
            TensorGroup('o_proj', ROLE_LINEAR, h, q_out, n),
        ]
        if dims.qkv_bias:
            groups += [TensorGroup('q_bias', ROLE_VECTOR, q_out, 1, n),
                       TensorGroup('kv_bias', ROLE_VECTOR, kv_out, 1, 2 * n)]
        if dims.o_bias:
            groups.append(TensorGroup('o_bias', ROLE_VECTOR, h, 1, n, replicated=True))
        if dims.qk_norm:
            groups.append(TensorGroup('qk_norm', ROLE_VECTOR, dims.head_dim, 1, 2 * n,
                                      replicated=True))
    if dims.attn_sinks:
        groups.append(TensorGroup('attn_sinks', ROLE_VECTOR, dims.num_attention_heads, 1, n))
    if dims.num_experts:
        groups.extend(_moe_groups(dims))
    if dims.intermediate_size:
        dense = dims.dense_layers if dims.num_experts else n
        groups += [TensorGroup('mlp_gate_up', ROLE_LINEAR, dims.intermediate_size, h, 2 * dense),
                   TensorGroup('mlp_down', ROLE_LINEAR, h, dims.intermediate_size, dense)]
    return [g for g in groups if g.count]


def _mla_groups(dims):
    h, n, heads = dims.hidden_size, dims.num_layers, dims.num_attention_heads
    qk_head = dims.qk_nope_head_dim + dims.qk_rope_head_dim
    groups = []
    if dims.q_lora_rank:
        # vLLM keeps the latent down-projections whole on every rank (ReplicatedLinear).
        groups += [TensorGroup('q_a_proj', ROLE_LINEAR, dims.q_lora_rank, h, n, replicated=True),
                   TensorGroup('q_a_layernorm', ROLE_VECTOR, dims.q_lora_rank, 1, n,
                               replicated=True),
                   TensorGroup('q_b_proj', ROLE_LINEAR, heads * qk_head, dims.q_lora_rank, n)]
    else:
        groups.append(TensorGroup('q_proj', ROLE_LINEAR, heads * qk_head, h, n))
    groups += [
        TensorGroup('kv_a_proj_with_mqa', ROLE_LINEAR, dims.kv_lora_rank + dims.qk_rope_head_dim,
                    h, n, replicated=True),
        TensorGroup('kv_a_layernorm', ROLE_VECTOR, dims.kv_lora_rank, 1, n, replicated=True),
        TensorGroup('kv_b_proj', ROLE_LINEAR, heads * (dims.qk_nope_head_dim + dims.v_head_dim),
                    dims.kv_lora_rank, n),
        TensorGroup('o_proj', ROLE_LINEAR, h, heads * dims.v_head_dim, n),
    ]
    return groups


def _moe_groups(dims):
    h, e, inter = dims.hidden_size, dims.num_experts, dims.moe_intermediate_size
    moe_layers = dims.num_layers - dims.dense_layers
    groups = [
        TensorGroup('router', ROLE_ROUTER, e, h, moe_layers, replicated=True),
        TensorGroup('experts_gate_up', ROLE_EXPERT, inter, h, 2 * e * moe_layers),
        TensorGroup('experts_down', ROLE_EXPERT, h, inter, e * moe_layers),
    ]
    if dims.router_bias:
        groups.append(TensorGroup('router_bias', ROLE_VECTOR, e, 1, moe_layers, replicated=True))
    if dims.router_score_bias:
        groups.append(TensorGroup('router_score_bias', ROLE_VECTOR, e, 1, moe_layers,
                                  replicated=True))
    if dims.expert_bias:
        groups += [TensorGroup('experts_gate_up_bias', ROLE_VECTOR, inter, 1, 2 * e * moe_layers),
                   TensorGroup('experts_down_bias', ROLE_VECTOR, h, 1, e * moe_layers)]
    if dims.shared_intermediate:
        s = dims.shared_intermediate
        groups += [TensorGroup('shared_gate_up', ROLE_LINEAR, s, h, 2 * moe_layers),
                   TensorGroup('shared_down', ROLE_LINEAR, h, s, moe_layers)]
        if dims.shared_expert_gate:
            groups.append(TensorGroup('shared_expert_gate', ROLE_ROUTER, 1, h, moe_layers,
                                      replicated=True))
    return groups


def config_tensor_groups(config):
    """Every weight tensor family an HF config's architecture implies: the decoder's
    (``weight_tensor_groups``: embeddings, attention with its KV heads (GQA) or MLA latents, dense
    MLP or routed and shared experts, norms, lm_head unless tied) or an encoder-decoder's
    (``whisper_tensor_groups``)."""
    if _architecture(config, config) in ENCODER_DECODER_ARCHITECTURES:
        return whisper_tensor_groups(_encoder_decoder_numbers(config))
    return weight_tensor_groups(arch_dims(config))


def param_count(model):
    """Parameters of a ModelSpec (its ``param_count``), of a list of ``TensorGroup`` or of an HF
    config dict (``config_tensor_groups``): the one count every spec and every check of a
    checkpoint against its config uses."""
    if isinstance(model, ModelSpec):
        return model.param_count
    groups = model if isinstance(model, list) else config_tensor_groups(model)
    return sum(g.elements for g in groups)


def check_weights_against_config(spec, where):
    """``spec`` unless the weights it carries (``weight_bytes``, read from what ``where`` names:
    a checkpoint's safetensors headers, its index, the hub's total) are outside what its own
    config implies: WEIGHT_CHECK_LOW..HIGH of ``computed_weight_bytes`` (parameters x bytes per
    parameter of the declared dtype or quantization), or, where the quantization is not one this
    loader sizes, MIN..MAX_BITS_PER_WEIGHT per parameter. ModelSpecError naming ``where`` and
    both numbers otherwise: a plan built on weights the config contradicts promises the wrong
    memory to the KV cache."""
    computed = spec.extra.get('computed_weight_bytes')
    params = spec.param_count
    multimodal = bool(spec.extra.get('multimodal'))
    high_factor = WEIGHT_CHECK_HIGH_MULTIMODAL if multimodal else WEIGHT_CHECK_HIGH
    if computed:
        low, high = computed * WEIGHT_CHECK_LOW, computed * high_factor
        implied = '%d B as %s' % (computed, spec.extra.get('quant_scheme') or 'stored')
        bounds = '%d%%..%d%% of that' % (WEIGHT_CHECK_LOW * 100, high_factor * 100)
    else:
        low = params * MIN_BITS_PER_WEIGHT / 8
        high = params * MAX_BITS_PER_WEIGHT / 8 * (high_factor / WEIGHT_CHECK_HIGH)
        implied = 'quantization %s, not sized here' % (spec.quantization or 'unknown')
        bounds = '%g..%d bits per parameter' % (MIN_BITS_PER_WEIGHT, MAX_BITS_PER_WEIGHT)
    if low <= spec.weight_bytes <= high:
        return spec
    raise ModelSpecError('model', '%s: %d B of weights, but the config.json it comes with describes %d '
                         'parameters (%s; %s): a checkpoint of that model holds %s%s, so this is not '
                         'the model the config describes (a partial download, another model\'s config, '
                         'or a file whose header lies); refused'
                         % (where, spec.weight_bytes, params, implied,
                            'text decoder only' if multimodal else 'whole model', bounds,
                            ' (%d..%d B)' % (low, high)))


# ---------------------------------------------------------------- stored bytes by scheme

@dataclass(frozen=True)
class QuantScheme:
    """How the checkpoint stores weights; ``describe`` is shown in plans."""
    name: Optional[str]          # None (unquantized) | 'fp8' | 'awq' | 'gptq' | 'w4a16' | 'mxfp4'
    dtype_bytes: int = 2         # unquantized tensors
    bits: int = 16
    group_size: int = 0          # 0: per output channel; -1 (HF) normalized to 0
    zero_points: bool = False
    g_idx: bool = False
    fp8_block: Optional[List[int]] = None   # [128, 128] for DeepSeek-style block scales
    scale_bytes: int = 2
    describe: str = ''


QUANT_BITS = (2, 3, 4, 8)
MAX_QUANT_GROUP = 1 << 16


def _quant_int(qc, key, default, choices=None, low=1, high=MAX_QUANT_GROUP, where='quantization_config'):
    """An integer field of a quantization config, type- and range-checked by name."""
    value = qc.get(key, default)
    name = '%s.%s' % (where, key)
    if choices is not None:
        if not _is_plain_int(value) or value not in choices:
            raise ModelSpecError('model', '%s must be one of %s, got %r'
                                 % (name, ', '.join(str(c) for c in choices), value))
        return value
    return check_int_range('model config', name, value, low, high)


def _fp8_block(value, name):
    if (not isinstance(value, (list, tuple)) or len(value) != 2
            or not all(_is_plain_int(v) and 1 <= v <= MAX_QUANT_GROUP for v in value)):
        raise ModelSpecError('model', '%s must be two block sizes [rows, columns] in 1..%d, got %r'
                             % (name, MAX_QUANT_GROUP, value))
    return list(value)


def quant_scheme(config, dtype_bytes=2):
    """``QuantScheme`` from ``quantization_config`` (ModelSpecError when unsupported or
    when a field has a type or value no real checkpoint has)."""
    qc = config.get('quantization_config') or {}
    if not qc:
        return QuantScheme(None, dtype_bytes, describe='%d B/param (%s)' % (
            dtype_bytes, 'bf16/fp16' if dtype_bytes == 2 else 'fp32'))
    if not isinstance(qc, dict):
        raise ModelSpecError('model', 'quantization_config must be a dict, got %s' % type_name(qc))
    if not isinstance(qc.get('quant_method', ''), str):
        raise ModelSpecError('model', 'quantization_config.quant_method must be a string, got %r'
                             % (qc.get('quant_method'),))
    method = str(qc.get('quant_method', '')).lower()
    if method == 'mxfp4':
        return QuantScheme('mxfp4', dtype_bytes, bits=4, group_size=32, scale_bytes=1,
                           describe='MXFP4 experts: 4-bit values + 1 B E8M0 scale per 32; '
                                    'everything else bf16')
    if method == 'fp8':
        block = qc.get('weight_block_size')
        if block:
            block = _fp8_block(block, 'quantization_config.weight_block_size')
            return QuantScheme('fp8', dtype_bytes, bits=8, fp8_block=block, scale_bytes=4,
                               describe='FP8 linear weights (1 B) + fp32 scale per %dx%d block;'
                                        ' embeddings/lm_head/norms/router bf16' % tuple(block))
        return QuantScheme('fp8', dtype_bytes, bits=8, scale_bytes=4,
                           describe='FP8 linear weights (1 B) + one fp32 scale per tensor; '
                                    'embeddings/lm_head/norms bf16')
    if method in ('awq', 'gptq'):
        bits_key = 'bits' if 'bits' in qc else 'w_bit'
        bits = _quant_int(qc, bits_key, 4, choices=QUANT_BITS)
        group_key = 'group_size' if 'group_size' in qc else 'q_group_size'
        group = _quant_int(qc, group_key, 128, low=-1)
        group = 0 if group < 0 else group
        if method == 'awq':
            zeros = bool(qc.get('zero_point', True))
            return QuantScheme('awq', 2, bits=bits, group_size=group, zero_points=zeros,
                               describe='AWQ int%d g%d: packed weights + fp16 scales%s per group;'
                                        ' embeddings/lm_head/norms fp16'
                                        % (bits, group, ' + packed zeros' if zeros else ''))
        # GPTQ checkpoints (AutoGPTQ / GPTQModel) always carry qzeros and g_idx tensors.
        return QuantScheme('gptq', 2, bits=bits, group_size=group, zero_points=True, g_idx=True,
                           describe='GPTQ int%d g%d (desc_act=%s): packed weights + packed '
                                    'qzeros + fp16 scales per group + int32 g_idx per input '
                                    'row; embeddings/lm_head/norms fp16'
                                    % (bits, group, bool(qc.get('desc_act'))))
    if method == 'compressed-tensors':
        return _compressed_tensors_scheme(qc, dtype_bytes)
    raise ModelSpecError('model', "quantization_config.quant_method %r is not supported for "
                         "weight sizing; pass weight_bytes with the model" % method)


def _compressed_tensors_scheme(qc, dtype_bytes):
    groups = qc.get('config_groups') or {}
    if not groups:
        raise ModelSpecError('model', 'compressed-tensors quantization_config has no '
                             'config_groups; pass weight_bytes with the model')
    first = list(groups.values())[0] or {} if isinstance(groups, dict) else None
    weights = (first.get('weights') or {}) if isinstance(first, dict) else None
    if not isinstance(weights, dict):
        raise ModelSpecError('model', 'quantization_config.config_groups must map group names to '
                             'dicts with a weights dict')
    where = 'quantization_config.config_groups.weights'
    bits = _quant_int(weights, 'num_bits', 8, choices=QUANT_BITS, where=where)
    wtype = weights.get('type', 'float')
    strategy = weights.get('strategy', 'tensor')
    if bits == 8 and wtype == 'float':
        if strategy == 'block':
            block = _fp8_block(weights.get('block_structure') or [128, 128], where + '.block_structure')
            return QuantScheme('fp8', dtype_bytes, bits=8, fp8_block=block, scale_bytes=4,
                               describe='FP8 (compressed-tensors, block %s) + fp32 block scales'
                                        % (block,))
        per_channel = strategy == 'channel'
        return QuantScheme('fp8', dtype_bytes, bits=8, scale_bytes=dtype_bytes,
                           group_size=0 if per_channel else -1,
                           describe='FP8 (compressed-tensors, %s): linear weights 1 B + %s '
                                    'scale; embeddings/lm_head/norms bf16'
                                    % (strategy, 'per-channel' if per_channel else 'one'))
    if wtype == 'int' and bits in (4, 8):
        group = _quant_int(weights, 'group_size', 0, low=-1, where=where) if weights.get('group_size') else 0
        group = max(group, 0)
        zeros = not weights.get('symmetric', True)
        return QuantScheme('w4a16' if bits == 4 else 'w8a16', dtype_bytes, bits=bits,
                           group_size=group, zero_points=zeros, scale_bytes=dtype_bytes,
                           describe='compressed-tensors int%d g%d packed weights + scales'
                                    % (bits, group))
    raise ModelSpecError('model', 'compressed-tensors weights %r are not supported for weight '
                         'sizing; pass weight_bytes with the model' % (weights,))


def group_stored_bytes(group, scheme):
    """Bytes one tensor group takes in the checkpoint under ``scheme``."""
    plain = group.elements * scheme.dtype_bytes
    if scheme.name is None:
        return plain
    out_f, in_f, count = group.out_features, group.in_features, group.count
    if scheme.name == 'mxfp4':
        if group.role != ROLE_EXPERT:
            return plain
        blocks = ceil_div(in_f, scheme.group_size)
        # per 32 values: 16 B of packed 4-bit values + one E8M0 scale byte
        return count * out_f * blocks * (scheme.group_size // 2 + scheme.scale_bytes)
    if group.role not in (ROLE_LINEAR, ROLE_EXPERT):
        return plain
    if scheme.name == 'fp8':
        if scheme.fp8_block:
            bo, bi = scheme.fp8_block
            scales = ceil_div(out_f, bo) * ceil_div(in_f, bi)
        elif scheme.group_size == 0:      # per output channel
            scales = out_f
        else:                             # per tensor
            scales = 1
        return count * (out_f * in_f + scales * scheme.scale_bytes)
    # integer weight-only schemes: packed values, scales (and zeros) per group of inputs
    n_groups = ceil_div(in_f, scheme.group_size) if scheme.group_size else 1
    packed = out_f * in_f * scheme.bits // 8
    scales = n_groups * out_f * scheme.scale_bytes
    zeros = n_groups * out_f * scheme.bits // 8 if scheme.zero_points else 0
    g_idx = in_f * 4 if scheme.g_idx else 0
    return count * (packed + scales + zeros + g_idx)


def stored_weight_bytes(groups, scheme):
    """(total bytes, replicated bytes, bytes by role) of ``groups`` under ``scheme``."""
    total = replicated = 0
    by_role = {}
    for group in groups:
        size = group_stored_bytes(group, scheme)
        total += size
        by_role[group.role] = by_role.get(group.role, 0) + size
        if group.replicated:
            replicated += size
    return total, replicated, by_role


# ---------------------------------------------------------------- layer kinds

def layer_kinds_from_config(config):
    """(kinds per layer, sliding window, rule applied) as vLLM/transformers assign them."""
    text, _mm = _text_config(config)
    dims_layers = _positive_int(text, 'num_hidden_layers')
    mtype = _model_type(config, text)
    arch = _architecture(config, text)
    window = _sliding_window(text)
    if _count(text, 'kv_lora_rank'):
        return [LAYER_MLA] * dims_layers, None, 'MLA on every layer'
    layer_types = text.get('layer_types')
    if layer_types:
        if not isinstance(layer_types, list) or not all(isinstance(t, str) for t in layer_types):
            raise ModelSpecError('model', "config key 'layer_types' must be a list of strings, "
                                 "got %s" % type_name(layer_types))
        if len(layer_types) != dims_layers:
            raise ModelSpecError('model', 'layer_types has %d entries for %d layers'
                                 % (len(layer_types), dims_layers))
        table = {'full_attention': LAYER_FULL, 'sliding_attention': LAYER_SLIDING,
                 'linear_attention': LAYER_NO_KV, 'mamba': LAYER_NO_KV}
        unknown = sorted(set(t for t in layer_types if t not in table))
        if unknown:
            raise ModelSpecError('model', 'layer_types has unknown kinds %s' % unknown)
        kinds = [table[t] for t in layer_types]
        if LAYER_SLIDING in kinds and window is None:
            raise ModelSpecError('model', "layer_types has sliding layers but config key "
                                 "'sliding_window' is missing")
        return kinds, (window if LAYER_SLIDING in kinds else None), 'from layer_types'
    if mtype.startswith('qwen') or arch.startswith('Qwen'):
        if text.get('use_sliding_window') and window:
            first = _count(text, 'max_window_layers', dims_layers)
            return ([LAYER_FULL if i < first else LAYER_SLIDING for i in range(dims_layers)],
                    window, 'Qwen: sliding from layer max_window_layers=%d' % first)
        return [LAYER_FULL] * dims_layers, None, 'Qwen: use_sliding_window false'
    if not window:
        return [LAYER_FULL] * dims_layers, None, 'no sliding_window'
    if mtype == 'gemma2' or arch.startswith('Gemma2'):
        # transformers Gemma2: is_sliding = not bool(layer_idx % 2) -> layer 0 slides
        return ([LAYER_SLIDING if i % 2 == 0 else LAYER_FULL for i in range(dims_layers)],
                window, 'Gemma2: even layers sliding')
    if mtype.startswith('gemma3') or arch.startswith('Gemma3'):
        pattern = _count(text, 'sliding_window_pattern', 6)
        # transformers Gemma3: is_sliding = bool((layer_idx + 1) % sliding_window_pattern)
        return ([LAYER_SLIDING if (i + 1) % pattern else LAYER_FULL
                 for i in range(dims_layers)],
                window, 'Gemma3: %d sliding : 1 full' % (pattern - 1))
    # Mistral v0.1, Phi-3-mini: one window on every layer.
    return [LAYER_SLIDING] * dims_layers, window, 'sliding_window on every layer'


# ---------------------------------------------------------------- builders

def _dtype_bytes(config):
    text, _mm = _text_config(config)
    dtype = str(text.get('torch_dtype') or text.get('dtype') or config.get('torch_dtype')
                or config.get('dtype') or 'bfloat16').lower().replace('torch.', '')
    if dtype not in DTYPE_BYTES:
        raise ModelSpecError('model', "torch_dtype %r is not one of %s"
                             % (dtype, sorted(DTYPE_BYTES)))
    return DTYPE_BYTES[dtype]


def _checked_weight_bytes(weight_bytes):
    if isinstance(weight_bytes, bool) or not isinstance(weight_bytes, int) or weight_bytes <= 0:
        raise ModelSpecError('weight_bytes', 'must be a positive integer number of bytes, '
                             'got %r' % (weight_bytes,))
    if weight_bytes > MAX_WEIGHT_BYTES:
        raise ModelSpecError('weight_bytes', '%d B is more than any checkpoint holds (limit %d B)'
                             % (weight_bytes, MAX_WEIGHT_BYTES))
    return weight_bytes


# ---------------------------------------------------------------- encoder-decoder (cross-attention)
# Architectures whose decoder layers each hold a self-attention and a cross-attention KV cache.
# Whisper is the one encoder-decoder model vLLM's V1 engine serves (vllm/v1/core/sched/scheduler.py:
# "Whisper is the only supported encoder-decoder model"); its config keys are transformers'
# WhisperConfig (d_model, encoder_/decoder_layers, ..._attention_heads, ..._ffn_dim,
# max_source_positions, max_target_positions, num_mel_bins).
ENCODER_DECODER_ARCHITECTURES = ('WhisperForConditionalGeneration',)


def whisper_tensor_groups(cfg):
    """Weight tensor groups of a Whisper checkpoint (transformers modeling_whisper): a conv
    front end and ``encoder_layers`` encoder layers, ``decoder_layers`` decoder layers with
    self- and cross-attention, learned positions on both sides, proj_out tied to the token
    embedding. Replicated: what vLLM's whisper.py keeps
    whole per TP rank (nn.Conv1d front end, nn.Embedding positions, norms and biases: the
    column-parallel biases are split there, so counting them whole errs on the large side).
    No proj_out: vLLM ties it to the token embedding whatever the config says (whisper.py
    ``proj_out.tie_weights(embed_tokens)``, ``load_weights`` skips the ``proj_out.`` prefix)."""
    d, enc, dec = cfg['d_model'], cfg['encoder_layers'], cfg['decoder_layers']
    enc_ff, dec_ff, mel = cfg['encoder_ffn_dim'], cfg['decoder_ffn_dim'], cfg['num_mel_bins']
    groups = [
        TensorGroup('encoder.conv', ROLE_LINEAR, d, 3 * mel + 3 * d, 1, replicated=True),
        TensorGroup('encoder.conv_bias', ROLE_VECTOR, d, 1, 2, replicated=True),
        TensorGroup('encoder.embed_positions', ROLE_EMBED, cfg['max_source_positions'], d, 1, replicated=True),
        TensorGroup('encoder.attn', ROLE_LINEAR, d, d, 4 * enc),
        TensorGroup('encoder.mlp', ROLE_LINEAR, enc_ff, d, 2 * enc),
        # q/v/out biases (k has none), fc1/fc2 biases, two layer norms (weight + bias)
        TensorGroup('encoder.vectors', ROLE_VECTOR, 3 * d + enc_ff + d + 4 * d, 1, enc, replicated=True),
        TensorGroup('encoder.layer_norm', ROLE_VECTOR, d, 1, 2, replicated=True),
        TensorGroup('decoder.embed_tokens', ROLE_EMBED, cfg['vocab_size'], d, 1),
        TensorGroup('decoder.embed_positions', ROLE_EMBED, cfg['max_target_positions'], d, 1, replicated=True),
        # self_attn and encoder_attn: q, k, v, out each
        TensorGroup('decoder.attn', ROLE_LINEAR, d, d, 8 * dec),
        TensorGroup('decoder.mlp', ROLE_LINEAR, dec_ff, d, 2 * dec),
        # q/v/out biases of both attentions, fc1/fc2 biases, three layer norms
        TensorGroup('decoder.vectors', ROLE_VECTOR, 6 * d + dec_ff + d + 6 * d, 1, dec, replicated=True),
        TensorGroup('decoder.layer_norm', ROLE_VECTOR, d, 1, 2, replicated=True),
    ]
    return groups


def _encoder_decoder_numbers(config):
    """The Whisper config keys the planner reads, each type- and range-checked by name."""
    cfg = {}
    for key in ('d_model', 'encoder_layers', 'decoder_layers', 'encoder_attention_heads',
                'decoder_attention_heads', 'encoder_ffn_dim', 'decoder_ffn_dim', 'vocab_size',
                'max_source_positions', 'max_target_positions', 'num_mel_bins'):
        cfg[key] = _positive_int(config, key)
    for side in ('encoder', 'decoder'):
        heads = cfg['%s_attention_heads' % side]
        if cfg['d_model'] % heads:
            raise ModelSpecError('model', "config key 'd_model' (%d) is not a multiple of '%s_attention_heads' (%d)"
                                 % (cfg['d_model'], side, heads))
    tie = config.get('tie_word_embeddings', True)     # WhisperConfig default; vLLM ties proj_out anyway
    if not isinstance(tie, bool):
        raise ModelSpecError('model', "config key 'tie_word_embeddings' must be true or false, got %r" % (tie,))
    return cfg


def _weight_dims(config):
    """``ArchDims`` for sorting a checkpoint's tensors into loaded and skipped: an encoder-decoder
    config's layers are the larger stack (encoder and decoder tensors both sit under
    ``...layers.<i>.``) and its head, proj_out, is always tied in vLLM."""
    if _architecture(config, config) not in ENCODER_DECODER_ARCHITECTURES:
        return arch_dims(config)
    cfg = _encoder_decoder_numbers(config)
    heads = cfg['decoder_attention_heads']
    return ArchDims(
        architecture=_architecture(config, config), model_type=_model_type(config, config),
        hidden_size=cfg['d_model'], num_layers=max(cfg['encoder_layers'], cfg['decoder_layers']),
        num_attention_heads=heads, num_kv_heads=heads, head_dim=cfg['d_model'] // heads,
        vocab_size=cfg['vocab_size'], intermediate_size=cfg['decoder_ffn_dim'], tie_word_embeddings=True)


def spec_from_encoder_decoder_config(config, name, weight_bytes=None, weight_note=None, source='hf_config',
                                     weight_bytes_exact=False):
    """ModelSpec of a Whisper ``config.json``: per decoder layer one self-attention ('full') and
    one cross-attention ('cross') KV layer, so ``num_layers`` is 2 x decoder_layers; the encoder
    layers cache nothing (vLLM: encoder attention has no KV cache spec). max_model_len is
    max_target_positions (vLLM's derived max_model_len: 448 for Whisper), max_encoder_len
    max_source_positions (vLLM get_encdec_max_encoder_len -> WhisperProcessingInfo
    get_num_audio_tokens: 1500)."""
    arch = _architecture(config, config)
    cfg = _encoder_decoder_numbers(config)
    if config.get('quantization_config'):
        raise ModelSpecError('model', "config key 'quantization_config': quantized %s checkpoints are not "
                             "modelled (only 16-bit encoder-decoder weights)" % arch)
    loaded_dtype = min(_dtype_bytes(config), LOADED_FLOAT_BYTES)
    scheme = QuantScheme(None, loaded_dtype, describe='%d B/param (bf16/fp16)' % loaded_dtype)
    groups = whisper_tensor_groups(cfg)
    computed, replicated, by_role = stored_weight_bytes(groups, scheme)
    if weight_bytes is not None:
        weight_bytes = _checked_weight_bytes(weight_bytes)
        note, exact = weight_note or 'given', bool(weight_bytes_exact)
    else:
        weight_bytes = computed
        note, exact = 'computed from config dimensions (encoder and decoder): %s' % scheme.describe, False
    dec = cfg['decoder_layers']
    return check_spec(ModelSpec(
        name=str(name), source=source, architecture=arch, num_layers=2 * dec,
        hidden_size=cfg['d_model'], intermediate_size=cfg['decoder_ffn_dim'],
        num_attention_heads=cfg['decoder_attention_heads'], num_kv_heads=cfg['decoder_attention_heads'],
        head_dim=cfg['d_model'] // cfg['decoder_attention_heads'], vocab_size=cfg['vocab_size'],
        max_position_embeddings=cfg['max_target_positions'], tie_word_embeddings=True, dtype_bytes=2,
        layer_kinds=[LAYER_FULL, LAYER_CROSS] * dec, max_encoder_len=cfg['max_source_positions'],
        param_count=param_count(groups), weight_bytes=int(weight_bytes), weight_bytes_exact=exact,
        weight_bytes_note=note, quantization=None, replicated_bytes=replicated,
        extra={
            'model_type': _model_type(config, config),
            'multimodal': False,
            'layer_kinds_rule': ('encoder-decoder: each of the %d decoder layers is one self-attention (full) '
                                 'and one cross-attention layer over %d encoder positions; the %d encoder '
                                 'layers cache no KV' % (dec, cfg['max_source_positions'], cfg['encoder_layers'])),
            'encoder_layers': cfg['encoder_layers'],
            'quant_scheme': scheme.describe,
            'computed_weight_bytes': computed,
            'weight_bytes_by_role': by_role,
            'params_by_group': dict((g.name, g.elements) for g in groups),
        },
    ))


def spec_from_hf_config(config, name, weight_bytes=None, weight_note=None, source='hf_config',
                        weight_bytes_exact=False):
    """ModelSpec from an HF ``config.json`` dict.

    ``weight_bytes``: the checkpoint's stored bytes when known (safetensors index); else
    they are computed from the dimensions and the quantization scheme."""
    if not isinstance(config, dict):
        raise ModelSpecError('model', 'an HF config must be a dict, got %s' % type_name(config))
    config = {k: v for k, v in config.items() if not str(k).startswith('_')}
    if _architecture(config, config) in ENCODER_DECODER_ARCHITECTURES:
        return spec_from_encoder_decoder_config(config, name, weight_bytes, weight_note, source,
                                                weight_bytes_exact)
    dims = arch_dims(config)
    text, _mm = _text_config(config)
    stored_dtype = _dtype_bytes(config)
    loaded_dtype = min(stored_dtype, LOADED_FLOAT_BYTES)
    groups = weight_tensor_groups(dims)
    params = param_count(groups)
    try:
        scheme = quant_scheme(config, loaded_dtype)
    except ModelSpecError:
        if weight_bytes is None:
            raise
        # Stored size is given; only the replicated share is sized, at 16 bit (norms and
        # routers stay unquantized in every scheme we know).
        method = str((config.get('quantization_config') or {}).get('quant_method', 'unknown'))
        scheme = QuantScheme(method.lower(), loaded_dtype, describe='%s (size given)' % method)
        _total, replicated, _by_role = stored_weight_bytes(groups, QuantScheme(None, loaded_dtype))
        computed, by_role = None, {}
    else:
        computed, replicated, by_role = stored_weight_bytes(groups, scheme)
    kinds, window, kinds_rule = layer_kinds_from_config(config)
    what = 'text decoder only (vision tower not counted)' if dims.multimodal else 'whole decoder'
    if weight_bytes is not None:
        weight_bytes = _checked_weight_bytes(weight_bytes)
        note = weight_note or 'given'
        exact = bool(weight_bytes_exact)
    else:
        weight_bytes = computed
        note = 'computed from config dimensions (%s): %s' % (what, scheme.describe)
        if stored_dtype > loaded_dtype:
            note += '; fp32 checkpoint, loaded in 16 bit (vLLM dtype=auto)'
        exact = False
    mla = dims.kv_lora_rank is not None
    extra = {
        'model_type': dims.model_type,
        'multimodal': dims.multimodal,
        'layer_kinds_rule': kinds_rule,
        'quant_scheme': scheme.describe,
        'computed_weight_bytes': computed,
        'weight_bytes_by_role': by_role,
        'params_by_group': dict((g.name, g.elements) for g in groups),
    }
    if mla:
        extra.update(q_lora_rank=dims.q_lora_rank, qk_nope_head_dim=dims.qk_nope_head_dim,
                     v_head_dim=dims.v_head_dim)
    if dims.dense_layers:
        extra['first_k_dense_replace'] = dims.dense_layers
    if _count(text, 'num_nextn_predict_layers'):
        extra['mtp_layers_not_counted'] = _count(text, 'num_nextn_predict_layers')
    if _count(text, 'sliding_window_pattern'):
        extra['sliding_window_pattern'] = _count(text, 'sliding_window_pattern')
    return check_spec(ModelSpec(
        name=str(name), source=source, architecture=dims.architecture,
        num_layers=dims.num_layers, hidden_size=dims.hidden_size,
        intermediate_size=dims.intermediate_size,
        num_attention_heads=dims.num_attention_heads,
        # vLLM caches one latent "head" of kv_lora_rank + rope dims per token for MLA.
        num_kv_heads=1 if mla else dims.num_kv_heads,
        head_dim=(dims.kv_lora_rank + dims.qk_rope_head_dim) if mla else dims.head_dim,
        vocab_size=dims.vocab_size,
        max_position_embeddings=_positive_int(text, 'max_position_embeddings', default=4096),
        tie_word_embeddings=dims.tie_word_embeddings,
        # vLLM's dtype=auto runs fp32 checkpoints in 16-bit; activations/KV use 2 B.
        dtype_bytes=2,
        layer_kinds=kinds, sliding_window=window,
        kv_lora_rank=dims.kv_lora_rank, qk_rope_head_dim=dims.qk_rope_head_dim if mla else None,
        num_experts=dims.num_experts, num_experts_per_tok=dims.num_experts_per_tok,
        moe_intermediate_size=dims.moe_intermediate_size, num_shared_experts=dims.num_shared_experts,
        param_count=params, weight_bytes=int(weight_bytes), weight_bytes_exact=exact,
        weight_bytes_note=note, quantization=scheme.name, replicated_bytes=replicated,
        extra=extra,
    ))


def spec_from_catalog(name):
    """ModelSpec for a catalog entry (exact stored bytes where the catalog has them)."""
    entry = CATALOG[name]
    weight_bytes = entry.get('_weight_bytes')
    note = None
    if weight_bytes is not None:
        note = 'safetensors index metadata.total_size (%s)' % entry.get('_weight_bytes_source')
    spec = spec_from_hf_config(entry, name, weight_bytes=weight_bytes, weight_note=note,
                               source='catalog', weight_bytes_exact=weight_bytes is not None)
    if weight_bytes is not None:
        check_weights_against_config(spec, 'catalog entry %s (%s)' % (name, entry.get('_weight_bytes_source')))
    return spec


def _refuse_constant(name):
    raise ValueError('%s is not a JSON number' % name)


def read_json_file(path, limit, what):
    """The JSON value in ``path``: at most ``limit`` bytes, strict JSON (no NaN/Infinity),
    bounded nesting. ModelSpecError says what is wrong, never what the file holds."""
    try:
        if not os.path.isfile(path):
            raise ModelSpecError('model', '%s %s is not a regular file' % (what, path))
        with open(path, 'rb') as handle:
            raw = handle.read(limit + 1)
    except OSError as exc:
        raise ModelSpecError('model', '%s %s cannot be read: %s' % (what, path, exc.strerror or exc))
    if len(raw) > limit:
        raise ModelSpecError('model', '%s %s is larger than %d bytes; no real one is' % (what, path, limit))
    return parse_json_bytes(raw, path, what)


def parse_json_bytes(raw, path, what):
    try:
        return json.loads(raw.decode('utf-8'), parse_constant=_refuse_constant)
    except UnicodeDecodeError:
        raise ModelSpecError('model', '%s %s is not valid JSON: not UTF-8 text' % (what, path))
    except RecursionError:
        raise ModelSpecError('model', '%s %s is not valid JSON: nested too deeply' % (what, path))
    except ValueError as exc:
        # json's messages give a position (line, column), never the text at it.
        raise ModelSpecError('model', '%s %s is not valid JSON: %s' % (what, path, exc))


def _safetensors_tensor_bytes(path):
    """{tensor name: bytes} from one .safetensors header (the payload is not read).

    The header is checked against the format: its length within the file (and the format's
    100 MB cap), a JSON object of tensors with a known dtype, a shape of sizes and data
    offsets inside the payload whose span matches shape x dtype."""
    what = 'safetensors file'
    try:
        size = os.path.getsize(path)
        with open(path, 'rb') as handle:
            head = handle.read(8)
            if len(head) < 8:
                raise ModelSpecError('model', '%s is not a safetensors file (shorter than 8 bytes)'
                                     % path)
            (header_len,) = struct.unpack('<Q', head)
            if header_len + 8 > size or header_len > MAX_SAFETENSORS_HEADER:
                # the number is the file's first 8 bytes: not repeated
                raise ModelSpecError('model', '%s is not a safetensors file: its header length '
                                     'exceeds the file size (%d bytes) or the format\'s %d-byte '
                                     'cap' % (path, size, MAX_SAFETENSORS_HEADER))
            raw = handle.read(header_len)
    except OSError as exc:
        raise ModelSpecError('model', '%s %s cannot be read: %s' % (what, path, exc.strerror or exc))
    if not raw.lstrip()[:1] == b'{':
        raise ModelSpecError('model', '%s: safetensors header cannot be parsed: not a JSON object'
                             % path)
    try:
        header = parse_json_bytes(raw, path, 'safetensors header of')
    except ModelSpecError as exc:
        raise ModelSpecError('model', '%s: safetensors header cannot be parsed (%s)'
                             % (path, str(exc).split(': ', 1)[-1]))
    if not isinstance(header, dict):
        raise ModelSpecError('model', '%s: safetensors header cannot be parsed: not a JSON object'
                             % path)
    payload = size - 8 - header_len
    _check_not_truncated(path, header, size, header_len, payload)
    sizes = {}
    for position, (name, info) in enumerate(header.items()):
        if name == '__metadata__':
            continue
        sizes[name] = _tensor_span(path, position, info, payload)
    return sizes


def _check_not_truncated(path, header, size, header_len, payload):
    """ModelSpecError naming the file and both sizes when a tensor's data ends past the end of
    the file (a download cut short): the size the header claims is 8 + its length + the last
    tensor's end."""
    claimed, last = payload, None
    for position, (name, info) in enumerate(header.items()):
        offsets = info.get('data_offsets') if isinstance(info, dict) and name != '__metadata__' else None
        if (isinstance(offsets, list) and len(offsets) == 2 and all(_is_plain_int(o) for o in offsets)
                and 0 <= offsets[0] <= offsets[1] and offsets[1] > claimed):
            claimed, last = offsets[1], (position, offsets)
    if last is not None:
        position, (begin, end) = last
        raise ModelSpecError('model', '%s is truncated: the file is %d B, its header claims %d B '
                             '(safetensors tensor #%d: data_offsets [%d, %d] lie outside the %d-byte '
                             'payload); complete the download' % (path, size, 8 + header_len + claimed,
                                                                  position, begin, end, payload))


def _tensor_span(path, position, info, payload):
    """Bytes of one header entry, checked (tensors are named by position: names are content)."""
    where = '%s: safetensors tensor #%d' % (path, position)
    if not isinstance(info, dict):
        raise ModelSpecError('model', '%s cannot be parsed: entry is not an object' % where)
    dtype = info.get('dtype')
    if not isinstance(dtype, str) or dtype not in SAFETENSORS_DTYPES:
        raise ModelSpecError('model', '%s has an unknown dtype (known: %s)'
                             % (where, ', '.join(sorted(SAFETENSORS_DTYPES))))
    shape, offsets = info.get('shape'), info.get('data_offsets')
    if not isinstance(shape, list) or len(shape) > 16 or not all(
            _is_plain_int(d) and 0 <= d <= 1 << 40 for d in shape):
        raise ModelSpecError('model', '%s has a shape that is not a list of sizes' % where)
    if (not isinstance(offsets, list) or len(offsets) != 2
            or not all(_is_plain_int(o) for o in offsets)):
        raise ModelSpecError('model', '%s cannot be parsed: data_offsets must be [begin, end]' % where)
    begin, end = offsets
    if not 0 <= begin <= end <= payload:
        raise ModelSpecError('model', '%s: data_offsets [%d, %d] lie outside the %d-byte payload '
                             '(truncated or not a safetensors file)' % (where, begin, end, payload))
    elements = 1
    for dim in shape:
        elements *= dim
    element_bytes = SAFETENSORS_DTYPES[dtype]
    if element_bytes is not None and elements * element_bytes != end - begin:
        raise ModelSpecError('model', '%s: shape %s x %d B (%s) = %d B, but its data_offsets span '
                             '%d B' % (where, shape, element_bytes, dtype, elements * element_bytes,
                                       end - begin))
    return end - begin


# Decoder-layer tensors: model.layers.N., language_model.model.layers.N., ...
LAYER_TENSOR_RE = re.compile(r'^(?:[a-z_]+\.)*layers\.(\d+)\.')
TIED_HEAD_NAMES = ('lm_head.weight', 'language_model.lm_head.weight', 'proj_out.weight')    # proj_out: Whisper


def _not_loaded(name, dims):
    """Why vLLM does not load a checkpoint tensor (None when it does)."""
    if dims.tie_word_embeddings and name in TIED_HEAD_NAMES:
        return 'lm_head stored although tie_word_embeddings is true'
    match = LAYER_TENSOR_RE.match(name)
    if match and int(match.group(1)) >= dims.num_layers and 'vision' not in name:
        return 'layers past num_hidden_layers (MTP / next-token-prediction)'
    return None


def _read_index(index_path):
    """(metadata.total_size or None, weight_map) of a safetensors index, both checked: the
    total is a byte count no checkpoint exceeds, the map names plain shard file names."""
    index = read_json_file(index_path, MAX_INDEX_BYTES, 'safetensors index')
    if not isinstance(index, dict):
        raise ModelSpecError('model', '%s must hold a JSON object' % index_path)
    metadata = index.get('metadata') or {}
    weight_map = index.get('weight_map') or {}
    if not isinstance(metadata, dict) or not isinstance(weight_map, dict):
        raise ModelSpecError('model', '%s: metadata and weight_map must be objects' % index_path)
    total = metadata.get('total_size')
    if total is not None:
        check_int_range(index_path, 'metadata.total_size', total, 1, MAX_WEIGHT_BYTES)
    files = set(weight_map.values())
    bad = [f for f in files if not isinstance(f, str) or os.path.basename(f) != f
           or f in ('.', '..') or not f.endswith('.safetensors')]
    if bad:
        raise ModelSpecError('model', '%s: weight_map must name .safetensors files in the model '
                             'directory (%d entries do not)' % (index_path, len(bad)))
    if len(files) > MAX_SHARDS:
        raise ModelSpecError('model', '%s: weight_map names %d files; no checkpoint has more than '
                             '%d shards' % (index_path, len(files), MAX_SHARDS))
    return total, dict(weight_map)


def _missing_shards(files):
    """Shard files (name-0000i-of-0000n.safetensors) whose siblings are absent."""
    missing = []
    for name in files:
        match = SHARD_NAME_RE.match(name)
        if not match:
            continue
        count = int(match.group('count'))
        if not 1 <= count <= MAX_SHARDS:
            raise ModelSpecError('model', 'shard file name claims %d shards (1..%d)' % (count, MAX_SHARDS))
        for i in range(1, count + 1):
            sibling = '%s-%05d-of-%05d.safetensors' % (match.group('stem'), i, count)
            if sibling not in files and sibling not in missing:
                missing.append(sibling)
    return sorted(missing)


def _as_loaded(stored, note, config):
    """Stored bytes of an unquantized fp32 checkpoint halve when vLLM loads it in 16 bit."""
    if _dtype_bytes(config) > LOADED_FLOAT_BYTES and not config.get('quantization_config'):
        return stored * LOADED_FLOAT_BYTES // _dtype_bytes(config), (
            note + '; fp32 checkpoint (%d B stored), loaded in 16 bit (vLLM dtype=auto)' % stored)
    return stored, note


def _shard_label(path, files):
    if len(files) == 1:
        return os.path.join(path, files[0])
    return '%s (%d shards, %s .. %s)' % (path, len(files), files[0], files[-1])


def _model_dir_weight_bytes(path, config):
    """(bytes vLLM loads, note, what they were read from) from safetensors headers or, with no
    shard downloaded, the index; (None, None, None) when the directory has neither. A partial
    set of shards and an index total the shards contradict are refused."""
    dims = _weight_dims(config)
    index_path = os.path.join(path, SAFETENSORS_INDEX)
    total, weight_map = _read_index(index_path) if os.path.isfile(index_path) else (None, {})
    files = sorted(f for f in os.listdir(path) if f.endswith('.safetensors'))
    if len(files) > 1 and MISTRAL_CONSOLIDATED in files:
        files.remove(MISTRAL_CONSOLIDATED)
    if len(files) > MAX_SHARDS:
        raise ModelSpecError('model', 'model directory %s holds %d .safetensors files; no checkpoint '
                             'has more than %d shards' % (path, len(files), MAX_SHARDS))
    absent = sorted(set(weight_map.values()) - set(files))
    absent += [f for f in _missing_shards(files) if f not in absent]
    if files and absent:
        # Summing the shards present would size a fraction of the model as the whole, and an
        # index total beside a partial download is a figure nothing on disk backs.
        raise ModelSpecError('model', 'model directory %s is incomplete: %d shard(s) missing (%s%s) of '
                             'the %d its index and shard names call for (%d present%s); complete the '
                             'download' % (path, len(absent), ', '.join(absent[:4]),
                                           ', ...' if len(absent) > 4 else '', len(absent) + len(files),
                                           len(files), '' if total is None else
                                           '; %s metadata.total_size %s B' % (SAFETENSORS_INDEX, total)))
    if files:
        loaded = 0
        skipped = {}
        indexed = 0
        named = set(weight_map.values())
        for name_ in files:
            for tensor, size in _safetensors_tensor_bytes(os.path.join(path, name_)).items():
                if name_ in named:
                    indexed += size
                reason = _not_loaded(tensor, dims)
                if reason:
                    skipped[reason] = skipped.get(reason, 0) + size
                else:
                    loaded += size
        if total is not None and named and abs(indexed - total) > INDEX_TOTAL_TOLERANCE * max(indexed, total):
            raise ModelSpecError('model', '%s: metadata.total_size %s B, but the %d shard(s) it names '
                                 'hold %d B of tensors (their safetensors headers); an index that '
                                 'disagrees with its shards by more than %g%% belongs to another '
                                 'checkpoint' % (index_path, total, len(named), indexed,
                                                 INDEX_TOTAL_TOLERANCE * 100))
        note = 'sum of tensor sizes in %d safetensors header(s)' % len(files)
        for reason, size in sorted(skipped.items()):
            note += '; %d B not counted (%s)' % (size, reason)
        return _as_loaded(loaded, note, config) + (_shard_label(path, files),)
    if total is not None:
        weight_bytes = int(total)
        note = '%s metadata.total_size (no shard downloaded)' % SAFETENSORS_INDEX
        if dims.tie_word_embeddings and any(t in weight_map for t in TIED_HEAD_NAMES):
            head = dims.vocab_size * dims.hidden_size * _dtype_bytes(config)
            weight_bytes -= head
            note += ' minus %d B of lm_head stored although tie_word_embeddings is true' % head
        mtp = [t for t in weight_map if _not_loaded(t, dims) and t not in TIED_HEAD_NAMES]
        if mtp:
            note += ('; includes %d tensors of layers past num_hidden_layers (MTP) that vLLM '
                     'does not load by default' % len(mtp))
        return _as_loaded(weight_bytes, note, config) + ('%s (metadata.total_size %d B)' % (index_path, total),)
    return None, None, None


def spec_from_model_dir(path):
    """ModelSpec from a local HF model directory (config.json + safetensors).

    Weight bytes: per-tensor sizes from the safetensors headers when every shard is
    present (tensors vLLM skips are left out and named in the note; the index's total_size
    must agree with them), else, with no shard downloaded, the index's metadata.total_size,
    else computed from the dimensions. Shards missing from a partial download, a shard
    shorter than its header says, and weights outside what the config implies
    (``check_weights_against_config``) are refused."""
    config_path = os.path.join(path, 'config.json')
    if not os.path.isfile(config_path):
        raise ModelSpecError('model', 'model directory %s has no readable config.json (no such '
                             'regular file)' % path)
    config = read_json_file(config_path, MAX_CONFIG_BYTES, 'config')
    if not isinstance(config, dict):
        raise ModelSpecError('model', '%s must hold a JSON object' % config_path)
    name = os.path.basename(os.path.normpath(path))
    weight_bytes, note, where = _model_dir_weight_bytes(path, config)
    spec = spec_from_hf_config(config, name, weight_bytes=weight_bytes, weight_note=note,
                               source='model_dir', weight_bytes_exact=weight_bytes is not None)
    if weight_bytes is not None:
        check_weights_against_config(spec, where)
    return spec


# ---------------------------------------------------------------- GGUF

# Ranges of the GGUF keys read ({arch}.<key>), from model_spec.GEOMETRY_LIMITS. Zero is
# allowed where llama.cpp reads it as "none" (no KV heads on a recurrent layer, no window).
_G = GEOMETRY_LIMITS
GGUF_KEY_LIMITS = {
    'block_count': _G['num_layers'], 'embedding_length': _G['hidden_size'],
    'attention.head_count': (0, _G['num_attention_heads'][1]),
    'attention.head_count_kv': _G['num_kv_heads'],
    'attention.key_length': _G['head_dim'], 'attention.value_length': _G['head_dim'],
    'feed_forward_length': _G['intermediate_size'],
    'attention.sliding_window': (0, _G['sliding_window'][1]),
    'attention.sliding_window_pattern': (0, _G['num_layers'][1]),
    'vocab_size': _G['vocab_size'], 'context_length': _G['max_position_embeddings'],
    'attention.kv_lora_rank': (0, _G['kv_lora_rank'][1]),
    'rope.dimension_count': (0, _G['qk_rope_head_dim'][1]),
    'expert_count': _G['num_experts'], 'expert_used_count': _G['num_experts_per_tok'],
    'expert_feed_forward_length': _G['moe_intermediate_size'],
    'expert_shared_count': _G['num_shared_experts'],
}


def _gguf_int(summary, key, default=None, required=True):
    """An integer (or per-layer list of integers) GGUF key, type- and range-checked by name."""
    value = summary.get(key)
    if value is None and key in summary.array_lengths:
        raise ModelSpecError('model', '%s: GGUF key %s is an array of %d entries; no model has '
                             'that many layers' % (summary.path, key, summary.array_lengths[key]))
    if value is None:
        value = default
    if value is None:
        if required:
            raise ModelSpecError('model', '%s: GGUF key %s is missing' % (summary.path, key))
        return None
    low, high = GGUF_KEY_LIMITS.get(key.split('.', 1)[-1], (0, 1 << 62))
    what = '%s: GGUF key' % summary.path
    if isinstance(value, list):
        return [check_int_range(what, key, v, low, high) for v in value]
    return check_int_range(what, key, value, low, high)


def _gguf_scalar(summary, key, default=None, required=True, low=None):
    """One integer GGUF key (not a per-layer list), at least ``low`` when given."""
    value = _gguf_int(summary, key, default=default, required=required)
    if isinstance(value, list):
        raise ModelSpecError('model', '%s: GGUF key %s must be one integer, not a list'
                             % (summary.path, key))
    if value is not None and low is not None and value < low:
        raise ModelSpecError('model', '%s: GGUF key %s = %d is out of range (>= %d)'
                             % (summary.path, key, value, low))
    return value


def _per_layer(value, n_layer, key):
    if isinstance(value, list):
        if len(value) != n_layer:
            raise ModelSpecError('model', 'GGUF key %s has %d entries for %d layers'
                                 % (key, len(value), n_layer))
        return value
    return [value] * n_layer


# llama.cpp's sliding-window layer patterns (set_swa_pattern): layer il slides when
# il % pattern < pattern - 1.
GGUF_SWA_PATTERN = {'gemma2': 2, 'gemma3': 6, 'gpt-oss': 2, 'cohere2': 4}


def _gguf_layer_kinds(arch, n_layer, kv_heads, window, summary):
    if summary.get('%s.attention.kv_lora_rank' % arch):
        return [LAYER_MLA] * n_layer
    kinds = [LAYER_FULL if kv else LAYER_NO_KV for kv in kv_heads]
    if not window:
        return kinds
    pattern_key = '%s.attention.sliding_window_pattern' % arch
    pattern = summary.get(pattern_key)
    if isinstance(pattern, list):
        # per layer, bool (or 0/1) each
        if not all(isinstance(p, (bool, int)) for p in pattern):
            raise ModelSpecError('model', '%s: GGUF key %s must list booleans' % (summary.path, pattern_key))
        sliding = [bool(p) for p in _per_layer(pattern, n_layer, 'sliding_window_pattern')]
    else:
        if pattern is not None:
            pattern = _gguf_int(summary, pattern_key)
        period = pattern if pattern else GGUF_SWA_PATTERN.get(arch, 1)
        sliding = [(i % period) < period - 1 if period > 1 else True for i in range(n_layer)]
    return [LAYER_SLIDING if (s and k == LAYER_FULL) else k for s, k in zip(sliding, kinds)]


def spec_from_gguf(path):
    """ModelSpec from a GGUF file (or a split set), sized from its tensor table."""
    summary = gguf_reader.read_gguf(path)
    arch = summary.get('general.architecture')
    if not arch:
        raise ModelSpecError('model', '%s: GGUF key general.architecture is missing' % path)
    if not isinstance(arch, str) or not re.match(r'^[A-Za-z0-9_.-]{1,64}$', arch):
        raise ModelSpecError('model', '%s: GGUF key general.architecture is not an architecture '
                             'name' % path)
    a = arch + '.'
    n_layer = _gguf_scalar(summary, a + 'block_count')
    n_embd = _gguf_scalar(summary, a + 'embedding_length')
    n_head = _gguf_int(summary, a + 'attention.head_count')
    heads = _per_layer(n_head, n_layer, a + 'attention.head_count')
    head_max = max(heads)
    if head_max < 1:
        raise ModelSpecError('model', '%s: GGUF key %sattention.head_count is 0 on every layer'
                             % (path, a))
    kv_raw = _gguf_int(summary, a + 'attention.head_count_kv', default=n_head)
    kv_heads = _per_layer(kv_raw, n_layer, a + 'attention.head_count_kv')
    for layer, (kv, head) in enumerate(zip(kv_heads, heads)):
        if kv > head or (kv and head % kv):
            raise ModelSpecError('model', '%s: layer %d has %d KV heads for %d attention heads '
                                 '(GGUF keys %sattention.head_count_kv / head_count); KV heads '
                                 'must divide the heads' % (path, layer, kv, head, a))
    key_length = _gguf_scalar(summary, a + 'attention.key_length', default=n_embd // head_max, low=1)
    value_length = _gguf_scalar(summary, a + 'attention.value_length', default=n_embd // head_max,
                                low=1)
    ffn = _gguf_int(summary, a + 'feed_forward_length', default=0, required=False) or 0
    ffn = max(ffn) if isinstance(ffn, list) else ffn
    window = _gguf_scalar(summary, a + 'attention.sliding_window', required=False)
    tensors = summary.tensors
    by_name = dict((t.name, t) for t in tensors)
    vocab = (_gguf_scalar(summary, a + 'vocab_size', required=False)
             or summary.array_lengths.get('tokenizer.ggml.tokens'))
    if not vocab and 'token_embd.weight' in by_name and len(by_name['token_embd.weight'].shape) > 1:
        vocab = by_name['token_embd.weight'].shape[1]
    if not vocab:
        raise ModelSpecError('model', '%s: vocabulary size not found (no %svocab_size, '
                             'tokenizer.ggml.tokens or token_embd.weight)' % (path, a))
    block_bytes = [0] * n_layer
    input_bytes = output_bytes = 0
    for tensor in tensors:
        match = BLOCK_TENSOR_RE.match(tensor.name)
        if match and int(match.group(1)) < n_layer:
            block_bytes[int(match.group(1))] += tensor.n_bytes
        elif tensor.name.startswith(('token_embd', 'position_embd', 'token_types')):
            input_bytes += tensor.n_bytes
        else:
            # output.weight, output_norm.*, and anything outside the repeating blocks
            # (rope_freqs, blocks past block_count such as next-token-prediction layers)
            output_bytes += tensor.n_bytes
    tied = 'output.weight' not in by_name
    file_type = summary.get('general.file_type')
    file_type_name = None
    if file_type is not None and (isinstance(file_type, bool) or not isinstance(file_type, int)
                                  or not 0 <= file_type < 1 << 16):
        raise ModelSpecError('model', '%s: GGUF key general.file_type must be a small integer' % path)
    if file_type is not None:
        try:
            file_type_name = gguf_reader.require_gguf().LlamaFileType(int(file_type)).name
        except ValueError:
            file_type_name = 'file_type_%d' % int(file_type)
    layout = GGUFLayout(
        file_type=file_type_name, block_bytes=block_bytes, input_bytes=input_bytes,
        output_bytes=output_bytes, output_tied=tied, key_length=key_length,
        value_length=value_length, kv_heads_per_layer=kv_heads, n_tensors=len(tensors),
        split_files=list(summary.files) if len(summary.files) > 1 else [])
    kinds = _gguf_layer_kinds(arch, n_layer, kv_heads, window, summary)
    kv_lora = _gguf_scalar(summary, a + 'attention.kv_lora_rank', required=False) or None
    rope_dim = _gguf_scalar(summary, a + 'rope.dimension_count', required=False) or None
    experts = _gguf_scalar(summary, a + 'expert_count', default=0, required=False) or 0
    name = summary.get('general.name')
    name = name if isinstance(name, str) and name.strip() else os.path.basename(path)
    return check_spec(ModelSpec(
        name=str(name), source='gguf', architecture=str(arch), num_layers=n_layer,
        hidden_size=n_embd, intermediate_size=ffn, num_attention_heads=head_max,
        num_kv_heads=max(kv_heads), head_dim=key_length, vocab_size=int(vocab),
        max_position_embeddings=_gguf_scalar(summary, a + 'context_length', default=4096, low=1),
        tie_word_embeddings=tied, dtype_bytes=2, layer_kinds=kinds,
        sliding_window=window if LAYER_SLIDING in kinds else None,
        kv_lora_rank=kv_lora, qk_rope_head_dim=rope_dim if kv_lora else None,
        num_experts=experts,
        num_experts_per_tok=_gguf_scalar(summary, a + 'expert_used_count', default=0,
                                         required=False) or 0,
        moe_intermediate_size=_gguf_scalar(summary, a + 'expert_feed_forward_length', default=0,
                                           required=False) or 0,
        num_shared_experts=_gguf_scalar(summary, a + 'expert_shared_count', default=0,
                                        required=False) or 0,
        param_count=sum(t.n_elements for t in tensors),
        weight_bytes=sum(t.n_bytes for t in tensors), weight_bytes_exact=True,
        weight_bytes_note='sum of GGUF tensor sizes (%d tensors, %d file(s))'
                          % (len(tensors), len(summary.files)),
        quantization='gguf', gguf=layout,
        extra={'file_type': file_type_name, 'gguf_path': summary.path},
    ))


# ---------------------------------------------------------------- resolve

def _catalog_key(name):
    wanted = name.strip().lower()
    for key in CATALOG:
        if key.lower() == wanted:
            return key
    for alias, key in ALIASES.items():
        if alias.lower() == wanted:
            return key
    return None


def resolve_model(model):
    """ModelSpec from a catalog name/alias, an HF config dict (optional ``weight_bytes``),
    a model directory or a ``.gguf`` path."""
    if isinstance(model, ModelSpec):
        return check_spec(model)
    if isinstance(model, dict):
        config = dict(model)
        weight_bytes = config.pop('weight_bytes', None)
        name = (config.pop('name', None) or config.get('_name_or_path')
                or _architecture(config, _text_config(config)[0]))
        return spec_from_hf_config(config, name, weight_bytes=weight_bytes,
                                   weight_note='given with the model' if weight_bytes else None)
    if not isinstance(model, str) or not model.strip():
        raise ModelSpecError('model', 'expected a catalog name, an HF config dict, a model '
                             'directory or a .gguf path; got %r' % (model,))
    # Catalog names first: an HF id like "org/model" must not turn into whatever directory of
    # that name the planning host's working directory holds (directories are given as ./x or /x).
    key = _catalog_key(model)
    if key is not None:
        return spec_from_catalog(key)
    model = os.path.expanduser(model)
    if model.lower().endswith(GGUF_SUFFIX):
        return spec_from_gguf(model)
    if os.path.isdir(model):
        return spec_from_model_dir(model)
    if os.path.isabs(model) or model.startswith('.'):
        raise ModelSpecError('model', 'path %s does not exist' % model)
    known = sorted(set(CATALOG) | set(ALIASES))
    close = difflib.get_close_matches(model.lower(), [k.lower() for k in known], n=3,
                                      cutoff=0.5)
    close = [k for k in known if k.lower() in close]
    raise ModelSpecError('model', "unknown model '%s'; known: %s%s" % (
        model, ', '.join(sorted(ALIASES)),
        ' (closest matches: %s)' % ', '.join(close) if close else ''))


def catalog_names():
    """Every catalog name (HF repo id) and alias."""
    return sorted(CATALOG) + sorted(ALIASES)


def catalog_specs():
    """ModelSpec of every catalog entry, by name (for listings and tests)."""
    return dict((name, spec_from_catalog(name)) for name in sorted(CATALOG))


__all__ = [
    'ArchDims', 'TensorGroup', 'QuantScheme', 'arch_dims', 'weight_tensor_groups',
    'param_count', 'quant_scheme', 'group_stored_bytes', 'stored_weight_bytes',
    'layer_kinds_from_config', 'spec_from_hf_config', 'spec_from_catalog',
    'spec_from_model_dir', 'spec_from_gguf', 'resolve_model', 'catalog_names',
    'catalog_specs', 'ROLE_EMBED', 'ROLE_LM_HEAD', 'ROLE_LINEAR', 'ROLE_EXPERT',
    'ROLE_ROUTER', 'ROLE_VECTOR',
]
