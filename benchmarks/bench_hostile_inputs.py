# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""How long serving_plan takes to refuse hostile inputs, and to plan the largest inputs it
accepts; prints a table, asserts nothing.

Target: every refusal well under a second (a 42 KB GGUF claiming a million blocks used to keep
the planner busy for minutes). The ratio column compares each case with an ordinary catalog
plan timed in the same process, so the table is comparable across machines. The last rows
are the bounds themselves: the deepest model accepted (256 layers) on the most GPUs accepted
(16), planned for llama.cpp, whose layer placement tries every -ngl.

Run from the repo root: .venv/bin/python benchmarks/bench_hostile_inputs.py
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time

# First: makes ansible_collections.kvpin.fleet importable (benchmarks/_setup.py).
import _setup  # noqa: F401  pylint: disable=unused-import

from ansible_collections.kvpin.fleet.plugins.module_utils.plan.serving_plan import serving_plan_result

GiB = 1 << 30
REPEATS = 5
TARGET_S = 1.0


def gpus(n, total=80 * GiB):
    return [dict(index=i, name='NVIDIA H100 80GB HBM3', memory_total=total, compute_capability='9.0')
            for i in range(n)]


def params(model, backend='vllm', version='0.10.1.1', n_gpus=1, total=80 * GiB, **knobs):
    return dict(backend=backend, backend_version=version, model=model, gpus=gpus(n_gpus, total),
                prompt_tokens_p99=4000, max_output_tokens=1000, max_concurrency=8, fail_on_infeasible=False,
                **knobs)


def write_gguf(folder, block_count, pad_to):
    import gguf   # pylint: disable=import-outside-toplevel
    path = os.path.join(folder, 'million-blocks.gguf')
    writer = gguf.GGUFWriter(path, 'llama')
    writer.add_block_count(block_count)
    writer.add_context_length(4096)
    writer.add_embedding_length(64)
    writer.add_feed_forward_length(128)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_token_list(['t%d' % i for i in range(32)])
    import numpy   # pylint: disable=import-outside-toplevel
    writer.add_tensor('blk.0.attn_norm.weight', numpy.zeros(64, dtype=numpy.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with open(path, 'ab') as handle:
        handle.write(b'\0' * max(0, pad_to - os.path.getsize(path)))
    return path


def hostile_cases(folder):
    small = {'architectures': ['LlamaForCausalLM'], 'model_type': 'llama', 'hidden_size': 64,
             'intermediate_size': 128, 'num_hidden_layers': 2, 'num_attention_heads': 4,
             'num_key_value_heads': 2, 'vocab_size': 100, 'max_position_embeddings': 1 << 20}
    huge_dir = os.path.join(folder, 'huge-config')
    os.makedirs(huge_dir)
    with open(os.path.join(huge_dir, 'config.json'), 'w', encoding='utf-8') as handle:
        json.dump(dict(small, padding='x' * (64 << 20)), handle)
    deep_dir = os.path.join(folder, 'deep-config')
    os.makedirs(deep_dir)
    with open(os.path.join(deep_dir, 'config.json'), 'w', encoding='utf-8') as handle:
        handle.write('{"a": ' + '[' * 500000 + ']' * 500000 + '}')
    counts = os.path.join(folder, 'counts.gguf')
    with open(counts, 'wb') as handle:
        handle.write(b'GGUF' + (3).to_bytes(4, 'little') + (1 << 60).to_bytes(8, 'little')
                     + (1 << 60).to_bytes(8, 'little') + b'\0' * 40000)
    deep_model = dict(small, num_hidden_layers=256)
    million = write_gguf(folder, 1000000, 42 * 1024)
    return [
        ('baseline: catalog 8B, vLLM, 1 GPU', params('meta-llama/Llama-3.1-8B-Instruct')),
        ('42 KB GGUF claiming 1,000,000 blocks', params(million, 'llama.cpp', 'b6327')),
        ('GGUF header claiming 2^60 tensors and keys', params(counts, 'llama.cpp', 'b6327')),
        ('config.json of 64 MiB', params(huge_dir)),
        ('config.json nested 500,000 deep', params(deep_dir)),
        ('config dict with 10^6 layers', params(dict(small, num_hidden_layers=10 ** 6))),
        ('config dict with 257 layers', params(dict(small, num_hidden_layers=257))),
        ('17 GPUs', params('meta-llama/Llama-3.1-8B-Instruct', n_gpus=17)),
        ('bound: 256 layers, vLLM, 8 GPUs', params(deep_model, n_gpus=8)),
        ('bound: 256 layers, llama.cpp, 1 GPU', params(deep_model, 'llama.cpp', 'b6327', quantization='Q4_K_M')),
        ('bound: 256 layers, llama.cpp, 16 GPUs', params(deep_model, 'llama.cpp', 'b6327', n_gpus=16,
                                                         quantization='Q4_K_M')),
        # worst case: nothing fits, so every -ngl is tried (and the suggestions replan)
        ('bound: 256 layers, llama.cpp, 16 x 2 GiB', params(deep_model, 'llama.cpp', 'b6327', n_gpus=16,
                                                            total=2 * GiB, quantization='Q4_K_M',
                                                            ctx_size=1 << 24, parallel=1)),
    ]


def time_case(case_params, repeats):
    samples, result = [], None
    for _unused in range(repeats):
        start = time.perf_counter()
        result = serving_plan_result(case_params)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples), result


def main():
    with tempfile.TemporaryDirectory(prefix='kvpin-bench-hostile-') as folder:
        rows = []
        for name, case_params in hostile_cases(folder):
            repeats = 1 if name.startswith('bound: 256 layers, llama.cpp, 16') else REPEATS
            seconds, result = time_case(case_params, repeats)
            outcome = ('refused: %s' % result['field'] if 'plan' not in result
                       else 'planned (%s)' % ('feasible' if result['plan']['feasible'] else 'infeasible'))
            rows.append((name, seconds, outcome))
    base = rows[0][1]
    print('serving_plan time to refuse hostile input (median of %d runs; target well under %.0f s)'
          % (REPEATS, TARGET_S))
    header = '%-44s %10s %9s  %s' % ('case', 'seconds', 'x base', 'outcome')
    print(header)
    print('-' * len(header))
    for name, seconds, outcome in rows:
        print('%-44s %10.4f %9.1f  %s' % (name, seconds, seconds / base, outcome))
    refusals = [r for r in rows if r[2].startswith('refused')]
    print('slowest refusal %.4f s = %.1f %% of the %.0f s target'
          % (max(r[1] for r in refusals), 100.0 * max(r[1] for r in refusals) / TARGET_S, TARGET_S))


if __name__ == '__main__':
    main()
    sys.exit(0)
