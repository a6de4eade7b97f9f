# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Several traffic classes on one deployment's GPUs: which pinned configuration(s) serve them.

A traffic class is ``{name, prompt_tokens_p99, max_output_tokens, max_concurrency, hours}``
(``hours`` "HH:MM-HH:MM", a window that may cross midnight; left out = always). Three ways to
serve them are planned, each with the engine's own planner (``serving_plan.build_plan``; no
memory arithmetic is done here):

* ``single`` - one pinned configuration for every class: max_model_len from the longest
  class, max_num_seqs and the KV pool from the busiest time window (the classes active at the
  same minute add up);
* ``scheduled`` - the same weights (tensor parallelism and quantization fixed) and one pinned
  profile per distinct set of classes active together, switched at the window edges;
* ``split`` - two deployments on disjoint halves of the GPUs, each holding the whole weights:
  only reported, with the bytes it costs.

Cheapest = the fewest resident copies of the weights first, then the fewest engine restarts a
day: ``single`` (weights once, no restart) when it holds every window's demand, else
``scheduled`` (weights once, a restart at each switch) when every profile does, else nothing
fits (``strategy: none``). ``split`` holds the weights twice and is never chosen.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import List, Optional, Tuple

from ansible_collections.kvpin.fleet.plugins.module_utils.plan import model_loaders
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.plan_types import (
    BACKEND_VLLM, MAX_CONCURRENCY, MAX_TOKENS_PER_REQUEST, PlanInputError, Traffic, check_gpus, is_int, positive_int,
    type_name)
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.vllm_memory import derive_max_model_len
from ansible_collections.kvpin.fleet.plugins.module_utils.units import GiB, ceil_div

CLASS_KEYS = ('name', 'prompt_tokens_p99', 'max_output_tokens', 'max_concurrency', 'hours')
SINGLE_CLASS_OPTIONS = ('prompt_tokens_p99', 'max_output_tokens', 'max_concurrency')
MAX_CLASSES = 16              # more classes than this on one endpoint is a configuration error
MAX_NAME_LENGTH = 64
NAME_RE = re.compile(r'^[A-Za-z0-9][A-Za-z0-9_.-]*$')
HOURS_RE = re.compile(r'^(\d{2}):(\d{2})-(\d{2}):(\d{2})$')
MINUTES_PER_DAY = 24 * 60
# Knobs that fix the weights' layout: the same for every profile of a scheduled strategy.
WEIGHT_KNOBS = ('tensor_parallel_size', 'quantization', 'pipeline_parallel_size', 'pp_layer_partition')
CHEAPEST_RULE = ('cheapest = fewest resident copies of the weights, then fewest engine restarts a day: '
                 'single (weights once, no restart) if it holds every window, else scheduled (weights '
                 'once, one restart per switch) if every profile holds its window, else none; split '
                 '(weights twice) is only reported')


@dataclass(frozen=True)
class TrafficClass:
    name: str
    prompt_tokens_p99: int
    max_output_tokens: int
    max_concurrency: int
    hours: Optional[str]                       # as given, None = always
    intervals: Tuple[Tuple[int, int], ...]     # active minutes, half-open, within [0, 1440)

    @property
    def tokens_per_sequence(self):
        return self.prompt_tokens_p99 + self.max_output_tokens


# ---------------------------------------------------------------- input
def _minute(field_name, hours, hh, mm, end):
    hour, minute = int(hh), int(mm)
    if minute > 59 or hour > 24 or (hour == 24 and (minute or not end)):
        raise PlanInputError(field_name, '%r is not a time of day (00:00 to 23:59; 24:00 only as an end)'
                             % (hours,))
    return hour * 60 + minute


