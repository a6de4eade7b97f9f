# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The total a CUDA process sees, from the total NVML reports.

NVML's ``memory.total`` (what nvidia-smi prints, what gpu_facts reports as
``memory_total``) is the card's physical memory. CUDA's ``cudaMemGetInfo`` total (what
``torch.cuda.mem_get_info()[1]`` returns, what vLLM budgets as ``total_gpu_memory x
gpu_memory_utilization`` and what llama.cpp's placement can ever get) is smaller by what
the driver and firmware keep. Examples from public logs: an RTX 3090 is 24576 MiB in
nvidia-smi and 23.58 GiB to vLLM; an H100 80GB HBM3 is 81559 MiB and 79.18 GiB. A planner
fed the NVML total promises ``util x`` that gap more KV than the engine will have.

Where the gap comes from, best first:

* ``nvml_v2_reserved``: nvmlDeviceGetMemoryInfo_v2 (driver >= R510) returns ``reserved``,
  "Device memory (in bytes) reserved for system use (driver or firmware)", next to
  ``total``, "Total physical device memory (in bytes)"
  (https://docs.nvidia.com/deploy/nvml-api/structnvmlMemory__v2__t.html). ``total``
  includes ``reserved``, so what CUDA can see is at most ``total - reserved``.
* ``table:<card>``: the largest gap seen in public logs for that card class
  (``CARD_GAPS``, one sourced row per card; derived rows say so). The driver's reserve
  changes a little between driver versions, so a row is a floor of the gap, not the gap.
* ``default margin``: for a card in no row, ``DEFAULT_MARGIN_FRACTION_X1000`` of the total
  (at least ``DEFAULT_MARGIN_MIN_BYTES``), above every sourced gap as a share of its card.

When both the reserved figure and a table row are known, the larger gap is used (the safe
side: never a CUDA total above what some public log showed for that card). A reported
``reserved`` of 0 is not a measurement (no real GPU reserves nothing; the lab fixtures
leave it 0 where no figure was found) and is treated like "not reported".

Pure functions; ``estimate(name, memory_total, memory_reserved) -> CudaTotal``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ansible_collections.kvpin.fleet.plugins.module_utils.plan.plan_types import PlanInputError
from ansible_collections.kvpin.fleet.plugins.module_utils.units import GiB, MiB, fmt_bytes

SOURCE_RESERVED = 'nvml_v2_reserved'
SOURCE_TABLE_PREFIX = 'table:'
SOURCE_DEFAULT = 'default margin'
SOURCE_GIVEN = 'given'

# A unknown card keeps 2 % of its NVML total (at least 528 MiB) for the driver: the largest
# sourced gap is the A10's, 515 MiB of 23028 MiB (2.24 %, covered by the 528 MiB floor on
# cards of its size); on cards above 26 GB the largest share is well under 2 % (L40S 1.3 %).
DEFAULT_MARGIN_FRACTION_X1000 = 20
DEFAULT_MARGIN_MIN_BYTES = 528 * MiB

# A row's total must be within this share of the GPU's NVML total for the row to apply
# (the same name with another memory size, e.g. a modded 48 GB RTX 4090, is another card).
# Wide enough for ECC on (RTX A6000: 49140 MiB with ECC off, 46068 MiB with ECC on).
TOTAL_MATCH_FRACTION_X100 = 10

# Logged CUDA totals are rounded to 0.01 GiB: the smallest total consistent with a logged
# figure X is X - 0.005 GiB, which gives the largest gap.
_HALF_CENTI_GIB = GiB // 200


def _gap_from_log(nvml_mib, cuda_gib_x100):
    """NVML total (MiB) minus the smallest CUDA total a log printing X.XX GiB allows."""
    return nvml_mib * MiB - (cuda_gib_x100 * GiB // 100 - _HALF_CENTI_GIB)


@dataclass(frozen=True)
class CardGap:
    """One card class: how its NVML total and its CUDA total differ, with the sources.

    ``tokens``: lower-case words that must all appear in the NVML name (split at spaces
    and dashes); ``nvml_total_mib``: the nvidia-smi ``memory.total`` of the class (ECC
    off); ``gap_bytes``: NVML total - CUDA total, the largest seen (or derived, see
    ``derived``); ``source``: URLs and the quoted log lines; ``source_rows``: the ids of
    the benchmarks/data rows whose logged total the gap was read from (those rows are then
    "fit", not held-out, in the accuracy benchmarks)."""
    card: str
    tokens: tuple
    nvml_total_mib: int
    gap_bytes: int
    derived: bool
    source: str
    source_rows: tuple = ()


# RTX 3090: the largest sourced 24 GB-class gap (the smallest CUDA total logged); the derived rows below are built on it.
_RTX3090_GAP = _gap_from_log(24576, 2354)
# Derived rows for GA102/24 GB-class cards without a public pair: the RTX 3090 gap rounded up.
_DERIVED_24GB_GAP = 512 * MiB
# A10 (23028 MiB): 21.99 GiB in torch, the largest sourced gap (515 MiB); the A10G shares it.
_A10_GAP = max(_gap_from_log(23028, 2199), _DERIVED_24GB_GAP)

CARD_GAPS = (
    CardGap(
        'RTX 3090', ('3090',), 24576, _RTX3090_GAP, False,
        'nvidia-smi "NVIDIA GeForce RTX 3090 ... 15005MiB /  24576MiB" '
        '(https://github.com/noonghunna/club-3090/issues/390); vLLM TP=16 on a 16 x RTX 3090 rig '
        '(https://github.com/ikawrakow/ik_llama.cpp/issues/263): "the current vLLM instance can use '
        'total_gpu_memory (23.58GiB) x gpu_memory_utilization (0.99) = 23.35GiB" '
        '(https://github.com/vllm-project/vllm/pull/14447); the smallest total seen, the gap kept: vLLM 0.17.1 '
        'on an RTX 3090, torch "GPU 0 has a total capacity of 23.54 GiB" '
        '(https://github.com/TheBuccaneer/vllm-offload-profiles/blob/547be9005dd6483d21e15e32416ffab96d1a2e63/'
        'data/provenance/gpu_memory_configuration/fixd_llama_gmem090_offload0_failed.log)',
        ('buccaneer-rtx3090-llama-3.1-8b-tp1-u090-fixd-fail',)),
    CardGap(
        'RTX 4090', ('4090',), 24564, 24564 * MiB - 25250627584, False,
        'torch.cuda total 25250627584 B (23.52 GiB) in a vLLM 0.19.0 run record on an RTX 4090 '
        '(https://github.com/casys-kaist/LLMServingSim/blob/5daddb21a545658d5150b535712d0494584b5278/'
        'bench/examples/RTX4090/Llama-3.1-8B/vllm/meta.json), the smallest seen; '
        'nvidia-smi "23859MiB / 24564MiB" on 4 x RTX 4090 (https://github.com/vllm-project/vllm/issues/7553); '
        'torch on a 4090: "GPU 0 has a total capacity of 23.61 GiB" '
        '(https://github.com/pinokiofactory/flux-webui/issues/11); also 23.64 GiB '
        '(https://github.com/3DTopia/Phidias-Diffusion/issues/8) and 23.65 GiB '
        '(https://github.com/HKUDS/GraphGPT/issues/29)',
        ('llmservingsim-rtx4090-llama-3.1-8b-tp1-32k',)),
    CardGap(
        'RTX A6000', ('a6000',), 49140, _DERIVED_24GB_GAP, True,
        'DERIVED, no public NVML/CUDA pair found: nvidia-smi "67MiB / 49140MiB" '
        '(https://nvlabs.github.io/sionna/phy/tutorials/Discover_Sionna.html); gap = the RTX 3090 '
        'gap (same GA102 die and driver, 476 MiB) rounded up to 512 MiB. Bounded above by an '
        'observation: the field report\'s all-80-layer llama-box deployment of a 70B Q4 model LOADED '
        'on a 48 GB A6000 before dying on long prompts, which with this planner\'s load-time terms '
        'needs a gap <= ~546 MiB (tests/unit/plugins/module_utils/test_llamacpp_memory.py). The 48 GB '
        'Ada cards log 0.56-0.57 GiB (RTX 6000 Ada: 46068 MiB vs "total capacity of 44.43 GiB", '
        'https://github.com/DINGYANB/MTVCrafter/issues/21; L40S row)'),
    CardGap(
        'RTX A5000', ('a5000',), 24564, _DERIVED_24GB_GAP, True,
        'DERIVED, no public NVML/CUDA pair found: GA102 24 GB like the RTX 3090; gap = the RTX 3090 '
        'gap (476 MiB, the largest sourced 24 GB-class gap: https://github.com/TheBuccaneer/vllm-offload-profiles/blob/'
        '547be9005dd6483d21e15e32416ffab96d1a2e63/data/provenance/gpu_memory_configuration/fixd_llama_gmem090_offload0_failed.log) '
        'rounded up to 512 MiB'),
    CardGap(
        'A100 80GB', ('a100', '80gb'), 81920, _gap_from_log(81920, 7914), False,
        'nvidia-smi "A100 80GB: 81920MiB" (https://github.com/modal-labs/modal-client/pull/2797) and '
        '"NVIDIA A100-SXM4-80GB ... 0MiB /  81920MiB" (https://github.com/Project-HAMi/HAMi/pull/1847); '
        'torch on "a single NVIDIA A100 card which has 80GB": "GPU 0 has a total capacity of 79.14 GiB" '
        '(https://github.com/lianqi1008/Control-GIC/issues/6)'),
    CardGap(
        'A100 40GB', ('a100', '40gb'), 40960, 40960 * MiB - 42298834944, False,
        'nvidia-smi "A100 40GB: 40960MiB" (https://github.com/modal-labs/modal-client/pull/2797); CUDA '
        'deviceQuery "NVIDIA A100-SXM4-40GB ... Total amount of global memory: 40339 MBytes '
        '(42298834944 bytes)" (https://github.com/bottlerocket-os/bottlerocket/pull/3873)'),
    CardGap(
        'H100 80GB', ('h100', '80gb'), 81559, _gap_from_log(81559, 7918), False,
        'nvidia-smi "NVIDIA H100 80GB HBM3 ... 0MiB /  81559MiB" '
        '(https://github.com/vllm-project/vllm/issues/55169; "H100: 81559MiB", '
        'https://github.com/modal-labs/modal-client/pull/2797); vLLM on H100 80GB: "Free memory on '
        'device: 78.57/79.18 GiB on startup" (https://github.com/llm-d/llm-d-benchmark/blob/'
        '4f4d44943c39b76b28e30dfa1fb0dfaf1ee894b5/config_explorer/empirical-vllm-memory-results.md)',
        ('llmd-h100-gpt-oss-20b-tp1', 'llmd-h100-llama-3.1-8b-tp1')),
    CardGap(
        'L40S', ('l40s',), 46068, _gap_from_log(46068, 4442), False,
        'nvidia-smi "L40S: 46068MiB" (https://github.com/modal-labs/modal-client/pull/2797); torch on '
        '8 x L40S: "GPU  has a total capacity of 44.42 GiB" '
        '(https://github.com/stepfun-ai/Step-Video-T2V/issues/8)'),
    CardGap(
        'A10G', ('a10g',), 23028, _A10_GAP, True,
        'DERIVED, no public NVML/CUDA pair found for the A10G: NVML total as the A10 (GA102, 23028 MiB); '
        'gap = the A10 row\'s (the same die and memory size; the larger of it and the RTX 3090 gap, '
        'https://github.com/vllm-project/vllm/pull/14447)'),
    CardGap(
        'A10', ('a10',), 23028, _A10_GAP, False,
        'nvidia-smi "A10: 23028MiB" (https://github.com/modal-labs/modal-client/pull/2797); torch on '
        '4 x A10: "GPU 0 has a total capacity of 21.99 GiB" (https://github.com/QwenLM/Qwen3/issues/1387), '
        'the smallest seen; also 22.18 GiB on "一张A10" (one A10) '
        '(https://github.com/OpenBMB/MiniCPM-V/issues/640)'),
    CardGap(
        'L4', ('l4',), 23034, _DERIVED_24GB_GAP, True,
        'DERIVED, no public NVML/CUDA pair found: nvidia-smi "L4: 23034MiB" '
        '(https://github.com/modal-labs/modal-client/pull/2797); gap = the RTX 3090 gap rounded up '
        'to 512 MiB'),
)

# CARD_GAPS rows read from benchmarks/data rows -> those rows' ids (bench_accuracy_vllm.py
# scores them as the "fit" split; docs/data-sources.md).
FITTED_SOURCE_ROWS = dict(('cuda_total.CARD_GAPS[%s]' % row.card, row.source_rows)
                          for row in CARD_GAPS if row.source_rows)


@dataclass(frozen=True)
class CudaTotal:
    """What CUDA sees of one GPU: ``cuda_total = nvml_total - gap``; ``source`` is one of
    'nvml_v2_reserved', 'table:<card>', 'default margin', or what the caller gave."""
    nvml_total: int
    cuda_total: int
    gap: int
    source: str
    explain: str


def _tokens(name):
    return set(str(name or '').lower().replace('-', ' ').replace('_', ' ').split())


def find_card(name, memory_total=None):
    """The CARD_GAPS row for an NVML name (and, when given, a total within 10 % of the
    row's), or None. The first matching row wins: A10G is listed before A10."""
    words = _tokens(name)
    for row in CARD_GAPS:
        if not all(token in words for token in row.tokens):
            continue
        if memory_total is not None:
            row_total = row.nvml_total_mib * MiB
            if abs(memory_total - row_total) * 100 > TOTAL_MATCH_FRACTION_X100 * row_total:
                continue
        return row
    return None


def _check_int(value, field, low, high, high_text):
    if isinstance(value, bool) or not isinstance(value, int):
        raise PlanInputError(field, 'must be a whole number of bytes, got %r' % (value,))
    if value < low:
        raise PlanInputError(field, 'must be >= %d bytes, got %d' % (low, value))
    if high is not None and value > high:
        raise PlanInputError(field, 'must be <= %s (%d bytes), got %d' % (high_text, high, value))
    return value


def default_margin_bytes(memory_total):
    return max(memory_total * DEFAULT_MARGIN_FRACTION_X1000 // 1000, DEFAULT_MARGIN_MIN_BYTES)


def estimate(name, memory_total, memory_reserved=None, where='gpu'):
    """CudaTotal of one GPU from its NVML name, total and v2 ``reserved`` (None on v1).

    Raises PlanInputError naming ``<where>.memory_total`` / ``<where>.memory_reserved`` for
    a value that is not a whole number of bytes or out of range."""
    total = _check_int(memory_total, '%s.memory_total' % where, 1, None, None)
    reserved = None
    if memory_reserved is not None:
        reserved = _check_int(memory_reserved, '%s.memory_reserved' % where, 0, total - 1,
                              'memory_total - 1')
    row = find_card(name, total)
    candidates = []
    if reserved:
        candidates.append((reserved, SOURCE_RESERVED,
                           'NVML v2 reserved %s (driver/firmware, part of total)' % fmt_bytes(reserved)))
    if row is not None:
        candidates.append((row.gap_bytes, SOURCE_TABLE_PREFIX + row.card,
                           '%s gap %s for %s (%s)' % ('derived' if row.derived else 'logged',
                                                      fmt_bytes(row.gap_bytes), row.card, row.source)))
    if not candidates:
        margin = default_margin_bytes(total)
        candidates.append((margin, SOURCE_DEFAULT,
                           'default margin %s (%s %% of the card, >= %s: %r is in no table row and '
                           'NVML reports no reserved figure)' % (
                               fmt_bytes(margin), DEFAULT_MARGIN_FRACTION_X1000 / 10.0,
                               fmt_bytes(DEFAULT_MARGIN_MIN_BYTES), name)))
    gap, source, why = max(candidates, key=lambda c: c[0])
    if gap >= total:
        raise PlanInputError('%s.memory_total' % where, '%d bytes is not more than the memory the '
                             'driver keeps (%d bytes, %s): not a real GPU total' % (total, gap, source))
    others = [c[2] for c in candidates if c[1] != source]
    explain = 'NVML total %s - %s = %s%s' % (
        fmt_bytes(total), why, fmt_bytes(total - gap),
        ('; also known, smaller: ' + '; '.join(others)) if others else '')
    return CudaTotal(nvml_total=total, cuda_total=total - gap, gap=gap, source=source, explain=explain)


def of_gpu(gpu, where='gpu'):
    """CudaTotal of a gpu dict as gpu_facts reports it.

    ``memory_total_cuda`` (gpu_facts' estimate, or a figure the user measured) is used
    when present and not None, checked against ``memory_total``; otherwise the estimate
    is made from ``name``, ``memory_total`` and ``memory_reserved``."""
    if not isinstance(gpu, dict):
        raise PlanInputError(where, 'must be a dict with memory_total (bytes), got %r' % (gpu,))
    total = _check_int(gpu.get('memory_total'), '%s.memory_total' % where, 1, None, None)
    given = gpu.get('memory_total_cuda')
    if given is None:
        return estimate(gpu.get('name'), total, gpu.get('memory_reserved'), where)
    given = _check_int(given, '%s.memory_total_cuda' % where, 1, total, 'memory_total')
    source = gpu.get('memory_total_cuda_source')
    if not isinstance(source, str) or not source.strip():
        source = SOURCE_GIVEN
    source = source.strip()[:200]
    return CudaTotal(nvml_total=total, cuda_total=given, gap=total - given, source=source,
                     explain='memory_total_cuda %s as given (%s); NVML total %s' % (
                         fmt_bytes(given), source, fmt_bytes(total)))


def facts_fields(name, memory_total, memory_reserved):
    """(memory_total_cuda, memory_total_cuda_source) for gpu_facts; (None, 'none: <why>')
    when the NVML figures themselves are unusable (the probe must not fail on them)."""
    try:
        result = estimate(name, memory_total, memory_reserved)
    except PlanInputError as exc:
        return None, 'none: %s' % exc
    return result.cuda_total, result.source
