# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one table of vLLM version facts: flags, defaults and memory-accounting eras.

Every fact here was read in the released vLLM wheels listed in
docs/architecture.md (0.8.5.post1 … 0.33.0). A range ``[since, until)`` uses the
first wheel where the code differs; releases between two read wheels (e.g. 0.9.0/0.9.1,
0.17.1, 0.21.0) are bracketed, and the bracket is put at the later release's first
version number. Nothing else in kvpin.fleet may hard-code a vLLM version.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional, Tuple

from ansible_collections.kvpin.fleet.plugins.module_utils.plan_types import PlanInputError
from ansible_collections.kvpin.fleet.plugins.module_utils.units import GiB

# Supported: every V1-engine release whose memory accounting was read (0.8.5 … 0.33.x).
SUPPORTED_SINCE = (0, 8, 5)
SUPPORTED_UNTIL = (0, 34, 0)
SUPPORTED_TEXT = '0.8.5 … 0.33.x'

_VERSION_RE = re.compile(
    r'^\s*v?(\d+)\.(\d+)(?:\.(\d+))?(?:\.(\d+))?'
    r'(?:\.?(post\d+|rc\d+|a\d+|b\d+|dev\d*))?(?:\+[\w.]+)?\s*$')


@dataclass(frozen=True)
class VllmVersion:
    """A parsed vLLM version. ``release`` has four parts ("0.10.1.1" -> (0, 10, 1, 1)).

    A pre-release ("0.20.0rc1") is treated as the release it precedes: its code already
    carries that release's flags and defaults, which is what matters for a plan."""
    text: str
    release: Tuple[int, int, int, int]
    suffix: Optional[str] = None

    def at_least(self, since):
        return self.release[:len(since)] >= tuple(since)

    def in_range(self, since, until):
        """True when since <= self < until (either bound may be None = open)."""
        if since is not None and self.release[:len(since)] < tuple(since):
            return False
        if until is not None and self.release[:len(until)] >= tuple(until):
            return False
        return True

    def __str__(self):
        return self.text


def parse_version(text):
    """'0.10.1.1', 'v0.11.0', '0.20.0rc1', '0.8.5.post1' -> VllmVersion; anything else, a
    series without its release ('0.10') or a version outside the supported range ->
    PlanInputError('backend_version', ...)."""
    if text is None or not str(text).strip():
        raise PlanInputError('backend_version', 'a vLLM version is required (e.g. "0.10.1.1"); '
                             'flags and memory accounting differ by version (supported: %s)'
                             % SUPPORTED_TEXT)
    match = _VERSION_RE.match(str(text))
    if not match:
        raise PlanInputError('backend_version', 'cannot parse vLLM version %r (expected e.g. '
                             '"0.10.1.1", "v0.11.0", "0.20.0rc1")' % (text,))
    if match.group(3) is None:
        # "0.10" names a series, not a release: within one series flags and accounting change
        # (0.10.2 added --kv-cache-memory-bytes), so the rules must come from one release.
        raise PlanInputError('backend_version', 'vLLM version %r is ambiguous: it names the %s.%s '
                             'series, not a release, and flags and memory accounting change within '
                             'a series; give the release the image runs (e.g. "%s.%s.0"), '
                             'quoted in YAML (unquoted 0.10 is the number 0.1)'
                             % (str(text).strip(), match.group(1), match.group(2),
                                match.group(1), match.group(2)))
    parts = tuple(int(p) if p is not None else 0 for p in match.group(1, 2, 3, 4))
    version = VllmVersion(text=str(text).strip().lstrip('v'), release=parts, suffix=match.group(5))
    if not version.in_range(SUPPORTED_SINCE, SUPPORTED_UNTIL):
        raise PlanInputError('backend_version', 'vLLM %s is not supported: the memory model covers '
                             'the V1 engine releases %s (older releases use the V0 worker, newer '
                             'ones were not read)' % (version.text, SUPPORTED_TEXT))
    return version


def _vtext(bound):
    return '.'.join(str(p) for p in bound)


