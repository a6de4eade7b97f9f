# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one table of vLLM version facts: flags, defaults and memory-accounting eras.

Every fact here was read in the released vLLM wheels listed in
docs/architecture.md and docs/vllm-versions.md (0.6.1 … 0.34.0). A range ``[since, until)`` uses the
first wheel where the code differs; releases between two read wheels (e.g. 0.9.0/0.9.1,
0.17.1, 0.21.0) are bracketed, and the bracket is put at the later release's first
version number. Nothing else in kvpin.fleet may hard-code a vLLM version.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional, Tuple

from ansible_collections.kvpin.fleet.plugins.module_utils.plan.plan_types import PlanInputError
from ansible_collections.kvpin.fleet.plugins.module_utils.units import GiB, ceil_div
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.fitted import Fitted, source_rows_of

# Supported: every release from the oldest one a GPUStack release pinned (gpustack 0.3.0:
# vllm = "^0.6.1") on; docs/vllm-versions.md lists what each GPUStack release pinned or shipped.
# Releases from NEWEST_READ_UNTIL on were not read: they are planned with the newest era's rules
# and the plan says so (version_warnings). Only releases older than SUPPORTED_SINCE are refused.
SUPPORTED_SINCE = (0, 6, 1)
SUPPORTED_UNTIL = None
SUPPORTED_TEXT = '0.6.1 and later (read: 0.6.1 … 0.34.x)'
OLDEST_SUPPORTED_TEXT = '0.6.1'
NEWEST_READ_UNTIL = (0, 35, 0)
NEWEST_READ_TEXT = '0.34.0'

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
        raise PlanInputError('backend_version', 'vLLM %s is older than the oldest supported release, '
                             '%s (the oldest any GPUStack release pinned: gpustack 0.3.0 '
                             'requires vllm ^0.6.1); use vLLM %s or later'
                             % (version.text, OLDEST_SUPPORTED_TEXT, OLDEST_SUPPORTED_TEXT))
    return version


def version_warnings(version):
    """Warnings a plan for this version carries: a release newer than the newest one read is
    planned with that one's rules, which it may have changed."""
    if version.in_range(None, NEWEST_READ_UNTIL):
        return []
    return ['vLLM %s is newer than the newest release whose memory accounting was read (%s): it is '
            'planned with %s\'s rules; compare the plan with the startup log ("Memory after warmup", '
            '"Available KV cache memory") before relying on it' % (
                version, NEWEST_READ_TEXT, NEWEST_READ_TEXT)]


def version_tuple_text(bound):
    """'0.9.1' for (0, 9, 1): a release bound of the tables here, as messages print it."""
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
            return '>= %s and < %s' % (version_tuple_text(self.since), version_tuple_text(self.until))
        if self.since:
            return '>= %s' % version_tuple_text(self.since)
        if self.until:
            return '< %s' % version_tuple_text(self.until)
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
    FlagRule('max_cudagraph_capture_size', '--max-cudagraph-capture-size', (0, 11, 1), None),
    FlagRule('kv_offloading_size', '--kv-offloading-size', (0, 11, 1), None),
    FlagRule('performance_mode', '--performance-mode', (0, 17, 0), None),
    FlagRule('custom_histogram_buckets', '--custom-histogram-buckets', (0, 32, 0), None,
             'JSON {family: [bounds]}; family request_tokens sets the prompt / generation length '
             'histograms (ObservabilityConfig.custom_histogram_buckets)'),
    FlagRule('enable_extensible_kv_cache', '--enable-extensible-kv-cache', (0, 34, 0), None,
             'KV sized after warm-up and graph capture from what is free; on by default on CUDA '
             'unless --kv-cache-memory-bytes is set; an error where the driver lacks VMM'),
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


def kv_bytes_pin_default(version):
    """(pin?, why): whether a plan pins its KV pool with --kv-cache-memory-bytes when the
    deployment does not say (knob pin_kv_cache_memory unset). Pinned wherever the flag exists
    (0.10.2 - 0.33): the pool is then a number in the argv, so a recycled instance (GPUStack
    recreates it from the same backend_parameters) gets the same pool even when its
    torch.compile runs cold, which a profiled budget charges as activation (vllm#54383: ~5 %
    less KV on a cold boot). Not from 0.34, whose extensible KV cache (on by default, turned off
    by the flag) sizes the pool after warm-up instead of from the profile."""
    if accounting(version).extensible_kv_default:
        return False, ('vLLM %s sizes its KV cache after warm-up (the extensible KV cache, on by '
                       'default), which %s would turn off: a recycled instance gets what is free '
                       'after its own warm-up; pin_kv_cache_memory: true gives every (re)start the '
                       'planned pool (a GPU shared with another instance)'
                       % (version, flag_span('kv_cache_memory_bytes')))
    if flag_available('kv_cache_memory_bytes', version):
        return True, ('vLLM %s has %s: the planned KV pool is pinned in bytes, so a recycled '
                      'instance gets the same pool whether its torch.compile cache is warm or '
                      'cold' % (version, flag_span('kv_cache_memory_bytes')))
    return False, ('vLLM %s has no %s: the KV pool is what total x gpu_memory_utilization leaves '
                   'after the profiled peak' % (version, flag_span('kv_cache_memory_bytes')))


# ---------------------------------------------------------------- KV cache dtypes
@dataclass(frozen=True)
class KvDtypeRule:
    name: str
    since: Optional[Tuple[int, ...]]
    bytes_per_element: Optional[int]   # None: 'auto' = the model dtype
    note: str = ''


