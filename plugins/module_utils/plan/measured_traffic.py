# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Planning from measured traffic and from the KV pool the engine really got.

Input: one deployment's ``measurement``, the shape the watchdog's ``measure`` subcommand prints
(``kvpin_watchdog_lib/measure.py``)::

    {traffic: <measure --metrics summary: requests, prompt_tokens_p99_upper/_lower/_censored,
               generation_tokens_p99_upper/_lower/_censored, max_concurrency, length_truncated,
               rejected, preemptions, restarts_seen, hours: {"HH": same figures}, ...>,
     kv_pool: <measure --engine-log: kv_cache_tokens, kv_cache_bytes, weights_bytes, ...>,
     gpu: the card name the engine ran on, backend_version: its engine version,
     args: the argv it ran with}

``check_measurement`` type- and range-checks it (PlanInputError naming ``measurement.<key>`` and
the value). ``choose_traffic`` picks, per figure, the declared or the measured value by
``traffic_source``:

* ``declared`` (default): the inventory's figures; the measurement is only compared and printed;
* ``measured``: a trusted measured bound replaces the declared figure (it may shrink the plan);
* ``larger``: the larger of the declared figure and a trusted measured bound (grows only).

A measured p99 bound is trusted when it rests on at least MIN_REQUESTS = 299 requests (the
distribution-free rule: with n >= 299 requests, 1 - 0.99**n >= 0.95) in the whole window and
is not censored (the p99 in the +Inf bucket) there or in any hour of day that has 299 requests
itself; the bound used is the largest over the window and those hours (a busy night of short
prompts must not hide a day tail). An output bound is not trusted when more than 1 % of the
requests were cut by their length limit (the p99 is then the cap, not the demand). Otherwise the
declared figure stays and the reasons say why.