# ---------------------------------------------------------------- CLI flags
@dataclass(frozen=True)
class FlagRule:
    """One CLI flag: present for since <= version < until (None = open)."""
    option: str
    flag: str
    since: Optional[Tuple[int, ...]]
    until: Optional[Tuple[int, ...]]
    note: str = ''

    def available(self, version):
        return version.in_range(self.since, self.until)

    def span(self):
        if self.since and self.until:
            return '>= %s and < %s' % (_vtext(self.since), _vtext(self.until))
        if self.since:
            return '>= %s' % _vtext(self.since)
        if self.until:
            return '< %s' % _vtext(self.until)
        return 'all supported versions'

    def describe(self):
        return '%s (%s)%s' % (self.flag, self.span(), (': ' + self.note) if self.note else '')


FLAGS = {rule.option: rule for rule in (
    FlagRule('tensor_parallel_size', '--tensor-parallel-size', None, None),
    FlagRule('max_model_len', '--max-model-len', None, None),
    FlagRule('gpu_memory_utilization', '--gpu-memory-utilization', None, None,
             'fraction of the device TOTAL memory, per instance'),
    FlagRule('max_num_seqs', '--max-num-seqs', None, None),
    FlagRule('max_num_batched_tokens', '--max-num-batched-tokens', None, None),
    FlagRule('enable_chunked_prefill', '--enable-chunked-prefill', None, None,
             'V1 forces it on; pinned anyway so the plan says what runs'),
    FlagRule('kv_cache_dtype', '--kv-cache-dtype', None, None),
    FlagRule('block_size', '--block-size', None, None),
    FlagRule('enforce_eager', '--enforce-eager', None, None),
    FlagRule('swap_space', '--swap-space', None, (0, 18, 0),
             'removed from the CLI and CacheConfig in 0.18.0; V1 never swapped to it'),
    FlagRule('kv_cache_memory_bytes', '--kv-cache-memory-bytes', (0, 10, 2), None,
             'per-GPU KV bytes; when set, gpu_memory_utilization is ignored for the budget'),
    FlagRule('max_seq_len_to_capture', '--max-seq-len-to-capture', None, (0, 11, 0)),
    FlagRule('cuda_graph_sizes', '--cuda-graph-sizes', (0, 9, 0), (0, 13, 0),
             'deprecated in 0.12.0'),
    FlagRule('max_cudagraph_capture_size', '--max-cudagraph-capture-size', (0, 12, 0), None),
    FlagRule('kv_offloading_size', '--kv-offloading-size', (0, 12, 0), None),
    FlagRule('performance_mode', '--performance-mode', (0, 17, 0), None),
)}


def flag_span(option):
    """'--swap-space (vLLM < 0.18.0)': the one text for a flag's version range."""
    return '%s (vLLM %s)' % (FLAGS[option].flag, FLAGS[option].span())


def flag_available(option, version):
    return FLAGS[option].available(version)


def render_flag(option, value=None):
    """'--flag=value' (the form GPUStack backend_parameters use) or '--flag' for switches."""
    flag = FLAGS[option].flag
    return flag if value is None else '%s=%s' % (flag, value)


# ---------------------------------------------------------------- KV cache dtypes
@dataclass(frozen=True)
class KvDtypeRule:
    name: str
    since: Optional[Tuple[int, ...]]
    bytes_per_element: Optional[int]   # None: 'auto' = the model dtype
    note: str = ''


KV_CACHE_DTYPES = {rule.name: rule for rule in (
    KvDtypeRule('auto', None, None, 'the model dtype (2 B for bf16/fp16 checkpoints, also for '
                'weight-quantized AWQ/GPTQ/FP8 models)'),
    KvDtypeRule('fp8', None, 1), KvDtypeRule('fp8_e4m3', None, 1), KvDtypeRule('fp8_e5m2', None, 1),
    KvDtypeRule('bfloat16', (0, 11, 0), 2), KvDtypeRule('float16', (0, 19, 0), 2),
)}
FP8_KV_DTYPES = ('fp8', 'fp8_e4m3', 'fp8_e5m2')
# Accepted by vLLM but not modelled here (page sizes not verified, or not CUDA).
KV_CACHE_DTYPES_NOT_MODELLED = {
    'fp8_inc': 'Intel Gaudi only',
    'fp8_ds_mla': 'DeepSeek-V3.2 sparse MLA (656 B/token/layer), not modelled',
}


