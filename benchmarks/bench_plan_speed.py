# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""How long one vLLM plan takes; prints a table, asserts nothing.

Target: one plan well under 50 ms (a playbook plans every deployment of the fleet on every
run). Times are medians over repeated runs in this process; the ratio column compares each
case with the simplest plan (every knob set, one GPU) timed in the same process, so the
table is comparable across machines.

Run from the repo root: .venv/bin/python benchmarks/bench_plan_speed.py
"""

from __future__ import annotations

import statistics
import sys
import time

# First: makes ansible_collections.kvpin.fleet importable (benchmarks/_setup.py).
import _setup  # noqa: F401  pylint: disable=unused-import

from ansible_collections.kvpin.fleet.plugins.module_utils.plan.model_loaders import resolve_model
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.plan_types import Traffic
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.vllm_memory import plan_vllm

A6000 = ('NVIDIA RTX A6000', 51527024640)
RTX4090 = ('NVIDIA GeForce RTX 4090', 25757220864)
H200 = ('NVIDIA H200', 150754820096)
TARGET_MS = 50.0
REPEATS = 200


def gpus(card, n):
    return [dict(index=i, name=card[0], memory_total=card[1]) for i in range(n)]


CASES = (
    # name, model, gpus, traffic, knobs, version
    ('baseline: 8B, every knob set, 1 GPU', 'meta-llama/Llama-3.1-8B-Instruct', gpus(RTX4090, 1),
     Traffic(4000, 1000, 8), dict(tensor_parallel_size=1, gpu_memory_utilization=0.85,
                                  max_model_len=8192, max_num_seqs=8, kv_cache_dtype='auto'), '0.11.0'),
    ('field report: 70B bf16, 4 x A6000, derived', 'meta-llama/Llama-3.3-70B-Instruct', gpus(A6000, 4),
     Traffic(11000, 2000, 32), dict(tensor_parallel_size=4), '0.10.1.1'),
    ('70B, auto TP over 8 x A6000', 'meta-llama/Llama-3.3-70B-Instruct', gpus(A6000, 8),
     Traffic(11000, 2000, 32), {}, '0.20.0'),
    ('gemma-3-27b hybrid sliding window, 4 x 4090', 'google/gemma-3-27b-it', gpus(RTX4090, 4),
     Traffic(8000, 1000, 16), {}, '0.11.0'),
    ('DeepSeek-V3 MLA, 8 x H200, pinned KV', 'deepseek-ai/DeepSeek-V3', gpus(H200, 8),
     Traffic(8000, 2000, 64), dict(pin_kv_cache_memory=True), '0.33.0'),
)


def time_case(spec, gpu_list, traffic, knobs, version):
    samples = []
    for _unused in range(REPEATS):
        start = time.perf_counter()
        plan_vllm(spec, gpu_list, traffic, knobs, version)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1000.0, max(samples) * 1000.0


def main():
    rows = []
    for name, model, gpu_list, traffic, knobs, version in CASES:
        spec = resolve_model(model)
        plan = plan_vllm(spec, gpu_list, traffic, knobs, version)      # warm-up, and the outcome
        median_ms, worst_ms = time_case(spec, gpu_list, traffic, knobs, version)
        rows.append((name, version, median_ms, worst_ms, plan.feasible, plan.settings['tensor_parallel_size']))
    base = rows[0][2]
    print('plan_vllm time per plan (median of %d runs in this process; target well under %.0f ms)'
          % (REPEATS, TARGET_MS))
    header = '%-46s %-8s %9s %9s %7s %3s %-8s' % (
        'case', 'vLLM', 'median ms', 'worst ms', 'x base', 'TP', 'feasible')
    print(header)
    print('-' * len(header))
    for name, version, median_ms, worst_ms, feasible, tp in rows:
        print('%-46s %-8s %9.3f %9.3f %7.1f %3d %-8s' % (
            name, version, median_ms, worst_ms, median_ms / base, tp, feasible))
    slowest = max(r[2] for r in rows)
    print('slowest median %.3f ms = %.1f %% of the %.0f ms target' % (slowest, 100.0 * slowest / TARGET_MS, TARGET_MS))


if __name__ == '__main__':
    main()
    sys.exit(0)
