# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The model description every planner consumes (``ModelSpec``).

A spec is built once from one of four sources (catalog name, HF ``config.json`` dict,
local model directory, GGUF file: see ``model_loaders.resolve_model``) and is then
read-only. All sizes are bytes (ints). Planners never look at the raw config again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

from ansible_collections.kvpin.fleet.plugins.module_utils.plan.plan_types import PlanInputError, type_name
# Layer kinds, one per decoder layer, in ``ModelSpec.layer_kinds``: defined (and costed) in
# attention_kinds, re-exported here for the loaders and planners that build specs.
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.attention_kinds import (  # pylint: disable=unused-import
    LAYER_CROSS, LAYER_FULL, LAYER_KINDS, LAYER_MLA, LAYER_NO_KV, LAYER_SLIDING, kind_of)


class ModelSpecError(PlanInputError):
    """Bad or unsupported model input. ``field`` names the option or key at fault."""


# Ranges of every geometry figure a ModelSpec carries: (lowest, highest). Beyond these a
# figure is a typo, a wrong file or an attack, not a model (the largest open models have
# 126 layers, hidden 16384/18432, 256k vocabularies, 1M-token contexts and a few hundred
# experts); they also bound the planners' work, which grows with the square of the layer
# count (llama.cpp layer placement tries every -ngl).
GEOMETRY_LIMITS = {
    'num_layers': (1, 256),
    'hidden_size': (1, 131072),
    'intermediate_size': (0, 1 << 20),
    'num_attention_heads': (1, 4096),
    'num_kv_heads': (0, 4096),
    'head_dim': (1, 4096),
    'vocab_size': (1, 16 * 1024 * 1024),
    'max_position_embeddings': (1, 1 << 27),
    'sliding_window': (1, 1 << 27),
    'kv_lora_rank': (1, 65536),
    'qk_rope_head_dim': (1, 4096),
    'num_experts': (0, 4096),
    'num_experts_per_tok': (0, 4096),
    'moe_intermediate_size': (0, 1 << 20),
    'num_shared_experts': (0, 4096),
    # encoder positions a cross-attention layer caches per request (Whisper: 1500 audio frames)
    'max_encoder_len': (1, 1 << 20),
}
OPTIONAL_GEOMETRY = ('sliding_window', 'kv_lora_rank', 'qk_rope_head_dim', 'max_encoder_len')
# Stored weights: the largest open checkpoints hold about 2 TB.
MAX_WEIGHT_BYTES = 1 << 44
DTYPE_BYTES_CHOICES = (1, 2, 4)


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _geometry_error(spec, key, message):
    return ModelSpecError('model', '%s: model geometry %s %s' % (spec.name, key, message))


def check_int_range(what, key, value, low, high):
    """``value`` is an int (not a bool, not a float) in [low, high]; else ModelSpecError
    naming ``what`` (the model) and ``key``. Returns the value."""
    if not _is_int(value):
        raise ModelSpecError('model', '%s: %s must be an integer, got %r (%s)'
                             % (what, key, value, type_name(value)))
    if not low <= value <= high:
        raise ModelSpecError('model', '%s: %s = %d is out of range (%d..%d)'
                             % (what, key, value, low, high))
    return value


def check_spec(spec):
    """Refuse a ModelSpec with a figure no real model has (ModelSpecError naming the key
    and the number): the one range check every loader's result passes. Returns ``spec``."""
    for key, (low, high) in GEOMETRY_LIMITS.items():
        value = getattr(spec, key)
        if value is None and key in OPTIONAL_GEOMETRY:
            continue
        check_int_range(spec.name, key, value, low, high)
    if spec.dtype_bytes not in DTYPE_BYTES_CHOICES or not _is_int(spec.dtype_bytes):
        raise _geometry_error(spec, 'dtype_bytes', 'must be one of %s, got %r'
                              % (DTYPE_BYTES_CHOICES, spec.dtype_bytes))
    if not isinstance(spec.layer_kinds, list) or len(spec.layer_kinds) != spec.num_layers:
        raise _geometry_error(spec, 'layer_kinds', 'must list one kind per layer (%d)' % spec.num_layers)
    unknown = sorted(set(k for k in spec.layer_kinds if k not in LAYER_KINDS))
    if unknown:
        raise _geometry_error(spec, 'layer_kinds', 'has unknown kinds %s' % unknown)
    attention = [k for k in spec.layer_kinds if kind_of(k).kv_heads]
    if attention and spec.num_kv_heads < 1:
        raise _geometry_error(spec, 'num_kv_heads', 'is 0 but %d layers have attention' % len(attention))
    if spec.num_kv_heads > spec.num_attention_heads:
        raise _geometry_error(spec, 'num_kv_heads', '%d is more than the %d attention heads'
                              % (spec.num_kv_heads, spec.num_attention_heads))
    if LAYER_SLIDING in spec.layer_kinds and spec.sliding_window is None:
        raise _geometry_error(spec, 'sliding_window', 'is missing but layers slide')
    if LAYER_MLA in spec.layer_kinds and (spec.kv_lora_rank is None or spec.qk_rope_head_dim is None):
        raise _geometry_error(spec, 'kv_lora_rank', 'and qk_rope_head_dim are needed by MLA layers')
    if LAYER_CROSS in spec.layer_kinds and spec.max_encoder_len is None:
        raise _geometry_error(spec, 'max_encoder_len', 'is missing but %d layers are cross-attention'
                              % spec.kv_layer_count(LAYER_CROSS))
    if spec.num_experts_per_tok > spec.num_experts:
        raise _geometry_error(spec, 'num_experts_per_tok', '%d is more than the %d experts'
                              % (spec.num_experts_per_tok, spec.num_experts))
    if spec.num_experts and spec.num_experts_per_tok < 1:
        raise _geometry_error(spec, 'num_experts_per_tok', 'must be >= 1 with %d experts' % spec.num_experts)
    check_int_range(spec.name, 'weight_bytes', spec.weight_bytes, 1, MAX_WEIGHT_BYTES)
    check_int_range(spec.name, 'param_count', spec.param_count, 0, MAX_WEIGHT_BYTES * 2)
    check_int_range(spec.name, 'replicated_bytes', spec.replicated_bytes, 0, MAX_WEIGHT_BYTES)
    if spec.gguf is not None:
        _check_gguf_layout(spec, spec.gguf)
    return spec


