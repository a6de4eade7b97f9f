# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one table of llama-box / llama.cpp version facts: flag spellings, defaults, the
layer placement rule, flash-attention and KV padding rules, and ``-np`` semantics.

Sources (docs/architecture.md, "llama-box / llama.cpp"):

* llama-box: gpustack/llama-box snapshot 4d068484 (2025-11-24); its llama.cpp submodule is
  a mid-2025 build (``patches/llama.cpp/context.patch`` still patches a bool
  ``flash_attn``). Every llama-box release is planned with the mid-2025 rules ("L-2025").
* llama.cpp ``llama-server``: version = release build number ``bNNNN``. Boundaries:

  - ``--flash-attn on|off|auto`` replaced the ``-fa`` switch (ggml-org/llama.cpp#15434);
    first build seen with it: b6327 (mybigday/llama.node#102, 2025-08-31: "Deprecate
    flash_attn and introduce flash_attn_type (auto|on|off)").
  - Output layer offloaded first (ggml-org/llama.cpp#18148, merged 2025-12-17). b7347
    (2025-12-10, node-llama-cpp 3.14.5) predates it; b7710 (xorbitsai/xllamacpp#109,
    January 2026) has it. Builds in between are planned with the new rule and a warning.
  - KV cells padded to 256 whatever flash attention is: the 2025-12-03 logs in
    ggml-org/llama.cpp#17715 show the same 402 MiB KV with ``-fa 0`` and ``-fa 1`` for
    gpt-oss-20b, which only 256-padding of the SWA cells explains. First build not pinned
    down; from b7250 (about that date) the 256 rule is used, before it the L-2025 rule
    (256 with flash attention, 32 without; ``get_padding``).
  - ``-fit, --fit [on|off]``, default ``on`` ("whether to adjust unset arguments to fit in
    device memory", common/arg.cpp; margin ``--fit-target`` 1024 MiB per device): added by
    ggml-org/llama.cpp#16653 ("llama: automatically set parameters not set by the user in
    such a way that maximizes GPU utilization"), still under review on 2025-12-10 (the review
    that asked for the "use -fit off" hint its merged log line carries), so b7347 (2025-12-10)
    predates it; b7445 has it on by default (its llama-server log: "common_init_result: fitting
    params to device memory, to report bugs during this step use -fit off"). From b7445
    ``--fit off`` is pinned; builds in between are planned without it and warned about (an
    unknown flag stops llama-server at start, so none is emitted where it may not exist).

Nothing else in kvpin.fleet may hard-code a llama-box / llama.cpp version or flag.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from ansible_collections.kvpin.fleet.plugins.module_utils.plan.fitted import Fitted, source_rows_of
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.plan_types import PlanInputError

ENGINE_LLAMA_BOX = 'llama-box'
ENGINE_LLAMA_CPP = 'llama.cpp'
ENGINES = (ENGINE_LLAMA_BOX, ENGINE_LLAMA_CPP)

GENERATION_2025 = 'L-2025'   # mid-2025 llama.cpp (llama-box's pin, llama-cpp-python 0.3.16)
GENERATION_NEW = 'L-new'     # llama.cpp after PR #18148 (output layer first)

# ---------------------------------------------------------------- version boundaries
# (build numbers of ggml-org/llama.cpp releases; one place for each boundary)
FLASH_ATTN_TRISTATE_FROM_BUILD = 6327
OUTPUT_FIRST_LAST_BUILD_WITHOUT = 7347
OUTPUT_FIRST_FIRST_BUILD_WITH = 7710
KV_PAD_ALWAYS_256_FROM_BUILD = 7250
FIT_LAST_BUILD_WITHOUT = 7347
FIT_FIRST_BUILD_WITH = 7445
# The 256 rule was read off the KV buffers of the two llama.cpp#17715 rows of
# benchmarks/data/llamacpp_public.json (402 MiB with -fa 0 and -fa 1; docstring above).
KV_PAD_SOURCE_ROWS = ('llamacpp-17715-gpt-oss-20b-fa1', 'llamacpp-17715-gpt-oss-20b-fa0')
KV_PAD_ALWAYS_256 = Fitted(
    'llamacpp_profile.KV_PAD_ALWAYS_256_FROM_BUILD', KV_PAD_ALWAYS_256_FROM_BUILD,
    'the always-256 KV padding from build {}',
    'the KV buffers of the two llama.cpp#17715 rows (402 MiB with -fa 0 and -fa 1)', KV_PAD_SOURCE_ROWS)
FITTED_SOURCE_ROWS = source_rows_of(KV_PAD_ALWAYS_256)

# llama-box versions whose pinned llama.cpp was read: all of them use the
# L-2025 rules (the project is unmaintained since 2025-11; GPUStack 0.7.1 shipped v0.0.171).
LLAMA_BOX_KNOWN_NEWEST = (0, 0, 171)

# ---------------------------------------------------------------- KV cache types
# Types accepted by -ctk/-ctv (llama-box README; llama.cpp common/arg.cpp kv_cache_types).
# Bytes per value come from GGML_QUANT_SIZES (llamacpp_memory.ggml_type_size).
CACHE_TYPES = ('f32', 'f16', 'bf16', 'q8_0', 'q4_0', 'q4_1', 'iq4_nl', 'q5_0', 'q5_1')
CACHE_TYPE_DEFAULT = 'f16'

# ---------------------------------------------------------------- defaults (both engines)
DEFAULT_UBATCH = 512      # -ub (llama-box README; llama.cpp common.h n_ubatch)
DEFAULT_BATCH = 2048      # -b
# ggml-cuda offloads an op on host weights to the GPU when its batch is >= 32 tokens
# (ggml_backend_cuda_device_offload_op, min_batch_size = 32).
CUDA_OFFLOAD_MIN_BATCH = 32
# Scheduler copies of the graph inputs when every layer is on GPUs across >1 device with
# layer split and KV offload (GGML_SCHED_MAX_COPIES, llama-context.cpp:255-285).
PIPELINE_PARALLEL_COPIES = 4

# ---------------------------------------------------------------- flag spellings
# Separate argv tokens for both engines: llama-server matches whole argv tokens and does
# not accept "--flag=value" (gpustack/gpustack#3537, GPUStack 2.0); GPUStack 0.7 launches
# llama-box with separate tokens ("--gpu-layers 42"), so the same form is used there.
FLAGS_LLAMA_BOX = {
    'gpu_layers': '--gpu-layers',
    'ctx_size': '--ctx-size',
    'parallel': '--parallel',          # deprecated alias of --threads-http: sets the slots
    'batch_size': '--batch-size',
    'ubatch_size': '--ubatch-size',
    'cache_type_k': '--cache-type-k',
    'cache_type_v': '--cache-type-v',
    'flash_attn_on': '--flash-attn',
    'flash_attn_off': '--no-flash-attn',
    'tensor_split': '--tensor-split',
    'split_mode': '--split-mode',
    'no_mmap': '--no-mmap',
    'no_kv_offload': '--no-kv-offload',
    'metrics': '--metrics',             # /metrics endpoint, off by default (engine_param.hpp / common.h)
    'fit': None,                        # llama-box has no --fit
}
FLAGS_LLAMA_CPP = {
    'gpu_layers': '--n-gpu-layers',
    'ctx_size': '--ctx-size',
    'parallel': '--parallel',
    'batch_size': '--batch-size',
    'ubatch_size': '--ubatch-size',
    'cache_type_k': '--cache-type-k',
    'cache_type_v': '--cache-type-v',
    'flash_attn_on': '--flash-attn',    # a switch before b6327; takes on|off|auto from b6327
    'flash_attn_off': None,             # before b6327 "off" is the absence of the switch
    'tensor_split': '--tensor-split',
    'split_mode': '--split-mode',
    'no_mmap': '--no-mmap',
    'no_kv_offload': '--no-kv-offload',
    'metrics': '--metrics',             # /metrics endpoint, off by default (engine_param.hpp / common.h)
    'fit': '--fit',                     # on|off, default on, from b7445 (see the docstring)
}


@dataclass(frozen=True)
class EngineProfile:
    """What the planner must know about one engine build."""
    engine: str
    version: str
    build: Optional[int]                 # llama.cpp build number, None for llama-box
    generation: str                      # GENERATION_2025 | GENERATION_NEW
    output_layer_first: bool             # PR #18148 placement (-ngl 1 = output.weight only)
    flash_attn_tristate: bool            # --flash-attn on|off|auto (else a plain switch)
    flash_attn_default: str              # 'off' | 'auto'
    kv_pad_always_256: bool              # else 256 with flash attention, 32 without
    v_quant_without_fa: str              # 'reset_f16' (llama-box patch) | 'error' | 'auto_fa'
    parallel_default: str                # what runs when -np is not given
    parallel_sets_http_threads: bool     # llama-box: -np == --threads-http
    flags: Dict[str, Optional[str]]
    rules: List[str] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)
    has_fit: bool = False                # --fit on|off exists (on by default)

    def flag(self, concept):
        return self.flags[concept]

    def kv_padding(self, flash_attn):
        """Cells the KV cache size is padded to (L-2025 ``get_padding``)."""
        if self.kv_pad_always_256 or flash_attn:
            return 256
        return 32


_LLAMA_CPP_BUILD_RE = re.compile(r'^\s*(?:b|build[- ]?)?(\d{3,6})\s*$', re.IGNORECASE)
_LLAMA_BOX_RE = re.compile(r'^\s*v?(\d+)\.(\d+)\.(\d+)\s*$')


def _llama_box_profile(version_text):
    match = _LLAMA_BOX_RE.match(version_text)
    if not match:
        raise PlanInputError('backend_version', 'cannot parse llama-box version %r (expected e.g. '
                                                '"v0.0.171")' % (version_text,))
    parts = tuple(int(p) for p in match.groups())
    warnings = []
    if parts > LLAMA_BOX_KNOWN_NEWEST:
        warnings.append('llama-box %s is newer than v%s, the newest release whose llama.cpp was '
                        'read; planned with the mid-2025 (L-2025) rules'
                        % (version_text, '.'.join(str(p) for p in LLAMA_BOX_KNOWN_NEWEST)))
    rules = [
        'llama-box %s: llama.cpp L-2025 placement: the last k repeating blocks go to the GPU, the '
        'output layer only when k > n_layer; token_embd stays on the CPU' % version_text,
        'llama-box: -fa is a plain switch, off unless given; a quantized V cache without -fa is '
        'reset to f16 (context.patch)',
        'llama-box: --parallel is the deprecated alias of --threads-http and sets the slot count; '
        'without it the slots default to the CPU math cores (up to 64), so --parallel and '
        '--ctx-size are always pinned; each slot gets ctx-size/parallel tokens',
        'llama-box: KV cells padded to 256 with flash attention, 32 without',
    ]
    return EngineProfile(
        engine=ENGINE_LLAMA_BOX, version=version_text, build=None, generation=GENERATION_2025,
        output_layer_first=False, flash_attn_tristate=False, flash_attn_default='off',
        kv_pad_always_256=False, v_quant_without_fa='reset_f16',
        parallel_default='CPU math cores (n_threads_http = -1), capped at 64',
        parallel_sets_http_threads=True, flags=dict(FLAGS_LLAMA_BOX), rules=rules,
        warnings=warnings)


def _llama_cpp_profile(version_text):
    match = _LLAMA_CPP_BUILD_RE.match(version_text)
    if not match:
        raise PlanInputError('backend_version', 'cannot parse llama.cpp version %r: give the '
                             'release build number, e.g. "b6327" (tags such as "server-cuda" '
                             'move; pin the image to a bNNNN tag)' % (version_text,))
    build = int(match.group(1))
    warnings = []
    rules = []
    tristate = build >= FLASH_ATTN_TRISTATE_FROM_BUILD
    output_first = build > OUTPUT_FIRST_LAST_BUILD_WITHOUT
    if OUTPUT_FIRST_LAST_BUILD_WITHOUT < build < OUTPUT_FIRST_FIRST_BUILD_WITH:
        warnings.append('llama.cpp b%d lies between b%d (output layer offloaded last) and b%d '
                        '(output layer first, PR #18148); planned with output first: check the '
                        'load log for "offloading output layer to GPU" at -ngl 1'
                        % (build, OUTPUT_FIRST_LAST_BUILD_WITHOUT, OUTPUT_FIRST_FIRST_BUILD_WITH))
    has_fit = build >= FIT_FIRST_BUILD_WITH
    if FIT_LAST_BUILD_WITHOUT < build < FIT_FIRST_BUILD_WITH:
        warnings.append('llama.cpp b%d lies between b%d (no --fit) and b%d (--fit on by default, '
                        'PR #16653); --fit off is not pinned, since llama-server refuses a flag it '
                        'does not have: if its --help lists --fit, it fits the unset arguments to '
                        'free VRAM minus 1 GiB; use b%d or later'
                        % (build, FIT_LAST_BUILD_WITHOUT, FIT_FIRST_BUILD_WITH, FIT_FIRST_BUILD_WITH))
    pad256 = build >= KV_PAD_ALWAYS_256_FROM_BUILD
    generation = GENERATION_NEW if output_first else GENERATION_2025
    if output_first:
        rules.append('llama.cpp b%d: output layer offloaded first (PR #18148): -ngl k puts '
                     'output.weight and the last k-1 blocks on the GPU' % build)
    else:
        rules.append('llama.cpp b%d: L-2025 placement: the last k blocks go to the GPU, the '
                     'output layer only when k > n_layer' % build)
    if tristate:
        rules.append('llama.cpp b%d: --flash-attn takes on|off|auto (default auto); the planner '
                     'pins on or off so the memory plan holds' % build)
    else:
        rules.append('llama.cpp b%d: -fa is a plain switch, off by default; a quantized V cache '
                     'without it is an error' % build)
    rules.append('llama.cpp b%d: KV cells padded to %s' % (
        build, '256' if pad256 else '256 with flash attention, 32 without'))
    if has_fit:
        rules.append('llama.cpp b%d: --fit is on by default and fits the arguments left unset to '
                     'free VRAM minus 1 GiB (--fit-target); pinned --fit off, with --n-gpu-layers, '
                     '--ctx-size and --parallel always pinned, so the plan is what runs' % build)
    rules.append('llama.cpp: --parallel N gives N slots of ctx-size/N tokens each (without '
                 '--kv-unified); recent builds default to -np auto = 4 slots with a unified '
                 'cache, so --parallel and --ctx-size are always pinned; flags are separate '
                 'argv tokens (no "=" form, gpustack#3537)')
    return EngineProfile(
        engine=ENGINE_LLAMA_CPP, version=version_text, build=build, generation=generation,
        output_layer_first=output_first, flash_attn_tristate=tristate,
        flash_attn_default='auto' if tristate else 'off', kv_pad_always_256=pad256,
        v_quant_without_fa='auto_fa' if tristate else 'error',
        parallel_default='-1 = auto (4 slots, unified KV)' if tristate else '1',
        parallel_sets_http_threads=False, flags=dict(FLAGS_LLAMA_CPP), rules=rules,
        warnings=warnings, has_fit=has_fit)


def engine_profile(engine, version):
    """EngineProfile for ``engine`` ('llama-box' | 'llama.cpp') at ``version``."""
    if engine not in ENGINES:
        raise PlanInputError('backend', 'must be one of %s, got %r' % (', '.join(ENGINES), engine))
    if version is None or not str(version).strip():
        raise PlanInputError('backend_version', 'is required for %s: flags, layer placement and '
                                                'KV padding differ by version' % engine)
    text = str(version).strip()
    if engine == ENGINE_LLAMA_BOX:
        return _llama_box_profile(text)
    return _llama_cpp_profile(text)


def flash_attn_args(profile, enabled):
    """argv tokens that pin flash attention on/off for this build."""
    on_flag = profile.flag('flash_attn_on')
    if profile.flash_attn_tristate:
        return [on_flag, 'on' if enabled else 'off']
    if enabled:
        return [on_flag]
    off_flag = profile.flag('flash_attn_off')
    return [off_flag] if off_flag else []


def fit_args(profile):
    """argv tokens that turn llama.cpp's --fit off where the build has it (else none)."""
    return [profile.flag('fit'), 'off'] if profile.has_fit else []


def gpu_blocks_and_output(profile, n_layer, gpu_layers):
    """(first GPU block index, number of GPU blocks, output layer on GPU) for -ngl k.

    L-2025: ``i_gpu_start = max(n_layer - k, 0)``, output on GPU when k > n_layer.
    L-new (PR #18148): ``i_gpu_start = max(n_layer + 1 - k, 0)``: output first."""
    k = max(0, min(int(gpu_layers), n_layer + 1))
    if profile.output_layer_first:
        start = max(n_layer + 1 - k, 0)
        blocks = n_layer - min(start, n_layer)
        return min(start, n_layer), blocks, k >= 1
    start = max(n_layer - k, 0)
    return start, n_layer - start, k > n_layer