FP8_KV_DTYPES = ('fp8', 'fp8_e4m3', 'fp8_e5m2')        # one byte per element in every version
KV_CACHE_DTYPES = {rule.name: rule for rule in (
    KvDtypeRule('auto', None, None, 'the model dtype (2 B for bf16/fp16 checkpoints, also for '
                'weight-quantized AWQ/GPTQ/FP8 models)'),
    *(KvDtypeRule(name, None, 1) for name in FP8_KV_DTYPES),
    KvDtypeRule('bfloat16', (0, 11, 0), 2), KvDtypeRule('float16', (0, 18, 0), 2),
)}
# Accepted by vLLM (CacheDType in vllm/config/cache.py) but not modelled here: page sizes with
# their scales not verified, or not CUDA. Refused with this reason rather than guessed.
_SCALED_KV = 'a sub-byte or per-token-scaled KV cache whose page size (values plus scales) is not modelled'
KV_CACHE_DTYPES_NOT_MODELLED = {
    'fp8_inc': 'Intel Gaudi only',
    'fp8_ds_mla': 'DeepSeek-V3.2 sparse MLA (656 B/token/layer), not modelled',
    'nvfp4_ds_mla': 'DeepSeek sparse MLA in NVFP4, not modelled',
    **{name: _SCALED_KV for name in (
        'nvfp4', 'nvfp4_4over6', 'turboquant_k8v4', 'turboquant_4bit_nc', 'turboquant_k3v4_nc',
        'turboquant_3bit_nc', 'octave_k3v4', 'octave_k3v3', 'octave_k3v3_compact', 'ultraquant_4bit',
        'int4_per_token_head', 'int8_per_token_head', 'fp8_per_token_head')},
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
            dtype, version_tuple_text(rule.since), version, ', '.join(kv_cache_dtype_choices(version))))
    return model_dtype_bytes if rule.bytes_per_element is None else rule.bytes_per_element


# ---------------------------------------------------------------- defaults
# gpu_memory_utilization default: 0.9 up to 0.19.x, 0.92 from 0.20.0 (moved together with
# CUDA-graph memory being charged to the budget).
GPU_MEMORY_UTILIZATION_DEFAULTS = (((0, 20, 0), 0.92), (None, 0.9))

DEFAULT_BLOCK_SIZE = 16          # CUDA default in every supported version
MLA_BLOCK_SIZE = 64              # FlashMLA forces 64 (CUTLASS MLA 128, FlashInfer-MLA 32/64)
BLOCK_SIZE_CHOICES = (1, 8, 16, 32, 64, 128)


# Default --block-size on CUDA: 16 up to 0.33 (CacheConfig.DEFAULT_BLOCK_SIZE, the V0 EngineArgs
# default), 64 from 0.34.0 (vllm/config/cache.py).
DEFAULT_BLOCK_SIZE_SINCE_0_34 = 64


def block_size_choices(version):
    """--block-size values the CLI accepts: [8, 16, 32] before 0.6.4, [8, 16, 32, 64, 128] up to
    0.8.4 (vllm/engine/arg_utils.py choices), then BLOCK_SIZE_CHOICES (1 added in 0.8.5)."""
    if not version.at_least((0, 6, 4)):
        return (8, 16, 32)
    if not version.at_least((0, 8, 5)):
        return (8, 16, 32, 64, 128)
    return BLOCK_SIZE_CHOICES


def default_block_size(version):
    """The --block-size vLLM uses on CUDA when none is given (MLA backends force their own)."""
    return DEFAULT_BLOCK_SIZE_SINCE_0_34 if version.at_least(EXTENSIBLE_KV_SINCE) else DEFAULT_BLOCK_SIZE


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
    if not version.at_least(V1_ENGINE_SINCE):
        raise ValueError('vLLM %s runs the V0 engine: its batch defaults depend on max_model_len '
                         '(v0_prefill_defaults)' % version)
    if not version.at_least((0, 8, 5)):
        # 0.8.0 - 0.8.4 _set_default_args_v1: by device NAME, H100/H200 only; max_num_seqs
        # 1024 everywhere before 0.8.4, 256 off H100/H200 in 0.8.4.
        hopper = 'h100' in name or 'h200' in name
        seqs = 1024 if hopper or not version.at_least((0, 8, 4)) else 256
        return BatchDefaults(8192 if hopper else 2048, seqs, 'vLLM %s default for this device (rule '
                             '0.8.0 - 0.8.4: name contains h100/h200: %s) -> max_num_batched_tokens '
                             '%d, max_num_seqs %d' % (version, 'yes' if hopper else 'no',
                                                      8192 if hopper else 2048, seqs))
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
# 0.8.x V1 (gpu_worker.py determine_available_memory) measured non-torch memory device-wide, like
# V0 0.6.4.x; 0.9.2 (the next read wheel) profiles from a baseline snapshot.
DEVICE_WIDE_NON_TORCH_UNTIL = (0, 9, 0)
# The V1 engine is the default from 0.8.0 (vllm/envs.py VLLM_USE_V1 default "1"; "0" in 0.6.x/0.7.x).
V1_ENGINE_SINCE = (0, 8, 0)
# Cross-attention (encoder-decoder: Whisper) on the V1 engine: vllm/v1/kv_cache_interface.py
# CrossAttentionSpec, vllm/v1/core/single_type_kv_cache_manager.py CrossAttentionManager (PR #21088,
# "[v1] Add Whisper model support (encoder-decoder)", first in 0.10.2). Before it V1 refused
# encoder-decoder models and vLLM ran them on the V0 engine (vllm/core/block_manager.py: a
# cross_block_table per sequence group, allocated from the same pool), also in 0.8.0 - 0.10.1 where
# V1 is the default: those V0 layouts are not modelled, so a cross-attention model is refused there.
CROSS_ATTENTION_SINCE = (0, 10, 2)
# V0 profilers (vllm/worker/worker.py determine_num_available_blocks), by release:
V0_FREE_DELTA = 'free_delta'              # 0.6.1 - 0.6.3.post1: init free - free after profile_run
V0_DEVICE_NON_TORCH = 'device_non_torch'  # 0.6.4.x: torch peak + (device used - torch allocated)
V0_MEMORY_PROFILING = 'memory_profiling'  # 0.6.5+: weights + torch peak increase + non-torch increase
V0_DEVICE_NON_TORCH_SINCE = (0, 6, 4)
V0_MEMORY_PROFILING_SINCE = (0, 6, 5)
# V0 block manager: admits a sequence only while 1 % of the GPU blocks stay free (watermark 0.01,
# vllm/core/block_manager*.py); there is no null block.
V0_WATERMARK_X100 = 1
# V0 chunked prefill: off unless max_model_len > 32768 (EngineArgs.create_engine_config
# use_long_context), and then not for sliding-window models; its default max_num_batched_tokens
# (SchedulerConfig) is 512 up to 0.6.4.post1, 2048 from 0.6.5; without it max(max_model_len, 2048).
V0_LONG_CONTEXT_TOKENS = 32768
V0_CHUNKED_MNBT_2048_SINCE = (0, 6, 5)
# 0.34.0: the extensible KV cache (vllm/v1/worker/extensible_kv_cache.py), on by default on CUDA
# unless --kv-cache-memory-bytes is set (vllm/config/vllm.py _resolve_extensible_kv_cache).
EXTENSIBLE_KV_SINCE = (0, 34, 0)
EXTENSIBLE_MARGIN_FLOOR_BYTES = 1 << 30          # KV_CACHE_MARGIN_FLOOR_BYTES on CUDA
EXTENSIBLE_MARGIN_FRACTION_X100 = 75             # KV_CACHE_MARGIN_FRACTION
EXTENSIBLE_NON_TORCH_RESERVE_BYTES = 1 << 29     # KV_CACHE_NON_TORCH_RESERVE_BYTES on CUDA (in the margin)
EXTENSIBLE_DEFAULT_UTILIZATION = 1.0             # CacheConfig.resolved_gpu_memory_utilization


