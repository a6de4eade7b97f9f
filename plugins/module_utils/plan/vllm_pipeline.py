# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""vLLM pipeline parallelism (PP, and TP x PP): the memory of each stage, in bytes.

With ``--pipeline-parallel-size N`` vLLM splits the decoder layers into N consecutive stages
(``get_pp_indices``, vllm/distributed/utils.py; ``VLLM_PP_LAYER_PARTITION`` overrides the split)
and runs each stage on its own TP group of GPUs. Per GPU of stage s, in bytes:

    weights_s  = layers_s x (per-rank layer bytes / num_layers)
                 + embedding / TP                 on the first stage
                 + lm_head / TP + final norm      on the last stage (a tied model builds its
                                                  embedding there too, as the lm_head)
    activation = the profile run's forward pass   on every stage
                 + sampler warm-up + hidden states   on the last stage only (it samples)
                 + intermediate tensors received  on every stage but the first
                   (hidden states + residual, max_num_batched_tokens x hidden x dtype each)
    non-torch, CUDA graphs (nodes scale with layers_s), the outside terms: as for TP alone,
                 plus the PP group's NCCL buffers
    kv budget_s = total x util - the charged terms above
    blocks_s    = kv budget_s // (block_size x layers_s x KV bytes per layer per token)

Every worker profiles itself and vLLM then gives every worker the SMALLEST block count
("Change the num_blocks of each rank to the smallest among all ranks", get_kv_cache_configs /
unify_kv_cache_configs), so the engine holds min over stages of blocks_s: the smallest stage
bounds the KV tokens and the concurrency. One gpu_memory_utilization applies to every GPU.

On a node whose cards differ (an RTX A6000 with an RTX 4090), stages of different cards get
an uneven ``VLLM_PP_LAYER_PARTITION``: layers in proportion to what each stage has free after
its fixed terms, then moved one at a time while the stages' block counts, smallest first, grow
(each candidate at the utilization it would get); GPUs are staged in index order, with
``CUDA_DEVICE_ORDER=PCI_BUS_ID`` so CUDA numbers them the same way. The plan
also carries llama-box's layer-offload plan of the same model on the same cards, so the two
can be compared in layers, bytes and KV tokens. Entry point: ``plan_vllm_pipeline``.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Dict, List, Optional

from ansible_collections.kvpin.fleet.plugins.module_utils.plan.attention_kinds import kind_of, vllm_forced_block_size
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.plan_types import (
    GpuMemory, KvPool, Plan, PlanInputError, check_gpu_totals, type_name)
from ansible_collections.kvpin.fleet.plugins.module_utils.plan import vllm_memory as vm
from ansible_collections.kvpin.fleet.plugins.module_utils.plan import vllm_profile as prof
from ansible_collections.kvpin.fleet.plugins.module_utils.plan import term_kinds as tk
from ansible_collections.kvpin.fleet.plugins.module_utils.plan import llamacpp_memory as lm
from ansible_collections.kvpin.fleet.plugins.module_utils.plan import llamacpp_profile as lprof
from ansible_collections.kvpin.fleet.plugins.module_utils.units import ceil_div, fmt_bytes

PP_KNOBS = ('pipeline_parallel_size', 'pp_layer_partition')
# Knobs a PP plan does not model (the pinned KV size is per worker and the stages differ).
PP_UNSUPPORTED_KNOBS = ('pin_kv_cache_memory', 'kv_cache_memory_bytes', 'cudagraph_memory_estimate')
MAX_PIPELINE_PARALLEL = 16
# Longest pp_layer_partition read: 16 stages of up to 3 digits, commas and spaces.
MAX_PARTITION_TEXT = 128
# Hidden states + residual: what a decoder stage hands the next (make_empty_intermediate_tensors).
INTERMEDIATE_TENSORS = 2
_PARTITION_ITEM_RE = re.compile(r'^\s*[+-]?\d+\s*$')


def pipeline_requested(knobs):
    """True when the knobs ask for pipeline parallelism (a size or a partition)."""
    knobs = knobs or {}
    return any(knobs.get(name) is not None for name in PP_KNOBS)


# ---------------------------------------------------------------- layer partition
def default_partition(num_layers, pp):
    """Layers per stage as vLLM's get_pp_indices splits them without VLLM_PP_LAYER_PARTITION:
    num_layers // pp each, the remainder one each to partitions[-2], [-3], ... (never the last)."""
    partition = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        partition[-i] += 1
    return partition


def stage_ranges(partition):
    """[(start, end)] of each stage, end exclusive (get_pp_indices' start_layer/end_layer)."""
    ranges, start = [], 0
    for count in partition:
        ranges.append((start, start + count))
        start += count
    return ranges


def parse_partition(value, num_layers, pp):
    """A user's pp_layer_partition (a list of integers or the env form "40,24"), checked the way
    vLLM checks VLLM_PP_LAYER_PARTITION (pp entries summing to num_hidden_layers) and more:
    every stage needs at least one layer. PlanInputError('pp_layer_partition') otherwise."""
    field = 'pp_layer_partition'
    if isinstance(value, (str, list, tuple)) and len(value) > MAX_PARTITION_TEXT:
        raise PlanInputError(field, 'is %d long; a partition has at most %d stages' % (
            len(value), MAX_PIPELINE_PARALLEL))
    if isinstance(value, str):
        items = value.split(',')
        if not all(_PARTITION_ITEM_RE.match(item) for item in items):
            raise PlanInputError(field, 'must be integers separated by commas (the %s form), got %r'
                                 % (prof.PP_LAYER_PARTITION_ENV, value))
        items = [int(item) for item in items]
    elif isinstance(value, (list, tuple)):
        items = []
        for position, item in enumerate(value):
            if isinstance(item, bool) or not isinstance(item, (int, float, str)):
                raise PlanInputError(field, 'entry %d must be an integer number of layers, got %r'
                                     % (position, item))
            if isinstance(item, str):
                if not _PARTITION_ITEM_RE.match(item):
                    raise PlanInputError(field, 'entry %d must be an integer number of layers, got %r'
                                         % (position, item))
                item = int(item)
            elif isinstance(item, float):
                if math.isnan(item) or math.isinf(item) or item != int(item):
                    raise PlanInputError(field, 'entry %d must be an integer number of layers, got %r'
                                         % (position, item))
                item = int(item)
            items.append(item)
    else:
        raise PlanInputError(field, 'must be a list of layer counts (one per stage) or "a,b,...", '
                                    'got %r (%s)' % (value, type_name(value)))
    if len(items) != pp:
        raise PlanInputError(field, '%d entries %s for pipeline_parallel_size %d: one per stage'
                             % (len(items), items, pp))
    for position, item in enumerate(items):
        if item < 1:
            raise PlanInputError(field, 'entry %d is %d: every stage needs at least one layer'
                                 % (position, item))
    if sum(items) != num_layers:
        raise PlanInputError(field, '%s sums to %d layers, the model has %d (num_hidden_layers)'
                             % (items, sum(items), num_layers))
    return items