def _check_gguf_layout(spec, layout):
    if len(layout.block_bytes) != spec.num_layers or len(layout.kv_heads_per_layer) != spec.num_layers:
        raise _geometry_error(spec, 'GGUF layout', 'has %d blocks and %d KV head counts for %d layers'
                              % (len(layout.block_bytes), len(layout.kv_heads_per_layer), spec.num_layers))
    for position, size in enumerate(layout.block_bytes):
        check_int_range(spec.name, 'blk.%d bytes' % position, size, 0, MAX_WEIGHT_BYTES)
    for key in ('input_bytes', 'output_bytes'):
        check_int_range(spec.name, key, getattr(layout, key), 0, MAX_WEIGHT_BYTES)
    for key in ('key_length', 'value_length'):
        check_int_range(spec.name, key, getattr(layout, key), 1, GEOMETRY_LIMITS['head_dim'][1])
    for position, heads in enumerate(layout.kv_heads_per_layer):
        check_int_range(spec.name, 'head_count_kv[%d]' % position, heads, 0, spec.num_attention_heads)


@dataclass(frozen=True)
class GGUFLayout:
    """What a GGUF file stores, per llama.cpp buffer (bytes as stored, quantized)."""
    file_type: Optional[str]                 # e.g. 'MOSTLY_Q4_K_M'
    block_bytes: List[int]                   # bytes of blk.<i>.* for i in range(n_layer)
    input_bytes: int                         # token_embd.* (+ position embeddings)
    output_bytes: int                        # output.weight + output_norm.* (+ tensors past the blocks)
    output_tied: bool                        # no output.weight: llama.cpp duplicates token_embd
    key_length: int                          # {arch}.attention.key_length (per head)
    value_length: int                        # {arch}.attention.value_length (per head)
    kv_heads_per_layer: List[int]            # head_count_kv per layer (list even when uniform)
    n_tensors: int
    split_files: List[str] = field(default_factory=list)


@dataclass(frozen=True)
class ModelSpec:
    """Architecture dimensions and stored weight size of one model."""
    name: str
    source: str                      # 'catalog' | 'hf_config' | 'model_dir' | 'gguf'
    architecture: str                # HF architectures[0] or GGUF general.architecture
    num_layers: int                  # decoder layers (num_hidden_layers)
    hidden_size: int
    intermediate_size: int           # dense FFN width (0 when every layer is MoE)
    num_attention_heads: int
    num_kv_heads: int                # KV heads of full-attention layers
    head_dim: int
    vocab_size: int
    max_position_embeddings: int
    tie_word_embeddings: bool
    dtype_bytes: int                 # activation / unquantized weight dtype (2 for bf16/fp16)
    layer_kinds: List[str]           # len == num_layers; LAYER_* constants
    sliding_window: Optional[int] = None
    # MLA (DeepSeek): KV per token per layer = (kv_lora_rank + qk_rope_head_dim) * dtype
    kv_lora_rank: Optional[int] = None
    qk_rope_head_dim: Optional[int] = None
    # Encoder-decoder (cross-attention layers): encoder positions one request's cross-attention
    # caches, fixed per request (vLLM max_num_encoder_input_tokens; Whisper max_source_positions)
    max_encoder_len: Optional[int] = None
    # MoE
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    num_shared_experts: int = 0
    # Weights as stored (quantized where the checkpoint is): bytes for the whole model.
    param_count: int = 0
    weight_bytes: int = 0
    weight_bytes_exact: bool = False         # True when read from safetensors index / GGUF tensors
    weight_bytes_note: str = ''              # how weight_bytes was obtained (shown in plans)
    quantization: Optional[str] = None       # None | 'awq' | 'gptq' | 'fp8' | 'mxfp4' | 'gguf' ...
    # Bytes that vLLM keeps whole on every TP rank (not split by tensor parallelism).
    replicated_bytes: int = 0
    gguf: Optional[GGUFLayout] = None
    extra: Dict[str, object] = field(default_factory=dict)

    def kv_layer_count(self, kind):
        return sum(1 for k in self.layer_kinds if k == kind)
