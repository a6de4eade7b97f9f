# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the GPU choice costs: serving_plan.build_plan for a vLLM deployment without gpu_indexes
(every candidate group planned, module_utils/gpu_choice.py) against one plan_vllm call on the
GPUs it chose, in the same process. Prints a table, asserts nothing.

The ratio column is build_plan / that one plan: about the number of candidates planned (plus
resolving the model). Times are medians over repeated runs.

Run from the repo root: .venv/bin/python benchmarks/bench_gpu_choice.py
"""

from __future__ import annotations

import statistics
import sys
import time

# First: makes ansible_collections.kvpin.fleet importable (benchmarks/_setup.py).
import _setup  # noqa: F401  pylint: disable=unused-import

from ansible_collections.kvpin.fleet.plugins.module_utils.plan.model_loaders import resolve_model
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.plan_types import Traffic
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.serving_plan import build_plan
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.vllm_memory import plan_vllm

A6000 = ('NVIDIA RTX A6000', 51527024640)
RTX4090 = ('NVIDIA GeForce RTX 4090', 25757220864)
REPEATS = 50
MODEL_8B = 'meta-llama/Llama-3.1-8B-Instruct'
MODEL_70B = 'meta-llama/Llama-3.3-70B-Instruct'


def node(*cards):
    return [dict(index=i, name=card[0], memory_total=card[1]) for i, card in enumerate(cards)]


CASES = (
    # name, model, gpus, traffic
    ('8B, 2 x 4090 (one kind)', MODEL_8B, node(RTX4090, RTX4090), Traffic(4096, 512, 32)),
    ('8B, 4090 + A6000 (the swapped lab node)', MODEL_8B, node(RTX4090, A6000), Traffic(4096, 512, 32)),
    ('70B, 4090 + 4 x A6000', MODEL_70B, node(RTX4090, A6000, A6000, A6000, A6000), Traffic(11000, 1024, 32)),
    ('70B, 8 x A6000 (one kind)', MODEL_70B, node(*[A6000] * 8), Traffic(11000, 1024, 32)),
    ('70B, 4 x 4090 + 4 x A6000', MODEL_70B, node(*([RTX4090] * 4 + [A6000] * 4)), Traffic(11000, 1024, 32)),
)


def median_ms(function):
    samples = []
    for _unused in range(REPEATS):
        start = time.perf_counter()
        function()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1000.0


def main():
    print('GPU choice: build_plan without gpu_indexes vs one plan_vllm on the chosen GPUs '
          '(median of %d runs, vLLM 0.10.1.1)' % REPEATS)
    header = '%-42s %10s %10s %7s %5s %-14s %3s %-8s' % (
        'case', 'choice ms', 'one ms', 'x one', 'cands', 'chosen', 'TP', 'feasible')
    print(header)
    print('-' * len(header))
    for name, model, gpus, traffic in CASES:
        params = dict(backend='vllm', backend_version='0.10.1.1', model=model, gpus=gpus,
                      prompt_tokens_p99=traffic.prompt_tokens_p99, max_output_tokens=traffic.max_output_tokens,
                      max_concurrency=traffic.max_concurrency)
        plan = build_plan(params)
        spec = resolve_model(model)
        chosen = [g for g in gpus if g['index'] in plan.gpu_indexes]
        knobs = {'tensor_parallel_size': len(chosen)}
        choice = median_ms(lambda: build_plan(params))
        one = median_ms(lambda: plan_vllm(spec, chosen, traffic, knobs, '0.10.1.1'))
        print('%-42s %10.3f %10.3f %7.1f %5d %-14s %3d %-8s' % (
            name, choice, one, choice / one, len(plan.gpu_choice['candidates']),
            ','.join(str(i) for i in plan.gpu_indexes), plan.settings['tensor_parallel_size'], plan.feasible))


if __name__ == '__main__':
    main()
    sys.exit(0)