# ---------------------------------------------------------------- per-stage terms
def weight_parts(spec, tp, gpus=(None,), version=None):
    """(per-layer bytes x num_layers, embedding, lm_head, final norm) one TP rank loads, in
    bytes, and how. The rank total is vllm_memory.weights_per_gpu (TP sharding, replicated
    parts, KV-head replication); embedding and lm_head are vocab x hidden matrices sharded by
    TP (VocabParallelEmbedding / ParallelLMHead), from the checkpoint's roles where known."""
    # the GPU whose kernel stores the most (MXFP4 on Marlin below Hopper pads its experts)
    rank_total, _terms, w_explain = max((vm.weights_per_gpu(spec, tp, gpu, version) for gpu in gpus),
                                        key=lambda weights: weights[0])
    by_role = spec.extra.get('weight_bytes_by_role') or {}
    matrix = spec.vocab_size * spec.hidden_size * spec.dtype_bytes
    embedding = ceil_div(by_role.get('embedding') or matrix, tp)
    lm_head = embedding if spec.tie_word_embeddings else ceil_div(by_role.get('lm_head') or matrix, tp)
    norm = spec.hidden_size * spec.dtype_bytes
    stored_head = 0 if spec.tie_word_embeddings else lm_head
    layers = max(0, rank_total - embedding - stored_head - norm)
    explain = ('%s per rank (%s); less embedding %s%s and final norm %s leaves %s for %d decoder '
               'layers, %s each' % (
                   fmt_bytes(rank_total), w_explain, fmt_bytes(embedding),
                   '' if spec.tie_word_embeddings else ' and lm_head %s' % fmt_bytes(lm_head),
                   fmt_bytes(norm), fmt_bytes(layers), spec.num_layers, fmt_bytes(layers // spec.num_layers)))
    return layers, embedding, lm_head, norm, explain


def stage_spec(spec, start, end):
    """The model as one stage sees it: its layers only (KV layout, graph nodes)."""
    return dataclasses.replace(spec, num_layers=end - start, layer_kinds=list(spec.layer_kinds[start:end]))


class _Setup:
    """Everything fixed for one PP plan: version, knobs, stages of GPUs, batch shape."""

    def __init__(self, spec, gpus, traffic, knobs, version, pp, tp):
        self.spec, self.traffic, self.knobs, self.version = spec, traffic, knobs, version
        self.pp, self.tp = pp, tp
        self.acct = prof.accounting(version)
        self.stages = [gpus[s * tp:(s + 1) * tp] for s in range(pp)]
        self.cudas = [[vm.cuda_total_of(gpu, s * tp + i) for i, gpu in enumerate(stage)]
                      for s, stage in enumerate(self.stages)]
        self.enforce_eager = bool(knobs.get('enforce_eager'))
        self.graphs_inside = self.acct.cuda_graphs == prof.GRAPHS_INSIDE
        self.kv_dtype = knobs.get('kv_cache_dtype') or 'auto'
        self.kv_bytes = prof.kv_cache_dtype_bytes(self.kv_dtype, version, spec.dtype_bytes)
        self.reasons = {}
        block_size = knobs.get('block_size')
        if block_size is None:
            forced = vllm_forced_block_size(spec.layer_kinds)
            if forced is not None:
                block_size, self.reasons['block_size'] = forced
            else:
                block_size = prof.default_block_size(version)
        self.block_size = block_size
        first = gpus[0]
        defaults = prof.batch_defaults(version, first.get('name'), first['memory_total'])
        mnbt = knobs.get('max_num_batched_tokens')
        if mnbt is None:
            mnbt = defaults.max_num_batched_tokens
            self.reasons['max_num_batched_tokens'] = defaults.rule + ' (device of the first stage)'
            if knobs.get('max_num_seqs', 0) > mnbt:
                mnbt = knobs['max_num_seqs']
                self.reasons['max_num_batched_tokens'] = ('raised to max_num_seqs %d: vLLM requires '
                                                          'max_num_batched_tokens >= max_num_seqs' % mnbt)
        self.mnbt = mnbt
        self.layers_w, self.embedding, self.lm_head, self.norm, self.w_explain = weight_parts(spec, tp, gpus, version)
        # Layers are charged alike. A MoE model whose first k layers are dense (DeepSeek's
        # first_k_dense_replace) has smaller dense layers: every layer is charged the MoE
        # layers' average (all layer bytes / MoE layers), which over-counts, never under.
        dense = spec.extra.get('first_k_dense_replace') or 0 if spec.num_experts else 0
        self.layer_divisor = spec.num_layers - dense if 0 < dense < spec.num_layers else spec.num_layers
        if self.layer_divisor != spec.num_layers:
            self.w_explain += ('; %d leading dense layers: every layer charged the MoE average, all layer '
                               'bytes / %d MoE layers (an over-count)' % (dense, self.layer_divisor))
        self.non_torch_growth = 0 if self.acct.cublas_in_baseline else vm.NON_TORCH_GROWTH_BYTES
        self.tp_workspace = vm.TP_WORKSPACE_BYTES if tp > 1 else 0

    def capture_sizes(self, ms):
        return [] if self.enforce_eager else prof.cudagraph_capture_sizes(self.version, ms, self.mnbt)


@dataclasses.dataclass
class StageGpu:
    """One GPU of a stage: its CUDA total, budget (total x util), KV budget and blocks, and what
    vLLM holds outside the budget there. ``budget``, ``kv_budget`` and ``blocks`` are None while
    the utilization is being derived."""
    gpu: dict
    cuda: object                    # cuda_total.CudaTotal
    total: int
    budget: Optional[int]
    kv_budget: Optional[int]
    blocks: Optional[int]
    outside: Dict[str, int]
    resident: int
    required: int
    ext: Optional[dict]             # the extensible KV cache's sizing (vLLM 0.34+), else None


@dataclasses.dataclass
class Stage:
    """One stage's numbers, in bytes (the same for each GPU of its TP group but the total):
    layers [start, end), weights, activation, non-torch, CUDA graphs, its KV layout, and per GPU
    the budget and KV blocks (``blocks``: the smallest over its GPUs)."""
    stage: int
    start: int
    end: int
    layout: object                  # vllm_memory.KvLayout of the stage's layers
    w_layers: int
    w_embed: int
    w_head: int
    act: int
    a_forward: int
    a_sampler: int
    a_hidden: int
    a_intermediate: int
    graph: int
    g_terms: Dict[str, int]
    g_explain: str
    tp_nccl: int
    pp_nccl: int
    inside_nt: int
    charged: int
    rows: List[StageGpu]
    blocks: Optional[int]

    @property
    def layers(self):
        return self.end - self.start

    @property
    def weights(self):
        return self.w_layers + self.w_embed + self.w_head


def _stage(setup, s, start, end, ms, util):
    """One stage's numbers (the same for each GPU of its TP group but the total): a Stage."""
    spec, tp, pp = setup.spec, setup.tp, setup.pp
    sub = stage_spec(spec, start, end)
    first, last = s == 0, s == pp - 1
    layer_bytes = ceil_div(setup.layers_w * (end - start), setup.layer_divisor)
    w_embed = setup.embedding if first else 0
    w_head = (setup.lm_head + setup.norm) if last else 0
    weights = layer_bytes + w_embed + w_head
    peak, a_terms, _a_explain = vm.activation_peak(spec, tp, ms, setup.mnbt, setup.version,
                                                   setup.knobs.get('vllm_sampler'))
    intermediate = 0 if first else INTERMEDIATE_TENSORS * setup.mnbt * spec.hidden_size * spec.dtype_bytes
    if last:
        sampler, hidden = a_terms['activation_sampler_warmup'], a_terms['activation_hidden_states']
        act = peak + intermediate
    else:
        sampler = hidden = 0
        act = a_terms['activation_forward_pass'] + intermediate
    name = setup.stages[s][0].get('name')
    graph, g_terms, g_explain = vm.cuda_graph_pool(sub, tp, setup.capture_sizes(ms), name)
    tp_nccl = vm.nccl_buffer_bytes(tp, name)
    pp_nccl = vm.nccl_buffer_bytes(pp, name)
    inside_nt = setup.non_torch_growth + setup.tp_workspace + (
        0 if setup.acct.nccl_in_baseline else tp_nccl + pp_nccl)
    charged = weights + act + inside_nt + (graph if setup.graphs_inside else 0)
    try:
        layout = vm.kv_layout(sub, tp, setup.kv_bytes, setup.block_size, setup.mnbt)
    except PlanInputError:
        raise PlanInputError('pp_layer_partition', 'stage %d (layers %d-%d) has no layer with a KV '
                             'cache; vLLM sizes its pool per stage' % (s, start, end - 1))
    rows = []
    for gpu, cuda in zip(setup.stages[s], setup.cudas[s]):
        total = cuda.cuda_total
        budget = vm.util_bytes(total, util) if util is not None else None
        kv_budget = None if budget is None else budget - charged
        ext = None
        if kv_budget is not None and setup.acct.extensible_kv_default:
            # vLLM 0.34+: the extensible KV cache (on by default; a PP plan cannot pin the KV
            # bytes, see _checked) sizes each worker from what is free after warm-up, less a
            # >= 1 GiB margin: the stage holds the smaller of that and the util budget's rest.
            ext = vm.extensible_sizing(setup.acct, tp, gpu, total, util, weights + inside_nt + graph,
                                       act + (graph if setup.graphs_inside else 0))
            kv_budget = min(kv_budget, ext['kv'])
        blocks = None if kv_budget is None else max(0, kv_budget) // layout.bytes_per_block
        outside, resident, required = vm.outside_terms(setup.acct, setup.graphs_inside, tp, gpu, graph)
        if setup.acct.nccl_in_baseline:
            outside = dict(outside, pp_nccl_buffers=pp_nccl)
            resident += pp_nccl
            required += pp_nccl
        rows.append(StageGpu(gpu=gpu, cuda=cuda, total=total, budget=budget, kv_budget=kv_budget,
                             blocks=blocks, outside=outside, resident=resident, required=required, ext=ext))
    return Stage(stage=s, start=start, end=end, layout=layout,
                 w_layers=layer_bytes, w_embed=w_embed, w_head=w_head, act=act,
                 a_forward=a_terms['activation_forward_pass'], a_sampler=sampler, a_hidden=hidden,
                 a_intermediate=intermediate, graph=graph, g_terms=g_terms, g_explain=g_explain,
                 tp_nccl=tp_nccl, pp_nccl=pp_nccl, inside_nt=inside_nt, charged=charged, rows=rows,
                 blocks=min(r.blocks for r in rows) if util is not None else None)


def _derived_util(setup, partition, ms):
    """min over GPUs of floor((total - what vLLM holds outside the budget - margin) / total)."""
    util = None
    for s, (start, end) in enumerate(stage_ranges(partition)):
        for row in _stage(setup, s, start, end, ms, None).rows:
            here = vm.floor_util(row.total - row.required, row.total)
            util = here if util is None else min(util, here)
    return util


def _evaluate(setup, partition, ms, util):
    stages = [_stage(setup, s, start, end, ms, util)
              for s, (start, end) in enumerate(stage_ranges(partition))]
    usable = min(st.blocks for st in stages) - (1 if setup.acct.holds_null_block else 0)
    return stages, max(0, usable)


def _balanced_partition(setup, ms, util_for):
    """The partition that gives the smallest stage the most blocks: layers in proportion to
    each stage's budget left after its fixed terms (weights without layers, activation,
    non-torch, graphs), largest remainder first, then single layers moved while the stages'
    block counts, smallest first, grow (leximin). ``util_for(partition)`` is the utilization
    that partition runs at (the user's, or derived: a graph pool outside the budget grows with
    a stage's layers)."""
    pp, n = setup.pp, setup.spec.num_layers
    start = default_partition(n, pp)
    util = util_for(start)
    free = []
    for s in range(pp):
        st = _stage(setup, s, 0, 1, ms, util)      # one layer: the fixed terms + one layer
        free.append(max(1, min(r.budget for r in st.rows) - st.charged + st.w_layers))
    total_free = sum(free)
    shares = [n * f / total_free for f in free]
    partition = [max(1, int(x)) for x in shares]
    while sum(partition) > n:
        i = max((i for i in range(pp) if partition[i] > 1), key=lambda i: partition[i] - shares[i])
        partition[i] -= 1
    while sum(partition) < n:
        i = max(range(pp), key=lambda i: shares[i] - partition[i])
        partition[i] += 1

    def score(candidate):
        # leximin: the smallest stage's blocks first, then the next smallest, ... (so that two
        # stages tied at the minimum can be raised one move at a time)
        stages, _usable = _evaluate(setup, candidate, ms, util_for(candidate))
        return tuple(sorted(st.blocks for st in stages))

    best = score(partition)
    for _step in range(n * pp):
        improved = False
        for i in range(pp):
            for j in range(pp):
                if i == j or partition[i] <= 1:
                    continue
                candidate = list(partition)
                candidate[i] -= 1
                candidate[j] += 1
                value = score(candidate)
                if value > best:
                    partition, best, improved = candidate, value, True
        if not improved:
            break
    return partition


def _kind(gpu):
    return (gpu.get('name', ''), gpu['memory_total'])


# ---------------------------------------------------------------- inputs
def _checked(spec, gpus, traffic, knobs, backend_version):
    """(version, gpus, knobs without the PP ones, pp, tp, user partition or None)."""
    version = prof.parse_version(backend_version)
    knobs = {k: v for k, v in dict(knobs or {}).items() if v is not None}
    size = knobs.get('pipeline_parallel_size')
    if size == 1 and isinstance(size, int) and not isinstance(size, bool):
        # one stage is no pipeline: the TP planner; a partition can then only be [num_layers]
        if 'pp_layer_partition' in knobs:
            parse_partition(knobs['pp_layer_partition'], spec.num_layers, 1)
        return version, gpus, {k: v for k, v in knobs.items() if k not in PP_KNOBS}, 1, None, None
    for name in PP_UNSUPPORTED_KNOBS:
        if name in knobs:
            raise PlanInputError(name, 'is not modelled with pipeline parallelism (each stage has its '
                                 'own KV page size); leave it unset with pipeline_parallel_size')
    pp = vm.int_knob(knobs, 'pipeline_parallel_size', 1, MAX_PIPELINE_PARALLEL)
    partition_value = knobs.pop('pp_layer_partition', None)
    knobs.pop('pipeline_parallel_size', None)
    if pp is None:
        if isinstance(partition_value, (list, tuple)):
            pp = len(partition_value)
        elif isinstance(partition_value, str):
            pp = len(partition_value.split(','))
        if not pp or pp > MAX_PIPELINE_PARALLEL:
            raise PlanInputError('pp_layer_partition', 'give pipeline_parallel_size (1-%d) with it'
                                 % MAX_PIPELINE_PARALLEL)
    if pp == 1:
        if partition_value is not None:
            parse_partition(partition_value, spec.num_layers, 1)
        return version, gpus, knobs, 1, None, None
    if not prof.pipeline_supported(version):
        raise PlanInputError('pipeline_parallel_size', 'vLLM %s runs `--pipeline-parallel-size` on the '
                             'V0 engine (the V1 engine takes it with the default executor from %s), '
                             'which this planner does not model' % (
                                 version, prof.version_tuple_text(prof.PIPELINE_V1_SINCE)))
    vm.check_vllm_spec(spec)
    for kind in sorted(set(kind_of(k) for k in spec.layer_kinds if kind_of(k).vllm_pipeline_refusal),
                       key=lambda kind: kind.name):
        raise PlanInputError('pipeline_parallel_size', '%s has %s layers: %s' % (
            spec.name, kind.label, kind.vllm_pipeline_refusal))
    vm.check_traffic(traffic)
    check_gpu_totals(gpus, 'vLLM needs at least one GPU')
    # vLLM's rank r (stage r // TP) runs on CUDA device r; with CUDA_DEVICE_ORDER=PCI_BUS_ID
    # (set by the plan when stages differ) that is the r-th GPU by NVML index
    gpus = sorted(gpus, key=lambda gpu: gpu.get('index', 0) if isinstance(gpu.get('index'), int) else 0)
    partition = parse_partition(partition_value, spec.num_layers, pp) if partition_value is not None else None
    if pp > spec.num_layers:
        raise PlanInputError('pipeline_parallel_size', '%d stages for %d layers: every stage needs a layer'
                             % (pp, spec.num_layers))
    tp_value = knobs.pop('tensor_parallel_size', None)
    if tp_value is None or (isinstance(tp_value, str) and tp_value.strip() == 'auto'):
        tp = max(1, len(gpus) // pp)
        while tp > 1 and vm.tp_refusal(spec, tp):
            tp -= 1
    else:
        tp = vm.int_knob({'tensor_parallel_size': tp_value}, 'tensor_parallel_size', 1, 1024)
        why = vm.tp_refusal(spec, tp)
        if why:
            raise PlanInputError('tensor_parallel_size', '%s: %s' % (spec.name, why))
    if tp * pp > len(gpus):
        raise PlanInputError('pipeline_parallel_size', 'TP %d x PP %d needs %d GPUs, %d given'
                             % (tp, pp, tp * pp, len(gpus)))
    for s in range(pp):
        stage = gpus[s * tp:(s + 1) * tp]
        kinds = sorted(set(_kind(gpu) for gpu in stage), key=lambda k: k[1])
        if len(kinds) > 1:
            raise PlanInputError('gpus', 'stage %d (GPUs %s) mixes %s: tensor parallelism inside a stage '
                                 'needs GPUs of one kind; order gpus so each stage of %d holds one kind' % (
                                     s, ', '.join(str(g.get('index', '?')) for g in stage),
                                     ' and '.join('%s %s' % (name or '?', fmt_bytes(total)) for name, total in kinds),
                                     tp))
    if tp_value is not None and not (isinstance(tp_value, str) and tp_value.strip() == 'auto'):
        knobs['tensor_parallel_size'] = tp          # user-set: the reason says so
    knobs = vm.checked_knobs(knobs, spec, version)
    return version, list(gpus[:tp * pp]), knobs, pp, tp, partition


# ---------------------------------------------------------------- the plan
def plan_vllm_pipeline(spec, gpus, traffic, knobs, backend_version):
    """Plan one vLLM deployment with pipeline parallelism (knob pipeline_parallel_size, TP per
    stage from tensor_parallel_size, optional pp_layer_partition). Bad input -> PlanInputError
    naming the field; a plan that does not fit -> Plan.feasible False naming the stages."""
    version, gpus, knobs, pp, tp, user_partition = _checked(spec, gpus, traffic, knobs, backend_version)
    if pp == 1:
        return vm.plan_vllm(spec, gpus, traffic, knobs, backend_version)
    setup = _Setup(spec, gpus, traffic, knobs, version, pp, tp)
    max_model_len, len_reason, warnings, beyond_model = vm.derive_max_model_len(spec, traffic, knobs)
    mixed = len(set(_kind(stage[0]) for stage in setup.stages)) > 1
    user_ms = knobs.get('max_num_seqs')
    ms = user_ms if user_ms is not None else max(1, min(traffic.max_concurrency, setup.mnbt))
    even = default_partition(spec.num_layers, pp)
    user_util = knobs.get('gpu_memory_utilization')

    def util_for(candidate):
        return user_util if user_util is not None else _derived_util(setup, candidate, ms)

    if user_partition is not None:
        partition, partition_reason = user_partition, 'set by the user (%s)' % ','.join(
            str(n) for n in user_partition)
    elif not mixed:
        partition, partition_reason = even, (
            'vLLM get_pp_indices default for %d layers over %d stages of one GPU kind: %s' % (
                spec.num_layers, pp, prof.PP_REMAINDER_RULE))
    else:
        partition = _balanced_partition(setup, ms, util_for)
        partition_reason = ('stages on different cards: layers in proportion to each stage\'s budget '
                            'left after its fixed terms, then moved one at a time while the engine\'s KV '
                            'blocks grow (vLLM gives every stage the smallest block count)')
        if _evaluate(setup, partition, ms, util_for(partition))[1] <= _evaluate(setup, even, ms, util_for(even))[1]:
            partition, partition_reason = even, (
                'vLLM\'s default split %s gives the engine as many KV blocks as any uneven one' % even)
    util = util_for(partition)
    stages, usable = _evaluate(setup, partition, ms, util)
    seq_tokens = min(traffic.tokens_per_sequence, max_model_len)
    seq_blocks = max(st.layout.blocks_per_request(seq_tokens) for st in stages)
    if user_ms is None and usable // seq_blocks < ms:
        ms = max(1, usable // seq_blocks)
        stages, usable = _evaluate(setup, partition, ms, util)
    return _plan(setup, _Chosen(
        partition=partition, partition_reason=partition_reason, even=even, mixed=mixed, util=util,
        user_util=user_util, ms=ms, user_ms=user_ms, stages=stages, usable=usable, seq_tokens=seq_tokens,
        seq_blocks=seq_blocks, max_model_len=max_model_len, len_reason=len_reason, warnings=warnings,
        beyond_model=beyond_model))


@dataclasses.dataclass
class _Chosen:
    """What plan_vllm_pipeline settled on: the partition and why, the utilization and
    max_num_seqs (each the user's or derived), the stages evaluated with them and the engine's
    usable KV blocks, max_model_len and the warnings so far."""
    partition: List[int]
    partition_reason: str
    even: List[int]                 # vLLM's own split of the layers
    mixed: bool                     # stages on cards of different kinds
    util: float
    user_util: Optional[float]
    ms: int
    user_ms: Optional[int]
    stages: List[Stage]
    usable: int                     # the engine's usable KV blocks (smallest stage, less the null block)
    seq_tokens: int
    seq_blocks: int
    max_model_len: int
    len_reason: str
    warnings: List[str]
    beyond_model: bool

    @property
    def partition_text(self):
        return ','.join(str(n) for n in self.partition)


def _uneven(setup, chosen):
    return chosen.partition != [setup.spec.num_layers // setup.pp] * setup.pp


def _plan(setup, chosen):
    """The Plan of ``chosen``: per-GPU memory, per-stage summary, engine args and settings, each
    value's reason, rules and warnings."""
    stages, usable = chosen.stages, chosen.usable
    bound, kv_tokens, concurrency, max_len_blocks = _engine_kv(setup, chosen)
    memory, not_fitting, stage_out = [], [], []
    vram_claim = system_reserved = 0
    charges_fit = True
    for st in stages:
        for row in st.rows:
            gpu_memory, fits = _gpu_memory(setup, chosen, st, row, bound, not_fitting)
            memory.append(gpu_memory)
            charges_fit = charges_fit and fits
            vram_claim = max(vram_claim, row.budget + row.resident)
            system_reserved = max(system_reserved, row.required)
        stage_out.append(_stage_entry(setup, st, bound))
    not_fitting.extend(_engine_not_fitting(setup, chosen, bound, charges_fit, max_len_blocks))
    feasible = not not_fitting
    suggestions = [] if feasible else _suggestions(setup, chosen, charges_fit, kv_tokens)
    settings = _settings(setup, chosen)
    reasons = _reasons(setup, chosen)
    environment, env_reasons = _environment(setup, chosen)
    reasons.update(env_reasons)
    if environment:
        settings['environment'] = environment
    return Plan(
        backend='vllm', backend_version=setup.version.text, args=_args(setup, chosen), memory=memory,
        kv_cache_tokens=kv_tokens, max_concurrency_at_max_len=round(concurrency, 2),
        feasible=feasible, settings=settings, reasons=reasons,
        warnings=_warnings(setup, chosen, feasible, bound),
        not_fitting=not_fitting, suggestions=suggestions, rules=_rules(setup, bound, environment),
        vram_claim_bytes=vram_claim, system_reserved_bytes=system_reserved,
        pipeline=_pipeline_summary(setup, chosen, stage_out, bound, kv_tokens, environment),
        kv_pool=KvPool(usable_blocks=usable, layouts=tuple(st.layout for st in stages)))


def _engine_kv(setup, chosen):
    """(bounding stage, engine KV tokens, concurrency at max_model_len, blocks of one
    max_model_len sequence): the smallest stage's block count is every stage's."""
    stages, usable, max_model_len = chosen.stages, chosen.usable, chosen.max_model_len
    max_len_blocks = max(st.layout.blocks_per_request(max_model_len) for st in stages)
    hybrid = any(st.layout.hybrid for st in stages)
    concurrency = min(usable / st.layout.blocks_per_request(max_model_len) for st in stages)
    kv_tokens = int(concurrency * max_model_len) if hybrid else usable * setup.block_size
    bound = min(stages, key=lambda st: st.blocks)
    return bound, kv_tokens, concurrency, max_len_blocks


def _gpu_memory(setup, chosen, st, row, bound, not_fitting):
    """(GpuMemory of one GPU of stage ``st``, every term in bytes and explained; whether the
    stage's charged terms fit its budget there). What does not fit is added to ``not_fitting``."""
    spec, version, pp, util, usable = setup.spec, setup.version, setup.pp, chosen.util, chosen.usable
    layout = st.layout
    # every stage allocates the engine's block count (the null block included)
    kv_alloc = bound.blocks * layout.bytes_per_block
    charges_fit = True
    gpu, total, budget = row.gpu, row.total, row.budget
    slack = total - budget
    margin = vm.safety_margin_bytes(row.cuda.nvml_total)
    where = 'stage %d (GPU %s %s, layers %d-%d)' % (
        st.stage, gpu.get('index', '?'), gpu.get('name', '?'), st.start, st.end - 1)
    if st.charged >= budget:
        charges_fit = False
        not_fitting.append('%s: weights %s + activation %s + non-torch %s%s = %s exceed the budget '
                           '%s (total %s x util %g)' % (
                               where, fmt_bytes(st.weights), fmt_bytes(st.act),
                               fmt_bytes(st.inside_nt),
                               (' + CUDA graphs %s' % fmt_bytes(st.graph)) if setup.graphs_inside else '',
                               fmt_bytes(st.charged), fmt_bytes(budget), fmt_bytes(total), util))
    if slack < row.required:
        not_fitting.append('%s: outside the budget vLLM %s holds %s + profiler buffer %s + safety '
                           'margin %s = %s, more than total x (1 - %g) = %s' % (
                               where, version, ' + '.join('%s %s' % (k, fmt_bytes(v)) for k, v in
                                                          sorted(row.outside.items())),
                               fmt_bytes(vm.PROFILER_UNDERESTIMATE_BYTES), fmt_bytes(margin),
                               fmt_bytes(row.required), util, fmt_bytes(slack)))
    terms = {
        'weights_pp_layers': st.w_layers, 'weights_pp_embedding': st.w_embed,
        'weights_pp_lm_head': st.w_head,
        'activation_forward_pass': st.a_forward, 'activation_sampler_warmup': st.a_sampler,
        'activation_hidden_states': st.a_hidden,
        'activation_pp_intermediate_tensors': st.a_intermediate,
        'non_torch_growth': setup.non_torch_growth, 'tp_workspaces': setup.tp_workspace,
        'nccl_buffers': st.tp_nccl, 'pp_nccl_buffers': st.pp_nccl,
        'cuda_context': vm.CUDA_CONTEXT_BYTES,
        'profiler_underestimate_buffer': vm.PROFILER_UNDERESTIMATE_BYTES, 'safety_margin': margin,
        'kv_budget': row.kv_budget, 'kv_bytes_per_token': layout.bytes_per_token,
        'kv_bytes_per_block': layout.bytes_per_block, 'kv_blocks_stage': row.blocks,
        'pp_stage': st.stage, 'pp_stage_layers': st.layers,
        'outside_resident': row.resident, 'outside_required': row.required,
        'nvml_total': row.cuda.nvml_total, 'driver_reserved': row.cuda.gap,
    }
    if row.ext is not None:
        terms['extensible_margin'] = row.ext['margin']
        terms['extensible_transient_peak'] = row.ext['transient']
    terms.update(st.g_terms)
    terms.update(('outside_' + name, size) for name, size in row.outside.items())
    explain = {
        'total': 'CUDA-visible total of GPU %s (%s): %s [%s]' % (
            gpu.get('index', '?'), gpu.get('name', '?'), row.cuda.explain, row.cuda.source),
        'budget': 'ceil(total x gpu_memory_utilization %g): one utilization for every stage' % util,
        'weights': 'stage %d of %d: %d layers x (%s) = %s%s%s' % (
            st.stage, pp, st.layers, setup.w_explain, fmt_bytes(st.w_layers),
            (' + embedding %s (first stage)' % fmt_bytes(st.w_embed)) if st.w_embed else '',
            (' + %s %s (last stage)' % ('tied embedding as lm_head + final norm'
                                        if spec.tie_word_embeddings else 'lm_head + final norm',
                                        fmt_bytes(st.w_head))) if st.w_head else ''),
        'activation': ('forward pass %s%s%s (the profile run of this stage)' % (
            fmt_bytes(st.a_forward),
            (' vs sampler warm-up %s + hidden states %s, the larger (last stage: it samples)' % (
                fmt_bytes(st.a_sampler), fmt_bytes(st.a_hidden))) if st.a_sampler else
            ' (no sampler: only the last stage samples)',
            (' + intermediate tensors received %s (%d x %d tokens x hidden %d x %d B)' % (
                fmt_bytes(st.a_intermediate), INTERMEDIATE_TENSORS, setup.mnbt, spec.hidden_size,
                spec.dtype_bytes)) if st.a_intermediate else '')),
        'non_torch': 'non-torch growth %s + TP workspaces %s%s' % (
            fmt_bytes(setup.non_torch_growth), fmt_bytes(setup.tp_workspace),
            '' if setup.acct.nccl_in_baseline else
            ' + NCCL buffers TP %s and PP %s (allocated after the snapshot in this version)' % (
                fmt_bytes(st.tp_nccl), fmt_bytes(st.pp_nccl))),
        'nccl_buffers': 'TP group %s + PP group of %d stages %s (ring connections x channels x %s)' % (
            fmt_bytes(st.tp_nccl), pp, fmt_bytes(st.pp_nccl),
            fmt_bytes(vm.NCCL_BYTES_PER_CHANNEL_CONNECTION)),
        'cuda_context': 'CUDA context + driver, outside torch (%s)' % vm.CUDA_CONTEXT.describe(),
        'cuda_graph': st.g_explain + (' -- charged INSIDE the budget' if setup.graphs_inside
                                      else ' -- OUTSIDE the budget'),
        'kv_cache': ('this stage fits %d blocks of %s (%d tokens x %d layers x %s per layer per '
                     'token); vLLM gives every stage the smallest count, %d usable blocks '
                     '(stage %d bounds it) -> %s resident here' % (
                         row.blocks, fmt_bytes(layout.bytes_per_block), setup.block_size,
                         st.layers, fmt_bytes(layout.bytes_per_token // max(1, st.layers)),
                         usable, bound.stage, fmt_bytes(kv_alloc))) + (
                             '; %s' % row.ext['explain_kv'] if row.ext is not None else ''),
        'headroom': 'total - budget - outside resident terms; must stay >= profiler buffer %s + '
                    'safety margin %s' % (fmt_bytes(vm.PROFILER_UNDERESTIMATE_BYTES), fmt_bytes(margin)),
    }
    return GpuMemory(
        index=gpu.get('index', 0), name=gpu.get('name', ''), total=total, budget=budget,
        weights=st.weights, activation=st.act, non_torch=st.inside_nt,
        cuda_graph=st.graph, kv_cache=kv_alloc, headroom=total - budget - row.resident,
        terms=terms, explain=explain, term_kinds=tk.term_kinds(tk.VLLM, terms, row.cuda)), charges_fit


def _stage_entry(setup, st, bound):
    """plan.pipeline.stages[s]: one stage's layers, terms and KV, in bytes."""
    return dict(
        stage=st.stage, gpus=[g.get('index', 0) for g in setup.stages[st.stage]],
        gpu_name=setup.stages[st.stage][0].get('name', ''), layers=[st.start, st.end],
        num_layers=st.layers, weights_bytes=st.weights, activation_bytes=st.act,
        non_torch_bytes=st.inside_nt, cuda_graph_bytes=st.graph,
        kv_budget_bytes=min(r.kv_budget for r in st.rows),
        kv_bytes_per_token=st.layout.bytes_per_token, kv_blocks=st.blocks,
        kv_cache_bytes=bound.blocks * st.layout.bytes_per_block,
        kv_tokens=max(0, st.blocks - 1) * setup.block_size,
        explain='stage %d, GPU %s, layers %d-%d: weights %s + activation %s + non-torch %s%s leave %s of '
                'the budget %s for KV = %d blocks of %d tokens x %s per token' % (
                    st.stage, ','.join(str(g.get('index', '?')) for g in setup.stages[st.stage]),
                    st.start, st.end - 1, fmt_bytes(st.weights), fmt_bytes(st.act),
                    fmt_bytes(st.inside_nt),
                    (' + CUDA graphs %s' % fmt_bytes(st.graph)) if setup.graphs_inside else '',
                    fmt_bytes(min(r.kv_budget for r in st.rows)),
                    fmt_bytes(min(r.budget for r in st.rows)), st.blocks, setup.block_size,
                    fmt_bytes(st.layout.bytes_per_token)))


def _engine_not_fitting(setup, chosen, bound, charges_fit, max_len_blocks):
    """What does not fit the engine as a whole: one max_model_len sequence, the model's length."""
    spec, traffic, usable, max_model_len = setup.spec, setup.traffic, chosen.usable, chosen.max_model_len
    beyond_model = chosen.beyond_model
    not_fitting = []
    if charges_fit and usable < max_len_blocks:
        not_fitting.append('one %d-token sequence needs %d blocks but the smallest stage (stage %d, %d '
                           'layers on GPU %s) gives the engine %d usable blocks' % (
                               max_model_len, max_len_blocks, bound.stage, bound.layers,
                               ','.join(str(g.get('index', '?')) for g in setup.stages[bound.stage]),
                               usable))
    if beyond_model:
        not_fitting.append('requests need %d tokens, the model supports %d' % (
            traffic.tokens_per_sequence, spec.max_position_embeddings))
    return not_fitting


def _suggestions(setup, chosen, charges_fit, kv_tokens):
    """What would fit, for an infeasible plan."""
    version, partition_reason, usable, mixed = setup.version, chosen.partition_reason, chosen.usable, chosen.mixed
    suggestions = []
    if partition_reason.startswith('set by the user'):
        suggestions.append('leave pp_layer_partition unset: the planner balances the stages')
    if charges_fit and setup.kv_dtype == 'auto' and 'fp8' in prof.kv_cache_dtype_choices(version):
        suggestions.append('kv_cache_dtype=fp8 (halves KV per token; evaluate long-context quality)')
    if charges_fit and usable:
        suggestions.append('max_model_len <= %d (what the smallest stage holds)' % kv_tokens)
    suggestions.append('a quantized checkpoint, or more stages / GPUs')
    if mixed:
        suggestions.append('backend llama-box / llama.cpp with layer offload (pipeline.offload_comparison)')
    return suggestions


def _args(setup, chosen):
    """The engine's command-line flags."""
    tp, pp, version, knobs = setup.tp, setup.pp, setup.version, setup.knobs
    max_model_len, util, ms = chosen.max_model_len, chosen.util, chosen.ms
    args = [prof.render_flag('tensor_parallel_size', tp), prof.render_flag('pipeline_parallel_size', pp),
            prof.render_flag('max_model_len', max_model_len),
            prof.render_flag('gpu_memory_utilization', '%g' % util),
            prof.render_flag('max_num_seqs', ms), prof.render_flag('max_num_batched_tokens', setup.mnbt),
            prof.render_flag('enable_chunked_prefill')]
    if prof.flag_available('swap_space', version):
        args.append(prof.render_flag('swap_space', 0))
    if setup.kv_dtype != 'auto':
        args.append(prof.render_flag('kv_cache_dtype', setup.kv_dtype))
    if 'block_size' in knobs or setup.block_size != prof.DEFAULT_BLOCK_SIZE:
        args.append(prof.render_flag('block_size', setup.block_size))
    if setup.enforce_eager:
        args.append(prof.render_flag('enforce_eager'))
    return args


def _settings(setup, chosen):
    """plan.settings without the environment."""
    tp, pp, version, partition = setup.tp, setup.pp, setup.version, chosen.partition
    max_model_len, util, ms = chosen.max_model_len, chosen.util, chosen.ms
    settings = {'tensor_parallel_size': tp, 'pipeline_parallel_size': pp, 'pp_layer_partition': partition,
                'max_model_len': max_model_len, 'max_num_seqs': ms, 'max_num_batched_tokens': setup.mnbt,
                'kv_cache_dtype': setup.kv_dtype, 'block_size': setup.block_size,
                'enable_chunked_prefill': True, 'enforce_eager': setup.enforce_eager,
                'gpu_memory_utilization': util}
    if prof.flag_available('swap_space', version):
        settings['swap_space'] = 0
    return settings


def _reasons(setup, chosen):
    """Why each setting has its value (the environment's reasons are _environment's)."""
    tp, pp, knobs, traffic = setup.tp, setup.pp, setup.knobs, setup.traffic
    partition, partition_reason, even, partition_text = (
        chosen.partition, chosen.partition_reason, chosen.even, chosen.partition_text)
    util, user_util, ms, user_ms, usable = chosen.util, chosen.user_util, chosen.ms, chosen.user_ms, chosen.usable
    seq_blocks, seq_tokens, len_reason = chosen.seq_blocks, chosen.seq_tokens, chosen.len_reason
    uneven = _uneven(setup, chosen)
    reasons = dict(setup.reasons)
    reasons.update({
        'max_model_len': len_reason,
        'pipeline_parallel_size': 'set by the user (%d stages of TP %d = %d GPUs)' % (pp, tp, pp * tp),
        'tensor_parallel_size': ('set by the user (%d per stage)' % tp) if 'tensor_parallel_size' in setup.knobs
        else 'GPUs given // stages = %d per stage (largest dividing the heads)' % tp,
        'pp_layer_partition': partition_reason + (
            '; passed as %s=%s%s' % (prof.PP_LAYER_PARTITION_ENV, partition_text,
                                     '' if partition != even else ' (vLLM\'s own split, pinned so a release '
                                     'that places the remainder elsewhere runs what was planned)')
            if uneven else '; even: no %s needed' % prof.PP_LAYER_PARTITION_ENV),
        'gpu_memory_utilization': ('set by the user (%.2f)' % util) if user_util is not None else (
            'floor to 0.01 of min over every GPU of every stage of (total - outside terms - margin) / '
            'total = %.2f: one value for all stages' % util),
        'max_num_seqs': ('set by the user (%d)' % ms) if user_ms is not None else (
            'min(declared concurrency %d, engine KV pool %d blocks // %d blocks per %d-token sequence) '
            '= %d' % (traffic.max_concurrency, usable, seq_blocks, seq_tokens, ms)),
        'kv_cache_dtype': ('set by the user (%s)' % setup.kv_dtype) if knobs.get('kv_cache_dtype')
        else 'auto (the model dtype)%s' % (
            ': a pipeline plan never switches the KV dtype by itself, allow_fp8_kv or not (set '
            'kv_cache_dtype: fp8 to plan fp8)' if knobs.get('allow_fp8_kv') else ''),
        'enable_chunked_prefill': 'on: prefill is split into max_num_batched_tokens chunks',
    })
    return reasons


def _environment(setup, chosen):
    """(the engine's environment, reasons for it): the uneven partition, the CUDA device order on
    mixed cards, the sampler's switches."""
    knobs, uneven, mixed, partition_text = setup.knobs, _uneven(setup, chosen), chosen.mixed, chosen.partition_text
    reasons = {}
    environment = {}
    if uneven:
        environment[prof.PP_LAYER_PARTITION_ENV] = partition_text
    if mixed:
        environment[prof.CUDA_DEVICE_ORDER_ENV] = prof.CUDA_DEVICE_ORDER_PCI
        reasons['environment'] = ('%s=%s: stage s runs on CUDA device s, and CUDA\'s default order '
                                  '(fastest first) could put the %s stage on the other card; bus order '
                                  'is the NVML index order this plan uses' % (
                                      prof.CUDA_DEVICE_ORDER_ENV, prof.CUDA_DEVICE_ORDER_PCI,
                                      setup.stages[0][0].get('name', 'first')))
    sampler = knobs.get('vllm_sampler')
    environment.update(prof.sampler_env(sampler, setup.version))
    if sampler is not None:
        reasons['vllm_sampler'] = ('set by the user (%s): each stage charges that path\'s sampler warm-up%s' % (
            sampler, ''.join(' (%s=%s)' % item for item in sorted(prof.sampler_env(sampler, setup.version).items()))))
    return environment, reasons


def _rules(setup, bound, environment):
    """The rules the plan applied, for people."""
    version, pp = setup.version, setup.pp
    rules = list(setup.acct.rules) + [
        'vLLM %s: --pipeline-parallel-size %d runs the V1 engine (%s)' % (
            version, pp, prof.FLAGS['pipeline_parallel_size'].note),
        'pipeline stages: embedding on the first stage, lm_head + final norm on the last (a tied model '
        'builds the embedding there too); the sampler runs on the last stage only',
        'KV: every stage sizes its own pool; vLLM gives every stage the smallest block count, so the '
        'smallest stage (here stage %d) bounds KV tokens and concurrency' % bound.stage,
    ]
    rules.extend('%s=%s set in the engine environment' % item for item in sorted(environment.items()))
    return rules


def _warnings(setup, chosen, feasible, bound):
    """``chosen.warnings`` and what else a person should know before starting the engine."""
    knobs, traffic, stages, warnings = setup.knobs, setup.traffic, chosen.stages, chosen.warnings
    ms, seq_tokens = chosen.ms, chosen.seq_tokens
    if not feasible or 'max_num_seqs' in knobs:
        pass
    elif ms < traffic.max_concurrency:
        warnings.append('max_num_seqs %d is below the declared concurrency %d: the smallest stage (stage %d) '
                        'holds only %d sequences of %d tokens' % (
                            ms, traffic.max_concurrency, bound.stage, ms, seq_tokens))
    for st in stages:
        for row in st.rows:
            free = row.gpu.get('memory_free')
            if isinstance(free, int) and not isinstance(free, bool) and free < row.budget:
                warnings.append('GPU %s has %s free now and vLLM needs %s free at startup (total x util): '
                                'stage %d will not start unless that memory is released first' % (
                                    row.gpu.get('index', '?'), fmt_bytes(free), fmt_bytes(row.budget),
                                    st.stage))
    warnings.append('pipeline parallelism: a request passes every stage in turn; decode latency is the '
                    'sum of the stages, throughput needs several requests in flight')
    return warnings


def _pipeline_summary(setup, chosen, stage_out, bound, kv_tokens, environment):
    """plan.pipeline: stages, partition, the bounding stage; on mixed cards the llama-box
    offload plan of the same model next to it."""
    pp, tp, partition, even, usable = setup.pp, setup.tp, chosen.partition, chosen.even, chosen.usable
    pipeline = {
        'pipeline_parallel_size': pp, 'tensor_parallel_size': tp, 'partition': partition,
        'partition_default': even, 'environment': environment,
        'stages': stage_out, 'bounding_stage': bound.stage, 'engine_kv_blocks': usable,
        'engine_kv_tokens': kv_tokens,
        'rule': 'engine KV tokens = (min over stages of blocks_s - 1 null block) x block_size %d; '
                'blocks_s = stage KV budget // (block_size x stage KV bytes per token)' % setup.block_size,
    }
    if chosen.mixed:
        pipeline['offload_comparison'] = offload_comparison(setup.spec, setup, setup.traffic, kv_tokens, partition,
                                                            stage_out, usable)
    return pipeline


# ---------------------------------------------------------------- the llama-box alternative
# GGUF type whose bytes per weight match the checkpoint vLLM would load.
_GGUF_TYPE_FOR = {None: {1: 'Q8_0', 2: 'F16', 4: 'F32'}, 'fp8': 'Q8_0'}


def comparison_quantization(spec):
    """(GGUF type, why) sized like the checkpoint vLLM loads: F16 for a 16-bit model, Q8_0 for
    FP8 / 8-bit, Q4_K_M for 4-bit schemes (AWQ, GPTQ, ...)."""
    if spec.quantization is None:
        name = _GGUF_TYPE_FOR[None].get(spec.dtype_bytes, 'F16')
        return name, '%s: the same bytes per weight as the %d-byte checkpoint' % (name, spec.dtype_bytes)
    if spec.quantization in ('fp8',):
        return 'Q8_0', 'Q8_0: 8 bits per weight like the FP8 checkpoint'
    return 'Q4_K_M', 'Q4_K_M: about 4.8 bits per weight, near the %s checkpoint' % spec.quantization


def offload_comparison(spec, setup, traffic, kv_tokens, partition, stage_out, usable):
    """llama-box's layer-offload plan of the same model on the same GPUs, side by side with the
    PP plan: layers, weights, KV bytes per GPU and KV tokens of each."""
    gpus = [gpu for stage in setup.stages for gpu in stage]
    version = 'v%s' % prof.version_tuple_text(lprof.LLAMA_BOX_KNOWN_NEWEST)
    quantization, why = comparison_quantization(spec)
    vllm_side = {'backend': 'vllm', 'partition': partition, 'kv_tokens': kv_tokens,
                 'gpus': [gpu.get('index', 0) for gpu in gpus],
                 'layers': [st['num_layers'] for st in stage_out for _gpu in st['gpus']],
                 'weights_bytes': [st['weights_bytes'] for st in stage_out for _gpu in st['gpus']],
                 'kv_cache_bytes': [st['kv_cache_bytes'] for st in stage_out for _gpu in st['gpus']]}
    result = {'backend': lprof.ENGINE_LLAMA_BOX, 'backend_version': version, 'quantization': quantization,
              'quantization_reason': why, 'vllm': vllm_side}
    try:
        plan = lm.plan_llamacpp(spec, gpus, traffic, {'quantization': quantization},
                                lprof.ENGINE_LLAMA_BOX, version)
    except PlanInputError as error:
        result.update(feasible=False, error=str(error))
        return result
    result.update(
        feasible=plan.feasible, args=plan.args, kv_tokens=plan.kv_cache_tokens,
        layers=plan.settings.get('blocks_per_gpu'), gpu_layers=plan.settings.get('gpu_layers'),
        weights_bytes=[m.weights for m in plan.memory], kv_cache_bytes=[m.kv_cache for m in plan.memory],
        not_fitting=plan.not_fitting)
    return result


# ---------------------------------------------------------------- for people
def report_lines(pipeline):
    """plan_report lines for ``plan.pipeline``: each stage in bytes, and on mixed cards the
    llama-box offload plan next to the vLLM stages."""
    lines = ['pipeline: %d stages x TP %d, layers %s%s; engine KV %d tokens, bounded by stage %d' % (
        pipeline['pipeline_parallel_size'], pipeline['tensor_parallel_size'],
        ','.join(str(n) for n in pipeline['partition']),
        ''.join(' (%s=%s)' % item for item in sorted(pipeline['environment'].items())),
        pipeline['engine_kv_tokens'], pipeline['bounding_stage'])]
    lines.extend(st['explain'] for st in pipeline['stages'])
    cmp = pipeline.get('offload_comparison')
    if cmp:
        vllm_side = cmp['vllm']
        lines.append('compare vllm PP: layers per GPU %s, weights %s, KV %s, %d KV tokens' % (
            vllm_side['layers'], ' / '.join(fmt_bytes(b) for b in vllm_side['weights_bytes']),
            ' / '.join(fmt_bytes(b) for b in vllm_side['kv_cache_bytes']), vllm_side['kv_tokens']))
        if cmp.get('error'):
            lines.append('compare %s %s offload: not planned (%s)' % (cmp['backend'], cmp['backend_version'],
                                                                      cmp['error']))
        else:
            lines.append('compare %s %s %s offload: layers per GPU %s, weights %s, KV %s, %d KV tokens%s' % (
                cmp['backend'], cmp['backend_version'], cmp['quantization'], cmp['layers'],
                ' / '.join(fmt_bytes(b) for b in cmp['weights_bytes']),
                ' / '.join(fmt_bytes(b) for b in cmp['kv_cache_bytes']), cmp['kv_tokens'],
                '' if cmp['feasible'] else ' (does not fit: %s)' % '; '.join(cmp['not_fitting'])))
    return lines
