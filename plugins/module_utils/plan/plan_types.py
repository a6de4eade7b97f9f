# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Types shared by every planner: inputs (traffic, GPUs) and the plan they return.

GPU dicts are the entries of ``ansible_facts.kvpin_gpus.gpus`` as ``gpu_facts`` returns
them; planners read only: index, uuid, name, memory_total, memory_used, memory_free,
memory_reserved, memory_total_cuda and memory_total_cuda_source (bytes; the last three
through cuda_total.of_gpu, which gives the CUDA-visible total the budgets start from) and
compute_capability ("8.6").
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field, replace
from typing import Dict, List, Optional


class PlanInputError(ValueError):
    """Bad input to a planner. ``field`` names the option at fault; the message carries
    the numbers."""

    def __init__(self, field_name, message):
        super().__init__('%s: %s' % (field_name, message))
        self.field = field_name


@dataclass(frozen=True)
class Traffic:
    """What the deployment must serve (from the inventory)."""
    prompt_tokens_p99: int
    max_output_tokens: int
    max_concurrency: int

    @property
    def tokens_per_sequence(self):
        return self.prompt_tokens_p99 + self.max_output_tokens


@dataclass
class GpuMemory:
    """One GPU's memory breakdown, every term in bytes.

    For vLLM: budget = total * gpu_memory_utilization (or kv-cache-memory-bytes + the rest);
    weights + activation + non_torch (+ cuda_graph where the version charges it) + kv_cache
    fill the budget; headroom = total - everything resident (must stay >= the margin).
    For llama.cpp / llama-box: weights = model buffer, activation = compute buffer + CUDA
    pool growth, non_torch = CUDA context/driver, kv_cache = KV buffer, budget = what the
    planner allows itself (total - reserve).
    """
    index: int
    name: str
    total: int
    budget: int
    weights: int
    activation: int
    non_torch: int
    cuda_graph: int
    kv_cache: int
    headroom: int
    terms: Dict[str, int] = field(default_factory=dict)        # finer terms (named, bytes)
    explain: Dict[str, str] = field(default_factory=dict)      # term -> how it was computed
    # term -> what kind of figure it is: shapes, engine, measured, fitted, shapes+fitted,
    # policy or derived (plugins/module_utils/plan/term_kinds.py)
    term_kinds: Dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class KvPool:
    """The block pool a planned vLLM engine will have, as the planner computed it: the blocks
    requests can hold (the null block and V0's watermark left out, min over GPUs) and the
    layout(s) that say how many blocks a request holds (pipeline parallelism: every stage's;
    the engine gives them one block count). A layout is vllm_memory.KvLayout."""
    usable_blocks: int
    layouts: tuple

    def blocks_per_request(self, tokens):
        """Blocks one request of ``tokens`` tokens holds: on the stage that needs the most."""
        return max(layout.blocks_per_request(tokens) for layout in self.layouts)


