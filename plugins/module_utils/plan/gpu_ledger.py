# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The per-GPU ledger of one node: every deployment planned on the node, charged together.

Each deployment is planned as if it had its GPUs to itself. GPUStack itself does not count
what processes outside it hold (its issues #6044 and #2852), and nothing else adds up what
several deployments on one card hold. The ledger does, per GPU, two accounts in bytes:

1. Memory, against the card's CUDA-visible total (module_utils/cuda_total.py; what the engines
   can allocate)::

       sum over the deployments on the GPU of (held + outside) + outside_processes <= card

   - ``held``: what the deployment holds inside its budget. vLLM: its budget
     (``plan.memory[].budget``: total x gpu-memory-utilization, or the pinned KV bytes plus the
     charged terms; vLLM fills it with KV cache). llama.cpp / llama-box: the buffers it allocates
     (weights + activation + non_torch + cuda_graph + kv_cache of the row).
   - ``outside``: what it holds (or must keep free) outside its budget. vLLM: the row's
     ``terms.outside_required`` (CUDA context, graph pool, NCCL, profiler buffer, safety margin);
     other backends: the plan's ``system_reserved_bytes`` (llama.cpp's reserve). Two deployments
     on one card each hold their own, so they add up.
   - ``outside_processes``: the ``used_memory`` of every process gpu_facts saw on the GPU that is
     not GPUStack's (a process is GPUStack's when its cgroup path contains one of the markers; the
     default marker ``gpustack`` matches the worker's unit, under which GPUStack 0.7.x runs its
     engines). A process whose memory NVML could not tell (None) is named in the warnings.

2. GPUStack's booking, against the total GPUStack books from (the NVML total its worker
   reports)::

       sum over the deployments on the GPU of booked + system_reserved <= NVML total

   - ``booked``: GPUStack's share of the deployment's VRAM claim on this GPU
     (``gpustack_records.gpu_vram_bookings``, the same function whose sum is the claim sent to
     GPUStack, so the claims agree with the ledger by construction).
   - ``system_reserved``: the worker's ``system_reserved.vram`` (whole GiB per GPU,
     module_utils/system_reserved.py), which GPUStack keeps off its books. It is a booking fence,
     not memory anyone holds: charging it in the memory account on top of the outside parts it
     exists for would count them twice (and refuse, by GiB rounding alone, plans that fit).

Either account over the card refuses the node in the plan phase, naming the GPU, the
deployments and the bytes.

