# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""vLLM (V1 engine) memory model per GPU, and the derivation of the flags that pin it.

How vLLM sizes its KV cache (docs/architecture.md, "vLLM"), per GPU, in bytes:

    total   = CUDA-visible total: NVML memory_total - what the driver keeps (cuda_total.py);
              vLLM reads torch.cuda.mem_get_info()[1], never the NVML figure
    budget  = total * gpu_memory_utilization              (or --kv-cache-memory-bytes)
    kv      = budget - weights - activation_peak - non_torch_inside (- cuda_graph_pool from 0.20)
    outside = cuda_context (+ nccl from 0.11) (+ cuda_graph_pool up to 0.19)
              + profiler underestimate buffer + safety margin   must fit in total * (1 - util)

The outside check is what the field report ran into: at util 0.92 on 4 x RTX A6000 (TP=4,
vLLM <= 0.19) the graph pool, the CUDA context and the allocator's slack do not fit in 8 %
of the card. Every estimated term below says what it was fitted on. Public entry point:
``plan_vllm(spec, gpus, traffic, knobs, backend_version) -> Plan``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Dict, List, Optional

from ansible_collections.kvpin.fleet.plugins.module_utils.plan.attention_kinds import (
    LAYER_CROSS, LAYER_MLA, LAYER_NO_KV, LAYER_SLIDING, kind_of, vllm_forced_block_size)
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.plan_types import (
    GpuMemory, KvPool, Plan, PlanInputError)
from ansible_collections.kvpin.fleet.plugins.module_utils.units import GiB, MiB, ceil_div, fmt_bytes
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.fitted import BYTES, Fitted, source_rows_of
from ansible_collections.kvpin.fleet.plugins.module_utils.plan import cuda_total as ct
from ansible_collections.kvpin.fleet.plugins.module_utils.plan import vllm_profile as prof
from ansible_collections.kvpin.fleet.plugins.module_utils.plan import term_kinds as tk

# ----------------------------------------------------------------------------------------
# Fitted and policy constants. "llm-d H100" = the H100 80GB rows of
# benchmarks/data/vllm_public.json (llm-d-benchmark empirical-vllm-memory-results.md).
# Each fitted constant names the rows it was read from (their "id"s) in a *_SOURCE_ROWS
# tuple next to it, gathered in FITTED_SOURCE_ROWS below: those rows are the "fit" split of
# the accuracy benchmark, every other row is "held_out" (docs/data-sources.md).
_LLMD_GPT_OSS_20B = 'llmd-h100-gpt-oss-20b-tp1'
_LLMD_GPT_OSS_120B = 'llmd-h100-gpt-oss-120b-tp1'
_LLMD_LLAMA70B_FP8_TP2 = 'llmd-h100-llama-3.3-70b-fp8-tp2'
_LLMD_LLAMA70B_FP8_TP1 = 'llmd-h100-llama-3.3-70b-fp8-tp1'
_LLMD_LLAMA8B = 'llmd-h100-llama-3.1-8b-tp1'
_LLMD_QWEN3_06B = 'llmd-h100-qwen3-0.6b-tp1'
_LLMD_QWEN3_32B_TP1 = 'llmd-h100-qwen3-32b-tp1'
_LLMD_QWEN3_32B_TP2 = 'llmd-h100-qwen3-32b-tp2'

# CUDA context + driver reservations of the vLLM process, held before the memory snapshot:
# llm-d H100 TP=1 logs 78.57 of 79.18 GiB free at startup -> 0.61 GiB. Smaller (Ampere/Ada)
# cards hold a little less; the H100 figure is kept as the upper value.
CUDA_CONTEXT_BYTES = int(0.61 * GiB)
CUDA_CONTEXT_SOURCE_ROWS = (_LLMD_GPT_OSS_20B, _LLMD_LLAMA8B)     # the two "78.57/79.18" lines
# Non-torch growth measured by the profiler at TP=1 (cuBLAS/cuBLASLt workspaces, attention
# backend buffers): 0.13-0.14 GiB in every llm-d H100 TP=1 row; the constant is the 0.13 GiB
# of the rows below (the 0.14 GiB rows, the held-out Mistral-Small-3.2 among them, did not
# give it: it is under their figure).
NON_TORCH_GROWTH_BYTES = int(0.13 * GiB)
NON_TORCH_GROWTH_SOURCE_ROWS = (_LLMD_GPT_OSS_20B, _LLMD_GPT_OSS_120B, _LLMD_LLAMA8B, _LLMD_QWEN3_06B)
# Extra non-torch growth at TP>1 charged inside the budget in every version (custom
# all-reduce / pynccl workspaces): llm-d H100 TP=2 logs 0.54-0.55 GiB vs 0.13 at TP=1.
TP_WORKSPACE_BYTES = int(0.42 * GiB)
TP_WORKSPACE_SOURCE_ROWS = (_LLMD_LLAMA70B_FP8_TP2, _LLMD_QWEN3_32B_TP2)
# NCCL channel buffers (Simple + LL128 + LL protocol buffers, proxy state) per channel per
# ring connection: llm-d H100 TP=2 (0.11-era baseline) holds 77.64 vs 78.57 GiB free at TP=1
# -> 0.93 GiB for one peer on NVLink, where NCCL runs 32 channels. PCIe cards get few
# channels (NCCL picks 2-4 on PCIe). A ring rank connects to min(tp - 1, 2) neighbours.
NCCL_BYTES_PER_CHANNEL_CONNECTION = int(0.93 * GiB) // 32
NCCL_SOURCE_ROWS = (_LLMD_LLAMA70B_FP8_TP2, _LLMD_GPT_OSS_20B, _LLMD_LLAMA8B)   # 77.64 vs 78.57 free
NCCL_CHANNELS_NVLINK = 32
NCCL_CHANNELS_PCIE = 4
NVLINK_CLASS_NAME_HINTS = ('sxm', 'hbm', 'h100', 'h200', 'h800', 'h20', 'b200', 'b300', 'gb200', 'gb300')
# Sampler warm-up of the profile run, from the shapes vLLM allocates (per logit element of the
# [R, vocab] logits, R = min(max_num_seqs, max_num_batched_tokens): _dummy_run schedules that many
# requests and hands hidden_states[logit_indices] to _dummy_sampler_run,
# vllm/v1/worker/gpu_model_runner.py in 0.9.1, 0.11.0, 0.27.0 and 0.28.0; the path per version
# in vllm_profile.sampler_path, read in 0.9.1 - 0.28.0):
#   lm_head output in the model dtype (LogitsProcessor.compute_logits)         dtype B
#   logits.to(torch.float32) (Sampler.forward, vllm/v1/sample/sampler.py)          4 B
# then, by top-k/top-p path (vllm_profile.sampler_path):
#   'sort' (apply_top_k_top_p, v1/sample/ops/topk_topp_sampler.py): logits.sort(dim=-1) returns
#     fp32 values 4 B + int64 indices 8 B; the CUDA pair sort underneath reads an int64 iota 8 B
#     and keeps cub radix-sort alternate key/value buffers 4 + 8 B                 32 B
#   'no_sort' (0.17+: FlashInfer top_k_mask_logits + softmax, or the Triton kernel in place +
#     softmax probs + exponential noise q, whichever the warm-up runs): 2 x 4 B     8 B
#     plus one cached [min(SMs, R), vocab] fp32 buffer of the Triton kernel
# With bf16 the sort path sums to 38 B per logit; the least-squares fit of the 7 llm-d H100 rows
# (vocab 128256-201088, max_num_seqs 1024, max_num_batched_tokens 8192) gave 38.19 B: the shapes
# explain all but 0.19 B, kept as a FITTED residual on the sort path (which 7 rows: every llm-d row
# but Mistral-Small-3.2, 2.12 GiB, which took FlashInfer, and the failed Llama-3.3-70B-FP8 TP=1
# run, whose summary row gives N/A).
SAMPLER_FP32_LOGITS_BYTES = 4
SAMPLER_SORT_BYTES = 4 + 8 + 8 + 4 + 8
SAMPLER_NO_SORT_BYTES = 4 + 4
# 'flashinfer' (knob vllm_sampler, vllm_profile.sampler_path): top_k_top_p_sampling_from_logits keeps
# the fp32 top_k_mask_logits output and its softmax probs, 4 + 4 B, and sorts nothing (flashinfer
# sampling.py; vLLM v1/sample/ops/topk_topp_sampler.py flashinfer_sample). Shapes, not fitted.
SAMPLER_FLASHINFER_BYTES = 4 + 4
SAMPLER_TRITON_BUFFER_ROWS = 192          # >= the SM count of every supported card (H100 SXM: 132)
SAMPLER_SORT_RESIDUAL_X100 = 19           # fitted, B per logit x 100 (38.19 - 38.00)
ACTIVATION_SOURCE_ROWS = (_LLMD_GPT_OSS_20B, _LLMD_GPT_OSS_120B, _LLMD_LLAMA70B_FP8_TP2, _LLMD_LLAMA8B,
                          _LLMD_QWEN3_06B, _LLMD_QWEN3_32B_TP1, _LLMD_QWEN3_32B_TP2)
# Hidden states alive while the sampler runs (profile_run keeps _dummy_run's output): the
# [max_num_batched_tokens, hidden] hidden states, the [R, hidden] gathered last positions and
# their torch.rand_like replacement (_dummy_sampler_run). Shapes, not fitted.
HIDDEN_STATE_ROW_COPIES = 2
# Policy guard, NOT physics: from 0.17 the shapes give the no-sort warm-up above, but the logs of
# that era show memory this model does not explain yet -- gpt-oss-20b on an A100 with 0.19.0
# (row myoceane-a100-80gb-gpt-oss-20b-tp1-u065) is planned 0.25 GiB above its logged KV with the
# no-sort bytes alone; Llama-3.1-8B on an RTX PRO 6000 with 0.28.0 (row
# llmservingsim-rtxpro6000-llama-3.1-8b-tp1-131k) holds ~1.4 GiB more outside KV than the plan
# charges at TP 1 (0.2 GiB over even with this guard); and 7B models on 24 GB A10G/L4 cards with
# 0.27/0.28 log ~50 % less KV than the plan (issue 12). The likeliest home is the CUDA-graph
# estimate charged since 0.20 (logs print 12-23 MiB per captured graph, PIECEWISE + FULL), not the
# sampler. Until that is modelled the plan keeps charging what the sort path would hold: the
# difference is the named term activation_unexplained_reserve (0 before
# vllm_profile.NO_SORT_ERA_RESERVE_SINCE, 0.18: the 0.17.1 logs need none).
NO_SORT_ERA_RESERVE = True
# Forward pass of the profile run (what dominates when max_num_seqs is small or chunked
# prefill is off): residual + hidden + two norm outputs, and the FFN gate/up (2 x ffn) +
# activation output (1 x ffn), sharded by TP. Physical, not fitted.
FORWARD_HIDDEN_COPIES = 4
FORWARD_FFN_COPIES = 3
# CUDA-graph pool. (1) graph nodes and per-size bookkeeping, proportional to layers x captured
# sizes: 0.60 GiB for Llama-3.3-70B-FP8 (80 layers, 67 sizes, H100 TP=1, llm-d) -> 7.7 MiB per
# layer, rounded up to 8 MiB (smaller single-GPU rows log 0.09-0.52 GiB, below this line);
# (2) the largest graph's intermediates (physical); (3) at TP>1 without vLLM's custom
# all-reduce (PCIe cards), NCCL collectives captured in graphs: ~2.4 GiB per RTX 4090 at TP=4
# in V0 (vllm#7553) minus (1) -> 1 GiB per ring connection; with NVLink (custom all-reduce)
# the llm-d H100 TP=2 rows log no graph growth. V0 itself warned "CUDA graphs can take
# additional 1~3 GiB memory per GPU"; Llama-3.1-8B-INT8 logged 2.02 GiB on early V1 (vllm#14286).
GRAPH_BYTES_PER_LAYER = 8 * MiB
GRAPH_SOURCE_ROWS = (_LLMD_LLAMA70B_FP8_TP1,)
GRAPH_REFERENCE_CAPTURE_COUNT = 67
GRAPH_COLLECTIVE_BYTES_PER_CONNECTION = 1 * GiB
# vLLM's own "profiling may slightly underestimate" buffer (mem_utils, 0.10.2+ suggestion line).
PROFILER_UNDERESTIMATE_BYTES = 150 * MiB
# Policy: VRAM kept free on every card beyond everything modelled, for caching-allocator
# fragmentation under mixed prefill/decode (vllm#2248, PR #37428), prefill peaks above the
# profiled one (long prompts, MoE imbalance: "exceeds profiled peak by ~3 GiB" on a 96 GB
# RTX PRO 6000, rtx6kpro#103, i.e. ~3 %) and unprofiled logprobs (vllm#5907). 3 % of the
# card, at least 512 MiB. Scales with the card because the peaks scale with the batch the
# card can hold.
SAFETY_MARGIN_FRACTION_X1000 = 30
SAFETY_MARGIN_MIN_BYTES = 512 * MiB
# Cold torch.compile: where the KV pool is not pinned in bytes, vLLM sizes it from the profile
# run, and a cold compile (first boot of a shape, or a recycled instance whose compile cache
# did not survive) is charged as activation peak: vllm#54383 measured 245 fewer blocks,
# 0.47 GiB per GPU, 4.5 % of the KV pool, on 2 x RTX 4090 TP=2 (vLLM 0.28.0, util 0.85;
# boot-to-boot noise ~17 blocks). Charged inside the budget of every unpinned plan as 5 % of
# the KV budget the warm profile leaves, so the plan describes the cold start, the smaller one.
COLD_COMPILE_KV_FRACTION_X1000 = 50