@dataclass
class Plan:
    """The result of planning one deployment on its GPUs."""
    backend: str
    backend_version: str
    args: List[str]
    memory: List[GpuMemory]
    kv_cache_tokens: int
    max_concurrency_at_max_len: float
    feasible: bool
    settings: Dict[str, object]                 # the pinned values, by option name
    reasons: Dict[str, str]                     # option -> the rule that produced it
    warnings: List[str] = field(default_factory=list)
    not_fitting: List[str] = field(default_factory=list)   # terms that do not add up
    suggestions: List[str] = field(default_factory=list)   # what would fit instead
    rules: List[str] = field(default_factory=list)         # version rules applied
    # Per GPU: what the deployment really holds resident (budget + what lives outside it).
    # GPUStack's GPUSTACK_MODEL_VRAM_CLAIM is per replica and compared with total x util, so
    # the filter kvpin_gpustack_vram_claim converts (see plugins/filter/gpustack.py).
    vram_claim_bytes: Optional[int] = None
    system_reserved_bytes: Optional[int] = None  # per GPU, kept outside GPUStack's booking
    # vLLM pipeline parallelism only: the stages (layers, bytes, KV) and, on a node of mixed
    # cards, the llama-box layer-offload plan of the same model to compare (vllm_pipeline).
    pipeline: Optional[Dict[str, object]] = None
    # The GPUs GPUStack's GPU selector pins (NVML indexes): the deployment's gpu_indexes, or
    # for vLLM without them the planner's choice (gpu_choice: what it compared, module gpu_choice);
    # None when GPUStack places the deployment itself.
    gpu_indexes: Optional[List[int]] = None
    gpu_choice: Optional[Dict[str, object]] = None
    # vLLM only: the pool the evaluation sized, handed to traffic_classes in the same process
    # (its classes are compared in blocks). Not output: kv_cache_tokens and each GPU's kv_cache
    # say the same to an operator, and the layouts are planner objects.
    kv_pool: Optional[KvPool] = field(default=None, compare=False, repr=False)
    # With a measurement (module measured_traffic): {traffic: declared vs measured per figure,
    # per hour, traffic_classes proposal; kv_pool: planned vs actual}. Output only when given.
    measured: Optional[Dict[str, object]] = None

    def to_dict(self):
        out = asdict(replace(self, kv_pool=None))
        del out['kv_pool']
        if out['measured'] is None:
            del out['measured']
        return out


class PlanTermError(PlanInputError):
    """A plan with a negative, non-finite or impossible term: refused, never returned."""


# GpuMemory fields that are amounts of memory (bytes) and so can never be negative.
MEMORY_AMOUNTS = ('total', 'budget', 'weights', 'activation', 'non_torch', 'cuda_graph',
                  'kv_cache')
# What the deployment holds on a GPU (budget-internal and outside terms alike).
RESIDENT_TERMS = ('weights', 'activation', 'non_torch', 'cuda_graph', 'kv_cache')
# Differences, not amounts: below zero exactly when the plan does not fit (an infeasible
# plan shows its shortfall there); a feasible plan with one below zero contradicts itself.
SIGNED_TERMS = ('headroom', 'kv_budget')


def _is_number(value):
    return not isinstance(value, bool) and isinstance(value, (int, float))


def _term_error(field_name, gpu, message):
    where = ('GPU %s (%s)' % (gpu.index, gpu.name or '?')) if gpu is not None else 'the plan'
    return PlanTermError(field_name, '%s: %s; refused rather than planned (a term like this comes '
                                     'from model geometry or a setting outside what any real '
                                     'deployment has)' % (where, message))


def _check_term(field_name, gpu, name, value, may_be_negative):
    if not _is_number(value) or not math.isfinite(value):
        raise _term_error(field_name, gpu, 'term %s is %r, not a finite number' % (name, value))
    if value < 0 and not may_be_negative:
        raise _term_error(field_name, gpu, 'term %s is negative (%s)' % (name, value))


def check_plan(plan):
    """The one check every plan passes before anyone sees it (PlanTermError otherwise).

    Every memory term is a finite number of bytes and no amount is negative; the signed
    differences (headroom, kv_budget) are negative only in an infeasible plan; a feasible
    plan's resident terms add up to no more than its GPU's total; the capacity figures
    are finite and not negative. Returns ``plan``."""
    for position, gpu in enumerate(plan.memory):
        prefix = 'plan.memory[%d]' % position
        for name in MEMORY_AMOUNTS + ('headroom',):
            _check_term('%s.%s' % (prefix, name), gpu, name, getattr(gpu, name),
                        name in SIGNED_TERMS and not plan.feasible)
        for name, value in sorted(gpu.terms.items()):
            _check_term('%s.terms.%s' % (prefix, name), gpu, name, value,
                        name in SIGNED_TERMS and not plan.feasible)
        if gpu.total <= 0:
            raise _term_error('%s.total' % prefix, gpu, 'total memory is %s' % gpu.total)
        resident = sum(getattr(gpu, name) for name in RESIDENT_TERMS)
        if plan.feasible and resident > gpu.total:
            raise _term_error('%s.headroom' % prefix, gpu, 'a feasible plan whose resident terms '
                              '(%s) add up to %d B, more than the GPU total %d B'
                              % (' + '.join(RESIDENT_TERMS), resident, gpu.total))
    for name in ('kv_cache_tokens', 'max_concurrency_at_max_len', 'vram_claim_bytes',
                 'system_reserved_bytes'):
        value = getattr(plan, name)
        if value is not None:
            _check_term('plan.%s' % name, None, name, value, False)
    if not plan.memory:
        raise _term_error('plan.memory', None, 'no GPU in the plan')
    return plan