def parse_hours(field_name, hours):
    """Active minutes of "HH:MM-HH:MM" as half-open intervals on the day circle; a window whose
    end is before its start crosses midnight. None = always."""
    if hours is None:
        return ((0, MINUTES_PER_DAY),)
    if not isinstance(hours, str):
        raise PlanInputError(field_name, 'must be a string "HH:MM-HH:MM", got %r (%s)'
                             % (hours, type_name(hours)))
    match = HOURS_RE.match(hours.strip())
    if not match:
        raise PlanInputError(field_name, 'must be "HH:MM-HH:MM" (e.g. "07:00-23:00"), got %r' % (hours,))
    start = _minute(field_name, hours, match.group(1), match.group(2), False)
    end = _minute(field_name, hours, match.group(3), match.group(4), True)
    if start == end or (start == 0 and end == MINUTES_PER_DAY):
        if start == end:
            raise PlanInputError(field_name, '%r is an empty window (start = end); leave hours out for '
                                 'a class that is always active' % (hours,))
        return ((0, MINUTES_PER_DAY),)
    if start < end:
        return ((start, end),)
    return tuple(iv for iv in ((start, MINUTES_PER_DAY), (0, end)) if iv[0] < iv[1])


def parse_traffic_classes(value):
    """The classes, each key type- and range-checked; PlanInputError naming
    ``traffic_classes[i].key`` (and the value) otherwise."""
    if not isinstance(value, (list, tuple)):
        raise PlanInputError('traffic_classes', 'must be a list of classes, got %s' % type_name(value))
    if not value:
        raise PlanInputError('traffic_classes', 'is empty: give at least one class')
    if len(value) > MAX_CLASSES:
        raise PlanInputError('traffic_classes', '%d classes given; at most %d' % (len(value), MAX_CLASSES))
    classes, seen = [], set()
    for position, entry in enumerate(value):
        where = 'traffic_classes[%d]' % position
        if not isinstance(entry, dict):
            raise PlanInputError(where, 'must be a dict with %s, got %s' % (', '.join(CLASS_KEYS),
                                                                            type_name(entry)))
        unknown = sorted(str(key) for key in entry if key not in CLASS_KEYS)
        if unknown:
            raise PlanInputError(where, 'unknown key(s) %s; a class takes %s' % (', '.join(unknown),
                                                                                 ', '.join(CLASS_KEYS)))
        missing = [key for key in CLASS_KEYS[:4] if entry.get(key) is None]
        if missing:
            raise PlanInputError(where, 'missing %s' % ', '.join(missing))
        name = entry['name']
        if not isinstance(name, str) or not NAME_RE.match(name) or len(name) > MAX_NAME_LENGTH:
            raise PlanInputError(where + '.name', 'must be a name of letters, digits, "_", "." or "-" '
                                 '(1 to %d characters), got %r' % (MAX_NAME_LENGTH, name))
        if name in seen:
            raise PlanInputError(where + '.name', '%r names two classes; names must be unique' % name)
        seen.add(name)
        classes.append(TrafficClass(
            name=name,
            prompt_tokens_p99=positive_int(where + '.prompt_tokens_p99', entry['prompt_tokens_p99'],
                                           MAX_TOKENS_PER_REQUEST),
            max_output_tokens=positive_int(where + '.max_output_tokens', entry['max_output_tokens'],
                                           MAX_TOKENS_PER_REQUEST),
            max_concurrency=positive_int(where + '.max_concurrency', entry['max_concurrency'],
                                         MAX_CONCURRENCY),
            hours=entry.get('hours'),
            intervals=parse_hours(where + '.hours', entry.get('hours'))))
    total = sum(c.max_concurrency for c in classes)
    if total > MAX_CONCURRENCY:
        raise PlanInputError('traffic_classes', 'max_concurrency adds up to %d over the classes; at most %d'
                             % (total, MAX_CONCURRENCY))
    return classes


def check_exclusive(params):
    """traffic_classes replaces the three single-class options: giving both is refused."""
    given = [name for name in SINGLE_CLASS_OPTIONS if params.get(name) is not None]
    if given:
        raise PlanInputError('traffic_classes', 'replaces %s; got both traffic_classes and %s'
                             % (', '.join(SINGLE_CLASS_OPTIONS), ', '.join(
                                 '%s=%r' % (name, params[name]) for name in given)))


# ---------------------------------------------------------------- time windows
def _active(cls, minute):
    return any(start <= minute < end for start, end in cls.intervals)