def kv_cache_dtype_choices(version):
    return [name for name, rule in KV_CACHE_DTYPES.items() if rule.since is None or version.at_least(rule.since)]


def kv_cache_dtype_bytes(dtype, version, model_dtype_bytes):
    """Bytes per cached element for ``--kv-cache-dtype=dtype`` on this version."""
    rule = KV_CACHE_DTYPES.get(dtype)
    if rule is None:
        why = KV_CACHE_DTYPES_NOT_MODELLED.get(dtype, 'unknown to vLLM or sub-byte (not modelled)')
        raise PlanInputError('kv_cache_dtype', '%r: %s; use one of %s' % (
            dtype, why, ', '.join(kv_cache_dtype_choices(version))))
    if rule.since is not None and not version.at_least(rule.since):
        raise PlanInputError('kv_cache_dtype', '%r needs vLLM >= %s (got %s); choices there: %s' % (
            dtype, _vtext(rule.since), version, ', '.join(kv_cache_dtype_choices(version))))
    return model_dtype_bytes if rule.bytes_per_element is None else rule.bytes_per_element


# ---------------------------------------------------------------- defaults
# gpu_memory_utilization default: 0.9 up to 0.19.x, 0.92 from 0.20.0 (moved together with
# CUDA-graph memory being charged to the budget).
GPU_MEMORY_UTILIZATION_DEFAULTS = (((0, 20, 0), 0.92), (None, 0.9))

DEFAULT_BLOCK_SIZE = 16          # CUDA default in every supported version
MLA_BLOCK_SIZE = 64              # FlashMLA forces 64 (CUTLASS MLA 128, FlashInfer-MLA 32/64)
BLOCK_SIZE_CHOICES = (1, 8, 16, 32, 64, 128)


def default_gpu_memory_utilization(version):
    for since, value in GPU_MEMORY_UTILIZATION_DEFAULTS:
        if since is None or version.at_least(since):
            return value
    raise AssertionError('unreachable')


@dataclass(frozen=True)
class BatchDefaults:
    max_num_batched_tokens: int   # OpenAI server (vllm serve), chunked prefill on
    max_num_seqs: int
    rule: str


def batch_defaults(version, gpu_name, memory_total):
    """V1 defaults of ``vllm serve`` by device (``get_batch_defaults``, vllm/engine/arg_utils.py)."""
    name = (gpu_name or '').lower()
    big = memory_total >= 70 * GiB
    if not version.at_least((0, 9, 0)):
        cond = big
        text = '0.8.5: >= 70 GiB'
    elif not version.at_least((0, 28, 0)):
        cond = big and 'a100' not in name
        text = '0.9 - 0.27: >= 70 GiB and not A100'
    else:
        if memory_total >= 160 * GiB:
            return BatchDefaults(16384, 1024, 'vLLM %s: >= 160 GiB device -> max_num_batched_tokens '
                                 '16384, max_num_seqs 1024' % version)
        cond = big and 'a100' not in name and 'gb10' not in name
        text = '0.28+: >= 70 GiB, not A100, not GB10'
    if cond:
        return BatchDefaults(8192, 1024, 'vLLM %s default for this device (rule %s: yes) -> '
                             'max_num_batched_tokens 8192, max_num_seqs 1024' % (version, text))
    return BatchDefaults(2048, 256, 'vLLM %s default for this device (rule %s: no) -> '
                         'max_num_batched_tokens 2048, max_num_seqs 256' % (version, text))


