# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One class per kind of decoder layer, each owning what its KV cache costs in both engines.

``ModelSpec.layer_kinds`` names one kind per layer (the LAYER_* strings); ``kind_of`` turns a
name into its class, which knows:

- vLLM: KV bytes one token costs on one rank, and the blocks one request holds (as vLLM's
  ``vllm/v1/kv_cache_interface.py`` does with FullAttentionSpec, SlidingWindowSpec,
  MLAAttentionSpec and MambaSpec: page size per token, ``max_memory_usage_bytes``);
- llama.cpp: K and V values per cell of the layer (llama-hparams ``n_embd_k_gqa`` /
  ``n_embd_v_gqa``) and whether it is one of the sliding-window (iSWA) cache's layers, or why
  llama.cpp cannot serve the kind at all (``llamacpp_refusal``);
- the first vLLM release whose V1 engine caches the kind (``vllm_since``, None: every release).

The planners ask the kind instead of comparing kind names, so a new kind lands here.
"""

from __future__ import annotations

from dataclasses import dataclass

from ansible_collections.kvpin.fleet.plugins.module_utils.plan.plan_types import PlanInputError
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.vllm_profile import CROSS_ATTENTION_SINCE, MLA_BLOCK_SIZE
from ansible_collections.kvpin.fleet.plugins.module_utils.units import ceil_div

LAYER_FULL = 'full'          # ordinary (GQA/MHA) attention over the whole context
LAYER_SLIDING = 'sliding'    # sliding-window attention (window = ModelSpec.sliding_window)
LAYER_MLA = 'mla'            # multi-head latent attention (DeepSeek V2/V3/R1)
LAYER_NO_KV = 'none'         # no KV cache (e.g. linear attention / state-space layers)
LAYER_CROSS = 'cross'        # decoder cross-attention over the encoder output (Whisper)


@dataclass(frozen=True)
class LayerKV:
    """llama.cpp KV values per cell of one layer (K and V rows) and whether it slides."""
    n_embd_k_gqa: int
    n_embd_v_gqa: int
    sliding: bool


def kv_heads_per_gpu(spec, tp):
    """KV heads one rank stores: replicated when fewer than TP (vLLM get_num_kv_heads)."""
    return max(1, spec.num_kv_heads // tp)


class FullAttention:
    """GQA/MHA attention over the whole context (vLLM FullAttentionSpec)."""
    name = LAYER_FULL
    label = 'full attention'
    caches_kv = True         # keeps K/V per token (a recurrent state is not a KV cache)
    kv_heads = True          # K and V projections per KV head: needs num_kv_heads >= 1
    slides = False
    vllm_block_size = None   # the engine's default block size
    vllm_block_size_reason = None
    v0_kind = LAYER_FULL     # what vLLM's V0 engine (no hybrid KV manager) caches: None, not modelled there
    vllm_since = None        # first vLLM release (tuple) whose V1 engine caches this kind; None: all
    llamacpp_refusal = None  # why llama.cpp / llama-box cannot serve this kind; None: it can
    vllm_pipeline_refusal = None  # why vLLM cannot split models with this kind into pipeline stages
    vllm_no_chunked_prefill = None  # why vLLM (V1) turns chunked prefill off for models with this kind

    def vllm_bytes_per_token(self, spec, tp, kv_dtype_bytes):
        return 2 * kv_heads_per_gpu(spec, tp) * spec.head_dim * kv_dtype_bytes

    def vllm_blocks_per_request(self, tokens, block_size, sliding_window, max_num_batched_tokens, max_encoder_len=0):
        """Blocks one request of ``tokens`` tokens holds in one group of these layers."""
        del sliding_window, max_num_batched_tokens, max_encoder_len
        return ceil_div(tokens, block_size)

    def vllm_group_rule(self, spec, group_size, block_size):
        """How one KV group of only these layers grows with a request, for the plan's rules."""
        del spec
        return 'one KV group of %d layers: a request of L tokens holds ceil(L / %d) blocks' % (
            group_size, block_size)

    def llamacpp_dims(self, spec, layout, index):
        """K and V values per cell of layer ``index``: the GGUF file's when there is one."""
        if layout is not None:
            heads = layout.kv_heads_per_layer[index]
            return LayerKV(layout.key_length * heads, layout.value_length * heads, self.slides)
        n = spec.head_dim * spec.num_kv_heads
        return LayerKV(n, n, self.slides)