# ---------------------------------------------------------------- the request's shared checks
# serving_plan (one deployment) and traffic_classes (several classes of traffic on one
# deployment's GPUs) both read their input with these, so they refuse alike.
BACKEND_VLLM = 'vllm'
BACKEND_LLAMA_BOX = 'llama-box'
BACKEND_LLAMA_CPP = 'llama.cpp'
BACKENDS = (BACKEND_VLLM, BACKEND_LLAMA_BOX, BACKEND_LLAMA_CPP)

# Sanity bounds for traffic figures: beyond these a number is a typo, not a workload.
MAX_TOKENS_PER_REQUEST = 10 * 1024 * 1024
MAX_CONCURRENCY = 100000
GPU_KEYS = ('index', 'name', 'memory_total')
# Bounds on the GPU list: llama.cpp drives at most 16 devices (GGML_CUDA_MAX_DEVICES in
# ggml/include/ggml-cuda.h), vLLM's tensor parallelism here at most 8, and no GPU has more
# memory than the bound (the largest cards hold a few hundred GB); beyond these the facts
# are wrong, not a machine. They also bound the planners' work.
MAX_GPUS = 16
MAX_GPU_MEMORY_BYTES = 1 << 42        # 4 TiB
MIN_GPU_MEMORY_BYTES = 256 << 20      # below this the figure is in MiB or GiB, not bytes
COMPUTE_CAPABILITY_RE = re.compile(r'^[0-9]{1,2}(\.[0-9]{1,2})?$')   # ASCII digits only


