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

The watchdog table (bench_watchdog_pages, issue 39): the latency sensor's time on each hostile
/metrics page of tests/adversarial/hostile_metrics.py, and the daemon scraping it as a process:
CPU per tick, peak RSS (its unit has MemoryMax=128M), whether each tick's memory sample reached
the decision engine, and what the daemon said about the page.

Run from the repo root: .venv/bin/python benchmarks/bench_hostile_inputs.py
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

# First: makes ansible_collections.kvpin.fleet importable (benchmarks/_setup.py).
import _setup  # noqa: F401  pylint: disable=unused-import

from ansible_collections.kvpin.fleet.plugins.module_utils.plan.serving_plan import serving_plan_result
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.model_catalog import CATALOG
from ansible_collections.kvpin.fleet.plugins.module_utils.facts import node_state

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


def fake_checkpoints(folder):
    """Issue 39 item 2: model directories whose checkpoint lies about an 8B config (one 64x64
    tensor in a complete model.safetensors; an index claiming total_size 1000, no shards)."""
    config = dict((k, v) for k, v in CATALOG['meta-llama/Llama-3.1-8B'].items() if not k.startswith('_'))
    paths = []
    for name in ('fake-8b-tensor', 'fake-8b-index'):
        path = os.path.join(folder, name)
        os.makedirs(path)
        with open(os.path.join(path, 'config.json'), 'w', encoding='utf-8') as handle:
            json.dump(config, handle)
        paths.append(path)
    header = json.dumps({'w': {'dtype': 'BF16', 'shape': [64, 64], 'data_offsets': [0, 8192]}}).encode()
    with open(os.path.join(paths[0], 'model.safetensors'), 'wb') as handle:
        handle.write(len(header).to_bytes(8, 'little') + header + b'\0' * 8192)
    with open(os.path.join(paths[1], 'model.safetensors.index.json'), 'w', encoding='utf-8') as handle:
        json.dump({'metadata': {'total_size': 1000}, 'weight_map': {
            'w%d' % i: 'model-%05d-of-00004.safetensors' % (i + 1) for i in range(4)}}, handle)
    return paths


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
    fake_8b, fake_index = fake_checkpoints(folder)
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
        ('8B config.json, one 64x64 tensor on disk', params(fake_8b)),
        ('8B config.json, index total_size 1000', params(fake_index)),
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


def bench_node_file_hash():
    """Issue 39 item 3: node_state hashing a 20 GB sparse file (reported over-size, not read) and
    one call over 5 files of 60 MiB (the fifth over the call's byte budget): time, bytes read, peak
    Python memory."""
    import tracemalloc   # pylint: disable=import-outside-toplevel
    rows = []
    with tempfile.TemporaryDirectory(prefix='kvpin-bench-hash-') as folder:
        sparse = os.path.join(folder, 'sparse-20GB')
        with open(sparse, 'wb') as handle:
            handle.truncate(20 * 1000 ** 3)
        files = []
        for number in range(5):
            files.append(os.path.join(folder, 'f%d' % number))
            with open(files[-1], 'wb') as handle:
                handle.truncate(60 << 20)
        checks = node_state.parse_checks([{'name': 'c', 'files': [{'path': p, 'read_sha1': True} for p in files]}])
        for name, run in (('observe_file: 20 GB sparse file, sha1 wanted',
                           lambda budget: {sparse: node_state.observe_file(sparse, want_sha1=True, budget=budget)}),
                          ('observe: 5 files of 60 MiB, one call', lambda budget: node_state.observe(checks)['files'])):
            budget = node_state.HashBudget()
            tracemalloc.start()
            start = time.perf_counter()
            seen = run(budget)
            seconds = time.perf_counter() - start
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            hashed = sum(1 for s in seen.values() if 'sha1' in s)
            rows.append((name, seconds, peak, hashed, len(seen) - hashed))
    print()
    print('node_state hashing, bounded (%d MiB per file, %d MiB and %g s per call)'
          % (node_state.HASH_MAX_FILE_BYTES >> 20, node_state.HASH_MAX_CALL_BYTES >> 20, node_state.HASH_CALL_SECONDS))
    header = '%-46s %9s %12s %7s %9s' % ('case', 'seconds', 'peak MiB', 'hashed', 'skipped')
    print(header)
    print('-' * len(header))
    for name, seconds, peak, hashed, skipped in rows:
        print('%-46s %9.4f %12.2f %7d %9d' % (name, seconds, peak / float(1 << 20), hashed, skipped))