def hhmm(minute):
    return '%02d:%02d' % divmod(minute % MINUTES_PER_DAY, 60)


def time_windows(classes):
    """[(start, end, names)]: the day cut at every window edge, adjacent pieces with the same
    active classes merged (across midnight too), in day order from the window that holds 00:00;
    minutes in [0, 1440), a window's end is below its start when it crosses midnight."""
    edges = sorted({0} | {m for c in classes for iv in c.intervals for m in iv if m < MINUTES_PER_DAY})
    pieces = []
    for position, start in enumerate(edges):
        end = edges[position + 1] if position + 1 < len(edges) else MINUTES_PER_DAY
        names = tuple(c.name for c in classes if _active(c, start))
        if pieces and pieces[-1][2] == names:
            pieces[-1] = (pieces[-1][0], end, names)
        else:
            pieces.append((start, end, names))
    if len(pieces) > 1 and pieces[0][2] == pieces[-1][2]:
        last = pieces.pop()
        pieces[0] = (last[0], pieces[0][1], last[2])
    return pieces


def window_text(window):
    start, end, _names = window
    if end - start == MINUTES_PER_DAY:
        return 'always'
    return '%s-%s' % (hhmm(start), hhmm(end))


def demand(classes, block_size=1):
    """(sequences, KV tokens) the classes need at once: every class at its concurrency with
    sequences of prompt p99 + max output tokens, rounded up to whole KV blocks."""
    sequences = sum(c.max_concurrency for c in classes)
    tokens = sum(c.max_concurrency * ceil_div(c.tokens_per_sequence, block_size) * block_size for c in classes)
    return sequences, tokens


# ---------------------------------------------------------------- one profile
def _group_traffic(backend, classes, windows):
    """(Traffic for the engine planner, text): what one configuration must hold over ``windows``
    (the classes active in each add up; the busiest window counts)."""
    by_name = dict((c.name, c) for c in classes)
    per_window = [[by_name[n] for n in names] for _s, _e, names in windows if names]
    sequences = max(demand(group)[0] for group in per_window)
    tokens = max(demand(group)[1] for group in per_window)
    longest = max((c for group in per_window for c in group), key=lambda c: c.tokens_per_sequence)
    if backend != BACKEND_VLLM:
        # llama.cpp slots are ctx_size / parallel each: every slot must hold the longest request
        return Traffic(longest.prompt_tokens_p99, longest.max_output_tokens, sequences), (
            '%d slots (the busiest window\'s concurrency) of %d tokens (the longest class, %s): '
            'llama.cpp gives every slot ctx_size / parallel' % (sequences, longest.tokens_per_sequence,
                                                                longest.name))
    # vLLM pages the KV cache: the pool must hold the tokens, max_model_len the longest request
    mean = ceil_div(tokens, sequences)
    heaviest = max(per_window, key=lambda group: demand(group)[1])
    prompt_share = sum(c.max_concurrency * c.prompt_tokens_p99 for c in heaviest) / float(
        sum(c.max_concurrency * c.tokens_per_sequence for c in heaviest))
    prompt = min(mean - 1, max(1, int(round(mean * prompt_share))))
    return Traffic(prompt, mean - prompt, sequences), (
        'busiest window: %d sequences, %d KV tokens (sum of concurrency x (prompt p99 + max output) of '
        'the classes active at once) -> planned as %d sequences of %d tokens on average' % (
            sequences, tokens, sequences, mean))


def _memory_rows(plan):
    return [dict(index=m.index, name=m.name, total=m.total, budget=m.budget, weights=m.weights,
                 activation=m.activation, non_torch=m.non_torch, cuda_graph=m.cuda_graph,
                 kv_cache=m.kv_cache, headroom=m.headroom,
                 resident=m.weights + m.activation + m.non_torch + m.cuda_graph + m.kv_cache)
            for m in plan.memory]