class SlidingWindowAttention(FullAttention):
    """Attention over the last ``sliding_window`` tokens (vLLM SlidingWindowSpec)."""
    name = LAYER_SLIDING
    label = 'sliding-window attention'
    slides = True
    # V0 turns interleaved windows off and frees only whole blocks behind a uniform one: full is the bound
    v0_kind = LAYER_FULL

    def vllm_blocks_per_request(self, tokens, block_size, sliding_window, max_num_batched_tokens, max_encoder_len=0):
        del max_encoder_len
        # kv_cache_interface SlidingWindowSpec.max_memory_usage_bytes: one block more than the window needs
        held = min(sliding_window - 1 + max_num_batched_tokens, tokens)
        return ceil_div(held, block_size) + 1

    def vllm_group_rule(self, spec, group_size, block_size):
        del block_size
        return ('all %d layers use a %d-token sliding window: a request holds at most '
                'min(window - 1 + max_num_batched_tokens, len) tokens + 1 block'
                % (group_size, spec.sliding_window))


class LatentAttention(FullAttention):
    """Multi-head latent attention, DeepSeek V2/V3/R1 (vLLM MLAAttentionSpec)."""
    name = LAYER_MLA
    label = 'MLA attention'
    kv_heads = False
    vllm_block_size = MLA_BLOCK_SIZE
    vllm_block_size_reason = 'MLA attention backends force block size %d (FlashMLA)' % MLA_BLOCK_SIZE
    v0_kind = None

    def vllm_bytes_per_token(self, spec, tp, kv_dtype_bytes):
        # latent + rope key, no separate V, replicated on every TP rank
        return (spec.kv_lora_rank + spec.qk_rope_head_dim) * kv_dtype_bytes

    def llamacpp_dims(self, spec, layout, index):
        if layout is not None:
            return super().llamacpp_dims(spec, layout, index)
        # no file: assume an MLA-converted GGUF (llama.cpp#12801, Apr 2025): one latent
        # head, K = kv_lora_rank + rope dims, V = kv_lora_rank. A file keeps its own
        # key/value lengths: older DeepSeek GGUFs cache K 128 x 192 / V 128 x 128
        # (gpustack#1126: 640 MiB per layer at 8192 cells).
        rank = int(spec.kv_lora_rank or 0)
        return LayerKV(rank + int(spec.qk_rope_head_dim or 0), rank, False)


class LinearAttention(FullAttention):
    """Linear-attention / state-space (mamba) layers of hybrid models: a fixed-size recurrent
    state, no per-token KV (vLLM MambaSpec). The state is not modelled: charged 0 bytes."""
    name = LAYER_NO_KV
    label = 'linear attention / state-space layers'
    caches_kv = False
    kv_heads = False
    v0_kind = LAYER_NO_KV

    def vllm_bytes_per_token(self, spec, tp, kv_dtype_bytes):
        del spec, tp, kv_dtype_bytes
        return 0

    def llamacpp_dims(self, spec, layout, index):
        del spec, layout, index
        return LayerKV(0, 0, False)