# ---------------------------------------------------------------- accounting eras
GRAPHS_OUTSIDE = 'outside'        # captured after the KV cache: the pool lives in (1 - util)
GRAPHS_OPT_IN = 'opt_in'          # estimated, charged only with VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1
GRAPHS_INSIDE = 'inside'          # estimated and charged to the budget by default
CUDAGRAPH_ESTIMATE_ENV = 'VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS'
CUDAGRAPH_ESTIMATE_SINCE = (0, 18, 0)       # env present; default 1 from GRAPHS_INSIDE_SINCE
GRAPHS_INSIDE_SINCE = (0, 20, 0)
NCCL_IN_BASELINE_SINCE = (0, 11, 0)
CUBLAS_IN_BASELINE_SINCE = (0, 33, 0)


@dataclass(frozen=True)
class Accounting:
    """How this version's worker turns total * util into a KV budget."""
    cuda_graphs: str
    nccl_in_baseline: bool          # NCCL/distributed init before the memory snapshot
    cublas_in_baseline: bool        # cuBLAS(Lt) handles pre-created before the snapshot
    holds_null_block: bool          # BlockPool keeps one block back
    profiler_buffer_in_suggestion: bool
    capture_size_rule: str          # 'fixed_512' | 'max_num_seqs_x2'
    rules: Tuple[str, ...]


def accounting(version):
    v = version
    rules = []
    if v.at_least(GRAPHS_INSIDE_SINCE):
        graphs = GRAPHS_INSIDE
        rules.append('vLLM %s: CUDA-graph memory is estimated during profiling and charged to the '
                     'budget (%s=1 by default since 0.20.0)' % (v, CUDAGRAPH_ESTIMATE_ENV))
    elif v.at_least(CUDAGRAPH_ESTIMATE_SINCE):
        graphs = GRAPHS_OPT_IN
        rules.append('vLLM %s: CUDA graphs are captured after KV allocation (outside the budget) '
                     'unless %s=1 (default 0 in 0.18/0.19)' % (v, CUDAGRAPH_ESTIMATE_ENV))
    else:
        graphs = GRAPHS_OUTSIDE
        rules.append('vLLM %s: CUDA graphs captured after KV allocation -> their pool is outside '
                     'the budget and must fit in total x (1 - util)' % v)
    nccl_baseline = v.at_least(NCCL_IN_BASELINE_SINCE)
    rules.append('vLLM %s: NCCL/custom all-reduce buffers are %s' % (v, (
        'allocated before the memory snapshot (since 0.11.0) -> outside the budget, in the '
        '(1 - util) slack' if nccl_baseline else
        'allocated after the memory snapshot (before 0.11.0) -> charged inside the budget')))
    cublas_baseline = v.at_least(CUBLAS_IN_BASELINE_SINCE)
    if cublas_baseline:
        rules.append('vLLM %s: cuBLAS handles pre-created before the snapshot -> outside the budget' % v)
    rules.append('vLLM %s: the block pool holds one null block back from the KV cache' % v)
    if v.at_least((0, 28, 0)):
        rules.append('vLLM %s: budget = total x util - (consumed since baseline + transient peak) '
                     '- CUDA graph estimate (mem_get_info accounting, 0.27.0+)' % v)
    return Accounting(
        cuda_graphs=graphs, nccl_in_baseline=nccl_baseline, cublas_in_baseline=cublas_baseline,
        holds_null_block=True, profiler_buffer_in_suggestion=v.at_least((0, 10, 2)),
        capture_size_rule='max_num_seqs_x2' if v.at_least((0, 12, 0)) else 'fixed_512',
        rules=tuple(rules))


# MXFP4 MoE (gpt-oss): vLLM lays the expert matrices out with their 2880-wide dimension
# padded to a multiple of 256 (3072), so the experts load ~6.7 % heavier than the
# checkpoint stores them. Fitted on two log lines only (gpt-oss-20b 13.47 GiB and
# gpt-oss-120b 64.38 GiB loaded on H100, llm-d results); both land within 0.5 %.
MXFP4_EXPERT_PAD_MULTIPLE = 256
MXFP4_PAD_SOURCE_ROWS = ('llmd-h100-gpt-oss-20b-tp1', 'llmd-h100-gpt-oss-120b-tp1')