def window_blocks(pool, group, max_model_len):
    """(KV blocks, text): what the classes of one window hold at once in ``pool`` - every class
    at its concurrency, each request the blocks its own length takes (a request is cut at
    max_model_len). Counted per class: on a sliding-window or hybrid layout a short request
    holds more blocks per token than max_model_len's average."""
    parts = [(c, pool.blocks_per_request(min(c.tokens_per_sequence, max_model_len))) for c in group]
    return sum(c.max_concurrency * blocks for c, blocks in parts), ' + '.join(
        '%s %d x %d' % (c.name, c.max_concurrency, blocks) for c, blocks in parts)


def _vllm_pool_check(plan, groups):
    """(usable KV blocks, blocks the busiest window needs, text): the classes' demand in blocks
    against the blocks the engine will have (the pool the planner sized, plan.kv_pool) - the one
    comparison exact on every KV layout."""
    pool = plan.kv_pool
    need, parts = max(window_blocks(pool, group, plan.settings['max_model_len']) for group in groups)
    return pool.usable_blocks, need, (
        'the KV pool has %d blocks %s %d needed by the busiest window (class concurrency x blocks per '
        'request: %s)' % (pool.usable_blocks, '>=' if pool.usable_blocks >= need else '<', need, parts))


def plan_profile(name, params, spec, classes, windows, build_plan, planners=None, fixed_reasons=None):
    """One pinned configuration for ``classes`` over ``windows``: (profile dict, Plan), planned by
    ``build_plan`` (serving_plan.build_plan: the planner of one deployment).
    ``fixed_reasons``: knob -> why it was fixed (replaces the planner's "set by the user")."""
    backend = params.get('backend')
    by_name = dict((c.name, c) for c in classes)
    active = [by_name[n] for n in sorted({n for _s, _e, names in windows for n in names},
                                         key=[c.name for c in classes].index)]
    traffic, traffic_text = _group_traffic(backend, classes, windows)
    longest = max(active, key=lambda c: c.tokens_per_sequence)
    knobs = dict(params)
    for option in SINGLE_CLASS_OPTIONS:
        knobs[option] = getattr(traffic, option)
    knobs['traffic_classes'] = None
    extra_reasons = {'traffic': traffic_text}
    warnings, not_fitting = [], []
    if backend == BACKEND_VLLM and params.get('max_model_len') is None:
        need = Traffic(longest.prompt_tokens_p99, longest.max_output_tokens, 1)
        max_model_len, reason, len_warnings, beyond = derive_max_model_len(spec, need, {})
        knobs['max_model_len'] = max_model_len
        extra_reasons['max_model_len'] = '%s (the longest class, %s)' % (reason, longest.name)
        warnings.extend(len_warnings)
        if beyond:
            not_fitting.append('class %s needs %d tokens, the model supports %d' % (
                longest.name, longest.tokens_per_sequence, spec.max_position_embeddings))
    elif is_int(params.get('max_model_len')) and params['max_model_len'] < longest.tokens_per_sequence:
        warnings.append('max_model_len %d is below class %s\'s prompt p99 + max output = %d: its longer '
                        'requests are rejected' % (params['max_model_len'], longest.name,
                                                   longest.tokens_per_sequence))
    plan = build_plan(knobs, resolve_model=lambda _model: spec, planners=planners)
    groups = [[by_name[n] for n in names] for _s, _e, names in windows if names]
    sequences = max(demand(group)[0] for group in groups)
    if backend == BACKEND_VLLM:
        blocks, need_blocks, kv_text = _vllm_pool_check(plan, groups)
        holds_kv = blocks >= need_blocks
        # vLLM counts blocks: a hybrid layout's kv_cache_tokens is no measure of what short requests hold
        kv_fields = dict(kv_cache_blocks=blocks, demand_blocks=need_blocks)
        need_tokens = max(demand(group, plan.settings['block_size'])[1] for group in groups)
        seqs = plan.settings.get('max_num_seqs', 0)
        seq_knob = 'max_num_seqs'
    else:
        need_tokens = sequences * longest.tokens_per_sequence
        holds_kv = plan.kv_cache_tokens >= need_tokens
        kv_fields = {}
        kv_text = 'the KV cache holds %d tokens %s %d slots x %d tokens = %d needed' % (
            plan.kv_cache_tokens, '>=' if holds_kv else '<', sequences, longest.tokens_per_sequence, need_tokens)
        seqs = plan.settings.get('parallel', 0)
        seq_knob = 'parallel'
    holds = holds_kv and seqs >= sequences
    seq_text = '%s %d %s %d sequences (the busiest window)' % (seq_knob, seqs, '>=' if seqs >= sequences else '<',
                                                               sequences)
    if not holds and plan.feasible:
        # (an infeasible plan's own not_fitting already says what is short)
        not_fitting.append('; '.join(text for text, ok in ((kv_text, holds_kv), (seq_text, seqs >= sequences))
                                     if not ok))
    extra_reasons['kv_pool'] = '%s; %s' % (kv_text, seq_text)
    if backend == BACKEND_VLLM:
        extra_reasons['activation'] = (
            'chunked prefill %s, max_num_batched_tokens %s: the activation peak (%.2f GiB per GPU) is '
            'sized by the batch, not by the %d-token longest prompt' % (
                'on' if plan.settings.get('enable_chunked_prefill') else 'off',
                plan.settings.get('max_num_batched_tokens'), plan.memory[0].activation / GiB,
                longest.prompt_tokens_p99))
    reasons = dict(plan.reasons)
    reasons.update(fixed_reasons or {})
    reasons.update(extra_reasons)
    feasible = plan.feasible and not not_fitting
    profile = dict(
        name=name, classes=[c.name for c in active], hours=[window_text(w) for w in windows if w[2]],
        feasible=feasible, args=list(plan.args), settings=dict(plan.settings),
        memory_per_gpu=_memory_rows(plan), kv_cache_tokens=plan.kv_cache_tokens,
        demand_tokens=need_tokens, demand_sequences=sequences, vram_claim_bytes=plan.vram_claim_bytes,
        reasons=reasons, warnings=list(plan.warnings) + warnings,
        not_fitting=list(plan.not_fitting) + not_fitting, suggestions=list(plan.suggestions), **kv_fields)
    return profile, plan