# Model Runner V2 (vllm_profile.model_runner: 0.25+ dense models, 0.29+ every model), terms read in
# the 0.25.1 - 0.34.0 wheels (docs/vllm-versions.md, "Model Runner V2"):
# (1) persistent runner buffers the 0.27+ formula counts (total_consumed): the penalties state,
#     output_bin_counts [max_num_seqs, vocab] int32 and prompt_bin_mask [max_num_seqs,
#     ceil(vocab / 32)] int32 (0.27.1 vllm/v1/worker/gpu/sample/penalties.py:32-42). Shapes.
V2_BIN_COUNT_BYTES = 4
V2_PROMPT_MASK_BITS_PER_WORD = 32
V2_PROMPT_MASK_WORD_BYTES = 4
# (2) the cold torch.compile inside the profile run (0.27.1 vllm/compilation/decorators.py:651-671:
#     AOT compile, then the measured forward, one profiling window, no peak reset): vLLM turns on
#     Inductor's combo kernels with compile-time benchmarking (0.27.1 vllm/config/compilation.py
#     :976-986, from 0.19), and Inductor benchmarks on random copies of every kernel argument at
#     per-rank shapes (torch 2.13.0 torch/_inductor/codegen/triton.py:6007-6038), weights included.
#     Which kernels are benchmarked was not established; the charge is per-rank-shape scaled: copies
#     of the per-rank embedding table E = vocab x hidden x dtype / TP. The transient peak is
#     max(warm peak, COLD_COMPILE_TRANSIENT_COPIES x E); from 0.27 (total_consumed) to 0.30 the
#     freed block can stay pinned by a later small allocation and is counted as consumed:
#     + COLD_COMPILE_PINNED_COPIES x E; 0.31+ limits allocator splitting in the profile window, so
#     nothing stays pinned. Fitted on issue 37's startups of a 7B bf16 model (Qwen2.5-7B: vocab
#     152064, hidden 3584) on A10G / L4 with vLLM 0.27 / 0.28 at TP 1 / 2 / 4, whose non-KV memory
#     beyond the weights was ~2.2 / 1.2 / 0.6 GiB (2E + shapes = 2.24 / 1.23 / 0.72), and consistent
#     with vllm#54383 (0.28.0, 2 x RTX 4090 TP 2, expandable segments: 0.47 GiB per GPU, the model
#     without the pinned copy: 0.55). Not data rows (those logs are not public): source rows ().
COLD_COMPILE_TRANSIENT_COPIES = 1
COLD_COMPILE_PINNED_COPIES = 1
# (3) what load_model allocates beyond the checkpoint's bytes ("Model loading took" is torch's
#     allocated delta around load_model: 0.27.1 gpu/model_runner.py:306-331, vllm/platforms/cuda.py
#     :351-356): issue 37's A10G / L4 logs show 0.10 GiB at TP 1 and 0.07 - 0.08 GiB at TP 2 / 4 for
#     Qwen2.5-7B, not identified (no per-rank scaling: the smallest, 0.07 GiB, is charged). The V1
#     terms were fitted with the checkpoint bytes as the weights, so only V2 plans charge it.
V2_LOAD_RESIDUAL_BYTES = int(0.07 * GiB)
# (4) NCCL collectives captured in graphs (GRAPH_COLLECTIVE_BYTES_PER_CONNECTION, V0-era vllm#7553)
#     are not charged to V2's graph pool: issue 37's A10G / L4 runs at TP 2 and TP 4 started at util
#     0.90 with V2 capturing its graphs after the KV cache, in 2.2 GiB of slack that could not have
#     held 1 - 2 GiB of collectives beside the CUDA context, NCCL buffers and allocator slack.
V2_GRAPH_COLLECTIVES = ('graphs captured at TP 2 / 4 on A10G / L4 with vLLM 0.27 / 0.28 fit in the '
                        '10 %% slack of util 0.90 (issue 37), which 1 GiB per ring connection would not')

# Each fitted constant above as one Fitted (plugins/module_utils/plan/fitted.py): its value, what
# it was fitted on and its source rows; the explanations print describe(), never the number.
CUDA_CONTEXT = Fitted(
    'vllm_memory.CUDA_CONTEXT_BYTES', CUDA_CONTEXT_BYTES, BYTES,
    'the H100 80GB startup lines of llm-d (78.57 of 79.18 GiB free)', CUDA_CONTEXT_SOURCE_ROWS)
NON_TORCH_GROWTH = Fitted(
    'vllm_memory.NON_TORCH_GROWTH_BYTES', NON_TORCH_GROWTH_BYTES, BYTES,
    'the non-torch growth the profiler logs at TP1, llm-d H100', NON_TORCH_GROWTH_SOURCE_ROWS)
TP_WORKSPACE = Fitted(
    'vllm_memory.TP_WORKSPACE_BYTES', TP_WORKSPACE_BYTES, BYTES,
    'the non-torch growth at TP2 above TP1, llm-d H100 (0.55 - 0.13 GiB)', TP_WORKSPACE_SOURCE_ROWS)
NCCL_PER_CHANNEL_CONNECTION = Fitted(
    'vllm_memory.NCCL_BYTES_PER_CHANNEL_CONNECTION', NCCL_BYTES_PER_CHANNEL_CONNECTION,
    BYTES + ' per channel per ring connection',
    'llm-d H100 free at startup, TP2 vs TP1 (0.93 GiB for one NVLink peer over %d channels)'
    % NCCL_CHANNELS_NVLINK, NCCL_SOURCE_ROWS)
SAMPLER_SORT_RESIDUAL = Fitted(
    'vllm_memory.SAMPLER_SORT_RESIDUAL_X100', SAMPLER_SORT_RESIDUAL_X100, '{} B per logit',
    'the sort-path sampler warm-up of the %d llm-d H100 rows (least squares 38.19 B per logit, '
    'the shapes 38.00)' % len(ACTIVATION_SOURCE_ROWS), ACTIVATION_SOURCE_ROWS, scale=100)
GRAPH_PER_LAYER = Fitted(
    'vllm_memory.GRAPH_BYTES_PER_LAYER', GRAPH_BYTES_PER_LAYER, BYTES + ' per layer',
    'the graph pool of Llama-3.3-70B-FP8, H100 TP1, llm-d (0.60 GiB, 80 layers, %d captured sizes)'
    % GRAPH_REFERENCE_CAPTURE_COUNT, GRAPH_SOURCE_ROWS)
GRAPH_COLLECTIVES = Fitted(
    'vllm_memory.GRAPH_COLLECTIVE_BYTES_PER_CONNECTION', GRAPH_COLLECTIVE_BYTES_PER_CONNECTION,
    BYTES + ' per ring connection',
    'vllm#7553 (~2.4 GiB of graphs per RTX 4090 at TP4 in V0, less the graph nodes; not a data row)')
COLD_COMPILE_MARGIN = Fitted(
    'vllm_memory.COLD_COMPILE_KV_FRACTION_X1000', COLD_COMPILE_KV_FRACTION_X1000,
    '{} % of the warm KV budget',
    'vllm#54383 (245 fewer blocks, 4.5 % of the KV pool, after a cold compile on 2 x RTX 4090 TP2, '
    'vLLM 0.28.0; not a data row)', scale=10)

COLD_COMPILE_TRANSIENT = Fitted(
    'vllm_memory.COLD_COMPILE_TRANSIENT_COPIES', COLD_COMPILE_TRANSIENT_COPIES,
    '{} copy of the per-rank embedding table as the cold-compile transient peak (Model Runner V2)',
    'issue 37\'s A10G / L4 startups of a 7B bf16 model with vLLM 0.27 / 0.28 at TP 1 / 2 / 4 and '
    'vllm#54383 (0.28.0, 2 x RTX 4090, 0.47 GiB per GPU cold vs warm); not data rows')
COLD_COMPILE_PINNED = Fitted(
    'vllm_memory.COLD_COMPILE_PINNED_COPIES', COLD_COMPILE_PINNED_COPIES,
    '{} copy of the per-rank embedding table left pinned after the cold compile (vLLM 0.27 - 0.30)',
    'issue 37\'s A10G / L4 startups of a 7B bf16 model with vLLM 0.27 / 0.28 at TP 1 / 2 / 4 '
    '(non-KV beyond the weights ~2.2 / 1.2 / 0.6 GiB); not data rows')

V2_LOAD_RESIDUAL = Fitted(
    'vllm_memory.V2_LOAD_RESIDUAL_BYTES', V2_LOAD_RESIDUAL_BYTES, BYTES,
    'issue 37\'s A10G / L4 logs of Qwen2.5-7B with vLLM 0.27 / 0.28 ("Model loading took" minus the '
    'checkpoint bytes: 0.10 GiB at TP 1, 0.07 - 0.08 at TP 2 / 4; not identified); not data rows')

# Fitted constant -> the benchmarks/data/vllm_public.json rows it was read from (the one place
# for it: bench_accuracy_vllm.py scores these rows as "fit", tests/unit/test_validation_split.py
# checks the data file's "split" and "fit_for" against it).
FITTED_SOURCE_ROWS = source_rows_of(
    CUDA_CONTEXT, NON_TORCH_GROWTH, TP_WORKSPACE, NCCL_PER_CHANNEL_CONNECTION, SAMPLER_SORT_RESIDUAL,
    GRAPH_PER_LAYER, GRAPH_COLLECTIVES, COLD_COMPILE_MARGIN, COLD_COMPILE_TRANSIENT, COLD_COMPILE_PINNED)

TP_CANDIDATES = (1, 2, 4, 8)
MAX_MODEL_LEN_LIMIT = 16 * 1024 * 1024
MAX_NUM_SEQS_LIMIT = 100000
MAX_NUM_BATCHED_TOKENS_LIMIT = 4 * 1024 * 1024
KNOWN_KNOBS = ('tensor_parallel_size', 'gpu_memory_utilization', 'max_model_len', 'max_num_seqs',
               'max_num_batched_tokens', 'kv_cache_dtype', 'block_size', 'enforce_eager',
               'pin_kv_cache_memory', 'kv_cache_memory_bytes', 'cudagraph_memory_estimate',
               'vllm_sampler', 'allow_fp8_kv', 'vllm_image')
FALLBACK_HINT = ('for GPUs of different sizes use backend llama-box (GPUStack 0.7) or llama.cpp '
                 '(GPUStack 2.x) with layer offload (gpu_layers / tensor_split)'
                 ', or vLLM pipeline parallelism, one stage per GPU kind (pipeline_parallel_size)')