# Fitted constant -> the benchmarks/data/vllm_public.json rows ("id"s) it was read from
# (bench_accuracy_vllm.py scores them as the "fit" split; docs/data-sources.md).
FITTED_SOURCE_ROWS = {'vllm_profile.MXFP4_EXPERT_PAD_MULTIPLE': MXFP4_PAD_SOURCE_ROWS}


def mxfp4_expert_padding(expert_bytes, expert_width):
    """Extra bytes vLLM allocates for MXFP4 experts whose width is not 256-aligned."""
    if not expert_bytes or not expert_width:
        return 0
    padded = -(-expert_width // MXFP4_EXPERT_PAD_MULTIPLE) * MXFP4_EXPERT_PAD_MULTIPLE
    return expert_bytes * padded // expert_width - expert_bytes


MAX_CAPTURE_SIZE = 512


def cudagraph_capture_sizes(version, max_num_seqs, max_num_batched_tokens):
    """The decode batch sizes vLLM captures: [1, 2, 4] + multiples of 8 up to the largest.

    Largest = 512 before 0.12.0 (``cuda_graph_sizes`` default [512]); from 0.12.0
    ``min(max_num_seqs * 2, 512)`` (``_set_cudagraph_sizes``). Never above
    max_num_batched_tokens. The exact list after 256 differs by version; the count
    is what the pool model uses."""
    largest = MAX_CAPTURE_SIZE
    if accounting(version).capture_size_rule == 'max_num_seqs_x2':
        largest = min(max_num_seqs * 2, MAX_CAPTURE_SIZE)
    largest = max(1, min(largest, max_num_batched_tokens))
    return [s for s in (1, 2, 4) if s <= largest] + list(range(8, largest + 1, 8))


# ---------------------------------------------------------------- profile-run sampler path
# Which top-k/top-p code the profile run's sampler warm-up (gpu_model_runner._dummy_sampler_run:
# max_num_seqs dummy requests with top_k = vocab - 1 and top_p = 0.9, i.e. both filters on) goes
# through, read in the wheels (v1/sample/ops/topk_topp_sampler.py):
#   'sort'    (0.8.5 ... 0.16.x): forward_native -> apply_top_k_top_p, a full-vocab logits.sort.
#             0.12.0 - 0.16.0 take it always (FlashInfer sampling is opt-in, "Users must opt in
#             explicitly via VLLM_USE_FLASHINFER_SAMPLER=1"); 0.9.1 - 0.11.0 take FlashInfer instead
#             when flashinfer is installed (an optional extra of those wheels, in the docker images)
#             and VLLM_USE_FLASHINFER_SAMPLER is not 0 -- the plan cannot see the install, so it
#             takes the sort, the larger of the two.
#   'no_sort' (0.17.0 on): apply_top_k_top_p calls apply_top_k_top_p_triton for batches >= 8
#             (topk_topp_triton.py, new in 0.17.0: in place on the fp32 logits, one cached
#             [min(SMs, batch), vocab] fp32 buffer) and FlashInfer does not sort either; from 0.27.0
#             the warm-up runs FlashInfer and the native path one after the other (read in 0.17.0,
#             0.19.0, 0.27.0, 0.28.0).
# Not modelled separately (vllm_memory keeps the sort path's bytes charged from 0.17, see
# NO_SORT_ERA_RESERVE): in 0.27 and 0.28 dense (non-MoE) models default to Model Runner V2
# (config/vllm.py use_v2_model_runner; v1/worker/gpu/model_runner.py), whose profile-run sampler
# applies no top-k/top-p ("the sampler may skip top_k, top_p, and logprobs, using less GPU memory
# than what is possible during actual execution") and which keeps output_bin_counts, a
# [max_num_seqs, vocab] int32 tensor, for the whole run (v1/worker/gpu/sample/penalties.py).
SAMPLER_NO_SORT_SINCE = (0, 17, 0)
SAMPLER_TRITON_MIN_BATCH = 8


def sampler_path(version, batch):
    """'sort' or 'no_sort': the top-k/top-p path of the profile run's sampler warm-up."""
    if version is not None and version.at_least(SAMPLER_NO_SORT_SINCE) and batch >= SAMPLER_TRITON_MIN_BATCH:
        return 'no_sort'
    return 'sort'


# ---------------------------------------------------------------- MXFP4 MoE kernel (gpt-oss)
# get_mxfp4_backend (vllm/model_executor/layers/quantization/mxfp4.py in 0.10.1 - 0.11;
# fused_moe/oracle/mxfp4.py later) picks the Marlin kernel (weight-only FP4, the log says "Your GPU
# does not have native support for FP4 computation ... leveraging the Marlin kernel") when the GPU's
# compute capability is below 9.0 (Ampere A100/A6000/A10/3090, Ada L4/L40S/4090), and on Hopper
# too when torch < 2.8 (the wheels before 0.10.2; vllm#23278 logs Marlin on an H100 with 0.10.1).
# For Marlin, create_weights allocates the experts with the intermediate size per TP rank rounded
# up to 128 and the hidden size to 256 (w13 [E, 2 x I_pad, H_pad / 2], w2 [E, H_pad, I_pad / 2],
# e8m0 scales on the same padded shapes / 32; "n % 256 == 0 and k % 128 == 0"), and
# prepare_moe_fp4_layer_for_marlin repacks into the same size: gpt-oss's 2880 x 2880 experts
# become 2944 x 3072, +9.0 % (the SM90 path of the fitted rule above: +6.7 %). Shapes, not fitted.
MARLIN_MXFP4_HIDDEN_MULTIPLE = 256
MARLIN_MXFP4_INTERMEDIATE_MULTIPLE = 128
MXFP4_NATIVE_CAPABILITY = (10, 0)


def mxfp4_moe_kernel(version, capability):
    """'marlin' or 'native' (the fitted 256-wide layout above) for gpt-oss MXFP4 experts.

    Below 9.0: Marlin, always. Hopper (9.x): Marlin with torch < 2.8 (vLLM < 0.10.2), and from
    0.10.2 whenever triton_kernels / FlashInfer are not installed -- which the plan cannot see:
    the H100 logs split both ways at the same version (llm-d 64.38 GiB native; vllm#23278 65.97 and
    vllm#27508 Marlin-sized), so Hopper is planned as Marlin, the larger layout. Blackwell (10+)
    keeps the fitted layout (its FlashInfer paths were not read). ``capability`` None (unknown)
    is planned as Marlin."""
    del version   # Marlin on every version up to Hopper (the torch-2.8 split is moot, see above)
    if capability is None or tuple(capability) < MXFP4_NATIVE_CAPABILITY:
        return 'marlin'
    return 'native'


def mxfp4_marlin_expert_padding(expert_bytes, hidden_size, intermediate_size, tp):
    """Extra bytes per TP rank Marlin allocates for MXFP4 experts of ``expert_bytes`` in the
    checkpoint (weights + scales): every expert matrix is hidden x intermediate/TP, padded to
    round_up(hidden, 256) x round_up(intermediate/TP, 128)."""
    if not expert_bytes or not hidden_size or not intermediate_size or tp < 1:
        return 0
    per_rank = intermediate_size // tp
    if not per_rank:
        return 0
    h_pad = -(-hidden_size // MARLIN_MXFP4_HIDDEN_MULTIPLE) * MARLIN_MXFP4_HIDDEN_MULTIPLE
    i_pad = -(-per_rank // MARLIN_MXFP4_INTERMEDIATE_MULTIPLE) * MARLIN_MXFP4_INTERMEDIATE_MULTIPLE
    rank_bytes = expert_bytes // tp
    return rank_bytes * h_pad * i_pad // (hidden_size * per_rank) - rank_bytes