# ---------------------------------------------------------------- strategies
def _weights_bytes(profiles):
    return max(sum(row['weights'] for row in p['memory_per_gpu']) for p in profiles)


def _resident_bytes(profiles):
    return max(sum(row['resident'] for row in p['memory_per_gpu']) for p in profiles)


def _summary(strategy, profiles, copies, reason, **extra):
    entry = dict(strategy=strategy, feasible=bool(profiles) and all(p['feasible'] for p in profiles),
                 profiles=[p['name'] for p in profiles], weight_copies=copies,
                 profile_args=dict((p['name'], list(p['args'])) for p in profiles),
                 weights_bytes=copies * _weights_bytes(profiles) if profiles else 0,
                 resident_bytes=(sum(_resident_bytes([p]) for p in profiles) if strategy == 'split'
                                 else _resident_bytes(profiles)) if profiles else 0,
                 reason=reason)
    entry.update(extra)
    return entry


def schedule_edges(windows, profile_of):
    """[{at, profile}]: the minute each profile takes over (windows with no class keep the one
    before); empty with fewer than two profiles."""
    busy = [(start, profile_of[names]) for start, _end, names in windows if names]
    if len({name for _m, name in busy}) < 2:
        return []
    edges = []
    for position, (start, name) in enumerate(busy):
        if name != busy[position - 1][1]:
            edges.append(dict(at=hhmm(start), profile=name))
    return sorted(edges, key=lambda e: e['at'])


def _split_classes(classes):
    longest = max(classes, key=lambda c: c.tokens_per_sequence)
    return [longest], [c for c in classes if c is not longest]


