# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Which of a node's GPUs a vLLM deployment runs on, when the inventory does not pin them.

vLLM's tensor parallelism splits the model evenly over its GPUs, so a TP group must be cards
of one kind (same name, same memory); a node whose cards differ (an RTX 4090 swapped for an
RTX A6000) still serves a model that fits on one card, or on a group of identical cards. The
candidates are, per kind of card (name, NVML memory_total), the lowest-indexed ``size`` cards
of that kind for each TP size: the size the user set, or with TP unset / ``auto`` every size
in ``TP_SIZES`` up to the number of cards of that kind (a single card is the group of size 1).
Cards of one kind give the same plan, so only the lowest-indexed group of each size is planned.

Each candidate is planned by the engine's own planner (nothing recomputed here), and the one
that fits best is chosen, by these keys in order:

1. feasible before infeasible;
2. fewer GPUs (the rest stay free for other deployments; no TP communication on one card);
3. the larger KV pool (``kv_cache_tokens``: more sequences held at once);
4. the lower GPU indexes (a stable choice, so a rerun picks the same GPUs).

The choice says what it compared: per candidate the GPU indexes and names, the TP size, the
verdict, the KV pool (bytes, tokens) and the KV headroom in bytes. The KV headroom is the pool
less what the declared traffic needs (``max_concurrency`` sequences of ``prompt_tokens_p99 +
max_output_tokens`` tokens, capped at the plan's max_model_len), at the pool's bytes per
token (pool bytes / pool tokens, rounded up); negative when the pool holds less than the
traffic. When no candidate is feasible the plan of the largest group is returned, infeasible,
with every candidate's verdict in ``not_fitting`` (the refusal). A pin (``gpu_indexes``) is
never re-chosen: the caller plans exactly the pinned GPUs.

Pure functions; ``plan_fn(gpus, tp)`` is the engine planner for one candidate.
"""

from __future__ import annotations

from ansible_collections.kvpin.fleet.plugins.module_utils.plan.plan_types import PlanInputError
from ansible_collections.kvpin.fleet.plugins.module_utils.units import ceil_div

# vLLM tensor-parallel sizes tried with TP unset (the same sizes vllm_memory.TP_CANDIDATES tries).
TP_SIZES = (1, 2, 4, 8)


def gpu_kind(gpu):
    """A GPU's kind for tensor parallelism: (name, NVML memory_total in bytes)."""
    return gpu.get('name') or '?', gpu['memory_total']


def kinds(gpus):
    """[(kind, [gpus of that kind, by index])], kinds in the order of their lowest index."""
    grouped = {}
    for gpu in sorted(gpus, key=lambda g: g['index']):
        grouped.setdefault(gpu_kind(gpu), []).append(gpu)
    return sorted(grouped.items(), key=lambda item: item[1][0]['index'])


def describe_kinds(gpus):
    """'NVIDIA RTX A6000 51527024640 B x1 (index 0); ...' for messages."""
    return '; '.join('%s %d B x%d (index %s)' % (name, total, len(members),
                                                 ','.join(str(g['index']) for g in members))
                     for (name, total), members in kinds(gpus))


def candidate_groups(gpus, tp):
    """[(tp, [gpu dicts])]: per kind, the lowest-indexed group of each TP size that kind has
    enough cards for. ``tp``: the user's TP size, or None (unset / auto) for every size in TP_SIZES."""
    sizes = (tp,) if tp else TP_SIZES
    groups = []
    for _kind, members in kinds(gpus):
        for size in sizes:
            if size <= len(members):
                groups.append((size, members[:size]))
    return groups


def kv_figures(plan, traffic):
    """(KV pool bytes, KV pool tokens, KV headroom bytes or None) of a plan: the headroom is the
    pool less what ``traffic`` needs, None when the pool holds no token (no bytes per token)."""
    pool = sum(row.kv_cache for row in plan.memory)
    tokens = plan.kv_cache_tokens
    if not tokens or not pool:
        return pool, tokens, None
    per_sequence = traffic.tokens_per_sequence
    max_len = plan.settings.get('max_model_len')
    if isinstance(max_len, int) and not isinstance(max_len, bool) and max_len > 0:
        per_sequence = min(per_sequence, max_len)
    needed = traffic.max_concurrency * per_sequence
    return pool, tokens, pool - ceil_div(needed * pool, tokens)


def _verdict(plan):
    if plan.feasible:
        return 'fits'
    return 'does not fit: %s' % ('; '.join(plan.not_fitting) or 'see its plan')


def _rank(candidate):
    """Sort key: feasible first, fewer GPUs, larger KV pool, lower indexes."""
    return (not candidate['feasible'], len(candidate['gpu_indexes']),
            -(candidate['kv_cache_tokens'] or 0), candidate['gpu_indexes'])


def _line(candidate):
    head = 'GPUs %s (%s, TP %d)' % (candidate['gpu_indexes'], candidate['gpu_name'],
                                    candidate['tensor_parallel_size'])
    if candidate['kv_cache_tokens'] is None:
        return '%s: %s' % (head, candidate['verdict'])
    headroom = candidate['kv_headroom_bytes']
    return '%s: %s, KV pool %d B (%d tokens), KV headroom %s' % (
        head, candidate['verdict'], candidate['kv_cache_bytes'], candidate['kv_cache_tokens'],
        'n/a' if headroom is None else '%d B' % headroom)


def choose_gpus(gpus, tp, traffic, plan_fn):
    """(plan, choice) for the best candidate group of ``gpus`` (see the module doc), or
    (None, None) when there is no candidate (no kind has ``tp`` cards): the caller then plans
    on ``gpus`` as given, whose planner refuses it with its own message.

    ``gpus``: checked GPU dicts (index, name, memory_total); ``tp``: the user's TP size or None;
    ``traffic``: plan_types.Traffic; ``plan_fn(group, size)``: the engine's plan_types.Plan for
    one candidate. A PlanInputError about ``tensor_parallel_size`` (a size the model's heads do
    not divide) makes that candidate refused; any other input error is the deployment's, not
    the candidate's, and is raised. When every candidate is refused, the first refusal is raised.

    ``choice``: {gpu_indexes, reason, candidates: [{gpu_indexes, gpu_name, tensor_parallel_size,
    feasible, verdict, kv_cache_bytes, kv_cache_tokens, kv_headroom_bytes}]}, candidates best first."""
    groups = candidate_groups(gpus, tp)
    if not groups:
        return None, None
    candidates, plans, first_error = [], {}, None
    for size, group in groups:
        indexes = [gpu['index'] for gpu in group]
        entry = dict(gpu_indexes=indexes, gpu_name=gpu_kind(group[0])[0], tensor_parallel_size=size,
                     feasible=False, kv_cache_bytes=None, kv_cache_tokens=None, kv_headroom_bytes=None)
        try:
            plan = plan_fn(group, size)
        except PlanInputError as error:
            if error.field != 'tensor_parallel_size':
                raise
            first_error = first_error or error
            entry['verdict'] = 'refused: %s' % error
            candidates.append(entry)
            continue
        pool, tokens, headroom = kv_figures(plan, traffic)
        entry.update(feasible=bool(plan.feasible), verdict=_verdict(plan), kv_cache_bytes=pool,
                     kv_cache_tokens=tokens, kv_headroom_bytes=headroom)
        candidates.append(entry)
        plans[tuple(indexes)] = plan
    if not plans:
        raise first_error
    candidates.sort(key=_rank)
    feasible = [c for c in candidates if c['feasible']]
    compared = '; '.join(_line(c) for c in candidates)
    if feasible:
        best = feasible[0]
        reason = ('chosen by the planner (the deployment pins no gpu_indexes): GPUs %s (%s, TP %d), '
                  'the feasible candidate with the fewest GPUs, then the largest KV pool, then the '
                  'lowest indexes, of %d compared: %s' % (
                      best['gpu_indexes'], best['gpu_name'], best['tensor_parallel_size'],
                      len(candidates), compared))
        plan = plans[tuple(best['gpu_indexes'])]
    else:
        total = dict((g['index'], g['memory_total']) for g in gpus)
        planned = [c for c in candidates if tuple(c['gpu_indexes']) in plans]
        # The one with the most memory (the closest to fitting), the lowest indexes on a tie.
        best = max(planned, key=lambda c: (sum(total[i] for i in c['gpu_indexes']),
                                           [-i for i in c['gpu_indexes']]))
        reason = ('no GPU choice fits (the deployment pins no gpu_indexes); GPUs %s, the most '
                  'memory of a candidate, shown; %d compared: %s' % (best['gpu_indexes'], len(candidates),
                                                                     compared))
        plan = plans[tuple(best['gpu_indexes'])]
        plan.not_fitting = ['no GPU choice of %s fits: %s' % (describe_kinds(gpus), compared)] + list(
            plan.not_fitting)
    choice = dict(gpu_indexes=list(best['gpu_indexes']), reason=reason, candidates=candidates)
    return plan, choice