@dataclass(frozen=True)
class Accounting:
    """How this version's worker turns total * util into a KV budget."""
    cuda_graphs: str
    nccl_in_baseline: bool          # NCCL/distributed init before the memory snapshot
    cublas_in_baseline: bool        # cuBLAS(Lt) handles pre-created before the snapshot
    holds_null_block: bool          # BlockPool keeps one block back
    profiler_buffer_in_suggestion: bool
    capture_size_rule: str          # 'fixed_512' | 'max_num_seqs_x2' | 'v0_max_num_seqs'
    rules: Tuple[str, ...]
    engine: str = 'v1'              # 'v0' before V1_ENGINE_SINCE
    v0_profiler: str = ''           # V0_FREE_DELTA | V0_DEVICE_NON_TORCH | V0_MEMORY_PROFILING
    kv_watermark_x100: int = 0      # V0: % of the blocks the block manager keeps free
    extensible_kv_default: bool = False   # 0.34+: extensible KV cache on unless KV bytes are pinned
    device_wide_non_torch: bool = False   # non-torch = device used - torch allocated: the CUDA
    #                                       context and other processes' memory count in the budget

    def held_back_blocks(self, num_blocks):
        """Blocks of a pool of ``num_blocks`` that no request can hold: V1's null block, V0's
        admission watermark (int(0.01 x blocks))."""
        if self.holds_null_block:
            return 1
        return num_blocks * self.kv_watermark_x100 // 100


def _v0_accounting(v):
    """The V0 engine (0.6.x, 0.7.x: vllm/worker/worker.py)."""
    rules = ['vLLM %s runs the V0 engine (VLLM_USE_V1 defaults to 0 before 0.8.0)' % v]
    if not v.at_least(V0_DEVICE_NON_TORCH_SINCE):
        profiler = V0_FREE_DELTA
        rules.append('vLLM %s (V0, 0.6.1 - 0.6.3.post1): KV budget = total x util - (free memory at '
                     'init - free memory after the profile run): weights, the activation peak torch '
                     'keeps cached and non-torch growth (NCCL included); it assumes no other process '
                     'changes its memory while vLLM profiles' % v)
    elif not v.at_least(V0_MEMORY_PROFILING_SINCE):
        profiler = V0_DEVICE_NON_TORCH
        rules.append('vLLM %s (V0, 0.6.4.x): KV budget = total x util - (torch peak + device-wide '
                     'used - torch allocated): memory OTHER processes hold on the GPU counts as '
                     'non-torch and comes out of this instance\'s budget' % v)
    else:
        profiler = V0_MEMORY_PROFILING
        rules.append('vLLM %s (V0, 0.6.5+ memory_profiling): KV budget = total x util - (weights + '
                     'activation peak + non-torch increase since the init snapshot)' % v)
    rules.append('vLLM %s: NCCL buffers are allocated after the init memory snapshot (V0) -> charged '
                 'inside the budget' % v)
    rules.append('vLLM %s: CUDA graphs captured after the KV cache is allocated (V0 _warm_up_model) '
                 '-> their pool is outside the budget and must fit in total x (1 - util); sizes '
                 '1, 2, 4, 8, 16 ... up to max_num_seqs rounded up to a multiple of 8' % v)
    rules.append('vLLM %s: no null block; the V0 block manager admits a sequence only while %d %% of '
                 'the KV blocks stay free (watermark)' % (v, V0_WATERMARK_X100))
    rules.append('vLLM %s: no --kv-cache-memory-bytes (%s): the KV pool cannot be pinned in bytes' % (
        v, FLAGS['kv_cache_memory_bytes'].span()))
    return Accounting(
        cuda_graphs=GRAPHS_OUTSIDE, nccl_in_baseline=False, cublas_in_baseline=False,
        holds_null_block=False, profiler_buffer_in_suggestion=False,
        capture_size_rule='v0_max_num_seqs', rules=tuple(rules), engine='v0', v0_profiler=profiler,
        kv_watermark_x100=V0_WATERMARK_X100, device_wide_non_torch=profiler == V0_DEVICE_NON_TORCH)