class CrossAttention(FullAttention):
    """Decoder cross-attention over the encoder's output in encoder-decoder models (Whisper):
    vLLM ``CrossAttentionSpec`` (vllm/v1/kv_cache_interface.py, since 0.10.2).

    - Page: an ``AttentionSpec`` like full attention, K and V per KV head per rank per token.
    - Blocks: ``max_memory_usage_bytes`` = cdiv(max_encoder_len, block_size) pages, with
      max_encoder_len = ``scheduler_config.max_num_encoder_input_tokens``, which
      vllm/config/vllm.py sets for encoder-decoder models to
      ``MULTIMODAL_REGISTRY.get_encdec_max_encoder_len`` (Whisper: max_source_positions, 1500;
      vllm/model_executor/models/whisper.py). The scheduler allocates them once, when the request
      starts (vllm/v1/core/sched/scheduler.py ``num_encoder_tokens`` passed to ``allocate_slots``:
      Whisper input is always padded to the maximum), so they do not grow with the decoder tokens.
    - Groups: the V1 KV manager puts the cross layers in their own KV group next to the
      self-attention group (a different spec type: ``CrossAttentionManager``, no prefix caching),
      drawn from the one block pool.
    """
    name = LAYER_CROSS
    label = 'cross-attention (encoder-decoder)'
    v0_kind = None           # the V0 cross_block_table layout is not modelled (vllm_profile.CROSS_ATTENTION_SINCE)
    vllm_since = CROSS_ATTENTION_SINCE
    # llama.cpp has no Whisper architecture (src/llama-arch.cpp); its one encoder-decoder model,
    # T5, keeps the encoder output in host memory (llama_context ``cross.v_embd``) and recomputes
    # cross K/V from it every step: nothing of that sits in the KV cache this planner sizes.
    llamacpp_refusal = ('llama.cpp / llama-box has no encoder-decoder model with a cross-attention KV '
                        'cache (no Whisper architecture in src/llama-arch.cpp; T5 keeps the encoder '
                        'output outside the KV cache): serve it with vLLM')
    # vllm/model_executor/models/whisper.py: WhisperForConditionalGeneration(nn.Module,
    # SupportsTranscription, SupportsMultiModal), no SupportsPP: vLLM refuses --pipeline-parallel-size > 1
    # vllm/config/vllm.py (0.10.2+): "Encoder-decoder models do not support chunked prefill nor prefix
    # caching; disabling both." (disable_chunked_prefill_reasons)
    vllm_no_chunked_prefill = ('off: vLLM turns chunked prefill and prefix caching off for encoder-decoder '
                               'models (vllm/config/vllm.py: "Encoder-decoder models do not support chunked '
                               'prefill nor prefix caching"); a prompt is prefilled whole, within '
                               'max_num_batched_tokens')
    vllm_pipeline_refusal = ('vLLM\'s encoder-decoder model (WhisperForConditionalGeneration, '
                             'vllm/model_executor/models/whisper.py) does not support pipeline parallelism '
                             '(no SupportsPP): use tensor parallelism')

    def vllm_blocks_per_request(self, tokens, block_size, sliding_window, max_num_batched_tokens, max_encoder_len=0):
        del tokens, sliding_window, max_num_batched_tokens
        if max_encoder_len < 1:
            raise PlanInputError('model', 'cross-attention layers need max_encoder_len >= 1, got %r'
                                 % (max_encoder_len,))
        return ceil_div(max_encoder_len, block_size)

    def vllm_group_rule(self, spec, group_size, block_size):
        return ('one KV group of %d cross-attention layers: a request holds ceil(max_encoder_len %d / %d) '
                '= %d blocks from its start, whatever its decoder length' % (
                    group_size, spec.max_encoder_len, block_size, ceil_div(spec.max_encoder_len, block_size)))


ATTENTION_KINDS = {kind.name: kind for kind in (FullAttention(), SlidingWindowAttention(), LatentAttention(),
                                                LinearAttention(), CrossAttention())}
LAYER_KINDS = tuple(ATTENTION_KINDS)


def kind_of(name):
    """The class instance of layer kind ``name`` (one of LAYER_KINDS)."""
    try:
        return ATTENTION_KINDS[name]
    except (KeyError, TypeError):
        raise PlanInputError('model', 'unknown layer kind %r; one of %s' % (name, ', '.join(LAYER_KINDS))) from None


def vllm_forced_block_size(layer_kinds):
    """(block size, reason) an attention backend forces for these layers, or None."""
    for name in layer_kinds:
        kind = kind_of(name)
        if kind.vllm_block_size is not None:
            return kind.vllm_block_size, kind.vllm_block_size_reason
    return None