``kv_check`` compares the plan's KV pool with the engine's read-back when both belong to the same
card, engine version and args (``--max-num-seqs`` and the histogram pin aside: they are what a
replan changes, and the KV pool is pinned in bytes or sized by memory, not by them); when the
engine got less, ``resized_max_num_seqs`` is how many sequences of the planned length that pool
holds, and ``serving_plan.build_plan`` replans with it. ``histogram_buckets`` gives the
``--custom-histogram-buckets`` bounds that make the prompt / output p99 measurable within 10 %,
``hour_classes`` the traffic_classes a day/night difference suggests (printed, never applied).
"""

from __future__ import annotations

import json
import math

from ansible_collections.kvpin.fleet.plugins.module_utils.plan.plan_types import (
    MAX_CONCURRENCY, MAX_TOKENS_PER_REQUEST, PlanInputError, Traffic, is_int, type_name)

TRAFFIC_SOURCES = ('declared', 'measured', 'larger')
DEFAULT_TRAFFIC_SOURCE = 'declared'
MIN_REQUESTS = 299                 # 1 - 0.99**299 >= 0.95: p99 bound at 95 % confidence
TRUNCATED_SHARE = 0.01             # more length-truncated requests than this: output bound censored
KV_DRIFT = 0.05                    # |actual - planned| / planned above this is flagged
BELOW_DECLARED = 0.9               # a measured upper bound below 90 % of the declaration is drift
HOUR_CLASS_RATIO = 2.0             # hours whose bounds differ by this factor suggest classes
MAX_REQUESTS = 10 ** 15
MAX_ARGS = 256
MAX_ARG_LENGTH = 8192
MAX_TEXT = 256
MEASUREMENT_KEYS = ('traffic', 'kv_pool', 'gpu', 'backend_version', 'args', 'measured_at')
FIGURES = (
    # (figure, declared Traffic field, measured summary key, what it is)
    ('prompt', 'prompt_tokens_p99', 'prompt_tokens_p99_upper', 'prompt p99 bound'),
    ('output', 'max_output_tokens', 'generation_tokens_p99_upper', 'output p99 bound'),
    ('concurrency', 'max_concurrency', 'max_concurrency', 'peak concurrency'),
)
# Histogram bounds: 1-2-5 below FINE_FROM, then steps of at most FINE_RATIO up to max_model_len.
FINE_FROM = 64
FINE_RATIO = 1.1
MAX_HISTOGRAM_BOUNDS = 128         # the watchdog's measure keeps at most 128 bounds per histogram
# Arguments a replan may change without changing the KV pool it is compared with.
KV_NEUTRAL_FLAGS = ('--max-num-seqs', '--custom-histogram-buckets')


def _error(key, message):
    return PlanInputError('measurement.%s' % key, message)


def _number(key, value, upper, allow_none=True, whole=False):
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not (is_int(value) or isinstance(value, float)):
        raise _error(key, 'must be a number, got %r (%s)' % (value, type_name(value)))
    if not math.isfinite(value) or value < 0 or value > upper:
        raise _error(key, 'must be a finite number in 0 .. %d, got %r' % (upper, value))
    if whole and value != int(value):
        raise _error(key, 'must be a whole number, got %r' % (value,))
    return int(value) if whole else value


def _flag(key, value):
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _error(key, 'must be true or false, got %r (%s)' % (value, type_name(value)))
    return value


def _text(key, value):
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > MAX_TEXT:
        raise _error(key, 'must be a string of at most %d characters, got %r (%s)'
                     % (MAX_TEXT, value if not isinstance(value, str) else value[:40] + '...', type_name(value)))
    return value.strip()


def _figures(key, summary):
    """The figures of one traffic summary (the window or one hour), checked."""
    if not isinstance(summary, dict):
        raise _error(key, 'must be a dict (the watchdog\'s measure summary), got %s' % type_name(summary))
    out = {'requests': _number(key + '.requests', summary.get('requests', 0), MAX_REQUESTS, False, True)}
    for side in ('prompt', 'generation'):
        upper = _number('%s.%s_tokens_p99_upper' % (key, side), summary.get('%s_tokens_p99_upper' % side),
                        MAX_TOKENS_PER_REQUEST)
        lower = _number('%s.%s_tokens_p99_lower' % (key, side), summary.get('%s_tokens_p99_lower' % side),
                        MAX_TOKENS_PER_REQUEST)
        if upper is not None and lower is not None and lower > upper:
            raise _error('%s.%s_tokens_p99_lower' % (key, side), 'is %r, above the upper bound %r'
                         % (lower, upper))
        # The 95 %-confidence bound of the p99 (the watchdog's measure gives it from 299 requests
        # on): absent in older or hand-made summaries, None when it lies in +Inf.
        confident = _number('%s.%s_tokens_p99_upper_95' % (key, side),
                            summary.get('%s_tokens_p99_upper_95' % side), MAX_TOKENS_PER_REQUEST)
        if confident is not None and upper is not None and confident < upper:
            raise _error('%s.%s_tokens_p99_upper_95' % (key, side), 'is %r, below the p99 bound %r (a confidence '
                         'bound of the p99 is never below the sample p99)' % (confident, upper))
        out['%s_upper' % side] = upper
        out['%s_upper_95' % side] = confident
        out['%s_has_95' % side] = '%s_tokens_p99_upper_95' % side in summary
        out['%s_lower' % side] = lower
        out['%s_censored' % side] = _flag('%s.%s_tokens_p99_censored' % (key, side),
                                          summary.get('%s_tokens_p99_censored' % side))
    out['max_concurrency'] = _number(key + '.max_concurrency', summary.get('max_concurrency'), MAX_CONCURRENCY)
    for name in ('length_truncated', 'rejected', 'preemptions', 'restarts_seen'):
        out[name] = _number('%s.%s' % (key, name), summary.get(name), MAX_REQUESTS, True, True) or 0
    return out


def check_measurement(measurement):
    """The checked measurement (a new dict) or None; PlanInputError names the bad key."""
    if measurement is None:
        return None
    if not isinstance(measurement, dict):
        raise PlanInputError('measurement', 'must be a dict (traffic, kv_pool, gpu, backend_version, args), '
                                            'got %s' % type_name(measurement))
    unknown = sorted(str(k) for k in measurement if k not in MEASUREMENT_KEYS)
    if unknown:
        raise PlanInputError('measurement', 'unknown key(s) %s; known: %s' % (
            ', '.join(unknown), ', '.join(MEASUREMENT_KEYS)))
    out = {'gpu': _text('gpu', measurement.get('gpu')),
           'backend_version': _text('backend_version', measurement.get('backend_version')),
           'measured_at': _text('measured_at', measurement.get('measured_at')),
           'traffic': None, 'hours': {}, 'kv_pool': None, 'args': None}
    traffic = measurement.get('traffic')
    if traffic is not None:
        out['traffic'] = _figures('traffic', traffic)
        hours = traffic.get('hours') or {}
        if not isinstance(hours, dict) or len(hours) > 24:
            raise _error('traffic.hours', 'must be a dict of at most 24 hours of day ("00" .. "23"), got %s'
                         % (type_name(hours) if not isinstance(hours, dict) else '%d entries' % len(hours)))
        for hour, figures in hours.items():
            if not (isinstance(hour, str) and len(hour) == 2 and hour.isdigit() and 0 <= int(hour) <= 23):
                raise _error('traffic.hours', 'keys are hours of day "00" .. "23", got %r' % (hour,))
            out['hours'][int(hour)] = _figures('traffic.hours.%s' % hour, figures)
    pool = measurement.get('kv_pool')
    if pool is not None:
        if not isinstance(pool, dict):
            raise _error('kv_pool', 'must be a dict (the watchdog\'s measure --engine-log output), got %s'
                         % type_name(pool))
        tokens = _number('kv_pool.kv_cache_tokens', pool.get('kv_cache_tokens'), 1 << 40, True, True)
        out['kv_pool'] = {'kv_cache_tokens': tokens,
                          'kv_cache_bytes': _number('kv_pool.kv_cache_bytes', pool.get('kv_cache_bytes'),
                                                    1 << 45, True, True),
                          'weights_bytes': _number('kv_pool.weights_bytes', pool.get('weights_bytes'),
                                                   1 << 45, True, True)}
        if tokens is None or tokens < 1:
            raise _error('kv_pool.kv_cache_tokens', 'must be a whole number >= 1 (the KV tokens the engine '
                                                    'logged), got %r' % (pool.get('kv_cache_tokens'),))
    args = measurement.get('args')
    if args is not None:
        if not isinstance(args, (list, tuple)) or len(args) > MAX_ARGS or not all(
                isinstance(a, str) and len(a) <= MAX_ARG_LENGTH for a in args):
            raise _error('args', 'must be a list of at most %d strings (the argv the engine ran with), got %s'
                         % (MAX_ARGS, type_name(args) if not isinstance(args, (list, tuple))
                            else '%d entries' % len(args)))
        out['args'] = list(args)
    return out


def check_traffic_source(value):
    if value is None:
        return DEFAULT_TRAFFIC_SOURCE
    if value not in TRAFFIC_SOURCES:
        raise PlanInputError('traffic_source', 'must be one of %s, got %r' % (', '.join(TRAFFIC_SOURCES), value))
    return value


# ---------------------------------------------------------------- traffic


def _bound(figure, window, hours):
    """(bound or None, why): the trusted measured bound of one figure, or None and the reason."""
    if window is None:
        return None, 'no traffic measured'
    n = window['requests']
    if n < MIN_REQUESTS:
        return None, ('%d requests measured, fewer than the %d a p99 bound at 95 %% confidence needs'
                      % (n, MIN_REQUESTS))
    if figure == 'concurrency':
        if not window['max_concurrency']:
            return None, 'no running/waiting gauge was scraped'
        return int(math.ceil(window['max_concurrency'])), (
            'peak of running + waiting requests over %d requests (sampled at the scrape interval: '
            'shorter spikes are missed)' % n)
    side = 'prompt' if figure == 'prompt' else 'generation'
    strata = [('the window', window)] + [
        ('hour %02d' % h, f) for h, f in sorted(hours.items()) if f['requests'] >= MIN_REQUESTS]
    for where, figures in strata:
        if figures['%s_censored' % side] or figures['%s_upper' % side] is None:
            return None, ('the p99 of %s is in the +Inf bucket (censored: longer than the largest bound; '
                          'pin finer buckets or a larger max_model_len to measure it)' % where)
    if side == 'generation' and window['length_truncated'] > TRUNCATED_SHARE * n:
        return None, ('%d of %d requests were cut at their length limit (> %g %%): the output p99 is the '
                      'cap, not the demand' % (window['length_truncated'], n, TRUNCATED_SHARE * 100))
    confident = all(f['%s_has_95' % side] for _where, f in strata)
    if confident:
        for where, figures in strata:
            if figures['%s_upper_95' % side] is None:
                return None, ('the 95 %%-confidence bound of the p99 of %s is in the +Inf bucket (censored: pin '
                              'finer buckets or a larger max_model_len to measure it)' % where)
    key = '%s_upper_95' % side if confident else '%s_upper' % side
    upper = max(f[key] for _where, f in strata)
    where = [w for w, f in strata if f[key] == upper][0]
    what = ('the bucket holding the 95 %-confidence bound of the p99 (the order statistic at or above the '
            'p99 with 95 % confidence, distribution-free)' if confident else
            'the bucket holding the sample p99 (this measurement carries no 95 % bound)')
    return max(1, int(math.ceil(upper))), (
        'upper edge %d of %s, largest over the window and the %d hour(s) with >= %d requests: %s; %d requests'
        % (upper, what, len(strata) - 1, MIN_REQUESTS, where, n))


def _drift(figure, declared, window, bound):
    """'above' / 'below' / None: whether the measurement says the declaration is off."""
    if window is None or window['requests'] < MIN_REQUESTS:
        return None
    if figure == 'concurrency':
        peak = window['max_concurrency']
        return 'above' if peak is not None and peak > declared else None
    side = 'prompt' if figure == 'prompt' else 'generation'
    lower = window['%s_lower' % side]
    if window['%s_censored' % side] or (lower is not None and lower >= declared):
        return 'above'
    if bound is not None and bound < BELOW_DECLARED * declared:
        return 'below'
    return None


def choose_traffic(declared, measurement, source):
    """(Traffic to plan with, check dict): per figure declared, measured, used, and why."""
    window = measurement['traffic'] if measurement else None
    hours = measurement['hours'] if measurement else {}
    used = {}
    rows = []
    for figure, field_name, _key, label in FIGURES:
        value = getattr(declared, field_name)
        bound, why = _bound(figure, window, hours)
        if source == 'declared' or bound is None:
            pick, reason = value, ('declared (traffic_source %s)' % source if bound is not None or source == 'declared'
                                   else 'declared kept: %s' % why)
        elif source == 'measured':
            pick, reason = bound, 'measured: %s' % why
        else:
            pick = max(value, bound)
            reason = ('measured (larger than declared %d): %s' % (value, why) if bound > value
                      else 'declared (not below the measured bound %d)' % bound)
        upper = MAX_CONCURRENCY if figure == 'concurrency' else MAX_TOKENS_PER_REQUEST
        pick = min(pick, upper)
        used[field_name] = pick
        rows.append({'figure': figure, 'label': label, 'option': field_name, 'declared': value,
                     'measured': bound, 'measured_note': why, 'used': pick, 'reason': reason,
                     'drift': _drift(figure, value, window, bound)})
    check = {'traffic_source': source, 'requests': window['requests'] if window else 0,
             'min_requests': MIN_REQUESTS, 'figures': rows, 'hours': {}}
    for hour, figures in sorted(hours.items()):
        check['hours']['%02d' % hour] = {
            'requests': figures['requests'], 'prompt_tokens_p99_upper': figures['prompt_upper'],
            'generation_tokens_p99_upper': figures['generation_upper'],
            'max_concurrency': figures['max_concurrency'],
            'censored': figures['prompt_censored'] or figures['generation_censored']}
    proposal = hour_classes(hours)
    if proposal:
        check['traffic_classes_proposal'] = proposal
    return Traffic(**used), check


def _windows(hours):
    """'HH:00-HH:00' windows of runs of consecutive hours (a run may cross midnight)."""
    hours = sorted(set(hours))
    runs = []
    for hour in hours:
        if runs and runs[-1][1] == hour:
            runs[-1][1] = hour + 1
        else:
            runs.append([hour, hour + 1])
    if len(runs) > 1 and runs[0][0] == 0 and runs[-1][1] == 24:
        runs[0][0] = runs.pop()[0]
    return ['%02d:00-%02d:00' % (start % 24, end % 24) for start, end in runs]


def hour_classes(hours):
    """traffic_classes suggested by hours of day whose trusted figures differ by HOUR_CLASS_RATIO
    or more (prompt bound or peak concurrency): the hours split at the geometric middle, each
    class sized on its largest hour. [] when no two hours differ that much (or too few hours
    have MIN_REQUESTS requests). A proposal only: the plan never applies it."""
    ok = {h: f for h, f in hours.items() if f['requests'] >= MIN_REQUESTS and not f['prompt_censored']
          and not f['generation_censored'] and f['prompt_upper'] and f['generation_upper']}
    if len(ok) < 2:
        return []
    for key in ('prompt_upper', 'max_concurrency'):
        values = [f[key] for f in ok.values() if f[key]]
        if len(values) < 2 or max(values) < HOUR_CLASS_RATIO * min(values):
            continue
        middle = math.sqrt(max(values) * min(values))
        high = [h for h, f in ok.items() if (f[key] or 0) > middle]
        low = [h for h in ok if h not in high]
        classes = []
        for name, group in (('busy', high), ('quiet', low)):
            figures = [ok[h] for h in group]
            classes.append({
                'name': name,
                'prompt_tokens_p99': int(math.ceil(max(f['prompt_upper'] for f in figures))),
                'max_output_tokens': int(math.ceil(max(f['generation_upper'] for f in figures))),
                'max_concurrency': int(math.ceil(max(f['max_concurrency'] or 1 for f in figures))),
                'hours': ','.join(_windows(group)),
                'measured_hours_utc': sorted(group)})
        return classes
    return []


# ---------------------------------------------------------------- KV pool


def _comparable(args):
    return [a for a in (args or []) if not any(a == f or a.startswith(f + '=') for f in KV_NEUTRAL_FLAGS)]


def kv_check(plan, measurement):
    """Planned vs actual KV pool, or None without a KV read-back. ``same_config``: the read-back
    belongs to this plan's card, engine version and args; ``short``: then the engine got less."""
    pool = measurement['kv_pool'] if measurement else None
    if pool is None:
        return None
    planned = int(plan.kv_cache_tokens)
    actual = pool['kv_cache_tokens']
    cards = sorted(set(gpu.name for gpu in plan.memory))
    mismatch = []
    if measurement['gpu'] is not None and cards and measurement['gpu'] not in cards:
        mismatch.append('card %r, plan on %s' % (measurement['gpu'], ', '.join(cards)))
    if measurement['backend_version'] is not None and measurement['backend_version'] != plan.backend_version:
        mismatch.append('engine version %s, plan for %s' % (measurement['backend_version'], plan.backend_version))
    if measurement['args'] is None or _comparable(measurement['args']) != _comparable(plan.args):
        mismatch.append('args %s, plan %s' % (' '.join(_comparable(measurement['args'])) or 'not given',
                                              ' '.join(_comparable(plan.args))))
    if measurement['gpu'] is None:
        mismatch.append('no card given')
    drift = (actual - planned) / float(planned) if planned > 0 else None
    return {'planned_kv_cache_tokens': planned, 'actual_kv_cache_tokens': actual,
            'actual_kv_cache_bytes': pool['kv_cache_bytes'], 'actual_weights_bytes': pool['weights_bytes'],
            'drift': drift, 'flagged': drift is not None and abs(drift) > KV_DRIFT,
            'same_config': not mismatch, 'mismatch': mismatch,
            'short': not mismatch and actual < planned}