def accounting(version):
    v = version
    if not v.at_least(V1_ENGINE_SINCE):
        return _v0_accounting(v)
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
    if v.at_least(TOTAL_CONSUMED_SINCE):
        rules.append('vLLM %s: budget = total x util - (consumed since baseline + transient peak) '
                     '- CUDA graph estimate (mem_get_info accounting, 0.27.0+)' % v)
    device_wide = not v.at_least(DEVICE_WIDE_NON_TORCH_UNTIL)
    if device_wide:
        rules.append('vLLM %s (V1, 0.8.x): KV budget = total x util - (torch peak + device-wide used - '
                     'torch allocated): the CUDA context and memory OTHER processes hold on the GPU count '
                     'as non-torch memory inside the budget' % v)
    extensible = v.at_least(EXTENSIBLE_KV_SINCE)
    if extensible:
        rules.append('vLLM %s: the extensible KV cache is on by default on CUDA: KV = min(total x util '
                     '- what the engine holds after warm-up and graph capture, free memory then - '
                     'margin max(1 GiB, 0.75 x transient peak)) - transient peak; util defaults to '
                     '1.0 and the startup free-memory check is skipped; --kv-cache-memory-bytes '
                     'turns it off (util default 0.92 then, check back)' % v)
    return Accounting(
        cuda_graphs=graphs, nccl_in_baseline=nccl_baseline, cublas_in_baseline=cublas_baseline,
        holds_null_block=True, profiler_buffer_in_suggestion=v.at_least((0, 10, 2)),
        capture_size_rule='max_num_seqs_x2' if v.at_least((0, 12, 0)) else 'fixed_512',
        rules=tuple(rules), extensible_kv_default=extensible, device_wide_non_torch=device_wide)


# ---------------------------------------------------------------- Model Runner V2 (0.25 - 0.34)
# Which GPU model runner a release runs for a model, and what that runner charges before KV
# sizing (docs/vllm-versions.md, "Model Runner V2"; read in the released wheels):
#   V1 vllm/v1/worker/gpu_model_runner.py: every model up to 0.24.x (0.24.0 vllm/config/vllm.py
#      :550-561 lists only some architectures, no dense default); the V1 terms of vllm_memory.
#   V2 vllm/v1/worker/gpu/model_runner.py: from 0.25 every dense (non-MoE, non-hybrid) model
#      (0.25.1 vllm/config/vllm.py:557-574 `... or not model_config.is_moe`; 0.27.1 :637-658
#      `_is_default_v2_model_runner_model`: `is_default_v2_architecture or not
#      model_config.is_moe`, hybrid and attention-free models stay V1), from 0.29 every model
#      (0.29.0 vllm/config/vllm.py:645-677). VLLM_USE_V2_MODEL_RUNNER=1/0 in the engine
#      environment forces it either way (0.27.1 vllm/config/vllm.py:579-581 reads it first;
#      vllm/envs.py:1954-1955).
# V2 before KV sizing, per release:
#   0.25 - 0.28: no CUDA-graph estimate (profile_cudagraph_memory returns 0: 0.25.1
#      gpu/model_runner.py:680-682, 0.27.1 :749-751, 0.28.0 :843-845); graphs are captured after
#      the KV cache, outside the budget, as in 0.17 and earlier.
#   0.29+: a throwaway capture estimate, charged (0.29.0 gpu/cudagraph_utils.py:718).
#   0.25 - 0.32: the profile run's sampler warm-up is greedy (dummy requests temperature 0,
#      top_k = vocab, top_p = 1: 0.27.1 gpu/sample/states.py:22-35), so no fp32 copy, no
#      top-k/top-p: one [R, vocab] logits tensor in the model dtype. 0.33 adds a warm-up pass with
#      top-k 50, top-p 0.9, min-p, penalties and logprobs (0.33.0 gpu/model_runner.py:993-1014).
#   0.27+: the budget formula counts total_consumed (the drop in free memory: the runner's
#      persistent buffers and allocator segments empty_cache() cannot release) + the transient
#      peak (0.27.1 vllm/utils/mem_utils.py:314-326, PR #37111); 0.25 - 0.26 keep weights + torch
#      peak increase + non-torch increase.
#   0.31+: an allocator split limit around the profile run (0.31.0 gpu_worker.py:624, 0.33.0
#      :686-700) keeps a freed multi-GiB block from being pinned by a later small allocation.
V2_RUNNER_ENV = 'VLLM_USE_V2_MODEL_RUNNER'
V2_RUNNER_DENSE_SINCE = (0, 25, 0)
V2_RUNNER_ALL_SINCE = (0, 29, 0)
V2_GRAPH_ESTIMATE_SINCE = (0, 29, 0)
TOTAL_CONSUMED_SINCE = (0, 27, 0)
PROFILE_SPLIT_LIMIT_SINCE = (0, 31, 0)
V2_WARMUP_PARAMS_SINCE = (0, 33, 0)
RUNNER_V1 = 'v1'
RUNNER_V2 = 'v2'
# Architectures that default to V2 in 0.25 - 0.28 even when MoE (DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES:
# 0.25.1 vllm/config/vllm.py:68-74; 0.27.1 :69-79 adds the others; 0.26 is bracketed with 0.25).
V2_DEFAULT_ARCHITECTURES = (
    ((0, 27, 0), frozenset({'DeepseekV2ForCausalLM', 'GraniteMoeForCausalLM', 'InklingForCausalLM',
                            'InklingForConditionalGeneration', 'KimiK3ForConditionalGeneration',
                            'LongcatFlashNgramForCausalLM', 'Qwen2MoeForCausalLM'})),
    ((0, 25, 0), frozenset({'DeepseekV2ForCausalLM', 'Qwen2MoeForCausalLM', 'GraniteMoeForCausalLM'})),
)