def safety_margin_bytes(total):
    return max(total * SAFETY_MARGIN_FRACTION_X1000 // 1000, SAFETY_MARGIN_MIN_BYTES)


def cold_compile_margin_bytes(kv_budget):
    """KV bytes a cold torch.compile costs an unpinned pool (COLD_COMPILE_KV_FRACTION_X1000)."""
    return ceil_div(max(0, kv_budget) * COLD_COMPILE_KV_FRACTION_X1000, 1000)


def embedding_bytes_per_rank(spec, tp):
    """E: the per-rank embedding table (vocab x hidden x model dtype / TP), the unit of the V2
    cold-compile terms (COLD_COMPILE_TRANSIENT_COPIES)."""
    return spec.vocab_size * spec.hidden_size * spec.dtype_bytes // max(1, tp)


def v2_runner_buffer_bytes(spec, max_num_seqs):
    """Model Runner V2's penalties state (output_bin_counts + prompt_bin_mask), persistent."""
    return max_num_seqs * (spec.vocab_size * V2_BIN_COUNT_BYTES + ceil_div(
        spec.vocab_size, V2_PROMPT_MASK_BITS_PER_WORD) * V2_PROMPT_MASK_WORD_BYTES)


def v2_cold_compile(spec, tp, version, warm_peak):
    """(transient extra, pinned) bytes a cold torch.compile adds to Model Runner V2's non-KV
    memory on one rank, over the warm profile whose peak above the live memory is ``warm_peak``."""
    copies = embedding_bytes_per_rank(spec, tp)
    transient = max(0, COLD_COMPILE_TRANSIENT_COPIES * copies - warm_peak)
    pinned = 0
    if prof.counts_total_consumed(version) and not prof.profile_split_limit(version):
        pinned = COLD_COMPILE_PINNED_COPIES * copies
    return transient, pinned


def next_power_of_two(n):
    p = 1
    while p < n:
        p *= 2
    return p


def floor_util(numerator, total):
    """floor(numerator / total) to 0.01, as a float with two decimals."""
    return max(0, numerator * 100 // total) / 100.0


def util_bytes(total, util):
    """total * util as vLLM requests it (math.ceil)."""
    return ceil_div(total * int(round(util * 10000)), 10000)


# ---------------------------------------------------------------- KV cache
# Bytes and blocks per layer kind: attention_kinds.
def kv_bytes_per_token(spec, tp, kv_dtype_bytes):
    """Per-GPU KV bytes for one token over all layers (Llama-3.3-70B bf16 TP1: 327,680)."""
    return sum(kind_of(kind).vllm_bytes_per_token(spec, tp, kv_dtype_bytes) for kind in spec.layer_kinds)


@dataclass
class KvLayout:
    """How the block pool is laid out for one model on one rank."""
    block_size: int
    bytes_per_token: int            # all KV layers, one token
    bytes_per_block: int            # one block id across the pool's group tensors
    groups: Dict[str, int]          # layer kind -> number of groups of group_size layers
    group_size: int
    sliding_window: int
    max_num_batched_tokens: int
    rule: str
    max_encoder_len: int = 0        # cross-attention groups: encoder positions each request holds

    @property
    def hybrid(self):
        return len(self.groups) > 1 or any(kind_of(k).slides for k in self.groups)

    def blocks_per_request(self, tokens):
        """Blocks one request of ``tokens`` tokens holds (kv_cache_interface max_memory_usage)."""
        return sum(count * kind_of(kind).vllm_blocks_per_request(
            tokens, self.block_size, self.sliding_window, self.max_num_batched_tokens, self.max_encoder_len)
            for kind, count in self.groups.items())


def kv_layout(spec, tp, kv_dtype_bytes, block_size, max_num_batched_tokens):
    counts = {}
    for kind in spec.layer_kinds:
        if kind_of(kind).caches_kv:
            counts[kind] = counts.get(kind, 0) + 1
    per_token = kv_bytes_per_token(spec, tp, kv_dtype_bytes)
    if not counts:
        raise PlanInputError('model', '%s has no attention layer with a KV cache; vLLM state-space '
                             'only models are not modelled' % spec.name)
    if len(counts) == 1:
        kind = next(iter(counts))
        group_size = counts[kind]
        groups = {kind: 1}
        bytes_per_block = block_size * per_token
        rule = kind_of(kind).vllm_group_rule(spec, group_size, block_size)
    else:
        # Hybrid KV cache manager: groups of equal layer count share one block pool; a block id
        # is one page in every group tensor, so bytes_per_block sums the largest group's layers.
        group_size = min(counts.values())
        groups = {kind: ceil_div(n, group_size) for kind, n in counts.items()}
        page_per_layer = max(kind_of(kind).vllm_bytes_per_token(spec, tp, kv_dtype_bytes) for kind in counts)
        bytes_per_block = block_size * group_size * page_per_layer
        rule = ('hybrid KV manager: %s, groups of %d layers share one block pool (%s per block); '
                'full groups hold ceil(L / bs) blocks per request, sliding groups '
                'ceil(min(window - 1 + max_num_batched_tokens, L) / bs) + 1' % (
                    ', '.join('%d %s layers' % (n, k) for k, n in sorted(counts.items())),
                    group_size, fmt_bytes(bytes_per_block)))
        if LAYER_CROSS in counts:
            # CrossAttentionSpec.max_memory_usage_bytes: fixed by the encoder length, not L
            rule += '; cross-attention groups ceil(max_encoder_len %d / bs) = %d blocks from the request\'s start' % (
                spec.max_encoder_len, ceil_div(spec.max_encoder_len, block_size))
    return KvLayout(block_size=block_size, bytes_per_token=per_token, bytes_per_block=bytes_per_block,
                    groups=groups, group_size=group_size, sliding_window=spec.sliding_window or 0,
                    max_num_batched_tokens=max_num_batched_tokens, rule=rule,
                    max_encoder_len=spec.max_encoder_len or 0)


# ---------------------------------------------------------------- weights
def _attention_layers(spec):
    return sum(1 for k in spec.layer_kinds if kind_of(k).kv_heads)


# Compute capability by card name, for GPUs whose facts carry no compute_capability: the
# MXFP4 kernel choice (vllm_profile.mxfp4_moe_kernel) turns on major < 10. An unknown card is
# None, which that choice plans as Marlin (the larger layout).
CAPABILITY_NAME_HINTS = (
    (('h100', 'h200', 'h800', 'h20', 'gh200'), (9, 0)),
    (('b200', 'b300', 'gb200', 'gb300', 'b100'), (10, 0)),
    (('rtx pro 6000', 'rtx 5090', 'rtx 5080', 'blackwell'), (12, 0)),
    (('l40', 'l4', 'rtx 4090', 'rtx 4080', 'ada', 'rtx 6000 ada'), (8, 9)),
    (('a100', 'a800', 'a30'), (8, 0)),
    (('a10', 'a40', 'a16', 'a2', 'a6000', 'a5000', 'a4500', 'a4000', 'rtx 3090', 'rtx 3080'), (8, 6)),
)


def gpu_compute_capability(gpu):
    """(major, minor) of a GPU: its compute_capability fact ("8.6"), else a card-name hint,
    else None (unknown)."""
    if not gpu:
        return None
    value = gpu.get('compute_capability')
    if value is not None:
        parts = str(value).strip().split('.')
        if len(parts) in (1, 2) and all(p.isdigit() and len(p) <= 2 for p in parts):
            return (int(parts[0]), int(parts[1]) if len(parts) > 1 else 0)
    name = (gpu.get('name') or '').lower()
    for hints, capability in CAPABILITY_NAME_HINTS:
        if any(hint in name for hint in hints):
            return capability
    return None


def weights_per_gpu(spec, tp, gpu=None, version=None):
    """(bytes, terms, explain) of the weights one TP rank loads. ``gpu`` and ``version`` pick
    the MXFP4 MoE kernel layout (vllm_profile.mxfp4_moe_kernel); without a gpu the fitted
    256-wide layout (the llm-d H100 rows) is used."""
    sharded = spec.weight_bytes // tp
    replicated = spec.replicated_bytes - spec.replicated_bytes // tp
    kv_replication = 0
    if spec.num_kv_heads < tp and spec.num_kv_heads > 0:
        # each rank holds one whole KV head of k_proj and v_proj instead of kv_heads / tp
        proj = 2 * spec.hidden_size * spec.head_dim * _attention_layers(spec)
        if spec.param_count:
            kv_replication = proj * spec.weight_bytes * (tp - spec.num_kv_heads) // (spec.param_count * tp)
        else:
            kv_replication = proj * spec.dtype_bytes * (tp - spec.num_kv_heads) // tp
    expert_padding = 0
    kernel = None
    if spec.quantization == 'mxfp4':
        expert_bytes = spec.extra.get('weight_bytes_by_role', {}).get('expert', 0)
        kernel = 'native' if gpu is None else prof.mxfp4_moe_kernel(version, gpu_compute_capability(gpu))
        if kernel == 'marlin':
            expert_padding = prof.mxfp4_marlin_expert_padding(
                expert_bytes, spec.hidden_size, spec.moe_intermediate_size, tp)
        else:
            expert_padding = prof.mxfp4_expert_padding(expert_bytes, spec.moe_intermediate_size) // tp
    total = sharded + replicated + kv_replication + expert_padding
    terms = {'weights_sharded': sharded, 'weights_replicated': replicated,
             'weights_kv_proj_replication': kv_replication,
             'weights_mxfp4_expert_padding': expert_padding}
    explain = ('%s stored weights / TP %d = %s%s%s%s (%s)' % (
        fmt_bytes(spec.weight_bytes), tp, fmt_bytes(sharded),
        (' + replicated parts %s' % fmt_bytes(replicated)) if replicated else '',
        (' + k/v projections replicated (%d KV heads < TP %d) %s' % (
            spec.num_kv_heads, tp, fmt_bytes(kv_replication))) if kv_replication else '',
        (' + MXFP4 experts padded %s' % (
            ('for the Marlin kernel vLLM picks below compute capability 10 (hidden to 256, '
             'intermediate / TP to 128; shapes from mxfp4.py create_weights) %s' % fmt_bytes(expert_padding))
            if kernel == 'marlin' else
            ('by vLLM (%s) %s' % (prof.MXFP4_EXPERT_PAD.describe(), fmt_bytes(expert_padding)))))
        if expert_padding else '',
        spec.weight_bytes_note or ('exact' if spec.weight_bytes_exact else 'from the model spec')))
    return total, terms, explain


# ---------------------------------------------------------------- activation
def ffn_width(spec):
    if spec.intermediate_size:
        return spec.intermediate_size
    return spec.moe_intermediate_size * max(1, spec.num_experts_per_tok)


def sampler_warmup_terms(spec, max_num_seqs, max_num_batched_tokens, version=None, sampler=None):
    """(named bytes, path): the sampler warm-up of the profile run, term by term (see
    SAMPLER_FP32_LOGITS_BYTES above for the vLLM source of each); ``sampler`` is the checked
    vllm_sampler knob (None: unset, the sort path where the version sorts)."""
    rows = min(max_num_seqs, max_num_batched_tokens)
    logits = rows * spec.vocab_size
    path = prof.sampler_path(version, rows, sampler)
    terms = {'logits_model_dtype': logits * spec.dtype_bytes,
             'logits_fp32': logits * SAMPLER_FP32_LOGITS_BYTES}
    if path == 'sort':
        terms['sort_values_indices_scratch'] = logits * SAMPLER_SORT_BYTES
        terms['fitted_sort_residual'] = logits * SAMPLER_SORT_RESIDUAL_X100 // 100
    elif path == 'flashinfer':
        terms['flashinfer_masked_logits_probs'] = logits * SAMPLER_FLASHINFER_BYTES
    else:
        terms['mask_probs_noise'] = logits * SAMPLER_NO_SORT_BYTES
        terms['triton_row_buffer'] = min(rows, SAMPLER_TRITON_BUFFER_ROWS) * spec.vocab_size * 4
    return terms, path


def v2_sampler_warmup_terms(spec, max_num_seqs, max_num_batched_tokens, version):
    """(named bytes, path) of Model Runner V2's profile-run sampler: greedy up to 0.32 (one
    [R, vocab] logits tensor in the model dtype, no fp32 copy, no top-k/top-p), from 0.33 a
    warm-up pass with top-k / top-p / min-p / penalties / logprobs (charged as the V1 no-sort
    path: logits, fp32 copy, mask + probs)."""
    rows = min(max_num_seqs, max_num_batched_tokens)
    logits = rows * spec.vocab_size
    if not version.at_least(prof.V2_WARMUP_PARAMS_SINCE):
        return {'logits_model_dtype': logits * spec.dtype_bytes}, 'v2_greedy'
    return {'logits_model_dtype': logits * spec.dtype_bytes, 'logits_fp32': logits * SAMPLER_FP32_LOGITS_BYTES,
            'mask_probs_noise': logits * SAMPLER_NO_SORT_BYTES}, 'v2_warmup_params'


def activation_peak(spec, tp, max_num_seqs, max_num_batched_tokens, version=None, sampler=None, runner=None):
    """(bytes, terms, explain): the profile run's torch peak above the weights.

    ``version`` (a vllm_profile.VllmVersion) and ``sampler`` (the checked vllm_sampler knob) pick
    the sampler path; None plans the sort path, the larger one. ``runner`` prof.RUNNER_V2 plans
    Model Runner V2's sampler (v2_sampler_warmup_terms; no reserve)."""
    rows = min(max_num_seqs, max_num_batched_tokens)
    if runner == prof.RUNNER_V2 and version is not None:
        parts, path = v2_sampler_warmup_terms(spec, max_num_seqs, max_num_batched_tokens, version)
    else:
        parts, path = sampler_warmup_terms(spec, max_num_seqs, max_num_batched_tokens, version, sampler)
    sampler = sum(parts.values())
    hidden_states = (max_num_batched_tokens + HIDDEN_STATE_ROW_COPIES * rows) * spec.hidden_size * spec.dtype_bytes
    # encoder-decoder: the profile run also passes max_encoder_len positions through the encoder
    # (vLLM profiles max_num_encoder_input_tokens), layers as wide as the decoder's (Whisper)
    forward_tokens = max(max_num_batched_tokens, spec.max_encoder_len or 0)
    forward = forward_tokens * spec.dtype_bytes * (
        FORWARD_HIDDEN_COPIES * spec.hidden_size + FORWARD_FFN_COPIES * ffn_width(spec) // tp)
    reserve = 0
    if path == 'no_sort' and NO_SORT_ERA_RESERVE and version is not None \
            and version.at_least(prof.NO_SORT_ERA_RESERVE_SINCE):
        sort_parts, _sort_path = sampler_warmup_terms(spec, max_num_seqs, max_num_batched_tokens, None)
        reserve = max(0, sum(sort_parts.values()) - sampler)
    sampler_phase = sampler + hidden_states + reserve
    peak = max(sampler_phase, forward)
    terms = {'activation_sampler_warmup': sampler, 'activation_hidden_states': hidden_states,
             'activation_forward_pass': forward, 'activation_unexplained_reserve': reserve}
    per_logit = ' + '.join('%s %s' % (name.replace('_', ' '), fmt_bytes(size)) for name, size in parts.items())
    guard = ''
    if reserve:
        guard = ('; + unexplained reserve %s (policy guard, not physics: the sort path\'s bytes are '
                 'kept from %s until the memory the 0.19 / 0.27 / 0.28 logs show above this model is '
                 'explained; it starts at %s)' % (
                     fmt_bytes(reserve), prof.version_tuple_text(prof.NO_SORT_ERA_RESERVE_SINCE),
                     prof.NO_SORT_ERA_RESERVE_START.describe()))
    explain = ('profile-run peak = max(sampler warm-up %s + hidden states %s%s, forward pass %s) = %s; '
               'sampler (%s path, vLLM %s) on R = min(max_num_seqs %d, max_num_batched_tokens %d) = %d '
               'rows x vocab %d: %s (shapes from gpu_model_runner._dummy_sampler_run, sampler.py, '
               'topk_topp_sampler.py; only the sort residual is %s); hidden states = (%d + %d x %d) tokens x hidden %d x %d B (shapes: profile_run '
               'keeps _dummy_run\'s output while the sampler runs); forward = %d tokens%s x (4 x hidden + 3 '
               'x FFN %d / TP %d) x %d B (shapes)' % (
                   fmt_bytes(sampler), fmt_bytes(hidden_states), (' + reserve %s' % fmt_bytes(reserve)) if reserve else '',
                   fmt_bytes(forward), fmt_bytes(peak), path,
                   version or 'unknown', max_num_seqs, max_num_batched_tokens, rows, spec.vocab_size,
                   per_logit, SAMPLER_SORT_RESIDUAL.describe(), max_num_batched_tokens, HIDDEN_STATE_ROW_COPIES, rows, spec.hidden_size,
                   spec.dtype_bytes, forward_tokens,
                   (' (the encoder pass: max_encoder_len, above max_num_batched_tokens %d)' % max_num_batched_tokens
                    if forward_tokens > max_num_batched_tokens else ''),
                   ffn_width(spec), tp, spec.dtype_bytes)) + guard
    return peak, terms, explain


# ---------------------------------------------------------------- non-torch and graphs
def ring_connections(tp):
    return min(tp - 1, 2) if tp > 1 else 0


def nccl_channels(gpu_name):
    name = (gpu_name or '').lower()
    if 'pcie' not in name and any(hint in name for hint in NVLINK_CLASS_NAME_HINTS):
        return NCCL_CHANNELS_NVLINK
    return NCCL_CHANNELS_PCIE


def nccl_buffer_bytes(tp, gpu_name):
    return ring_connections(tp) * nccl_channels(gpu_name) * NCCL_BYTES_PER_CHANNEL_CONNECTION


OUTSIDE_LABELS = {'cuda_context': 'CUDA context', 'nccl_buffers': 'NCCL buffers',
                  'cublas_workspaces': 'cuBLAS workspaces', 'cuda_graph_pool': 'CUDA graph pool'}


def cuda_total_of(gpu, position=0):
    """cuda_total.CudaTotal of one GPU: the total vLLM budgets from. vLLM reads
    ``torch.cuda.mem_get_info()[1]`` (cudaMemGetInfo), which is NVML's memory_total less
    what the driver and firmware keep; budgeting util x the NVML total would promise util x
    that gap more KV than vLLM allocates. Every total below is this one."""
    return ct.of_gpu(gpu, 'gpus[%d]' % position)


def outside_terms(acct, graphs_inside, tp, gpu, graph_pool):
    """(named terms, resident, required) that vLLM holds outside total * util on one GPU.

    resident = what really sits there while serving; required = resident + vLLM's profiler
    buffer + the safety margin: total * (1 - util) must be at least this. The margin is a
    share of the card's NVML memory_total (the larger total: the margin does not shrink
    because the driver keeps part of the card)."""
    total = gpu['memory_total']
    # vLLM 0.6.4.x / 0.8.x count the CUDA context inside the budget (device-wide non-torch)
    parts = {} if acct.device_wide_non_torch else {'cuda_context': CUDA_CONTEXT_BYTES}
    if acct.nccl_in_baseline and tp > 1:
        parts['nccl_buffers'] = nccl_buffer_bytes(tp, gpu.get('name'))
    if acct.cublas_in_baseline:
        parts['cublas_workspaces'] = NON_TORCH_GROWTH_BYTES
    if not graphs_inside and graph_pool:
        parts['cuda_graph_pool'] = graph_pool
    resident = sum(parts.values())
    return parts, resident, resident + PROFILER_UNDERESTIMATE_BYTES + safety_margin_bytes(total)


def custom_allreduce(tp, gpu_name):
    """vLLM's custom all-reduce (IPC buffers, no NCCL inside CUDA graphs) is disabled when
    ``world_size > 2 and not fully_connected`` ("not supported on more than two PCIe-only
    GPUs", custom_all_reduce.py); at TP=2 on PCIe it needs P2P, which a GPU name cannot tell:
    assumed absent, the conservative side. Without it graph-captured collectives go through NCCL."""
    return tp > 1 and nccl_channels(gpu_name) == NCCL_CHANNELS_NVLINK


def cuda_graph_pool(spec, tp, capture_sizes, gpu_name=None, runner=None):
    """(bytes, terms, explain) of the CUDA-graph memory pool per GPU (0 with no capture).
    ``runner`` prof.RUNNER_V2: no NCCL collectives charged in the graphs (see V2_GRAPH_COLLECTIVES)."""
    if not capture_sizes:
        return 0, {}, 'enforce_eager: no CUDA graphs captured'
    count = len(capture_sizes)
    largest = capture_sizes[-1]
    nodes = GRAPH_BYTES_PER_LAYER * spec.num_layers * count // GRAPH_REFERENCE_CAPTURE_COUNT
    intermediates = largest * spec.dtype_bytes * (
        FORWARD_HIDDEN_COPIES * spec.hidden_size + FORWARD_FFN_COPIES * ffn_width(spec) // tp)
    if runner == prof.RUNNER_V2 and tp > 1:
        total = nodes + intermediates
        return total, {'cuda_graph_nodes': nodes, 'cuda_graph_intermediates': intermediates,
                       'cuda_graph_collectives': 0}, (
            '%d captured sizes up to %d: graph nodes %s x %d layers x %d/%d = %s (%s) + largest graph '
            'intermediates %s (physical) + no NCCL collectives (Model Runner V2: %s) = %s' % (
                count, largest, fmt_bytes(GRAPH_BYTES_PER_LAYER), spec.num_layers, count,
                GRAPH_REFERENCE_CAPTURE_COUNT, fmt_bytes(nodes), GRAPH_PER_LAYER.describe(),
                fmt_bytes(intermediates), V2_GRAPH_COLLECTIVES, fmt_bytes(total)))
    nccl_in_graphs = tp > 1 and not custom_allreduce(tp, gpu_name)
    collectives = GRAPH_COLLECTIVE_BYTES_PER_CONNECTION * ring_connections(tp) if nccl_in_graphs else 0
    total = nodes + intermediates + collectives
    terms = {'cuda_graph_nodes': nodes, 'cuda_graph_intermediates': intermediates,
             'cuda_graph_collectives': collectives}
    if nccl_in_graphs:
        comm = ('NCCL collectives captured in graphs %s x %d ring connections = %s (%s)' % (
            fmt_bytes(GRAPH_COLLECTIVE_BYTES_PER_CONNECTION), ring_connections(tp), fmt_bytes(collectives),
            GRAPH_COLLECTIVES.describe()))
    elif tp > 1:
        comm = 'no NCCL in graphs (custom all-reduce over NVLink)'
    else:
        comm = 'no collectives (TP 1)'
    explain = ('%d captured sizes up to %d: graph nodes %s x %d layers x %d/%d = %s (%s) + largest '
               'graph intermediates %s (physical) + %s = %s; an estimate, logs show 0.1-2.5 GiB per GPU' % (
                   count, largest, fmt_bytes(GRAPH_BYTES_PER_LAYER), spec.num_layers, count,
                   GRAPH_REFERENCE_CAPTURE_COUNT, fmt_bytes(nodes), GRAPH_PER_LAYER.describe(),
                   fmt_bytes(intermediates), comm, fmt_bytes(total)))
    return total, terms, explain


# ---------------------------------------------------------------- inputs
def int_knob(knobs, name, low, high):
    """``knobs[name]`` as an int in [low, high] (None when unset); PlanInputError naming it otherwise."""
    value = knobs.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            if isinstance(value, bool) or float(value) != int(float(value)):
                raise ValueError
            value = int(float(value))
        except (TypeError, ValueError, OverflowError):
            raise PlanInputError(name, 'must be a whole number, got %r' % (value,))
    if value < low:
        raise PlanInputError(name, 'must be >= %d, got %d' % (low, value))
    if value > high:
        raise PlanInputError(name, 'must be <= %d, got %d (typo?)' % (high, value))
    return value


def _bool_knob(knobs, name):
    value = knobs.get(name)
    if value is None or isinstance(value, bool):
        return value
    raise PlanInputError(name, 'must be true or false, got %r' % (value,))


def check_vllm_spec(spec):
    """The model geometry the vLLM planners read (TP and pipeline alike); PlanInputError('model')."""
    if spec.weight_bytes <= 0:
        raise PlanInputError('model', '%s: weight_bytes must be > 0, got %d' % (spec.name, spec.weight_bytes))
    if spec.num_attention_heads <= 0 or spec.num_layers <= 0 or spec.hidden_size <= 0:
        raise PlanInputError('model', '%s: heads, layers and hidden size must be > 0' % spec.name)
    if len(spec.layer_kinds) != spec.num_layers:
        raise PlanInputError('model', '%s: %d layer kinds for %d layers' % (
            spec.name, len(spec.layer_kinds), spec.num_layers))
    if LAYER_MLA in spec.layer_kinds and not (spec.kv_lora_rank and spec.qk_rope_head_dim):
        raise PlanInputError('model', '%s: MLA layers need kv_lora_rank and qk_rope_head_dim' % spec.name)
    if LAYER_SLIDING in spec.layer_kinds and not spec.sliding_window:
        raise PlanInputError('model', '%s: sliding-window layers need sliding_window' % spec.name)
    if LAYER_CROSS in spec.layer_kinds and not spec.max_encoder_len:
        raise PlanInputError('model', '%s: cross-attention layers need max_encoder_len' % spec.name)


def check_traffic(traffic):
    """The three traffic figures, positive and within bounds; PlanInputError naming the figure."""
    for name in ('prompt_tokens_p99', 'max_output_tokens', 'max_concurrency'):
        value = getattr(traffic, name, None)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise PlanInputError(name, 'must be a positive integer, got %r' % (value,))
        limit = MAX_NUM_SEQS_LIMIT if name == 'max_concurrency' else MAX_MODEL_LEN_LIMIT
        if value > limit:
            raise PlanInputError(name, 'must be <= %d, got %d (typo?)' % (limit, value))


def _check_gpus(gpus):
    if not gpus:
        raise PlanInputError('gpus', 'no GPUs given: vLLM needs at least one GPU')
    kinds = {}
    for position, gpu in enumerate(gpus):
        if not isinstance(gpu, dict) or 'memory_total' not in gpu:
            raise PlanInputError('gpus[%d]' % position, 'must be a dict with memory_total (bytes)')
        total = gpu['memory_total']
        if isinstance(total, bool) or not isinstance(total, int) or total <= 0:
            raise PlanInputError('gpus[%d].memory_total' % position,
                                 'must be a positive number of bytes, got %r' % (total,))
        kinds.setdefault((gpu.get('name', ''), total), []).append(gpu.get('index', position))
    if len(kinds) > 1:
        raise PlanInputError('gpus', 'vLLM tensor parallelism needs GPUs of one kind, got %s; %s' % (
            '; '.join('%s %s (index %s)' % (name or '?', fmt_bytes(total), ','.join(str(i) for i in idx))
                      for (name, total), idx in sorted(kinds.items(), key=lambda kv: kv[0][1])),
            FALLBACK_HINT))
    return list(gpus)


def tp_refusal(spec, tp):
    """Why vLLM refuses tensor parallelism ``tp`` for ``spec`` (heads not divisible), or None."""
    if spec.num_attention_heads % tp:
        return '%d attention heads not divisible by %d' % (spec.num_attention_heads, tp)
    kv = spec.num_kv_heads
    if kv and kv % tp and tp % kv:
        return '%d KV heads neither divisible by %d nor a divisor of it' % (kv, tp)
    return None


# ---------------------------------------------------------------- one evaluation
@dataclass
class _Eval:
    tp: int
    kv_dtype: str
    util: float
    max_num_seqs: int
    max_num_batched_tokens: int
    block_size: int
    layout: KvLayout
    memory: List[GpuMemory]
    num_blocks: int                  # usable (null block removed), min over GPUs
    kv_cache_memory_bytes: int       # pinned value (0 when not pinned)
    slack: int                       # total - budget, min over GPUs
    charges_fit: bool                # weights + activation + non-torch (+ graphs) < budget
    not_fitting: List[str] = field(default_factory=list)
    reasons: Dict[str, str] = field(default_factory=dict)
    derived_util: float = 0.0
    graphs_inside: bool = False
    vram_claim: int = 0
    system_reserved: int = 0
    chunked_prefill: bool = True     # V0 below 32k: off (vLLM's own default, pinned)
    extensible: bool = False         # vLLM 0.34+ extensible KV cache left on (KV not pinned)


class _Context:
    """Everything fixed for one plan_vllm call."""

    def __init__(self, spec, gpus, traffic, knobs, version):
        self.spec, self.gpus, self.traffic, self.knobs, self.version = spec, gpus, traffic, knobs, version
        self.acct = prof.accounting(version)
        self.enforce_eager = bool(knobs.get('enforce_eager'))
        estimate = knobs.get('cudagraph_memory_estimate')
        if estimate is not None and self.acct.cuda_graphs == prof.GRAPHS_OUTSIDE:
            raise PlanInputError('cudagraph_memory_estimate', 'needs vLLM >= %s (%s), got %s' % (
                prof.version_tuple_text(prof.CUDAGRAPH_ESTIMATE_SINCE), prof.CUDAGRAPH_ESTIMATE_ENV, version))
        if self.acct.cuda_graphs == prof.GRAPHS_INSIDE:
            self.graphs_inside = estimate is not False
        elif self.acct.cuda_graphs == prof.GRAPHS_OPT_IN:
            self.graphs_inside = bool(estimate)
        else:
            self.graphs_inside = False
        self.estimate_env = None if estimate is None else ('1' if estimate else '0')
        # the GPU model runner: Model Runner V2 for dense models from 0.25, every model from 0.29
        self.runner, self.runner_reason = prof.model_runner(
            version, spec.num_experts > 0, LAYER_NO_KV in spec.layer_kinds, architecture=spec.architecture)
        self.v2 = self.runner == prof.RUNNER_V2
        # the sampler the plan charges: the knob, else what the image is known to carry
        self.sampler = knobs.get('vllm_sampler')
        self.image_sampler, self.image_evidence = prof.default_sampler(version, knobs.get('vllm_image'))
        if self.sampler is None:
            self.sampler = self.image_sampler
        if self.v2 and not prof.v2_charges_graphs(version):
            # 0.25 - 0.28: V2 estimates no graph memory; graphs are captured after the KV cache
            self.graphs_inside = False
        # vLLM 0.34+: the extensible KV cache stays on unless the plan pins the KV bytes
        # (--kv-cache-memory-bytes turns it off): see extensible_mode_reason.
        self.extensible = self.acct.extensible_kv_default and not (
            knobs.get('kv_cache_memory_bytes') or knobs.get('pin_kv_cache_memory'))


def _explain(ctx, tp, gpu, row, layout, kv_dtype, util, pinned_bytes, w_explain, non_torch_growth,
             tp_workspace, margin):
    """term -> how it was computed, for one GPU of an evaluation (GpuMemory.explain)."""
    acct = ctx.acct
    return {
        'total': 'CUDA-visible total of GPU %s (%s), what vLLM budgets from (torch.cuda.mem_get_info'
                 ' total, which excludes the memory the driver keeps): %s [%s]' % (
                     gpu.get('index', '?'), gpu.get('name', '?'), row['cuda'].explain, row['cuda'].source),
        'budget': (('--kv-cache-memory-bytes %s + the charged terms (vLLM ignores util for the budget); '
                    'planned within ' % fmt_bytes(pinned_bytes) if pinned_bytes else '') +
                   'ceil(total x gpu_memory_utilization %g), total = the CUDA-visible total %s, not '
                   'the NVML total %s' % (util, fmt_bytes(row['cuda'].cuda_total), fmt_bytes(row['cuda'].nvml_total))),
        'weights': w_explain,
        'activation': row['a_explain'],
        'non_torch': 'inside the budget: non-torch growth %s (cuBLAS/attention workspaces, %s)%s%s' % (
            fmt_bytes(non_torch_growth), NON_TORCH_GROWTH.describe(),
            (' + TP workspaces %s (%s)' % (fmt_bytes(tp_workspace), TP_WORKSPACE.describe()))
            if tp_workspace else '',
            (' + NCCL buffers %s (this version allocates them after the memory snapshot)'
             % fmt_bytes(row['nccl'])) if row['nccl'] and not acct.nccl_in_baseline else '') + (
            ' + CUDA context %s (this version measures non-torch memory device-wide)'
            % fmt_bytes(CUDA_CONTEXT_BYTES) if acct.device_wide_non_torch else ''),
        'nccl_buffers': '%d ring connections x %d NCCL channels x %s (%s) -> %s, %s' % (
            ring_connections(tp), nccl_channels(gpu.get('name')),
            fmt_bytes(NCCL_BYTES_PER_CHANNEL_CONNECTION), NCCL_PER_CHANNEL_CONNECTION.describe(),
            fmt_bytes(row['nccl']),
            'outside the budget' if acct.nccl_in_baseline else 'inside the budget'),
        'cuda_context': 'CUDA context + driver, outside torch (%s)' % CUDA_CONTEXT.describe(),
        'cuda_graph': row['g_explain'] + (' -- charged INSIDE the budget' if ctx.graphs_inside
                                          else ' -- OUTSIDE the budget (captured after KV allocation)'),
        'kv_cache': '%d blocks x %s per block (%d tokens x %s per token on this GPU, kv dtype %s); %s%s' % (
            row['blocks'], fmt_bytes(layout.bytes_per_block), layout.block_size,
            fmt_bytes(layout.bytes_per_token), kv_dtype, layout.rule,
            ('; the KV budget is net of a cold-compile margin %s (%s): not pinned in bytes, a cold '
             'torch.compile is charged as activation'
             % (fmt_bytes(row['cold']), ('Model Runner V2: transient %s, %s; pinned segments %s, %s' % (
                 fmt_bytes(row['cold_transient']), COLD_COMPILE_TRANSIENT.describe(), fmt_bytes(row['cold_pinned']),
                 COLD_COMPILE_PINNED.describe())) if ctx.v2 else COLD_COMPILE_MARGIN.describe()))
            if row['cold'] else ''),
        'headroom': 'total - budget - outside resident terms; must stay >= profiler buffer %s + '
                    'safety margin %s (3 %% of the card, >= 512 MiB: allocator fragmentation, '
                    'prefill peaks above the profiled one, unprofiled logprobs)' % (
                        fmt_bytes(PROFILER_UNDERESTIMATE_BYTES), fmt_bytes(margin)),
    }


@dataclass(frozen=True)
class _EvalSetup:
    """What one evaluation (one TP, one KV dtype) fixes before any max_num_seqs is tried."""
    tp: int
    kv_dtype: str
    gpus: List[dict]
    cudas: List[object]              # cuda_total per GPU
    block_size: int
    max_num_batched_tokens: int
    chunked_prefill: bool
    layout: KvLayout
    user_ms: Optional[int]
    ms_upper: int                    # the largest max_num_seqs considered
    pinned_user: Optional[int]       # --kv-cache-memory-bytes set by the user
    cold_applies: bool               # V1 compiles inside its profile run (cold-compile margin)
    pin_wanted: bool                 # pin the planned KV in bytes
    weights: int
    w_terms: Dict[str, int]
    w_explain: str
    non_torch_growth: int
    tp_workspace: int
    util: float
    derived_util: float
    reasons: Dict[str, str]          # block size, batching and utilization reasons, in that order


def _batch_settings(ctx, max_model_len):
    """Block size, chunked prefill and max_num_batched_tokens: the user's, else this version's
    defaults; returns them with their reasons."""
    spec, knobs, version, acct = ctx.spec, ctx.knobs, ctx.version, ctx.acct
    reasons = {}
    block_size = knobs.get('block_size')
    if block_size is None:
        forced = vllm_forced_block_size(spec.layer_kinds)
        if forced is not None:
            block_size, reasons['block_size'] = forced
        else:
            block_size = prof.default_block_size(version)
    first = ctx.gpus[0]
    chunked = True
    mnbt = knobs.get('max_num_batched_tokens')
    if acct.engine == 'v0':
        pre = prof.v0_prefill_defaults(version, max_model_len, bool(spec.sliding_window), mnbt)
        chunked = pre.chunked_prefill
        reasons['enable_chunked_prefill'] = pre.rule
        if mnbt is None:
            mnbt = pre.max_num_batched_tokens
            reasons['max_num_batched_tokens'] = pre.rule
    else:
        defaults = prof.batch_defaults(version, first.get('name'), first['memory_total'])
        off = [kind_of(k).vllm_no_chunked_prefill for k in spec.layer_kinds if kind_of(k).vllm_no_chunked_prefill]
        if off:
            chunked = False
            reasons['enable_chunked_prefill'] = off[0]
    if mnbt is None:
        mnbt = defaults.max_num_batched_tokens
        reasons['max_num_batched_tokens'] = defaults.rule + (' (chunked prefill on; pinned so the '
                                                             'profiled activation peak is the one that runs)' if chunked else
                                                             ' (pinned so the profiled activation peak is the one that runs; '
                                                             'chunked prefill off: a whole prompt fits in it)')
        if knobs.get('max_num_seqs', 0) > mnbt:
            mnbt = knobs['max_num_seqs']
            reasons['max_num_batched_tokens'] = ('raised to max_num_seqs %d: vLLM requires '
                                                 'max_num_batched_tokens >= max_num_seqs' % mnbt)
    elif not chunked and acct.engine != 'v0' and mnbt < max_model_len:
        # vllm/config/scheduler.py (chunked prefill off): max_num_batched_tokens must be >= max_model_len
        raise PlanInputError('max_num_batched_tokens', '%d is below max_model_len %d: with chunked prefill off '
                             '(%s) vLLM refuses to start' % (mnbt, max_model_len, spec.name))
    return block_size, chunked, mnbt, reasons


def _graph_for(ctx, tp, gpus, mnbt, ms):
    """The CUDA graph pool (bytes, terms, explanation) with ``ms`` sequences."""
    sizes = [] if ctx.enforce_eager else prof.cudagraph_capture_sizes(ctx.version, ms, mnbt)
    return cuda_graph_pool(ctx.spec, tp, sizes, gpus[0].get('name'), ctx.runner)


def _utilization(ctx, tp, gpus, cudas, graph_upper):
    """(util, derived util, reason): the user's, else the largest whole percent that leaves what vLLM
    holds outside the budget room on every GPU (with the largest graph pool considered, so the
    capture-size-dependent pool is not under-counted)."""
    acct, version = ctx.acct, ctx.version
    derived = None
    for gpu, cuda in zip(gpus, cudas):
        total = cuda.cuda_total
        required = outside_terms(acct, ctx.graphs_inside or ctx.extensible, tp, gpu, graph_upper)[2]
        util_here = floor_util(total - required, total)
        derived = util_here if derived is None else min(derived, util_here)
    user_util = ctx.knobs.get('gpu_memory_utilization')
    if user_util is not None:
        return user_util, derived, 'set by the user (%.2f); the safe maximum here is %.2f' % (user_util, derived)
    return derived, derived, (
        'floor to 0.01 of (total - outside terms - margin) / total = %.2f (vLLM %s default would '
        'be %.2f): what vLLM %s holds outside the budget must fit in total x (1 - util)' % (
            derived, version, prof.EXTENSIBLE_DEFAULT_UTILIZATION if ctx.extensible else
            prof.default_gpu_memory_utilization(version), version))


def _eval_setup(ctx, tp, kv_dtype, max_model_len):
    spec, knobs, version, acct, traffic = ctx.spec, ctx.knobs, ctx.version, ctx.acct, ctx.traffic
    gpus = ctx.gpus[:tp]
    kv_bytes = prof.kv_cache_dtype_bytes(kv_dtype, version, spec.dtype_bytes)
    block_size, chunked, mnbt, reasons = _batch_settings(ctx, max_model_len)
    layout = kv_layout(spec, tp, kv_bytes, block_size, mnbt)
    user_ms = knobs.get('max_num_seqs')
    ms_upper = user_ms if user_ms is not None else max(1, min(traffic.max_concurrency, mnbt))
    pinned_user = knobs.get('kv_cache_memory_bytes')
    pin_knob = knobs.get('pin_kv_cache_memory')
    pin_wanted = pinned_user is None and (
        pin_knob if pin_knob is not None else prof.kv_bytes_pin_default(version)[0])
    weights, w_terms, w_explain = weights_per_gpu(spec, tp, gpus[0], version)
    if ctx.v2:
        # Model Runner V2: what load_model allocates beyond the checkpoint (V2_LOAD_RESIDUAL)
        weights += V2_LOAD_RESIDUAL_BYTES
        w_terms = dict(w_terms, weights_v2_load_residual=V2_LOAD_RESIDUAL_BYTES)
        w_explain += ' + load residual %s (%s)' % (fmt_bytes(V2_LOAD_RESIDUAL_BYTES), V2_LOAD_RESIDUAL.describe())
    cudas = [cuda_total_of(gpu, position) for position, gpu in enumerate(gpus)]
    util, derived, reasons['gpu_memory_utilization'] = _utilization(
        ctx, tp, gpus, cudas, _graph_for(ctx, tp, gpus, mnbt, ms_upper)[0])
    return _EvalSetup(
        tp=tp, kv_dtype=kv_dtype, gpus=gpus, cudas=cudas, block_size=block_size, max_num_batched_tokens=mnbt,
        chunked_prefill=chunked, layout=layout, user_ms=user_ms, ms_upper=ms_upper, pinned_user=pinned_user,
        # V1 compiles the model (torch.compile) inside its profile run; V0 compiles nothing by default
        cold_applies=acct.engine != 'v0', pin_wanted=pin_wanted,
        weights=weights, w_terms=w_terms, w_explain=w_explain,
        non_torch_growth=0 if acct.cublas_in_baseline else NON_TORCH_GROWTH_BYTES,
        tp_workspace=TP_WORKSPACE_BYTES if tp > 1 else 0, util=util, derived_util=derived, reasons=reasons)


def _kv_row(ctx, setup, gpu, cuda, ms, cold_margin):
    """One GPU's charged terms and KV blocks with ``ms`` sequences; with ``cold_margin`` the KV
    budget is the one a cold torch.compile leaves (the cold start), else the warm one."""
    spec, acct, tp, mnbt, version = ctx.spec, ctx.acct, setup.tp, setup.max_num_batched_tokens, ctx.version
    total = cuda.cuda_total
    nccl = nccl_buffer_bytes(tp, gpu.get('name'))
    act, a_terms, a_explain = activation_peak(spec, tp, ms, mnbt, version, ctx.sampler,
                                              ctx.runner)
    graph, g_terms, g_explain = _graph_for(ctx, tp, setup.gpus, mnbt, ms)
    # Model Runner V2 from 0.27: its persistent buffers count (total_consumed)
    runner_buffers = v2_runner_buffer_bytes(spec, ms) if ctx.v2 and prof.counts_total_consumed(version) else 0
    inside_nt = setup.non_torch_growth + setup.tp_workspace + (0 if acct.nccl_in_baseline else nccl) + (
        CUDA_CONTEXT_BYTES if acct.device_wide_non_torch else 0) + runner_buffers
    charged = setup.weights + act + inside_nt + (graph if ctx.graphs_inside else 0)
    cold_transient, cold_pinned = v2_cold_compile(spec, tp, version, act) if ctx.v2 else (0, 0)
    cold = 0
    ext = None
    if setup.pinned_user is not None:
        kv_budget = kv_warm = kv_cold = setup.pinned_user
    elif ctx.extensible:
        # a cold compile raises the transient peak the extensible cache keeps free (and its margin)
        transient = act + (cold_transient if cold_margin else 0) + (graph if ctx.graphs_inside else 0)
        ext = extensible_sizing(acct, tp, gpu, total, setup.util, setup.weights + inside_nt + graph, transient)
        kv_budget = ext['kv']
        charged = ext['consumed'] + ext['transient']
        kv_warm = extensible_sizing(acct, tp, gpu, total, setup.util, setup.weights + inside_nt + graph,
                                    act + (graph if ctx.graphs_inside else 0))['kv']
        kv_cold = extensible_sizing(acct, tp, gpu, total, setup.util, setup.weights + inside_nt + graph,
                                    act + cold_transient + (graph if ctx.graphs_inside else 0))['kv']
        # no margin subtracted: the cold transient is inside the extensible formula (kv_budget_cold)
    else:
        kv_warm = util_bytes(total, setup.util) - charged
        cold_extra = cold_transient + cold_pinned if ctx.v2 else cold_compile_margin_bytes(kv_warm)
        kv_cold = kv_warm - cold_extra
        kv_budget = kv_warm
        if cold_margin == PINNED_BESIDE_COLD:
            # a pinned pool: the cold compile's transient is released before the KV cache is
            # allocated, its pinned segments (V2, 0.27 - 0.30) are not and sit beside the pool
            kv_budget = kv_warm - cold_pinned
            kv_cold = kv_warm = kv_budget
        elif cold_margin:
            cold = cold_extra
            kv_budget = kv_cold
    blocks = max(0, kv_budget) // setup.layout.bytes_per_block
    return dict(gpu=gpu, cuda=cuda, total=total, nccl=nccl, act=act, a_terms=a_terms,
                a_explain=a_explain, graph=graph, g_terms=g_terms, g_explain=g_explain,
                inside_nt=inside_nt, charged=charged, kv_budget=kv_budget, blocks=blocks,
                cold=cold, ext=ext, runner_buffers=runner_buffers, cold_transient=cold_transient,
                cold_pinned=cold_pinned, kv_warm=kv_warm, kv_cold=kv_cold)


# _kv_row's cold_margin for a pool pinned in bytes: sized beside what a cold start leaves pinned
PINNED_BESIDE_COLD = 'pinned_beside_cold'


def _kv_rows(ctx, setup, ms, cold_margin):
    """Usable blocks (min over GPUs, less what the engine holds back) and the per-GPU rows."""
    rows = [_kv_row(ctx, setup, gpu, cuda, ms, cold_margin) for gpu, cuda in zip(setup.gpus, setup.cudas)]
    fewest = min(r['blocks'] for r in rows)
    usable = fewest - ctx.acct.held_back_blocks(fewest)
    return max(0, usable), rows


def _max_num_seqs(ctx, setup, max_model_len):
    """(max_num_seqs, usable blocks, rows, reason): the user's, else the declared concurrency,
    lowered to what the KV pool holds."""
    traffic, layout = ctx.traffic, setup.layout
    cold = (setup.cold_applies and not setup.pin_wanted) or (PINNED_BESIDE_COLD if setup.pin_wanted else False)
    seq_tokens = min(traffic.tokens_per_sequence, max_model_len)
    seq_blocks = layout.blocks_per_request(seq_tokens)
    if setup.user_ms is not None:
        usable, rows = _kv_rows(ctx, setup, setup.user_ms, cold)
        return setup.user_ms, usable, rows, 'set by the user (%d)' % setup.user_ms
    ms = setup.ms_upper
    usable, rows = _kv_rows(ctx, setup, ms, cold)
    fit = usable // seq_blocks
    if fit < ms:
        # fewer sequences -> smaller sampler warm-up and graph pool -> more KV: stays consistent
        ms = max(1, fit)
        usable, rows = _kv_rows(ctx, setup, ms, cold)
    return ms, usable, rows, (
        'min(declared concurrency %d, KV pool %d blocks // %d blocks per %d-token sequence = %d) '
        '= %d: the declared traffic cannot oversubscribe the KV pool' % (
            traffic.max_concurrency, usable, seq_blocks, seq_tokens, usable // seq_blocks, ms))


def _pinned_kv(ctx, setup, ms, usable, rows):
    """(pinned KV bytes or 0, usable, rows): the planned pool pinned in bytes where wanted, never
    more than the util budget left after the charged terms."""
    null_block = 1 if ctx.acct.holds_null_block else 0
    if not setup.pin_wanted:
        return setup.pinned_user or 0, usable, rows
    if usable <= 0:
        # nothing to pin (the charged terms leave no KV pool): planned unpinned, cold margin too
        usable, rows = _kv_rows(ctx, setup, ms, setup.cold_applies)
        return 0, usable, rows
    return (usable + null_block) * setup.layout.bytes_per_block, usable, rows


@dataclass(frozen=True)
class _GpuOutcome:
    """One GPU of an evaluation: its memory, what does not fit there, and the node-level figures."""
    memory: GpuMemory
    shortfall: Optional[str]
    resident: int                    # budget + outside resident terms (the VRAM claim)
    required: int                    # outside terms + buffer + margin (system_reserved)
    slack: int                       # total - budget
    charges_fit: bool


def _shortfall(ctx, util, outside, margin, budget, required, slack, total, pinned_bytes):
    """Why the outside terms do not fit next to the budget on one GPU (None when they do)."""
    if slack >= required:
        return None
    parts = ['%s %s' % (OUTSIDE_LABELS[name], fmt_bytes(size)) for name, size in outside.items()]
    parts += ['profiler buffer %s' % fmt_bytes(PROFILER_UNDERESTIMATE_BYTES), 'safety margin %s' % fmt_bytes(margin)]
    if pinned_bytes:
        return ('budget %s (weights, activation, non-torch%s, pinned KV) + %s = %s, more than '
                'the card (%s)' % (fmt_bytes(budget), ', graphs' if ctx.graphs_inside else '',
                                   ' + '.join(parts), fmt_bytes(budget + required), fmt_bytes(total)))
    return ('outside the budget vLLM %s holds %s = %s, more than total x (1 - %g) = %s' % (
        ctx.version, ' + '.join(parts), fmt_bytes(required), util, fmt_bytes(slack)))


def _gpu_outcome(ctx, setup, row, pinned_bytes):
    total, gpu, util, layout = row['total'], row['gpu'], setup.util, setup.layout
    outside, outside_resident, required = outside_terms(ctx.acct, ctx.graphs_inside or ctx.extensible,
                                                        setup.tp, gpu, row['graph'])
    margin = safety_margin_bytes(row['cuda'].nvml_total)
    if pinned_bytes:
        # the cold start's pinned allocator segments (V2, 0.27 - 0.30) stay beside the pinned pool
        budget = row['charged'] + row['cold_pinned'] + pinned_bytes
        kv_alloc = kv_budget = pinned_bytes
    else:
        budget = util_bytes(total, util)
        kv_alloc, kv_budget = row['blocks'] * layout.bytes_per_block, row['kv_budget']
    resident = budget + outside_resident
    slack = total - budget
    terms = dict(setup.w_terms)
    terms.update(row['a_terms'])
    terms.update(row['g_terms'])
    terms.update({
        'non_torch_growth': setup.non_torch_growth, 'tp_workspaces': setup.tp_workspace,
        'nccl_buffers': row['nccl'], 'cuda_context': CUDA_CONTEXT_BYTES,
        'profiler_underestimate_buffer': PROFILER_UNDERESTIMATE_BYTES, 'safety_margin': margin,
        'kv_budget': kv_budget, 'cold_compile_margin': row['cold'],
        # the two named start cases (0 where the charged terms leave nothing): the pool a warm
        # start (compile cache present) and a cold one (no compile cache) gets; pinned: the pool
        'kv_budget_warm': pinned_bytes or max(0, row['kv_warm']),
        'kv_budget_cold': pinned_bytes or max(0, row['kv_cold']),
        'kv_bytes_per_token': layout.bytes_per_token,
        'kv_bytes_per_block': layout.bytes_per_block, 'outside_resident': outside_resident,
        'outside_required': required,
        'nvml_total': row['cuda'].nvml_total, 'driver_reserved': row['cuda'].gap,
    })
    terms.update(('outside_' + name, size) for name, size in outside.items())
    if ctx.v2:
        terms['v2_runner_buffers'] = row['runner_buffers']
        terms['cold_compile_transient'] = row['cold_transient']
        terms['cold_compile_pinned_segments'] = row['cold_pinned']
    if row['ext']:
        terms['extensible_margin'] = row['ext']['margin']
        terms['extensible_transient_peak'] = row['ext']['transient']
    explain = _explain(ctx, setup.tp, gpu, row, layout, setup.kv_dtype, util, pinned_bytes, setup.w_explain,
                       setup.non_torch_growth, setup.tp_workspace, margin)
    if row['ext']:
        explain['budget'] = row['ext']['explain_budget']
        explain['kv_cache'] = '%s; %s' % (row['ext']['explain_kv'], explain['kv_cache'])
    memory = GpuMemory(
        index=gpu.get('index', 0), name=gpu.get('name', ''), total=total, budget=budget,
        weights=setup.weights, activation=row['act'], non_torch=row['inside_nt'],
        cuda_graph=row['graph'], kv_cache=kv_alloc, headroom=total - resident, terms=terms,
        explain=explain, term_kinds=tk.term_kinds(tk.VLLM, terms, row['cuda']))
    return _GpuOutcome(
        memory=memory, shortfall=_shortfall(ctx, util, outside, margin, budget, required, slack, total, pinned_bytes),
        resident=resident, required=required, slack=slack,
        charges_fit=not (row['charged'] >= util_bytes(total, util) and not pinned_bytes))


def _grouped_shortfalls(rows, outcomes):
    """GPUs are of one kind: one line per distinct shortfall, naming the GPUs it applies to."""
    grouped = {}
    for row, outcome in zip(rows, outcomes):
        if outcome.shortfall is not None:
            grouped.setdefault(outcome.shortfall, []).append(str(row['gpu'].get('index', '?')))
    return ['GPU %s: %s' % (', '.join(idx), text) for text, idx in grouped.items()]


def _evaluate(ctx, tp, kv_dtype, max_model_len):
    """The whole memory picture for one TP and KV dtype: util (user or derived), max_num_seqs
    (user or derived), per-GPU GpuMemory, usable blocks (min over GPUs), shortfalls."""
    setup = _eval_setup(ctx, tp, kv_dtype, max_model_len)
    ms, usable, rows, ms_reason = _max_num_seqs(ctx, setup, max_model_len)
    pinned_bytes, usable, rows = _pinned_kv(ctx, setup, ms, usable, rows)
    outcomes = [_gpu_outcome(ctx, setup, row, pinned_bytes) for row in rows]
    if pinned_bytes:
        usable = pinned_bytes // setup.layout.bytes_per_block - (1 if ctx.acct.holds_null_block else 0)
    return _Eval(tp=tp, kv_dtype=kv_dtype, util=setup.util, max_num_seqs=ms,
                 max_num_batched_tokens=setup.max_num_batched_tokens, block_size=setup.block_size,
                 layout=setup.layout, memory=[o.memory for o in outcomes], num_blocks=max(0, usable),
                 kv_cache_memory_bytes=pinned_bytes, slack=min(o.slack for o in outcomes),
                 charges_fit=all(o.charges_fit for o in outcomes),
                 not_fitting=_grouped_shortfalls(rows, outcomes),
                 reasons=dict(setup.reasons, max_num_seqs=ms_reason), derived_util=setup.derived_util,
                 graphs_inside=ctx.graphs_inside, vram_claim=max([0] + [o.resident for o in outcomes]),
                 system_reserved=max([0] + [o.required for o in outcomes]),
                 chunked_prefill=setup.chunked_prefill, extensible=ctx.extensible)


def _fits_one_sequence(ev, max_model_len):
    return ev.num_blocks >= ev.layout.blocks_per_request(max_model_len)


def _feasible(ev, max_model_len):
    return ev.charges_fit and not ev.not_fitting and _fits_one_sequence(ev, max_model_len)


# ---------------------------------------------------------------- eras: V0, 0.34 extensible KV
def engine_spec(spec, version):
    """The model as this version's KV cache manager lays it out. V0 (before 0.8.0) has no hybrid
    KV manager: interleaved sliding windows are turned off (every layer caches every token) and a
    uniform window only frees whole blocks behind it, so sliding layers are planned as full
    attention (the bound, never under it). MLA on V0 (0.7.1+) was not read: refused."""
    for kind in sorted(set(kind_of(k) for k in spec.layer_kinds), key=lambda kind: kind.name):
        if kind.vllm_since is not None and not version.at_least(kind.vllm_since):
            raise PlanInputError('model', '%s uses %s; vLLM %s serves it only on the V0 engine, whose KV layout '
                                 'for it is not modelled: use vLLM %s or later (its V1 engine caches it)' % (
                                     spec.name, kind.label, version, prof.version_tuple_text(kind.vllm_since)))
    if prof.accounting(version).engine != 'v0':
        return spec
    unmodelled = [kind_of(k) for k in spec.layer_kinds if kind_of(k).v0_kind is None]
    if unmodelled:
        raise PlanInputError('model', '%s uses %s; its KV layout on the V0 engine (vLLM %s) is '
                             'not modelled: use vLLM %s or later (the V1 engine)' % (
                                 spec.name, unmodelled[0].label, version, prof.version_tuple_text(prof.V1_ENGINE_SINCE)))
    v0_kinds = [kind_of(k).v0_kind for k in spec.layer_kinds]
    if v0_kinds == spec.layer_kinds:
        return spec
    return replace(spec, layer_kinds=v0_kinds)


def v0_shared_gpu_warnings(ctx):
    """vLLM 0.6.4.x and 0.8.x count memory other processes hold on the GPU as their own non-torch memory."""
    if not ctx.acct.device_wide_non_torch:
        return []
    busy = [gpu for gpu in ctx.gpus if isinstance(gpu.get('memory_used'), int) and gpu['memory_used'] > 0]
    return ['GPU %s has %s in use now: vLLM %s counts memory other processes hold on the GPU as its own '
            'non-torch memory and takes it out of its KV budget (the plan assumes the GPU to itself); '
            'start it on an idle GPU' % (
                gpu.get('index', '?'), fmt_bytes(gpu['memory_used']), ctx.version) for gpu in busy]


def extensible_sizing(acct, tp, gpu, total, util, consumed, transient):
    """vLLM 0.34's extensible KV cache on one GPU, from the planned terms (bytes):

        requested = ceil(total x util)
        consumed  = weights + workspaces + CUDA graph pool: what the engine holds after warm-up
                    and graph capture, measured from the init snapshot (taken after the CUDA
                    context, NCCL and cuBLAS handles: the baseline)
        headroom  = total - baseline - consumed: free memory after warm-up on a GPU of its own
        transient = the profiled activation peak (+ the CUDA graph estimate while
                    VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1, the default), kept free in full
        margin    = max(1 GiB, 0.75 x transient)
        kv        = min(requested - consumed, headroom - margin) - transient"""
    baseline = outside_terms(acct, True, tp, gpu, 0)[1]
    requested = util_bytes(total, util)
    headroom = total - baseline - consumed
    kv, margin = prof.extensible_kv_bytes(requested, consumed, headroom, transient)
    bound = 'the util cap' if requested - consumed <= headroom - margin else 'free memory after warm-up'
    explain_budget = ('cap ceil(total x gpu_memory_utilization %g) = %s (extensible KV cache: a cap, not a '
                      'reservation; vLLM 0.34 skips the startup free-memory check)' % (util, fmt_bytes(requested)))
    explain_kv = ('extensible KV cache (vLLM 0.34): min(cap %s - consumed %s, headroom %s - margin %s) - '
                  'transient peak %s = %s, bound by %s; consumed = weights + workspaces + CUDA graph pool, '
                  'headroom = total - baseline (CUDA context, NCCL, cuBLAS) %s - consumed, margin = '
                  'max(1 GiB, 0.75 x transient), of which %s stays free for non-torch allocations '
                  '(vllm/v1/worker/extensible_kv_cache.py measure_kv_cache_bytes)' % (
                      fmt_bytes(requested), fmt_bytes(consumed), fmt_bytes(headroom), fmt_bytes(margin), fmt_bytes(transient),
                      fmt_bytes(kv), bound, fmt_bytes(baseline), fmt_bytes(prof.EXTENSIBLE_NON_TORCH_RESERVE_BYTES)))
    return dict(kv=kv, margin=margin, transient=transient, consumed=consumed, requested=requested,
                headroom=headroom, explain_budget=explain_budget, explain_kv=explain_kv)


def extensible_mode_reason(ctx):
    """Why this 0.34+ plan keeps the extensible KV cache on, or pins the KV bytes (turning it off)."""
    version = ctx.version
    if ctx.extensible:
        return ('vLLM %s extensible KV cache ON (single-tenant GPU): pinned --enable-extensible-kv-cache '
                '(vLLM refuses to start where the driver lacks VMM instead of silently falling back to '
                'estimate-based sizing) and an explicit --gpu-memory-utilization (vLLM would default to '
                '1.0): the cap keeps the safety margin and the terms held outside the budget free and '
                'is what GPUStack books; vLLM sizes the KV after warm-up and CUDA graph capture from '
                'what is then free, less its own margin of max(1 GiB, 0.75 x transient peak). vLLM logs '
                'that a utilization below 1.0 withholds memory from the KV cache: expected. On a GPU '
                'shared with another instance set pin_kv_cache_memory (or kv_cache_memory_bytes)' % version)
    return ('vLLM %s extensible KV cache OFF: --kv-cache-memory-bytes pins the KV pool (it turns the '
            'mode off), with an explicit --gpu-memory-utilization. For a GPU shared with another '
            'instance: the extensible cache sizes itself from whatever is free once warm-up ends and '
            'skips the startup free-memory check, so next to a neighbour it takes what the neighbour '
            'has not yet allocated (and the neighbour then runs out) or starts silently smaller than '
            'planned; pinned bytes make the pool the planned one on every (re)start, and vLLM fails at '
            'startup instead when the memory is not there' % version)


def extensible_free_warning(ctx, gpu, free, mem):
    """A GPU with less free now than the cap: 0.34's extensible cache would start anyway, smaller."""
    return ('GPU %s has %s free now, less than the %s cap (total x util) of this vLLM %s plan: with the '
            'extensible KV cache vLLM skips the startup free-memory check and would size the KV from '
            'what is free after warm-up, up to %s less than planned; if another process shares this '
            'GPU set pin_kv_cache_memory so the pool is pinned in bytes' % (
                gpu.get('index', '?'), fmt_bytes(free), fmt_bytes(mem.budget), ctx.version, fmt_bytes(mem.budget - free)))


# ---------------------------------------------------------------- public entry point
def checked_knobs(knobs, spec, version):
    """The user-set knobs (None dropped), type- and range-checked for this version."""
    knobs = {k: v for k, v in dict(knobs or {}).items() if v is not None}
    unknown = sorted(k for k in knobs if k not in KNOWN_KNOBS)
    if unknown:
        raise PlanInputError(unknown[0], 'is not a vLLM option of this planner (known: %s)' % ', '.join(KNOWN_KNOBS))
    for name, low, high in (('max_model_len', 16, MAX_MODEL_LEN_LIMIT),
                            ('max_num_seqs', 1, MAX_NUM_SEQS_LIMIT),
                            ('max_num_batched_tokens', 16, MAX_NUM_BATCHED_TOKENS_LIMIT),
                            ('kv_cache_memory_bytes', 1, 1 << 50)):
        if name in knobs:
            knobs[name] = int_knob(knobs, name, low, high)
    for name in ('enforce_eager', 'pin_kv_cache_memory', 'cudagraph_memory_estimate', 'allow_fp8_kv'):
        _bool_knob(knobs, name)
    if 'block_size' in knobs:
        knobs['block_size'] = int_knob(knobs, 'block_size', 1, 4096)
        if knobs['block_size'] not in prof.block_size_choices(version):
            raise PlanInputError('block_size', 'must be one of %s for vLLM %s, got %d' % (
                ', '.join(str(b) for b in prof.block_size_choices(version)), version, knobs['block_size']))
    if 'gpu_memory_utilization' in knobs:
        util = knobs['gpu_memory_utilization']
        if isinstance(util, bool) or not isinstance(util, (int, float)) or not 0 < util <= 1:
            raise PlanInputError('gpu_memory_utilization', 'must be in (0, 1], got %r' % (util,))
        knobs['gpu_memory_utilization'] = round(float(util), 4)
    if 'max_num_seqs' in knobs and 'max_num_batched_tokens' in knobs \
            and knobs['max_num_batched_tokens'] < knobs['max_num_seqs']:
        raise PlanInputError('max_num_batched_tokens', 'must be >= max_num_seqs (%d), got %d' % (
            knobs['max_num_seqs'], knobs['max_num_batched_tokens']))
    for name in ('kv_cache_memory_bytes', 'pin_kv_cache_memory'):
        if knobs.get(name) and not prof.flag_available('kv_cache_memory_bytes', version):
            raise PlanInputError(name, 'needs %s, got vLLM %s' % (prof.flag_span('kv_cache_memory_bytes'), version))
    if 'kv_cache_dtype' in knobs:
        prof.kv_cache_dtype_bytes(knobs['kv_cache_dtype'], version, spec.dtype_bytes)
    if 'vllm_sampler' in knobs:
        knobs['vllm_sampler'] = prof.check_sampler(knobs['vllm_sampler'], version)
    if 'vllm_image' in knobs:
        knobs['vllm_image'] = prof.check_image(knobs['vllm_image'])
    return knobs


def derive_max_model_len(spec, traffic, knobs):
    """(max_model_len, reason, warnings, beyond_model): the user's value, checked, or the next
    power of two >= prompt p99 + max output, capped at the model's maximum."""
    need = traffic.tokens_per_sequence
    model_max = spec.max_position_embeddings
    if 'max_model_len' in knobs:
        max_model_len = knobs['max_model_len']
        if model_max and max_model_len > model_max:
            raise PlanInputError('max_model_len', '%d is above the model maximum %d '
                                 '(max_position_embeddings of %s)' % (max_model_len, model_max, spec.name))
        warnings = []
        if max_model_len < need:
            warnings.append('max_model_len %d is below prompt p99 + max output = %d: longer requests '
                            'are rejected' % (max_model_len, need))
        return max_model_len, 'set by the user (%d)' % max_model_len, warnings, False
    max_model_len = next_power_of_two(need)
    reason = ('next power of two >= prompt_tokens_p99 %d + max_output_tokens %d = %d -> %d' % (
        traffic.prompt_tokens_p99, traffic.max_output_tokens, need, max_model_len))
    if not model_max or max_model_len <= model_max:
        return max_model_len, reason, [], False
    reason += ', capped at the model maximum %d' % model_max
    if need > model_max:
        return model_max, reason, ['requests need %d tokens but %s supports at most %d' % (
            need, spec.name, model_max)], True
    return model_max, reason, ['max_model_len capped at the model maximum %d' % model_max], False


def _tp_candidates(spec, gpus, knobs):
    """(TP values to try in order, auto?): the user's TP checked, or every TP in
    TP_CANDIDATES that divides the heads and fits the GPU count."""
    tp_knob = knobs.get('tensor_parallel_size')
    if tp_knob is None or tp_knob == 'auto':
        candidates = [tp for tp in TP_CANDIDATES if tp <= len(gpus) and tp_refusal(spec, tp) is None]
        if not candidates:
            raise PlanInputError('tensor_parallel_size', 'no TP in %s fits %d GPUs and %d heads' % (
                TP_CANDIDATES, len(gpus), spec.num_attention_heads))
        return candidates, True
    tp = int_knob(knobs, 'tensor_parallel_size', 1, 1024)
    why = tp_refusal(spec, tp)
    if why:
        raise PlanInputError('tensor_parallel_size', '%s: %s' % (spec.name, why))
    if tp > len(gpus):
        raise PlanInputError('tensor_parallel_size', '%d is more than the %d GPUs given' % (tp, len(gpus)))
    return [tp], False


def _short_of_traffic(ev, traffic, knobs, max_model_len):
    """The pool holds less than one max_model_len sequence, or (max_num_seqs derived) fewer
    sequences than the declared concurrency."""
    return not _fits_one_sequence(ev, max_model_len) or (
        'max_num_seqs' not in knobs and ev.max_num_seqs < traffic.max_concurrency)


def _fp8_wanted(ctx):
    """Whether the plan may switch the KV cache to fp8 by itself: only with the operator's consent
    (knob allow_fp8_kv), never over an explicit kv_cache_dtype, and only where the version takes fp8."""
    return (ctx.knobs.get('kv_cache_dtype') is None and ctx.knobs.get('allow_fp8_kv') is True
            and 'fp8' in prof.kv_cache_dtype_choices(ctx.version))


def _choose(ctx, candidates, max_model_len):
    """(evaluation, switched_to_fp8, fp8 alternative or None): the first TP candidate whose plan
    is feasible (else the last). The KV dtype is switched to fp8 only with allow_fp8_kv and only
    when the model dtype is short of the traffic; without consent the fp8 evaluation of the chosen
    TP is kept aside, so the plan can say what fp8 would buy."""
    user_dtype = ctx.knobs.get('kv_cache_dtype')
    fp8_ok = 'fp8' in prof.kv_cache_dtype_choices(ctx.version)
    ev = switched = None
    for tp in candidates:
        ev = _evaluate(ctx, tp, user_dtype or 'auto', max_model_len)
        switched = False
        if (_fp8_wanted(ctx) and ev.charges_fit and not ev.not_fitting
                and _short_of_traffic(ev, ctx.traffic, ctx.knobs, max_model_len)):
            ev8 = _evaluate(ctx, tp, 'fp8', max_model_len)
            if ev8.charges_fit and not ev8.not_fitting:
                ev, switched = ev8, True
        if _feasible(ev, max_model_len):
            break
    alternative = None
    if (not switched and user_dtype is None and fp8_ok and ev.charges_fit and not ev.not_fitting
            and _short_of_traffic(ev, ctx.traffic, ctx.knobs, max_model_len)):
        ev8 = _evaluate(ctx, ev.tp, 'fp8', max_model_len)
        if _feasible(ev8, max_model_len) and ev8.num_blocks * ev8.block_size > ev.num_blocks * ev.block_size:
            alternative = ev8
    return ev, switched, alternative


def fp8_gain_text(ev, ev8, max_model_len):
    """What fp8 KV would buy over ``ev`` (model dtype) at the same TP, in tokens and sequences."""
    tokens, concurrency, _rule = kv_capacity(ev, max_model_len)
    tokens8, concurrency8, _rule = kv_capacity(ev8, max_model_len)
    return ('fp8 KV (1 B per element) would hold %d KV tokens and max_num_seqs %d (%.2f sequences of '
            'max_model_len %d) where the model dtype holds %d KV tokens and max_num_seqs %d (%.2f) at TP %d' % (
                tokens8, ev8.max_num_seqs, concurrency8, max_model_len, tokens, ev.max_num_seqs, concurrency, ev.tp))


def _choice_reasons(ctx, ev, switched, auto_tp, max_model_len, alternative=None):
    """(reasons, warnings) for tensor_parallel_size and kv_cache_dtype."""
    spec, traffic, version = ctx.spec, ctx.traffic, ctx.version
    reasons, warnings = {}, []
    if auto_tp and _feasible(ev, max_model_len):
        reasons['tensor_parallel_size'] = (
            'smallest TP in %s dividing %d heads (%d KV heads), <= %d GPUs, that fits one '
            '%d-token sequence: %d' % (list(TP_CANDIDATES), spec.num_attention_heads,
                                       spec.num_kv_heads, len(ctx.gpus), max_model_len, ev.tp))
    elif auto_tp:
        reasons['tensor_parallel_size'] = (
            'no TP in %s (dividing %d heads, <= %d GPUs) gives a feasible plan; planned with '
            'the largest, %d' % (list(TP_CANDIDATES), spec.num_attention_heads, len(ctx.gpus), ev.tp))
    else:
        reasons['tensor_parallel_size'] = 'set by the user (%d)' % ev.tp
    if ctx.knobs.get('kv_cache_dtype'):
        reasons['kv_cache_dtype'] = 'set by the user (%s)' % ctx.knobs['kv_cache_dtype']
    elif switched:
        reasons['kv_cache_dtype'] = ('fp8: with the model dtype the KV pool holds too little for one '
                                     '%d-token sequence or the declared concurrency %d (vLLM %s '
                                     'accepts fp8; allow_fp8_kv set by the user)' % (
                                         max_model_len, traffic.max_concurrency, version))
        warnings.append('kv_cache_dtype switched to fp8 to fit the declared traffic: it halves the KV '
                        'cache but long-context retrieval quality must be evaluated first')
    else:
        if not _short_of_traffic(ev, traffic, ctx.knobs, max_model_len):
            why = 'the pool holds the declared traffic'
        elif 'fp8' not in prof.kv_cache_dtype_choices(version):
            why = 'vLLM %s does not accept fp8' % version
        elif alternative is not None and not ctx.knobs.get('allow_fp8_kv'):
            why = ('the pool is short of the declared traffic, but fp8 needs the operator\'s consent '
                   '(allow_fp8_kv: true; it changes the model\'s numerics, and long-context retrieval '
                   'degrades first), so %s; %s' % (
                       'max_num_seqs is capped to what the pool holds' if _fits_one_sequence(ev, max_model_len)
                       else 'the plan is refused', fp8_gain_text(ev, alternative, max_model_len)))
            if _fits_one_sequence(ev, max_model_len) and 'max_num_seqs' not in ctx.knobs:
                warnings.append('kv_cache_dtype kept at the model dtype (no allow_fp8_kv): max_num_seqs is '
                                '%d for the declared concurrency %d; with allow_fp8_kv: true the plan would '
                                'switch to fp8 KV and hold max_num_seqs %d (%d KV tokens instead of %d) - '
                                'evaluate long-context retrieval quality first' % (
                                    ev.max_num_seqs, traffic.max_concurrency, alternative.max_num_seqs,
                                    kv_capacity(alternative, max_model_len)[0], kv_capacity(ev, max_model_len)[0]))
        else:
            why = 'fp8 does not make this plan feasible (see not_fitting)'
        reasons['kv_cache_dtype'] = 'auto (the model dtype, %d B): %s' % (spec.dtype_bytes, why)
    return reasons, warnings


def _engine_args(ctx, ev, max_model_len):
    """(args, settings, reasons, rules): the argv for this version, in --flag=value form."""
    version, knobs = ctx.version, ctx.knobs
    reasons = {}
    rules = list(ctx.acct.rules)
    if version.at_least(prof.V2_RUNNER_DENSE_SINCE):
        rules.append('model runner: %s' % ctx.runner_reason)
        if ctx.v2 and not prof.v2_charges_graphs(version):
            rules.append('vLLM %s Model Runner V2 charges no CUDA-graph estimate before KV sizing '
                         '(profile_cudagraph_memory returns 0 in 0.25 - 0.28): graphs are captured after '
                         'the KV cache, outside the budget' % version)
    args = [prof.render_flag('tensor_parallel_size', ev.tp),
            prof.render_flag('max_model_len', max_model_len)]
    settings = {'tensor_parallel_size': ev.tp, 'max_model_len': max_model_len,
                'max_num_seqs': ev.max_num_seqs, 'max_num_batched_tokens': ev.max_num_batched_tokens,
                'kv_cache_dtype': ev.kv_dtype, 'block_size': ev.block_size,
                'enable_chunked_prefill': True, 'enforce_eager': ctx.enforce_eager}
    if ev.kv_cache_memory_bytes:
        args.append(prof.render_flag('kv_cache_memory_bytes', ev.kv_cache_memory_bytes))
        settings['kv_cache_memory_bytes'] = ev.kv_cache_memory_bytes
        rules.append('vLLM %s: --kv-cache-memory-bytes fixes the KV budget; gpu_memory_utilization '
                     'only sets the startup free-memory check' % version)
    reasons['kv_cache_memory_bytes'] = kv_pin_reason(ctx, ev)
    args.append(prof.render_flag('gpu_memory_utilization', '%g' % ev.util))
    settings['gpu_memory_utilization'] = ev.util
    args.append(prof.render_flag('max_num_seqs', ev.max_num_seqs))
    args.append(prof.render_flag('max_num_batched_tokens', ev.max_num_batched_tokens))
    if 'max_num_batched_tokens' in knobs:
        reasons['max_num_batched_tokens'] = 'set by the user (%d)' % ev.max_num_batched_tokens
    if ev.chunked_prefill:
        args.append(prof.render_flag('enable_chunked_prefill'))
    elif ctx.acct.engine == 'v0':
        args.append(prof.render_flag('enable_chunked_prefill', 'False'))
        settings['enable_chunked_prefill'] = False
    else:
        # V1 turns it off by itself (encoder-decoder); its CLI switch takes no '=False' value
        settings['enable_chunked_prefill'] = False
    reasons['enable_chunked_prefill'] = ev.reasons.get('enable_chunked_prefill', (
        'on: prefill is split into max_num_batched_tokens chunks, so the activation peak does not '
        'grow with max_model_len'))
    if ctx.acct.extensible_kv_default:
        reasons['kv_cache_sizing'] = extensible_mode_reason(ctx)
        if ev.extensible:
            args.append(prof.render_flag('enable_extensible_kv_cache'))
            settings['enable_extensible_kv_cache'] = True
        else:
            settings['enable_extensible_kv_cache'] = False
    if prof.flag_available('swap_space', version):
        args.append(prof.render_flag('swap_space', 0))
        settings['swap_space'] = 0
        reasons['swap_space'] = ('0: no host swap space, so an overload fails loudly instead of '
                                 'crawling; vLLM %s accepts %s' % (version, prof.flag_span('swap_space')))
        rules.append('vLLM %s accepts %s -> pinned to 0' % (version, prof.flag_span('swap_space')))
    else:
        reasons['swap_space'] = ('not passed: the flag exists only as %s; %s (vLLM %s would refuse it)' % (
            prof.flag_span('swap_space'), prof.FLAGS['swap_space'].note, version))
        rules.append('vLLM %s: no %s -> not passed' % (version, prof.flag_span('swap_space')))
    if ev.kv_dtype != 'auto':
        args.append(prof.render_flag('kv_cache_dtype', ev.kv_dtype))
    if 'block_size' in knobs or ev.block_size != prof.default_block_size(version):
        args.append(prof.render_flag('block_size', ev.block_size))
        reasons['block_size'] = ev.reasons.get('block_size', 'set by the user (%d)' % ev.block_size)
    if ctx.enforce_eager:
        args.append(prof.render_flag('enforce_eager'))
        reasons['enforce_eager'] = 'set by the user: no CUDA graphs, no graph pool'
    if ctx.estimate_env is not None:
        settings['environment'] = {prof.CUDAGRAPH_ESTIMATE_ENV: ctx.estimate_env}
        rules.append('%s=%s set in the engine environment (knob cudagraph_memory_estimate)' % (
            prof.CUDAGRAPH_ESTIMATE_ENV, ctx.estimate_env))
    sampler = knobs.get('vllm_sampler')
    for name, value in sorted(prof.sampler_env(sampler, version).items()):
        settings.setdefault('environment', {})[name] = value
        rules.append('%s=%s set in the engine environment (knob vllm_sampler: %s)' % (name, value, sampler))
    if version.at_least(prof.V1_ENGINE_SINCE):
        reasons['vllm_sampler'] = sampler_reason(ctx, ev)
    return args, settings, reasons, rules


def sampler_reason(ctx, ev):
    """Which top-k/top-p path the plan charged for the profile run's sampler warm-up, and why."""
    version, sampler = ctx.version, ctx.knobs.get('vllm_sampler')
    rows = min(ev.max_num_seqs, ev.max_num_batched_tokens)
    path = prof.sampler_path(version, rows, ctx.sampler)
    charged = ev.memory[0].terms.get('activation_sampler_warmup', 0)
    if ctx.v2:
        return ('vLLM %s runs Model Runner V2, whose profile-run sampler %s; charged %s%s' % (
            version, 'is greedy (no top-k/top-p)' if not version.at_least(prof.V2_WARMUP_PARAMS_SINCE)
            else 'runs a warm-up pass with top-k / top-p (no sort)', fmt_bytes(charged),
            '' if sampler is None else ', whatever vllm_sampler says (%s)' % sampler))
    if sampler is None and path == 'flashinfer':
        return ('not set; the image carries FlashInfer (%s) and vLLM %s takes it by itself when installed '
                '(0.9.1 - 0.11.x): charged its warm-up, %s (fp32 masked logits + probs, no sort). Set '
                'vllm_sampler: pytorch if the engine log prints "Falling back to the PyTorch-native '
                'implementation"' % (ctx.image_evidence, version, fmt_bytes(charged)))
    if path == 'no_sort':
        return ('vLLM %s: the warm-up sorts on neither path (%d rows >= %d: Triton or FlashInfer top-k/top-p); '
                'charged %s%s' % (version, rows, prof.SAMPLER_TRITON_MIN_BATCH, fmt_bytes(charged),
                                  '' if sampler is None else ', the same for vllm_sampler %s' % sampler))
    if path == 'flashinfer':
        return ('set by the user (flashinfer): the image runs FlashInfer top-k/top-p (%s=1 in the engine '
                'environment); charged its warm-up, %s (fp32 masked logits + probs, no sort). An image '
                'without flashinfer %s' % (
                    prof.FLASHINFER_SAMPLER_ENV, fmt_bytes(charged),
                    'falls back to the sort path and uses more than this' if not version.at_least(
                        prof.FLASHINFER_SAMPLER_OPT_IN_SINCE) else 'fails at the warm-up'))
    if sampler == prof.SAMPLER_PYTORCH:
        return ('set by the user (pytorch): %s the PyTorch sort path%s; charged its warm-up, %s' % (
            ('%s=0 pins' % prof.FLASHINFER_SAMPLER_ENV) if version.at_least(prof.FLASHINFER_SAMPLER_SINCE)
            else 'vLLM %s runs' % version,
            '' if not version.at_least(prof.FLASHINFER_SAMPLER_SINCE) else ' (full-vocab logits.sort)',
            fmt_bytes(charged)))
    if ctx.knobs.get('vllm_image'):
        return ('not set: charged the PyTorch sort path\'s warm-up, %s (full-vocab logits.sort): %s; %s' % (
            fmt_bytes(charged), ctx.image_evidence,
            'vLLM %s takes FlashInfer only with %s=1 (opt-in from 0.12): the sort path runs unless '
            'vllm_sampler: flashinfer sets it' % (version, prof.FLASHINFER_SAMPLER_ENV)
            if version.at_least(prof.FLASHINFER_SAMPLER_OPT_IN_SINCE) else
            'so the sort path, the safe side' if ctx.image_sampler is None and prof.image_flashinfer(
                ctx.knobs['vllm_image'])[0] is None else 'the image runs the sort path'))
    return ('not set: charged the PyTorch sort path\'s warm-up, %s (full-vocab logits.sort), the larger '
            'of the two; the plan cannot see whether the image ships FlashInfer (%s), so the safe side is '
            'the path that needs more. Set vllm_image (the engine\'s image: vllm/vllm-openai and amd64 '
            'gpustack/runner vLLM images carry FlashInfer), or vllm_sampler: flashinfer when the engine '
            'log prints "Using FlashInfer for top-p & top-k sampling." (more KV), pytorch to pin the sort '
            'path' % (
                fmt_bytes(charged), 'taken by default when installed in 0.9.1 - 0.11.x' if version.in_range(
                    prof.FLASHINFER_SAMPLER_SINCE, prof.FLASHINFER_SAMPLER_OPT_IN_SINCE)
                else 'opt-in with %s=1 from 0.12' % prof.FLASHINFER_SAMPLER_ENV))


def kv_pin_reason(ctx, ev):
    """Why the KV pool is (or is not) pinned in bytes, and what charges against it."""
    version, knobs = ctx.version, ctx.knobs
    if knobs.get('kv_cache_memory_bytes'):
        return 'set by the user'
    mem = ev.memory[0]
    requested = util_bytes(mem.total, ev.util)
    graphs = mem.cuda_graph if ev.graphs_inside else 0
    charged = ('(weights %s + activation %s + non-torch %s%s)' % (
        fmt_bytes(mem.weights), fmt_bytes(mem.activation), fmt_bytes(mem.non_torch),
        (' + CUDA graphs %s' % fmt_bytes(graphs)) if graphs else ''))
    default_pin, default_why = prof.kv_bytes_pin_default(version)
    user_set = knobs.get('pin_kv_cache_memory') is not None
    if ev.kv_cache_memory_bytes:
        return ('pinned (%s): %d blocks x %s = %d bytes per GPU, the KV pool the plan computed '
                'from the budget and never more: ceil(total %s x util %g) = %s - %s leaves %s, '
                'floored to whole blocks. A recycled instance gets this same pool; its cold '
                'torch.compile no longer sizes it' % (
                    'pin_kv_cache_memory set by the user' if user_set else 'default; ' + default_why,
                    ev.kv_cache_memory_bytes // ev.layout.bytes_per_block,
                    fmt_bytes(ev.layout.bytes_per_block), ev.kv_cache_memory_bytes, fmt_bytes(mem.total), ev.util,
                    fmt_bytes(requested), charged,
                    fmt_bytes(requested - mem.weights - mem.activation - mem.non_torch - graphs)))
    if ev.extensible:
        return 'not passed: %s' % (
            'pin_kv_cache_memory false (set by the user); the extensible KV cache sizes the pool'
            if user_set else default_why)
    if knobs.get('pin_kv_cache_memory') is False:
        why = 'pin_kv_cache_memory false (set by the user)'
    elif not default_pin:
        why = default_why
    else:
        why = 'the charged terms leave no KV pool to pin'
    cold = mem.terms.get('cold_compile_margin', 0)
    if cold:
        then = ('- a cold-compile margin %s (%s), so the plan '
                'describes a cold start (first boot of this shape, or a recycled instance without a '
                'persistent compile cache) and a warm one gets more' % (fmt_bytes(cold), (
                    'Model Runner V2: cold-compile transient + pinned segments, see reasons.cold_start'
                    if ctx.v2 else '5 % of the warm KV budget, vllm#54383')))
    else:
        then = ('and no cold-compile margin: vLLM %s runs the V0 engine, which compiles nothing with '
                'torch.compile by default' % version) if ctx.acct.engine == 'v0' else '(nothing left)'
    return ('not passed: %s. Instead --gpu-memory-utilization=%g is pinned explicitly and the KV '
            'budget = ceil(total x util) %s - %s %s' % (why, ev.util, fmt_bytes(requested), charged, then))


def cold_start_reason(ctx, ev):
    """The two named start cases of this plan: a cold start (no compile cache: the first start of
    this shape, or any start after the compile cache is wiped) and a warm one, per GPU."""
    version = ctx.version
    if ctx.acct.engine == 'v0':
        return ('vLLM %s runs the V0 engine, which compiles nothing with torch.compile by default: a cold '
                'and a warm start get the same KV pool' % version)
    mem = ev.memory[0]
    t = mem.terms
    warm, cold = t['kv_budget_warm'], t['kv_budget_cold']
    how = ('Model Runner V2 (%s): a cold torch.compile raises the profiled transient peak by %s and, in '
           '0.27 - 0.30, leaves %s of allocator segments pinned (%s; %s)' % (
               ctx.runner_reason, fmt_bytes(t.get('cold_compile_transient', 0)),
               fmt_bytes(t.get('cold_compile_pinned_segments', 0)), COLD_COMPILE_TRANSIENT.describe(),
               COLD_COMPILE_PINNED.describe())) if ctx.v2 else (
        'V1 runner: a cold compile is charged as %s' % COLD_COMPILE_MARGIN.describe())
    persisted = ('the gpustack_worker role keeps the compile cache on the node '
                 '(gpustack_worker_compile_cache_dir), so warm starts are the common case')
    if ev.kv_cache_memory_bytes:
        pinned = t.get('cold_compile_pinned_segments', 0)
        if not ctx.v2:
            how = ('V1 runner: vLLM does not size a pinned pool from its profile run, so the cold '
                   'compile\'s transient does not shrink it')
        return ('KV pool pinned (%s per GPU): a cold start and a warm start get the same pool; %s. Planned '
                'for the cold start: %s of pinned segments beside the pool are inside the budget, headroom '
                '%s. A compile-cache wipe costs startup time, not KV; %s' % (
                    fmt_bytes(ev.kv_cache_memory_bytes), how,
                    fmt_bytes(pinned) if pinned else 'no segments (nothing stays pinned)',
                    fmt_bytes(mem.headroom), persisted))
    return ('not pinned: cold start (no compile cache) KV budget %s per GPU, warm start %s; %s. max_num_seqs '
            'and the headroom are sized for the cold start; a compile-cache wipe costs %s of KV per GPU '
            '(%d tokens) until the next warm start; %s' % (
                fmt_bytes(cold), fmt_bytes(warm), how, fmt_bytes(max(0, warm - cold)),
                max(0, warm - cold) // max(1, t['kv_bytes_per_token']), persisted))


def kv_capacity(ev, max_model_len):
    """(kv_cache_tokens, max_concurrency_at_max_len, rule or None) of an evaluation."""
    blocks_per_max_len = ev.layout.blocks_per_request(max_model_len)
    concurrency = ev.num_blocks / blocks_per_max_len if blocks_per_max_len else 0.0
    if ev.layout.hybrid:
        return int(concurrency * max_model_len), concurrency, (
            'hybrid KV layout: kv_cache_tokens = max concurrency x max_model_len (vLLM 0.22+ reports '
            'it the same way); %s' % ev.layout.rule)
    return ev.num_blocks * ev.block_size, concurrency, None


def _diagnose(ctx, ev, max_model_len, beyond_model, alternative=None):
    """(not_fitting, suggestions, warnings): what does not add up, what would, what to watch."""
    spec, traffic, knobs, gpus = ctx.spec, ctx.traffic, ctx.knobs, ctx.gpus
    not_fitting = list(ev.not_fitting)
    suggestions, warnings = [], []
    mem0 = ev.memory[0]
    blocks_per_max_len = ev.layout.blocks_per_request(max_model_len)
    short_of_kv = ev.charges_fit and not _fits_one_sequence(ev, max_model_len)
    if not ev.charges_fit:
        not_fitting.append('weights %s + activation %s + non-torch %s%s exceed the budget %s per GPU' % (
            fmt_bytes(mem0.weights), fmt_bytes(mem0.activation), fmt_bytes(mem0.non_torch),
            (' + CUDA graphs %s' % fmt_bytes(mem0.cuda_graph)) if ev.graphs_inside else '', fmt_bytes(mem0.budget)))
    elif short_of_kv:
        not_fitting.append('one %d-token sequence needs %d blocks (%s) but the KV pool has %d blocks (%s)' % (
            max_model_len, blocks_per_max_len, fmt_bytes(blocks_per_max_len * ev.layout.bytes_per_block),
            ev.num_blocks, fmt_bytes(ev.num_blocks * ev.layout.bytes_per_block)))
    if beyond_model:
        not_fitting.append('requests need %d tokens, the model supports %d' % (
            traffic.tokens_per_sequence, spec.max_position_embeddings))
    if ev.not_fitting:
        suggestions.append('gpu_memory_utilization <= %.2f (what fits outside the budget)' % ev.derived_util)
        if mem0.cuda_graph and not ev.graphs_inside and not ctx.enforce_eager:
            suggestions.append('enforce_eager: true (no CUDA graph pool, %s less outside the budget; '
                               'slower decode)' % fmt_bytes(mem0.cuda_graph))
    bigger = [t for t in TP_CANDIDATES if t > ev.tp and tp_refusal(spec, t) is None]
    if short_of_kv:
        if ev.num_blocks and not ev.layout.hybrid:
            suggestions.append('max_model_len <= %d (what this KV pool holds)' % (ev.num_blocks * ev.block_size))
        else:
            suggestions.append('a shorter max_model_len')
        if ev.kv_dtype == 'auto' and 'fp8' in prof.kv_cache_dtype_choices(ctx.version):
            if alternative is not None:
                suggestions.append('allow_fp8_kv: true or kv_cache_dtype=fp8 (halves KV per token; evaluate '
                                   'long-context quality): %s' % fp8_gain_text(ev, alternative, max_model_len))
            else:
                suggestions.append('kv_cache_dtype=fp8 (halves KV per token; evaluate long-context quality)')
    if short_of_kv or not ev.charges_fit:
        if bigger:
            suggestions.append('tensor_parallel_size=%d (needs %d GPUs of this kind, %d given)' % (
                bigger[0], bigger[0], len(gpus)))
        if mem0.terms.get('activation_sampler_warmup', 0) > GiB:
            suggestions.append('a lower max_num_seqs (the sampler warm-up holds %s)' % fmt_bytes(
                mem0.terms['activation_sampler_warmup']))
    if not ev.charges_fit and not bigger:
        suggestions.append('a quantized checkpoint (weights %s per GPU)' % fmt_bytes(mem0.weights))
    feasible = _feasible(ev, max_model_len) and not beyond_model
    if feasible and 'max_num_seqs' not in knobs and ev.max_num_seqs < traffic.max_concurrency:
        warnings.append('max_num_seqs %d is below the declared concurrency %d: at %d tokens per '
                        'sequence the KV pool holds only %d sequences; more requests wait in the queue' % (
                            ev.max_num_seqs, traffic.max_concurrency, traffic.tokens_per_sequence,
                            ev.max_num_seqs))
    if 'max_num_seqs' in knobs:
        seq_blocks = ev.layout.blocks_per_request(min(traffic.tokens_per_sequence, max_model_len))
        if ev.max_num_seqs * seq_blocks > ev.num_blocks:
            warnings.append('max_num_seqs %d x %d blocks per sequence exceeds the KV pool (%d blocks): '
                            'full sequences will be preempted' % (ev.max_num_seqs, seq_blocks, ev.num_blocks))
    for gpu, mem in zip(gpus, ev.memory):
        free = gpu.get('memory_free')
        # init_device refuses to start unless free >= total x util, also when
        # --kv-cache-memory-bytes pins the pool (the check does not look at it)
        requested = util_bytes(mem.total, ev.util)
        if isinstance(free, int) and ev.extensible and free < mem.budget:
            warnings.append(extensible_free_warning(ctx, gpu, free, mem))
        elif isinstance(free, int) and free < requested:
            warnings.append('GPU %s has %s free now and vLLM needs %s free at startup (total x util): '
                            'it will not start unless that memory is released first (e.g. it is this '
                            'deployment\'s previous instance)' % (gpu.get('index', '?'), fmt_bytes(free), fmt_bytes(requested)))
    return feasible, not_fitting, suggestions, warnings


def plan_vllm(spec, gpus, traffic, knobs, backend_version):
    """Plan one vLLM deployment. Bad input -> PlanInputError; infeasible -> Plan.feasible False.

    ``knobs`` holds the user-set engine options by serving_plan option name (KNOWN_KNOBS); a knob
    left out (or None) is derived, and every value in the plan says why in ``reasons``. Pipeline
    parallelism is vllm_pipeline.plan_vllm_pipeline's (serving_plan.build_plan dispatches)."""
    version = prof.parse_version(backend_version)
    check_vllm_spec(spec)
    spec = engine_spec(spec, version)
    check_traffic(traffic)
    gpus = _check_gpus(gpus)
    knobs = checked_knobs(knobs, spec, version)
    ctx = _Context(spec, gpus, traffic, knobs, version)
    max_model_len, len_reason, warnings, beyond_model = derive_max_model_len(spec, traffic, knobs)
    warnings.extend(prof.version_warnings(version))
    warnings.extend(v0_shared_gpu_warnings(ctx))
    candidates, auto_tp = _tp_candidates(spec, gpus, knobs)
    ev, switched, alternative = _choose(ctx, candidates, max_model_len)
    reasons = {'max_model_len': len_reason}
    reasons.update(ev.reasons)
    choice_reasons, choice_warnings = _choice_reasons(ctx, ev, switched, auto_tp, max_model_len, alternative)
    reasons.update(choice_reasons)
    warnings.extend(choice_warnings)
    args, settings, arg_reasons, rules = _engine_args(ctx, ev, max_model_len)
    reasons.update(arg_reasons)
    reasons['cold_start'] = cold_start_reason(ctx, ev)
    kv_tokens, concurrency, capacity_rule = kv_capacity(ev, max_model_len)
    if capacity_rule:
        rules.append(capacity_rule)
    feasible, not_fitting, suggestions, diag_warnings = _diagnose(ctx, ev, max_model_len, beyond_model, alternative)
    warnings.extend(diag_warnings)
    return Plan(
        backend='vllm', backend_version=version.text, args=args, memory=ev.memory,
        kv_cache_tokens=kv_tokens, max_concurrency_at_max_len=round(concurrency, 2),
        feasible=feasible, settings=settings, reasons=reasons, warnings=warnings,
        not_fitting=not_fitting, suggestions=suggestions, rules=rules,
        vram_claim_bytes=ev.vram_claim, system_reserved_bytes=ev.system_reserved,
        kv_pool=KvPool(usable_blocks=ev.num_blocks, layouts=(ev.layout,)))