A deployment that does not pin its GPUs (no ``gpu_indexes``, and no GPU choice of the planner in
its plan's ``gpu_indexes``: a llama.cpp / llama-box plan) may be placed by GPUStack on other
GPUs than it was planned on; on a node with more than one deployment that makes the ledger
unknowable, so it is refused there with a message that says so.

Pure functions over gpu_facts' GPU dicts and serving_plan's plan dicts; every number is type-
and range-checked, a bad one raises :class:`LedgerInputError` naming the field.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Dict, List

from ansible_collections.kvpin.fleet.plugins.module_utils.plan import cuda_total
from ansible_collections.kvpin.fleet.plugins.module_utils.gpustack.records import (
    RecordInputError,
    gpu_vram_bookings,
)
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.plan_types import PlanInputError, RESIDENT_TERMS, type_name
from ansible_collections.kvpin.fleet.plugins.module_utils.units import fmt_gib

# The cgroup-path marker of GPUStack's own processes (GPUStack 0.7.x runs its engines as
# children of gpustack.service; the gpustack_worker role's units are gpustack*.service).
DEFAULT_GPUSTACK_CGROUP_MARKERS = ('gpustack',)
# Bounds: beyond these a figure is not a GPU's (the same as serving_plan's).
MAX_BYTES = 1 << 42
MAX_DEPLOYMENTS = 256
MAX_PROCESSES = 4096
MAX_NAME = 200


class LedgerInputError(ValueError):
    """Input the ledger cannot use. ``field`` names it; the message carries the value."""

    def __init__(self, field_name, message):
        super().__init__('%s: %s' % (field_name, message))
        self.field = field_name


@dataclass
class LedgerEntry:
    """One deployment on one GPU (bytes)."""
    deployment: str
    held: int          # what it holds inside its budget
    outside: int       # what it holds or keeps free outside its budget
    booked: int        # what GPUStack books for it on this GPU (its share of the VRAM claim)


@dataclass
class GpuLedger:
    """One GPU's two accounts (bytes)."""
    index: int
    name: str
    card: int                          # CUDA-visible total: the memory account's limit
    card_source: str
    card_nvml: int                     # NVML total: what GPUStack books from
    entries: List[LedgerEntry]
    outside_processes: int             # used_memory of the processes not GPUStack's
    processes: List[Dict[str, object]]  # those processes: pid, used_memory
    memory_charged: int                # sum(held + outside) + outside_processes
    system_reserved: int               # the worker's system_reserved.vram, in bytes
    booking_charged: int               # sum(booked) + system_reserved

    @property
    def memory_free(self):
        return self.card - self.memory_charged

    @property
    def booking_free(self):
        return self.card_nvml - self.booking_charged

    @property
    def fits(self):
        return self.memory_free >= 0 and self.booking_free >= 0


@dataclass
class Ledger:
    """The node's ledger: per GPU, whether it fits, and the VRAM claim of each deployment."""
    gpus: List[GpuLedger]
    claims: Dict[str, int]             # deployment -> GPUSTACK_MODEL_VRAM_CLAIM (sum of booked)
    problems: List[str]                # one per overcommitted GPU (or unknowable placement)
    warnings: List[str] = field(default_factory=list)

    @property
    def fits(self):
        return not self.problems

    def to_dict(self):
        result = asdict(self)
        result['fits'] = self.fits
        for gpu, row in zip(self.gpus, result['gpus']):
            row.update(fits=gpu.fits, memory_free=gpu.memory_free, booking_free=gpu.booking_free)
        result['report'] = ledger_report(self)
        return result


# ---------------------------------------------------------------- input checks

def _short(value):
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + '...'


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _bytes(value, where, allow_none=False):
    if value is None and allow_none:
        return None
    if not _is_int(value):
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            value = int(value)
        else:
            raise LedgerInputError(where, 'must be a whole number of bytes, got %s' % _short(value))
    if value < 0:
        raise LedgerInputError(where, 'must not be negative, got %d' % value)
    if value > MAX_BYTES:
        raise LedgerInputError(where, '%d B is more than any GPU has (limit %d B)' % (value, MAX_BYTES))
    return value


def _index(value, where):
    if not _is_int(value) or not 0 <= value < 1 << 16:
        raise LedgerInputError(where, 'must be a GPU index (integer >= 0), got %s' % _short(value))
    return value


def _name(value, where):
    if not isinstance(value, str) or not value.strip():
        raise LedgerInputError(where, 'must be a non-empty string, got %s' % _short(value))
    return value.strip()[:MAX_NAME]


def _check_processes(gpu, where, total, markers):
    """(outside processes [{pid, used_memory}], warnings) of one GPU dict."""
    processes = gpu.get('processes')
    if processes is None:
        return [], ['%s: gpu_facts could not list its processes; memory held outside GPUStack '
                    'is not counted there' % where]
    if not isinstance(processes, (list, tuple)):
        raise LedgerInputError(where + '.processes', 'must be a list of process dicts, got %s'
                               % type_name(processes))
    if len(processes) > MAX_PROCESSES:
        raise LedgerInputError(where + '.processes', '%d processes on one GPU (limit %d)'
                               % (len(processes), MAX_PROCESSES))
    outside, warnings = [], []
    for position, process in enumerate(processes):
        here = '%s.processes[%d]' % (where, position)
        if not isinstance(process, dict):
            raise LedgerInputError(here, 'must be a dict with pid and used_memory, got %s'
                                   % type_name(process))
        pid = process.get('pid')
        if not _is_int(pid) or pid < 0:
            raise LedgerInputError(here + '.pid', 'must be a process id (integer >= 0), got %s' % _short(pid))
        used = _bytes(process.get('used_memory'), here + '.used_memory', allow_none=True)
        if used is not None and used > total:
            raise LedgerInputError(here + '.used_memory', '%d B is more than the GPU\'s memory_total %d B'
                                   % (used, total))
        cgroup = process.get('cgroup')
        if cgroup is not None and not isinstance(cgroup, str):
            raise LedgerInputError(here + '.cgroup', 'must be a string, got %s' % _short(cgroup))
        if cgroup and any(marker in cgroup for marker in markers):
            continue
        if used is None:
            warnings.append('%s: pid %d holds memory NVML cannot tell; not counted' % (where, pid))
            continue
        outside.append({'pid': pid, 'used_memory': used})
    return outside, warnings


def _check_gpus(gpus, markers):
    """{index: (name, CudaTotal, outside processes)} and warnings."""
    if not isinstance(gpus, (list, tuple)) or not gpus:
        raise LedgerInputError('gpus', 'must be the non-empty list kvpin_gpus.gpus of gpu_facts, got %s'
                               % _short(gpus))
    cards, warnings = {}, []
    for position, gpu in enumerate(gpus):
        where = 'gpus[%d]' % position
        if not isinstance(gpu, dict):
            raise LedgerInputError(where, 'must be a dict, got %s' % type_name(gpu))
        index = _index(gpu.get('index'), where + '.index')
        if index in cards:
            raise LedgerInputError(where + '.index', 'GPU %d is listed twice' % index)
        name = gpu.get('name')
        if not isinstance(name, str):
            raise LedgerInputError(where + '.name', 'must be a string, got %s' % _short(name))
        try:
            card = cuda_total.of_gpu(gpu, where)
        except PlanInputError as exc:
            raise LedgerInputError(exc.field, str(exc).split(': ', 1)[-1])
        outside, more = _check_processes(gpu, 'GPU %d' % index, card.nvml_total, markers)
        warnings.extend(more)
        cards[index] = (name, card, outside)
    return cards, warnings


def _check_markers(markers):
    if markers is None:
        return DEFAULT_GPUSTACK_CGROUP_MARKERS
    if isinstance(markers, str) or not isinstance(markers, (list, tuple)) or not all(
            isinstance(m, str) and m.strip() for m in markers):
        raise LedgerInputError('gpustack_cgroup_markers', 'must be a list of non-empty strings, got %s'
                               % _short(markers))
    return tuple(m.strip() for m in markers)


def _row_outside(plan, row, where):
    terms = row.get('terms') or {}
    if not isinstance(terms, dict):
        raise LedgerInputError(where + '.terms', 'must be a dict, got %s' % type_name(terms))
    if 'outside_required' in terms:
        return _bytes(terms['outside_required'], where + '.terms.outside_required')
    return _bytes(plan.get('system_reserved_bytes') or 0, 'plan.system_reserved_bytes')


def _row_held(plan, row, where):
    if plan.get('backend') == 'vllm':
        return _bytes(row.get('budget'), where + '.budget')
    return sum(_bytes(row.get(term, 0), '%s.%s' % (where, term)) for term in RESIDENT_TERMS)


def deployment_entries(name, plan, where):
    """[(gpu index, LedgerEntry)] of one deployment's plan dict."""
    if not isinstance(plan, dict):
        raise LedgerInputError(where, 'must be a serving_plan plan dict, got %s' % type_name(plan))
    if not isinstance(plan.get('backend'), str):
        raise LedgerInputError(where + '.backend', 'must be a string, got %s' % _short(plan.get('backend')))
    memory = plan.get('memory')
    if not isinstance(memory, (list, tuple)) or not memory:
        raise LedgerInputError(where + '.memory', 'must be the non-empty list of per-GPU rows, got %s'
                               % _short(memory))
    for position, row in enumerate(memory):
        if not isinstance(row, dict):
            raise LedgerInputError('%s.memory[%d]' % (where, position), 'must be a dict, got %s'
                                   % type_name(row))
        total = row.get('total')
        if not _is_int(total) or not 0 < total <= MAX_BYTES:
            raise LedgerInputError('%s.memory[%d].total' % (where, position),
                                   'must be a positive number of bytes, got %s' % _short(total))
    try:
        if plan.get('backend') != 'vllm' and plan.get('vram_claim_bytes') == 0:
            booked = [0] * len(memory)     # nothing on the GPUs (0 layers offloaded): no claim
        else:
            booked = gpu_vram_bookings(plan)
    except (RecordInputError, TypeError, ValueError) as exc:
        raise LedgerInputError(where, 'cannot compute its GPUStack VRAM claim: %s' % exc)
    entries = []
    for position, (row, booking) in enumerate(zip(memory, booked)):
        here = '%s.memory[%d]' % (where, position)
        index = _index(row.get('index'), here + '.index')
        entries.append((index, LedgerEntry(deployment=name, held=_row_held(plan, row, here),
                                           outside=_row_outside(plan, row, here),
                                           booked=_bytes(booking, here + ' (GPUStack booking)'))))
    if len(set(index for index, _unused in entries)) != len(entries):
        raise LedgerInputError(where + '.memory', 'names one GPU twice')
    return entries


# ---------------------------------------------------------------- the ledger

def gpu_ledger(gpus, deployments, system_reserved_bytes=0, gpustack_cgroup_markers=None):
    """The node's :class:`Ledger`.

    ``gpus``: kvpin_gpus.gpus as gpu_facts returns it. ``deployments``: a list of dicts
    ``{name, plan, pinned}`` - the deployment's name, its serving_plan ``plan`` dict and whether
    the inventory pins its GPUs (``gpu_indexes``). Infeasible plans are not deployed and are
    left out. ``system_reserved_bytes``: the worker's ``system_reserved.vram`` per GPU, in
    bytes. ``gpustack_cgroup_markers``: cgroup-path substrings of GPUStack's processes."""
    markers = _check_markers(gpustack_cgroup_markers)
    reserved_config = _bytes(system_reserved_bytes, 'system_reserved_bytes')
    cards, warnings = _check_gpus(gpus, markers)
    if not isinstance(deployments, (list, tuple)):
        raise LedgerInputError('deployments', 'must be a list of {name, plan, pinned}, got %s'
                               % type_name(deployments))
    if len(deployments) > MAX_DEPLOYMENTS:
        raise LedgerInputError('deployments', '%d deployments on one node (limit %d)'
                               % (len(deployments), MAX_DEPLOYMENTS))
    per_gpu = dict((index, []) for index in cards)
    claims, problems, unpinned, seen = {}, [], [], set()
    for position, item in enumerate(deployments):
        where = 'deployments[%d]' % position
        if not isinstance(item, dict):
            raise LedgerInputError(where, 'must be a dict {name, plan, pinned}, got %s' % type_name(item))
        name = _name(item.get('name'), where + '.name')
        if name in seen:
            raise LedgerInputError(where + '.name', 'deployment %r is listed twice' % name)
        seen.add(name)
        pinned = item.get('pinned', False)
        if not isinstance(pinned, bool):
            raise LedgerInputError(where + '.pinned', 'must be a boolean, got %s' % _short(pinned))
        plan = item.get('plan')
        if isinstance(plan, dict) and plan.get('feasible') is False:
            warnings.append('%s: its plan is infeasible, so it is not deployed and holds nothing' % name)
            continue
        entries = deployment_entries(name, plan, where + '.plan')
        for index, entry in entries:
            if index not in per_gpu:
                raise LedgerInputError(where + '.plan.memory', 'plans on GPU %d, which the node does not '
                                       'have (GPUs %s)' % (index, sorted(per_gpu)))
            per_gpu[index].append(entry)
        claims[name] = sum(entry.booked for _unused, entry in entries)
        if not pinned:
            unpinned.append(name)
    if unpinned and len(claims) > 1:
        problems.append('deployments %s do not pin their GPUs (gpu_indexes) while %d deployments share '
                        'the node: GPUStack could place them on other GPUs than they were planned on, '
                        'so the per-GPU ledger cannot hold; give each deployment gpu_indexes'
                        % (', '.join(unpinned), len(claims)))
    rows = []
    for index in sorted(cards):
        name, card, outside = cards[index]
        entries = per_gpu[index]
        held_outside = sum(process['used_memory'] for process in outside)
        row = GpuLedger(index=index, name=name, card=card.cuda_total, card_source=card.source,
                        card_nvml=card.nvml_total, entries=entries, outside_processes=held_outside,
                        processes=outside,
                        memory_charged=sum(e.held + e.outside for e in entries) + held_outside,
                        system_reserved=reserved_config,
                        booking_charged=sum(e.booked for e in entries) + reserved_config)
        rows.append(row)
        if entries:
            problems.extend(overcommit_messages(row))
    return Ledger(gpus=rows, claims=claims, problems=problems, warnings=warnings)


def overcommit_messages(row):
    """The refusals for one GPU (none when both accounts fit): the GPU, the deployments and the bytes."""
    names = ', '.join(entry.deployment for entry in row.entries)
    messages = []
    if row.memory_free < 0:
        parts = ['%s %d B (held %d B + outside its budget %d B)' % (
            e.deployment, e.held + e.outside, e.held, e.outside) for e in row.entries]
        if row.processes:
            parts.append('processes outside GPUStack %d B (%s)' % (row.outside_processes, ', '.join(
                'pid %d %d B' % (p['pid'], p['used_memory']) for p in row.processes)))
        messages.append('GPU %d (%s): memory overcommitted by %d B (%s): %s = %d B, more than the '
                        'card\'s CUDA-visible %d B (%s); deployments on it: %s' % (
                            row.index, row.name, -row.memory_free, fmt_gib(-row.memory_free),
                            ' + '.join(parts), row.memory_charged, row.card, row.card_source, names))
    if row.booking_free < 0:
        parts = ['%s %d B' % (e.deployment, e.booked) for e in row.entries]
        messages.append('GPU %d (%s): GPUStack booking overcommitted by %d B (%s): VRAM claims %s + '
                        'system_reserved %d B = %d B, more than the NVML total %d B GPUStack books '
                        'from; deployments on it: %s' % (
                            row.index, row.name, -row.booking_free, fmt_gib(-row.booking_free),
                            ' + '.join(parts), row.system_reserved, row.booking_charged,
                            row.card_nvml, names))
    return messages


def ledger_report(ledger):
    """One line per GPU: what each account charges against the card, and the verdict."""
    lines = []
    for row in ledger.gpus:
        lines.append('GPU %d %s: memory %s of %s (%s), %s %s; GPUStack booking %s of %s '
                     '(claims %s + system_reserved %s), %s %s' % (
                         row.index, row.name, fmt_gib(row.memory_charged), fmt_gib(row.card),
                         ', '.join(['%s %s' % (e.deployment, fmt_gib(e.held + e.outside)) for e in row.entries]
                                   + ['outside GPUStack %s' % fmt_gib(row.outside_processes)]),
                         'free' if row.memory_free >= 0 else 'OVERCOMMITTED by', fmt_gib(abs(row.memory_free)),
                         fmt_gib(row.booking_charged), fmt_gib(row.card_nvml),
                         fmt_gib(row.booking_charged - row.system_reserved), fmt_gib(row.system_reserved),
                         'free' if row.booking_free >= 0 else 'OVERCOMMITTED by', fmt_gib(abs(row.booking_free))))
    lines.extend('claim %s: %d B' % (name, claim) for name, claim in sorted(ledger.claims.items()))
    lines.extend('warning: %s' % warning for warning in ledger.warnings)
    return lines


def deployments_from_results(results):
    """``deployments`` for :func:`gpu_ledger` from the ``results`` of site.yml's serving_plan
    loop (each carries the loop's ``deployment`` and the ``plan``); a result without a plan (the
    task failed or was skipped) is left out."""
    if results is None:
        return []
    if not isinstance(results, (list, tuple)):
        raise LedgerInputError('results', 'must be the list kvpin_plans.results, got %s' % type_name(results))
    out = []
    for position, result in enumerate(results):
        where = 'results[%d]' % position
        if not isinstance(result, dict):
            raise LedgerInputError(where, 'must be a dict, got %s' % type_name(result))
        if result.get('plan') is None:
            continue
        deployment = result.get('deployment')
        if not isinstance(deployment, dict):
            raise LedgerInputError(where + '.deployment', 'must be the inventory deployment dict, got %s'
                                   % _short(deployment))
        # Pinned: by the inventory, or by the planner's GPU choice (the plan's gpu_indexes, which
        # deploy_models.yml hands GPUStack's GPU selector), so GPUStack places it where it was planned.
        plan = result['plan']
        out.append({'name': deployment.get('name'), 'plan': plan,
                    'pinned': deployment.get('gpu_indexes') is not None
                    or (isinstance(plan, dict) and plan.get('gpu_indexes') is not None)})
    return out