def plan_split(params, spec, classes, single_profile, build_plan, planners=None):
    """Two deployments on disjoint halves of the GPUs, the longest class apart from the rest:
    each holds the whole weights. Its cost is reported; it is never chosen."""
    gpus = list(params['gpus'])
    if len(classes) < 2:
        return _summary('split', [], 2, 'one class: nothing to split')
    long_part, rest = _split_classes(classes)
    if len(gpus) < 2:
        weights = 2 * _weights_bytes([single_profile])
        return _summary('split', [], 2, 'needs two disjoint GPU sets, %d GPU given: both deployments would '
                        'hold the weights (%d B, %.2f GiB) on the same GPU' % (len(gpus), weights, weights / GiB),
                        weights_bytes=weights)
    half = len(gpus) // 2
    profiles = []
    knobs = dict(params)
    for option in WEIGHT_KNOBS[2:] + ('tensor_parallel_size', 'gpu_indexes'):
        knobs.pop(option, None)
    for part, part_gpus in ((long_part, gpus[:half]), (rest, gpus[half:])):
        name = 'split-' + '+'.join(c.name for c in part)
        try:
            profile, _plan = plan_profile(name, dict(knobs, gpus=part_gpus), spec, part,
                                          time_windows(part), build_plan, planners)
        except PlanInputError as error:
            profile = dict(name=name, classes=[c.name for c in part], hours=[], feasible=False, args=[],
                           settings={}, memory_per_gpu=[], kv_cache_tokens=0, demand_tokens=0,
                           demand_sequences=0, vram_claim_bytes=0, reasons={}, warnings=[],
                           not_fitting=['%s' % error], suggestions=[])
        profile['gpus'] = [g['index'] for g in part_gpus]
        profiles.append(profile)
    planned = [p for p in profiles if p['memory_per_gpu']]
    # one copy: the most any configuration of this model holds on GPUs (llama.cpp may offload layers)
    once = max([_weights_bytes([single_profile])] + [_weights_bytes([p]) for p in planned])
    weights = sum(_weights_bytes([p]) for p in planned) if len(planned) == 2 else 2 * once
    entry = _summary('split', planned, 2, '', deployments=profiles)
    entry.update(feasible=all(p['feasible'] for p in profiles), weights_bytes=weights,
                 profiles=[p['name'] for p in profiles])
    entry['reason'] = ('two deployments on GPUs %s and %s hold the weights twice: %d B (%.2f GiB) of weights '
                       'on GPUs against %d B (%.2f GiB) for one copy%s' % (
                           profiles[0]['gpus'], profiles[1]['gpus'], weights, weights / GiB, once, once / GiB,
                           '' if entry['feasible'] else '; and it does not fit: ' + '; '.join(
                               '%s: %s' % (p['name'], '; '.join(p['not_fitting'])) for p in profiles
                               if not p['feasible'])))
    return entry


@dataclass
class TrafficPlan:
    """The answer for several traffic classes: the chosen strategy, its profiles, the others."""
    strategy: str
    base: object                    # plan_types.Plan of the profile GPUStack must book (largest claim)
    feasible: bool
    profiles: List[dict]
    schedule: List[dict]
    alternatives: List[dict]
    classes: List[dict]
    not_fitting: List[str]

    def to_dict(self):
        result = self.base.to_dict()
        result.update(feasible=self.feasible, strategy=self.strategy, profiles=self.profiles,
                      schedule=self.schedule, alternatives=self.alternatives, traffic_classes=self.classes)
        result['reasons'] = dict(result['reasons'], strategy=self.alternatives_reason())
        if not self.feasible:
            result['not_fitting'] = list(self.not_fitting)
        return result

    def alternatives_reason(self):
        chosen = [a for a in self.alternatives if a['strategy'] == self.strategy]
        return '%s: %s (%s)' % (self.strategy, chosen[0]['reason'] if chosen else 'no strategy fits',
                                CHEAPEST_RULE)