def is_int(value):
    """An int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


# The types a value from YAML, JSON or a module argument can have, by the name a user knows them
# by, most specific first (a bool is an int). Ansible wraps templated values in subclasses with
# private names (ansible-core 2.19: ``_AnsibleTaggedInt``, ``_AnsibleTaggedList``, ...).
USER_TYPE_NAMES = ((bool, 'bool'), (int, 'int'), (float, 'float'), (str, 'str'), (bytes, 'bytes'),
                   (dict, 'dict'), (list, 'list'), (tuple, 'list'), (set, 'list'), (type(None), 'null'))


def type_name(value):
    """The name of ``value``'s type as a user wrote it (``int``, ``list``, ``str``, ``dict``,
    ``float``, ``bool``, ``null``), whatever subclass carries it; any other object by its class."""
    for kind, name in USER_TYPE_NAMES:
        if isinstance(value, kind):
            return name
    return type(value).__name__


def positive_int(field_name, value, upper):
    """``value`` as a whole number in 1..upper (a numeric string too); PlanInputError naming
    ``field_name`` otherwise."""
    if isinstance(value, bool) or value is None:
        raise PlanInputError(field_name, 'must be a positive integer, got %r' % (value,))
    if isinstance(value, float) and not math.isfinite(value):
        raise PlanInputError(field_name, 'must be a positive integer, got %r' % (value,))
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):
        raise PlanInputError(field_name, 'must be a positive integer, got %r' % (value,))
    if number != value and str(number) != str(value).strip():
        raise PlanInputError(field_name, 'must be a whole number, got %r' % (value,))
    if number <= 0:
        raise PlanInputError(field_name, 'must be > 0, got %d' % number)
    if number > upper:
        raise PlanInputError(field_name, 'must be <= %d, got %d (typo?)' % (upper, number))
    return number


def check_gpu_totals(gpus, none_given):
    """Each planner's own GPU check: at least one GPU (``none_given`` says why), and each one's
    memory_total a positive int (a GPU that is not a dict reads as having none)."""
    if not gpus:
        raise PlanInputError('gpus', 'no GPUs given: %s' % none_given)
    for position, gpu in enumerate(gpus):
        total = gpu.get('memory_total') if isinstance(gpu, dict) else None
        if isinstance(total, bool) or not isinstance(total, int) or total <= 0:
            raise PlanInputError('gpus[%d].memory_total' % position,
                                 'must be a positive number of bytes, got %r' % (total,))


def check_gpus(gpus):
    """The GPU list as gpu_facts returns it; at least one GPU with a memory size."""
    if not gpus:
        raise PlanInputError('gpus', 'no GPUs given: the deployment needs at least one GPU '
                                     '(did gpu_facts report gpus: [] on this node?)')
    if not isinstance(gpus, (list, tuple)):
        raise PlanInputError('gpus', 'must be a list of GPU dicts as in kvpin_gpus.gpus, got %s'
                             % type_name(gpus))
    if len(gpus) > MAX_GPUS:
        raise PlanInputError('gpus', '%d GPUs given; a deployment plans at most %d (one node\'s '
                                     'GPUs)' % (len(gpus), MAX_GPUS))
    seen = set()
    for position, gpu in enumerate(gpus):
        check_gpu(position, gpu)
        if gpu['index'] in seen:
            raise PlanInputError('gpus[%d].index' % position, 'GPU %d is listed twice' % gpu['index'])
        seen.add(gpu['index'])
    return list(gpus)


def check_gpu(position, gpu):
    """One entry of ``gpus`` as gpu_facts reports it: every key the planners read has the
    type and range of a real GPU (PlanInputError naming ``gpus[i].key`` otherwise)."""
    where = 'gpus[%d]' % position
    if not isinstance(gpu, dict):
        raise PlanInputError(where, 'must be a dict, got %s' % type_name(gpu))
    missing = [key for key in GPU_KEYS if key not in gpu]
    if missing:
        raise PlanInputError(where, 'missing %s' % ', '.join(missing))
    index = gpu['index']
    if not is_int(index) or not 0 <= index < 1 << 16:
        raise PlanInputError(where + '.index', 'must be a GPU index (integer >= 0), got %r' % (index,))
    if not isinstance(gpu['name'], str):
        raise PlanInputError(where + '.name', 'must be a string, got %s' % type_name(gpu['name']))
    total = gpu['memory_total']
    if not is_int(total) or total <= 0:
        raise PlanInputError(where + '.memory_total',
                             'must be a positive number of bytes, got %r' % (total,))
    if total < MIN_GPU_MEMORY_BYTES:
        raise PlanInputError(where + '.memory_total', '%d B is less than any GPU that serves a model '
                             'has (%d B); the value is not in bytes (MiB?)' % (total, MIN_GPU_MEMORY_BYTES))
    if total > MAX_GPU_MEMORY_BYTES:
        raise PlanInputError(where + '.memory_total', '%d B is more than any GPU has (limit %d B); '
                             'the value is not in bytes or not a GPU' % (total, MAX_GPU_MEMORY_BYTES))
    for key in ('memory_used', 'memory_free'):
        value = gpu.get(key)
        if value is not None and (not is_int(value) or not 0 <= value <= total):
            raise PlanInputError('%s.%s' % (where, key), 'must be bytes between 0 and memory_total '
                                 '%d, got %r' % (total, value))
    capability = gpu.get('compute_capability')
    if capability is not None and not (isinstance(capability, str)
                                       and COMPUTE_CAPABILITY_RE.match(capability)):
        raise PlanInputError(where + '.compute_capability', 'must be a string like "8.6", got %r'
                             % (capability,))
    for key in ('uuid',):
        if gpu.get(key) is not None and not isinstance(gpu[key], str):
            raise PlanInputError('%s.%s' % (where, key), 'must be a string, got %s'
                                 % type_name(gpu[key]))