def _env_flag(value):
    """VLLM_USE_V2_MODEL_RUNNER as vLLM reads it (envs.maybe_convert_bool): None unset, else
    True for "1"/"true", False for "0"/"false"; anything else PlanInputError naming it."""
    if value is None:
        return None
    text = str(value).strip().lower()
    if text in ('1', 'true'):
        return True
    if text in ('0', 'false'):
        return False
    raise PlanInputError(V2_RUNNER_ENV, 'must be 1 or 0 (true / false), got %r' % (value,))


def _v2_default_architecture(version, architecture):
    for since, names in V2_DEFAULT_ARCHITECTURES:
        if version.at_least(since):
            return architecture in names
    return False


def model_runner(version, is_moe, is_hybrid, env=None, architecture=None):
    """(RUNNER_V1 | RUNNER_V2, reason): the GPU model runner vLLM ``version`` runs for a model;
    ``env`` is the engine environment the plan sets (VLLM_USE_V2_MODEL_RUNNER honoured);
    ``architecture`` the HF architecture (a few MoE ones default to V2 from 0.25)."""
    forced = _env_flag((env or {}).get(V2_RUNNER_ENV))
    if not version.at_least(V1_ENGINE_SINCE):
        return RUNNER_V1, 'vLLM %s runs the V0 engine' % version
    if forced is not None and version.at_least(V2_RUNNER_DENSE_SINCE):
        return (RUNNER_V2 if forced else RUNNER_V1), ('%s=%d in the engine environment' % (
            V2_RUNNER_ENV, 1 if forced else 0))
    if version.at_least(V2_RUNNER_ALL_SINCE):
        return RUNNER_V2, 'vLLM %s runs Model Runner V2 for every model (from 0.29.0)' % version
    if version.at_least(V2_RUNNER_DENSE_SINCE):
        listed = _v2_default_architecture(version, architecture)
        # 0.25 - 0.26: hybrid models stay V1 even when listed; 0.27 - 0.28: listed ones run V2
        if listed and not (is_hybrid and not version.at_least(TOTAL_CONSUMED_SINCE)):
            return RUNNER_V2, ('vLLM %s runs Model Runner V2 for %s (a default-V2 architecture)' % (
                version, architecture))
        if is_moe or is_hybrid:
            return RUNNER_V1, ('vLLM %s runs Model Runner V2 only for dense models (0.25 - 0.28); this '
                               'one is %s: V1 runner' % (version, 'MoE' if is_moe else 'hybrid'))
        return RUNNER_V2, 'vLLM %s runs Model Runner V2 for dense (non-MoE) models (0.25 - 0.28)' % version
    return RUNNER_V1, 'vLLM %s runs the V1 model runner (V2 is the default from 0.25 for dense models)' % version


def v2_charges_graphs(version):
    """Whether Model Runner V2 of ``version`` charges a CUDA-graph estimate before KV sizing."""
    return version.at_least(V2_GRAPH_ESTIMATE_SINCE)


def counts_total_consumed(version):
    """0.27+: non-KV = total_consumed + transient peak (persistent buffers and pinned segments count)."""
    return version.at_least(TOTAL_CONSUMED_SINCE)


def profile_split_limit(version):
    """0.31+: the allocator split limit around the profile run (no pinned compile segments)."""
    return version.at_least(PROFILE_SPLIT_LIMIT_SINCE)


# MXFP4 MoE (gpt-oss): vLLM lays the expert matrices out with their 2880-wide dimension
# padded to a multiple of 256 (3072), so the experts load ~6.7 % heavier than the
# checkpoint stores them. Fitted on two log lines only (gpt-oss-20b 13.47 GiB and
# gpt-oss-120b 64.38 GiB loaded on H100, llm-d results); both land within 0.5 %.
MXFP4_EXPERT_PAD_MULTIPLE = 256
MXFP4_PAD_SOURCE_ROWS = ('llmd-h100-gpt-oss-20b-tp1', 'llmd-h100-gpt-oss-120b-tp1')

# Fitted constant -> the benchmarks/data/vllm_public.json rows ("id"s) it was read from
# (bench_accuracy_vllm.py scores them as the "fit" split; docs/data-sources.md).
MXFP4_EXPERT_PAD = Fitted(
    'vllm_profile.MXFP4_EXPERT_PAD_MULTIPLE', MXFP4_EXPERT_PAD_MULTIPLE, '{}-wide expert padding',
    'the gpt-oss-20b and gpt-oss-120b weights loaded on H100, llm-d', MXFP4_PAD_SOURCE_ROWS)


def mxfp4_expert_padding(expert_bytes, expert_width):
    """Extra bytes vLLM allocates for MXFP4 experts whose width is not 256-aligned."""
    if not expert_bytes or not expert_width:
        return 0
    padded = ceil_div(expert_width, MXFP4_EXPERT_PAD_MULTIPLE) * MXFP4_EXPERT_PAD_MULTIPLE
    return expert_bytes * padded // expert_width - expert_bytes


MAX_CAPTURE_SIZE = 512