def plan_traffic_classes(params, build_plan, resolve_model=None, planners=None):
    """Plan ``params['traffic_classes']`` on ``params['gpus']``: a TrafficPlan. ``build_plan``
    plans one configuration (serving_plan.build_plan, which calls this module: it passes itself)."""
    check_exclusive(params)
    classes = parse_traffic_classes(params.get('traffic_classes'))
    if params.get('model') in (None, '', {}):
        raise PlanInputError('model', 'is required (catalog name, HF config dict, model directory '
                                      'or .gguf path)')
    check_gpus(params.get('gpus'))
    if resolve_model is None:
        resolve_model = model_loaders.resolve_model
    spec = resolve_model(params['model'])
    windows = time_windows(classes)
    single, single_plan = plan_profile('single', params, spec, classes, windows, build_plan, planners)
    alternatives = [_summary('single', [single], 1, (
        'one configuration holds every window: weights once, no restart' if single['feasible'] else
        'one configuration does not hold every window: %s' % '; '.join(single['not_fitting'])))]
    sets = []
    for _s, _e, names in windows:
        if names and names not in sets:
            sets.append(names)
    scheduled, scheduled_plans, edges = [], [], []
    if len(sets) >= 2:
        # the same weights in every profile: TP (and quantization) as the single profile has them
        fixed, fixed_reasons = dict(params), {}
        for knob in WEIGHT_KNOBS:
            if knob in single_plan.settings and fixed.get(knob) in (None, 'auto') and knob != 'pp_layer_partition':
                fixed[knob] = single_plan.settings[knob]
                fixed_reasons[knob] = ('%s: fixed to the single configuration\'s, so every profile holds the '
                                       'weights in the same layout' % (fixed[knob],))
        if fixed.get('gpu_indexes') is None and getattr(single_plan, 'gpu_indexes', None) is not None:
            # the same GPUs too: the planner's GPU choice of the single configuration, pinned
            fixed['gpu_indexes'] = list(single_plan.gpu_indexes)
            fixed_reasons['gpu_indexes'] = ('%s: the single configuration\'s GPU choice, pinned so every '
                                            'profile holds the weights on the same GPUs' % (fixed['gpu_indexes'],))
        profile_of = {}
        for names in sets:
            name = '+'.join(names)
            profile_of[names] = name
            own = [w for w in windows if w[2] == names]
            profile, plan = plan_profile(name, fixed, spec, classes, own, build_plan, planners, fixed_reasons)
            scheduled.append(profile)
            scheduled_plans.append(plan)
        edges = schedule_edges(windows, profile_of)
        layout = ', '.join('%s=%s' % (k, fixed[k]) for k in WEIGHT_KNOBS if fixed.get(k) is not None)
        if all(p['feasible'] for p in scheduled):
            why = ('%d profiles with the same weights (%s), each holding its own window, switched at %s (%d '
                   'engine restarts a day)' % (len(scheduled), layout or 'as planned',
                                               ', '.join(e['at'] for e in edges), len(edges)))
        else:
            why = 'not every profile holds its window: %s' % '; '.join(
                '%s: %s' % (p['name'], '; '.join(p['not_fitting'])) for p in scheduled if not p['feasible'])
        alternatives.append(_summary('scheduled', scheduled, 1, why, switches_per_day=len(edges)))
    else:
        alternatives.append(_summary('scheduled', [], 1, 'every class is active in the same window(s): '
                                     'one profile is all a schedule could have'))
    alternatives.append(plan_split(params, spec, classes, single, build_plan, planners))
    if single['feasible']:
        strategy, profiles, plans, edges = 'single', [single], [single_plan], []
    elif scheduled and all(p['feasible'] for p in scheduled):
        strategy, profiles, plans = 'scheduled', scheduled, scheduled_plans
    else:
        strategy, profiles, plans, edges = 'none', [single] + scheduled, [single_plan], []
    base = max(plans, key=lambda p: p.vram_claim_bytes or 0)
    not_fitting = ['%s: %s' % (a['strategy'], a['reason']) for a in alternatives if not a['feasible']]
    return TrafficPlan(
        strategy=strategy, base=base, feasible=strategy != 'none', profiles=profiles, schedule=edges,
        alternatives=alternatives, not_fitting=not_fitting,
        classes=[dict(name=c.name, prompt_tokens_p99=c.prompt_tokens_p99, max_output_tokens=c.max_output_tokens,
                      max_concurrency=c.max_concurrency, hours=c.hours or 'always') for c in classes])