def resized_max_num_seqs(plan, traffic, actual_tokens):
    """How many sequences of the planned length (prompt + output, at most max_model_len, in
    whole blocks) the engine's real pool holds (at least 1)."""
    max_model_len = plan.settings.get('max_model_len') or traffic.tokens_per_sequence
    block = plan.settings.get('block_size') or 1
    seq_tokens = min(traffic.tokens_per_sequence, max_model_len)
    seq_blocks = -(-seq_tokens // block)
    return max(1, (actual_tokens // block) // seq_blocks), seq_tokens


# ---------------------------------------------------------------- measurable plans


def _one_two_five(below):
    out, decade = [], 1
    while True:
        for step in (1, 2, 5):
            if step * decade >= below:
                return out
            out.append(step * decade)
        decade *= 10


def histogram_buckets(max_model_len):
    """Bounds for vLLM's request_tokens histograms: 1-2-5 below the fine region, then steps of at
    most FINE_RATIO (10 %) up to max_model_len, which is the last bound: a p99 in (L, U] is known
    within U / L <= 1.1 wherever it is in the fine region. The fine region starts at FINE_FROM
    tokens, higher (doubled) where MAX_HISTOGRAM_BOUNDS would be exceeded (a max_model_len in
    the millions): the top of the range, where max_model_len is decided, stays fine."""
    max_model_len = int(max_model_len)
    fine_from = FINE_FROM
    while True:
        bounds = _one_two_five(min(fine_from, max_model_len))
        bound = fine_from
        while bound < max_model_len:
            bounds.append(bound)
            bound = max(bound + 1, int(bound * FINE_RATIO))
        bounds.append(max_model_len)
        if len(bounds) <= MAX_HISTOGRAM_BOUNDS:
            return bounds
        fine_from *= 2


def histogram_buckets_value(max_model_len):
    """The --custom-histogram-buckets value: compact JSON, one argv element."""
    return json.dumps({'request_tokens': histogram_buckets(max_model_len)}, separators=(',', ':'))


# ---------------------------------------------------------------- report


def _fmt(value):
    return '-' if value is None else str(value)


def report_lines(check, kv):
    """Text lines for plan_report: declared vs measured per figure, per hour, planned vs actual KV."""
    lines = []
    if check is not None:
        lines.append('traffic (source %s; %d requests measured, %d needed to trust a p99 bound):'
                     % (check['traffic_source'], check['requests'], check['min_requests']))
        for row in check['figures']:
            lines.append('  %-17s declared %-7s measured %-7s used %-7s%s  (%s)' % (
                row['label'], _fmt(row['declared']), _fmt(row['measured']), _fmt(row['used']),
                ' DRIFT: measured %s declared' % row['drift'] if row['drift'] else '', row['reason']))
        for hour, figures in sorted(check['hours'].items()):
            lines.append('  hour %s UTC: %d requests, prompt p99 <= %s, output p99 <= %s, peak %s%s' % (
                hour, figures['requests'], _fmt(figures['prompt_tokens_p99_upper']),
                _fmt(figures['generation_tokens_p99_upper']), _fmt(figures['max_concurrency']),
                ' (censored)' if figures['censored'] else ''))
        for cls in check.get('traffic_classes_proposal', []):
            lines.append('  proposal (not applied) traffic_classes: %s' % json.dumps(
                {k: cls[k] for k in ('name', 'prompt_tokens_p99', 'max_output_tokens', 'max_concurrency',
                                     'hours')}, sort_keys=True))
    if kv is not None:
        lines.append('KV pool: planned %d tokens, actual %d tokens (%s)%s%s' % (
            kv['planned_kv_cache_tokens'], kv['actual_kv_cache_tokens'],
            '%+.1f %%' % (100 * kv['drift']) if kv['drift'] is not None else '-',
            ' DRIFT' if kv['flagged'] else '',
            '' if kv['same_config'] else '; read-back from another configuration (%s): not acted on'
            % '; '.join(kv['mismatch'])))
    return lines