def bench_watchdog_pages(ticks=6):
    """Issue 39 item 1: the watchdog daemon (a real process, as its unit runs it, no memory limit)
    scraping one hostile /metrics page per row from a server on 127.0.0.1 every second: CPU per
    tick, peak RSS (VmHWM), whether every tick's memory sample reached the decision engine, and
    what the daemon said about the page. The pages are tests/adversarial/hostile_metrics.py's."""
    import threading   # pylint: disable=import-outside-toplevel
    adversarial = os.path.join(_setup.ROOT, 'tests', 'adversarial')
    for path in (adversarial, os.path.join(_setup.ROOT, 'tests')):
        if path not in sys.path:
            sys.path.insert(0, path)
    import hostile_metrics as hm   # pylint: disable=import-error,import-outside-toplevel
    from attacker_http import AttackerServer, raw   # pylint: disable=import-error,import-outside-toplevel
    from watchdog_program import PROGRAM, load_watchdog_program   # pylint: disable=import-error,import-outside-toplevel
    wd = load_watchdog_program()
    cases = [('baseline: sane vLLM page', hm.good_page(100))]
    cases += [(name, page) for name, (page, _reason) in sorted(hm.BAD_FAMILIES.items())]
    cases += [(name, build()) for name, build in hm.BIG_PAGES.items()]
    cases.append(('kept bound: 2x4096 series, 200 B lbl', hm.kept_bound_page()))
    tick_hz = os.sysconf('SC_CLK_TCK')

    def cpu_seconds(pid):
        """utime + stime of the process, finished tick threads included (clock ticks)."""
        with open('/proc/%d/stat' % pid, encoding='ascii') as handle:
            fields = handle.read().rsplit(')', 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / float(tick_hz)

    def sensor_seconds(page):
        """Median wall time of the latency sensor's second look at the page (the first is its
        baseline) in this process, and how it ended."""
        samples, outcome = [], 'ok'
        for _unused in range(REPEATS):
            sensor = wd.LatencySensor(dict(wd.DEFAULTS))
            start = time.perf_counter()
            try:
                sensor.from_text(0.0, page)
                start = time.perf_counter()
                sensor.from_text(60.0, page)
            except Exception as exc:  # noqa: BLE001 - a row of the table, not a failure
                outcome = 'raises %s' % type(exc).__name__
            samples.append(time.perf_counter() - start)
        return statistics.median(samples), outcome

    def vm_hwm(pid):
        with open('/proc/%d/status' % pid, encoding='ascii') as handle:
            return next(int(line.split()[1]) * 1024 for line in handle if line.startswith('VmHWM:'))

    rows = []
    with tempfile.TemporaryDirectory(prefix='kvpin-bench-metrics-') as folder:
        proc_dir = os.path.join(folder, 'proc', '1')
        os.makedirs(proc_dir)
        with open(os.path.join(proc_dir, 'status'), 'w', encoding='ascii') as handle:
            handle.write('RssAnon:\t2048 kB\nVmSwap:\t0 kB\n')
        with open(os.path.join(proc_dir, 'stat'), 'w', encoding='ascii') as handle:
            handle.write('1 (x) S 0 ' + '0 ' * 17 + '5 0\n')
        for name, page in cases:
            parse_s, parse_outcome = sensor_seconds(page)
            with AttackerServer({('GET', '/metrics'): raw(200, page)}) as server:
                config = os.path.join(folder, 'c.json')
                with open(config, 'w', encoding='utf-8') as handle:
                    json.dump({'name': 't', 'pid': 1, 'proc_root': os.path.join(folder, 'proc'),
                               'cgroup_root': os.path.join(folder, 'none'), 'interval_seconds': 1,
                               'metrics_url': server.url + '/metrics', 'lock_file': os.path.join(folder, 'l')}, handle)
                env = dict(os.environ)
                env.pop('NOTIFY_SOCKET', None)
                child = subprocess.Popen([sys.executable, PROGRAM, 'daemon', '--config', config], env=env,
                                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
                events = []
                reader = threading.Thread(target=lambda: events.extend(json.loads(line) for line in child.stdout),
                                          daemon=True)
                reader.start()

                def ticked():
                    return [e for e in list(events) if e['event'] in ('decision', 'error')]
                end = time.monotonic() + 60
                while not ticked() and time.monotonic() < end:
                    time.sleep(0.05)
                first_cpu, first = cpu_seconds(child.pid), len(ticked())
                while len(ticked()) < first + ticks and time.monotonic() < end:
                    time.sleep(0.05)
                cpu, done = cpu_seconds(child.pid) - first_cpu, len(ticked()) - first
                peak = vm_hwm(child.pid)
                child.terminate()
                child.wait(timeout=30)
                reader.join(timeout=10)
            seen = ticked()
            fed = sum(1 for e in seen if e['event'] == 'decision' and e.get('memory_bytes'))
            said = [e for e in events if e['event'] in ('metric_family_dropped', 'metrics_page_refused', 'error')]
            outcome = ('%s %s' % (said[0]['event'], said[0].get('reason') or said[0].get('error', '')[:40])
                       if said else 'read')
            rows.append((name, len(page), 1000.0 * parse_s, parse_outcome, 1000.0 * cpu / max(1, done), peak, fed,
                         len(seen), outcome))
    print()
    print('watchdog against hostile /metrics pages: the latency sensor in this process (median of %d), and the '
          'daemon (a process, %d ticks after the first; its unit has MemoryMax=128M)' % (REPEATS, ticks))
    header = '%-36s %8s %9s %-22s %9s %8s %6s  %s' % ('page', 'bytes', 'sensor ms', 'sensor', 'daemon ms',
                                                      'peak MiB', 'memory', 'what the daemon said')
    print(header)
    print('-' * len(header))
    for name, size, parse_ms, parse_outcome, cpu_ms, peak, fed, seen, outcome in rows:
        print('%-36s %8d %9.2f %-22s %9.1f %8.1f %2d/%-3d  %s' % (
            name, size, parse_ms, parse_outcome, cpu_ms, peak / float(1 << 20), fed, seen, outcome))
    print('sensor ms: one look at the page; daemon ms: CPU per tick (scrape, parse, decide; 10 ms clock ticks); '
          'peak MiB: the daemon\'s VmHWM; memory: ticks whose memory sample reached the decision engine')


if __name__ == '__main__':
    main()
    bench_node_file_hash()
    bench_watchdog_pages()
    sys.exit(0)