# ---------------------------------------------------------------- output
def traffic_report(tplan, backend, version):
    """The plan for people: strategy and why, each strategy's cost, each profile in full."""
    lines = ['%s %s, %d traffic classes: strategy %s (%s)' % (
        backend, version, len(tplan.classes), tplan.strategy, 'FEASIBLE' if tplan.feasible else 'INFEASIBLE'),
        'rule: %s' % CHEAPEST_RULE]
    for c in tplan.classes:
        lines.append('class %s: prompt p99 %d + max output %d tokens, %d concurrent, %s' % (
            c['name'], c['prompt_tokens_p99'], c['max_output_tokens'], c['max_concurrency'], c['hours']))
    lines.append('strategy   feasible  weight copies  weights GiB  resident GiB (on all GPUs)')
    for a in tplan.alternatives:
        lines.append('%-10s %-9s %13d  %11.2f  %12.2f' % (a['strategy'], 'yes' if a['feasible'] else 'no',
                                                          a['weight_copies'], a['weights_bytes'] / GiB,
                                                          a['resident_bytes'] / GiB))
        lines.append('  %s: %s' % (a['strategy'], a['reason']))
    for edge in tplan.schedule:
        lines.append('switch at %s to profile %s' % (edge['at'], edge['profile']))
    for profile in tplan.profiles:
        lines.append('profile %s (%s; classes %s): %s, %s' % (
            profile['name'], ', '.join(profile['hours']), ', '.join(profile['classes']),
            'FEASIBLE' if profile['feasible'] else 'INFEASIBLE', (
                '%d KV blocks for %d needed' % (profile['kv_cache_blocks'], profile['demand_blocks'])
                if 'demand_blocks' in profile else
                '%d KV tokens for %d needed' % (profile['kv_cache_tokens'], profile['demand_tokens']))))
        lines.append('  args: %s' % ' '.join(profile['args']))
        for row in profile['memory_per_gpu']:
            lines.append('  GPU %d %s: weights %.2f + activation %.2f + non-torch %.2f + graphs %.2f + KV %.2f '
                         '= %.2f of %.2f GiB' % (row['index'], row['name'], row['weights'] / GiB,
                                                 row['activation'] / GiB, row['non_torch'] / GiB,
                                                 row['cuda_graph'] / GiB, row['kv_cache'] / GiB,
                                                 row['resident'] / GiB, row['total'] / GiB))
        lines.extend('  reason %s: %s' % (k, profile['reasons'][k]) for k in sorted(profile['reasons']))
        lines.extend('  warning: %s' % w for w in profile['warnings'])
        lines.extend('  does not fit: %s' % t for t in profile['not_fitting'])
    return lines


def traffic_classes_result(params, build_plan):
    """serving_plan's result for ``traffic_classes`` (same shape as the single-class one);
    ``build_plan`` is serving_plan.build_plan."""
    try:
        tplan = plan_traffic_classes(params, build_plan)
    except PlanInputError as error:
        return dict(failed=True, msg='serving_plan: invalid %s' % error, field=error.field)
    except ImportError as error:
        return dict(failed=True, msg='serving_plan: %s' % error)
    result = dict(changed=False, plan=tplan.to_dict(),
                  plan_report=traffic_report(tplan, params.get('backend'), params.get('backend_version')))
    if not tplan.feasible and params.get('fail_on_infeasible', True):
        result.update(failed=True, msg='no strategy serves every traffic class: %s' % '. '.join(tplan.not_fitting))
        kept = [p['reasons']['kv_cache_dtype'] for p in tplan.profiles
                if 'allow_fp8_kv' in p.get('reasons', {}).get('kv_cache_dtype', '')]
        if kept:
            result['msg'] += ('. KV dtype: %s: %s' % (
                ', '.join(p['name'] for p in tplan.profiles
                          if 'allow_fp8_kv' in p.get('reasons', {}).get('kv_cache_dtype', '')), kept[0]))
        split = [a for a in tplan.alternatives if a['strategy'] == 'split' and a['feasible']]
        if split:
            result['msg'] += ('. What would fit: split (%s), not chosen automatically since it holds the weights '
                              'twice; plan its two deployments as two serving_plan tasks' % split[0]['reason'])
    return result