def cudagraph_capture_sizes(version, max_num_seqs, max_num_batched_tokens):
    """The decode batch sizes vLLM captures: [1, 2, 4] + multiples of 8 up to the largest.

    Largest = 512 before 0.12.0; from 0.12.0 ``min(max_num_seqs * 2, 512)``
    (``_set_cudagraph_sizes``). Never above max_num_batched_tokens. The exact list after 256
    differs by version; the count is what the pool model uses.

    vLLM itself defaults to ``min(max_num_seqs * 2, 512)`` from 0.10.0 (SchedulerConfig,
    vllm/config.py:2455 at v0.10.0; ``[512]`` at v0.9.2, vllm/config.py:2133). 0.10.0 - 0.11.2
    are still planned with 512: more graph memory than those releases capture below
    max_num_seqs 256 (the safe side); moving them needs their plans re-validated."""
    largest = MAX_CAPTURE_SIZE
    if accounting(version).capture_size_rule == 'max_num_seqs_x2':
        largest = min(max_num_seqs * 2, MAX_CAPTURE_SIZE)
    elif accounting(version).capture_size_rule == 'v0_max_num_seqs':
        # V0 (_get_max_graph_batch_size): max_num_seqs padded to 1, 2, 4 or a multiple of 8
        largest = max_num_seqs if max_num_seqs <= 2 else 4 if max_num_seqs <= 4 else ceil_div(max_num_seqs, 8) * 8
    largest = max(1, min(largest, max_num_batched_tokens))
    return [s for s in (1, 2, 4) if s <= largest] + list(range(8, largest + 1, 8))


# ---------------------------------------------------------------- V0 prefill, 0.34 extensible KV
@dataclass(frozen=True)
class V0Prefill:
    chunked_prefill: bool
    max_num_batched_tokens: int
    rule: str


def v0_prefill_defaults(version, max_model_len, has_sliding_window, user_max_num_batched_tokens=None):
    """What V0 runs for this max_model_len: chunked prefill on only above 32k tokens (and not
    for sliding-window models), else max_num_batched_tokens = max(max_model_len, 2048), so the
    profile run's forward pass covers a whole max_model_len prompt. A user max_num_batched_tokens
    below max_model_len needs chunked prefill (V0 refuses it otherwise)."""
    chunked_mnbt = 2048 if version.at_least(V0_CHUNKED_MNBT_2048_SINCE) else 512
    long_context = max_model_len > V0_LONG_CONTEXT_TOKENS
    user = user_max_num_batched_tokens
    if user is not None and user < max_model_len:
        return V0Prefill(True, user, 'vLLM %s (V0): max_num_batched_tokens %d < max_model_len %d '
                         'needs chunked prefill (V0 refuses it without) -> on' % (version, user, max_model_len))
    if long_context and not has_sliding_window:
        return V0Prefill(True, user or chunked_mnbt, 'vLLM %s (V0) default: chunked prefill on because '
                         'max_model_len %d > %d (use_long_context), max_num_batched_tokens %d; pinned '
                         'so the profiled activation peak is the one that runs' % (
                             version, max_model_len, V0_LONG_CONTEXT_TOKENS, user or chunked_mnbt))
    mnbt = user or max(max_model_len, 2048)
    why = ('max_model_len %d <= %d' % (max_model_len, V0_LONG_CONTEXT_TOKENS) if not long_context
           else 'sliding-window model (V0 does not chunk those by default)')
    return V0Prefill(False, mnbt, 'vLLM %s (V0) default: chunked prefill off (%s) -> '
                     'max_num_batched_tokens = max(max_model_len, 2048) = %d: the profile run pushes a '
                     'whole max_model_len prompt through the model, so the activation peak grows '
                     'with max_model_len; pinned off so the plan is what runs' % (version, why, mnbt))


