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

from ansible_collections.kvpin.fleet.plugins.module_utils.plan_types import PlanInputError

# Layer kinds, one per decoder layer, in ``ModelSpec.layer_kinds``.
LAYER_FULL = 'full'          # ordinary (GQA/MHA) attention over the whole context
LAYER_SLIDING = 'sliding'    # sliding-window attention (window = ModelSpec.sliding_window)
LAYER_MLA = 'mla'            # multi-head latent attention (DeepSeek V2/V3/R1)
LAYER_NO_KV = 'none'         # no KV cache (e.g. linear attention / state-space layers)


class ModelSpecError(PlanInputError):
    """Bad or unsupported model input. ``field`` names the option or key at fault."""


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