def extensible_kv_bytes(requested, consumed, headroom, transient_peak):
    """vLLM 0.34 measure_kv_cache_bytes: the KV bytes the extensible cache commits.

    requested = ceil(total x util); consumed = what the engine holds after warm-up and graph
    capture besides the KV (weights, graph pool, workspaces); headroom = free memory then
    (+ any KV already committed); transient_peak = the larger of the profiled activation peak
    (+ the CUDA graph estimate) and the warm-up peaks. Returns (kv_bytes, margin)."""
    margin = max(EXTENSIBLE_MARGIN_FLOOR_BYTES, transient_peak * EXTENSIBLE_MARGIN_FRACTION_X100 // 100)
    available = min(requested - consumed, headroom - margin) - transient_peak
    return max(available, 0), margin


# ---------------------------------------------------------------- pipeline parallelism
# --pipeline-parallel-size (vllm/engine/arg_utils.py) is in every supported release. Before
# 0.9.1 a plain `vllm serve -pp N` (no --distributed-executor-backend) made the V1 oracle fall
# back to the V0 engine: vllm PR #18915 added the default backend to the V1 list, merged
# 2025-05-30, after 0.9.0 was out, so first in 0.9.1. This planner models V1 only.
FLAGS['pipeline_parallel_size'] = FlagRule(
    'pipeline_parallel_size', '--pipeline-parallel-size', None, None,
    'V1 engine with the default executor from 0.9.1 (V0 fallback before)')
PIPELINE_V1_SINCE = (0, 9, 1)
# VLLM_PP_LAYER_PARTITION (vllm/envs.py; read by get_pp_indices in vllm/distributed/utils.py):
# comma-separated layers per stage; vLLM checks only the count (== pp) and the sum
# (== num_hidden_layers). Without it, layers // pp per stage and the remainder r goes one each
# to partitions[-2], [-3], ... [-(r + 1)] (vllm PR #13839, in every release since 0.8.0): never
# to the last stage, and not to the first unless r == pp - 1.
PP_LAYER_PARTITION_ENV = 'VLLM_PP_LAYER_PARTITION'
# CUDA numbers devices fastest first unless CUDA_DEVICE_ORDER=PCI_BUS_ID (CUDA C Programming
# Guide, environment variables); NVML indexes are in PCI bus order.
CUDA_DEVICE_ORDER_ENV = 'CUDA_DEVICE_ORDER'
CUDA_DEVICE_ORDER_PCI = 'PCI_BUS_ID'
PP_REMAINDER_RULE = ('layers // pp per stage; the remainder r goes one layer each to stages '
                     'pp-2, pp-3, ... pp-1-r (never the last: vllm PR #13839, vLLM >= 0.8.0)')


def pipeline_supported(version):
    """True when ``vllm serve --pipeline-parallel-size N`` runs the V1 engine at ``version``."""
    return version.at_least(PIPELINE_V1_SINCE)


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
# From this release vllm_memory charges activation_unexplained_reserve (the policy guard
# NO_SORT_ERA_RESERVE there) on the no-sort path. Not from 0.17.0: ten RTX 3090 runs of 0.17.1
# (TheBuccaneer/vllm-offload-profiles, Llama-3.1-8B and Qwen2.5-7B at util 0.60-0.90) log
# 0.06-0.14 GiB MORE KV than the no-sort shapes alone predict, i.e. nothing unexplained there;
# the unexplained memory is first logged by 0.19.0 (gpt-oss-20b on an A100); 0.18.x has no log,
# so it keeps the guard (the side that does not crash).
NO_SORT_ERA_RESERVE_SINCE_MINOR = 18
NO_SORT_ERA_RESERVE_SINCE = (0, NO_SORT_ERA_RESERVE_SINCE_MINOR, 0)
NO_SORT_ERA_RESERVE_START = Fitted(
    'vllm_profile.NO_SORT_ERA_RESERVE_SINCE_MINOR', NO_SORT_ERA_RESERVE_SINCE_MINOR, 'vLLM 0.{}',
    'ten vLLM 0.17.1 RTX 3090 runs that need no reserve (the first release it applies from)',
    ('buccaneer-rtx3090-llama-3.1-8b-tp1-u090', 'buccaneer-rtx3090-qwen2.5-7b-tp1-u090',
     'buccaneer-rtx3090-llama-3.1-8b-tp1-u090-fixd-fail', 'buccaneer-rtx3090-llama-3.1-8b-tp1-u086',
     'buccaneer-rtx3090-qwen2.5-7b-tp1-u086', 'buccaneer-rtx3090-llama-3.1-8b-tp1-u075',
     'buccaneer-rtx3090-llama-3.1-8b-tp1-u070-fail', 'buccaneer-rtx3090-qwen2.5-7b-tp1-u065',
     'buccaneer-rtx3090-qwen2.5-7b-tp1-u065-fail', 'buccaneer-rtx3090-qwen2.5-7b-tp1-u060-fail'))
SAMPLER_TRITON_MIN_BATCH = 8
# The serving_plan knob vllm_sampler: which top-k/top-p sampler the operator knows the engine
# runs. The plan cannot see whether the image ships FlashInfer (an optional extra of the wheels,
# in the docker images), so unset it charges the PyTorch sort path, the larger warm-up.
#   'flashinfer': TopKTopPSampler.forward_cuda -> flashinfer_sample: with both filters on (the
#     warm-up's) flashinfer.sampling.top_k_top_p_sampling_from_logits, top_k_mask_logits (fp32
#     masked logits) then softmax (fp32 probs), no sort. 0.9.1 - 0.11.x take it when flashinfer
#     (>= 0.2.3) imports and VLLM_USE_FLASHINFER_SAMPLER is not 0 ("envs.VLLM_USE_FLASHINFER_SAMPLER
#     is not False ... in V1, None means True"); 0.12.0 on only with VLLM_USE_FLASHINFER_SAMPLER=1
#     ("Users must opt in explicitly via VLLM_USE_FLASHINFER_SAMPLER=1"). The plan sets it to 1.
#     The variable cannot make an image without flashinfer take it: 0.9.1 - 0.11.x then fall back
#     to the sort path without an error, so the knob is the operator's statement about the image
#     (its engine log prints "Using FlashInfer for top-p & top-k sampling."), not something the
#     plan can check -- which is why unset charges the sort path.
#   'pytorch': forward_native; the plan sets VLLM_USE_FLASHINFER_SAMPLER=0 so that an image with
#     flashinfer takes it too (0.9.1 - 0.11.x would otherwise take FlashInfer).
# From 0.17 (batches >= SAMPLER_TRITON_MIN_BATCH) neither path sorts: the charge does not change.
# Before 0.9.1 the warm-up is not read here: 'flashinfer' is refused there.
SAMPLER_KNOB = 'vllm_sampler'
SAMPLER_PYTORCH = 'pytorch'
SAMPLER_FLASHINFER = 'flashinfer'
SAMPLER_CHOICES = (SAMPLER_PYTORCH, SAMPLER_FLASHINFER)
FLASHINFER_SAMPLER_ENV = 'VLLM_USE_FLASHINFER_SAMPLER'
FLASHINFER_SAMPLER_SINCE = (0, 9, 1)
FLASHINFER_SAMPLER_OPT_IN_SINCE = (0, 12, 0)


# The serving_plan knob vllm_image: the container image the deployment's vLLM engine runs. It
# decides the default of vllm_sampler where vLLM takes FlashInfer by itself when it is installed
# (0.9.1 - 0.11.x), from what the image's build files are known to install:
#   vllm/vllm-openai (every tag from v0.5.1): docker/Dockerfile installs FlashInfer (vllm PR #6172,
#     https://github.com/vllm-project/vllm/pull/6172, "The docker image for vllm/vllm-openai:latest and
#     v0.5.1 has been built"; docker/versions.json FLASHINFER_VERSION), and the 0.9-era image logs
#     "Using FlashInfer for top-p & top-k sampling." (https://github.com/flashinfer-ai/flashinfer/issues/1180);
#   gpustack/runner CUDA vLLM images: pack/cuda/Dockerfile builds a FlashInfer wheel in its
#     vllm-build-flashinfer stage and installs it in the vllm stage, on amd64 only ("Skipping
#     FlashInfer building for ${TARGETARCH}"; https://github.com/gpustack/runner, pack/cuda/Dockerfile):
#     counted only for a tag that names amd64, since the plan cannot see the node's architecture;
#   gpustack/gpustack (the 0.7-era image that runs vLLM in the server's environment): no FlashInfer
#     ("FlashInfer still unavailable", https://github.com/gpustack/gpustack/issues/1955).
# Anything else is unknown and keeps the safe side (the sort path).
IMAGE_KNOB = 'vllm_image'
IMAGE_MAX_LENGTH = 512
_IMAGE_RE = re.compile(r'^[A-Za-z0-9][A-Za-z0-9._/:@+-]*$')
IMAGE_FLASHINFER = 'flashinfer'
IMAGE_NO_FLASHINFER = 'no_flashinfer'


def check_image(value):
    """The vllm_image knob, checked: None or an image reference ([registry/]repo[:tag][@digest]);
    else PlanInputError('vllm_image', ...)."""
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip() or len(value) > IMAGE_MAX_LENGTH \
            or not _IMAGE_RE.match(value.strip()):
        raise PlanInputError(IMAGE_KNOB, 'must be a container image reference such as '
                             '"vllm/vllm-openai:v0.11.0" (at most %d characters), got %r' % (
                                 IMAGE_MAX_LENGTH, value if not isinstance(value, str) else value[:80]))
    return value.strip()


def image_flashinfer(image):
    """(IMAGE_FLASHINFER | IMAGE_NO_FLASHINFER | None, evidence): whether the image is known to
    carry FlashInfer, and from which build file or report."""
    if not image:
        return None, 'no vllm_image given'
    ref = image.split('@', 1)[0]
    repo, _sep, tag = ref.rpartition(':') if ':' in ref.rsplit('/', 1)[-1] else (ref, '', '')
    repo = repo.lower()
    for prefix in ('docker.io/', 'index.docker.io/', 'registry-1.docker.io/'):
        if repo.startswith(prefix):
            repo = repo[len(prefix):]
    if repo == 'vllm/vllm-openai':
        return IMAGE_FLASHINFER, ('%s: vllm/vllm-openai images install FlashInfer (docker/Dockerfile, vllm PR '
                                  '#6172, from v0.5.1)' % image)
    if repo == 'gpustack/runner' and 'vllm' in tag.lower():
        if 'amd64' in tag.lower():
            return IMAGE_FLASHINFER, ('%s: gpustack/runner builds FlashInfer into its CUDA vLLM images on amd64 '
                                      '(pack/cuda/Dockerfile, vllm-build-flashinfer stage)' % image)
        return None, ('%s: gpustack/runner installs FlashInfer on amd64 only and the tag does not name the '
                      'architecture' % image)
    if repo == 'gpustack/gpustack':
        return IMAGE_NO_FLASHINFER, ('%s: the GPUStack server image does not install FlashInfer '
                                     '(gpustack/gpustack#1955)' % image)
    return None, '%s: no build file of this image was read' % image


def default_sampler(version, image):
    """(sampler or None, evidence): the vllm_sampler an unset knob stands for. FlashInfer only where
    the image is known to carry it and vLLM takes it by itself (0.9.1 - 0.11.x); else None (the
    sort path where the version sorts: the safe side)."""
    carries, evidence = image_flashinfer(image)
    if carries == IMAGE_FLASHINFER and version.in_range(FLASHINFER_SAMPLER_SINCE, FLASHINFER_SAMPLER_OPT_IN_SINCE):
        return SAMPLER_FLASHINFER, evidence
    return None, evidence


def check_sampler(value, version):
    """The vllm_sampler knob, checked: None (unset), 'pytorch' or 'flashinfer'; else
    PlanInputError('vllm_sampler', ...)."""
    if value is None:
        return None
    if not isinstance(value, str) or value not in SAMPLER_CHOICES:
        raise PlanInputError(SAMPLER_KNOB, 'must be one of %s, got %r' % (', '.join(SAMPLER_CHOICES), value))
    if value == SAMPLER_FLASHINFER and not version.at_least(FLASHINFER_SAMPLER_SINCE):
        raise PlanInputError(SAMPLER_KNOB, '%s is modelled from vLLM %s (the V1 sampler warm-up read '
                             'there), got %s; leave it unset' % (
                                 value, version_tuple_text(FLASHINFER_SAMPLER_SINCE), version))
    return value


def sampler_env(value, version):
    """{VLLM_USE_FLASHINFER_SAMPLER: '1' | '0'} for a set knob on a V1 release that reads it, else {}."""
    if value is None or not version.at_least(FLASHINFER_SAMPLER_SINCE):
        return {}
    return {FLASHINFER_SAMPLER_ENV: '1' if value == SAMPLER_FLASHINFER else '0'}


def sampler_path(version, batch, sampler=None):
    """'sort', 'flashinfer' or 'no_sort': the top-k/top-p path of the profile run's sampler
    warm-up; ``sampler`` is the checked vllm_sampler knob (None: unset, the sort path)."""
    if version is not None and version.at_least(SAMPLER_NO_SORT_SINCE) and batch >= SAMPLER_TRITON_MIN_BATCH:
        return 'no_sort'
    if sampler == SAMPLER_FLASHINFER and version is not None and version.at_least(FLASHINFER_SAMPLER_SINCE):
        return 'flashinfer'
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
    h_pad = ceil_div(hidden_size, MARLIN_MXFP4_HIDDEN_MULTIPLE) * MARLIN_MXFP4_HIDDEN_MULTIPLE
    i_pad = ceil_div(per_rank, MARLIN_MXFP4_INTERMEDIATE_MULTIPLE) * MARLIN_MXFP4_INTERMEDIATE_MULTIPLE
    rank_bytes = expert_bytes // tp
    return rank_bytes * h_pad * i_pad // (hidden_size * per_rank) - rank_bytes


# Below NO_SORT_ERA_RESERVE_START, which is defined after MXFP4_EXPERT_PAD.
FITTED_SOURCE_ROWS = source_rows_of(MXFP4_EXPERT_PAD, NO_SORT_ERA_RESERVE_START)
