# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Accuracy of the llama-box / llama.cpp planner against public load logs.

Reads benchmarks/data/llamacpp_public.json (public load logs; docs/data-sources.md) and,
for every entry whose source gives enough to rebuild the run, compares per device:
model buffer, KV buffer, compute buffer and, where the entry says, OOM vs predicted
feasibility. The same figures come from a naive baseline in the same process
(gguf-parser-like "weights + KV over the whole context, no compute buffer, no pool,
250 MiB platform footprint"). Prints tables, a summary and ``accuracy:`` lines that state
each target and whether the planner meets it (PASS/FAIL); always exits 0.

Every entry is scored in its split (benchmarks/_splits.py): "fit" entries gave a fitted
constant (the constant's ``*_SOURCE_ROWS``) or an input from their own answer (llama.cpp#8035:
its tensor split is read from its KV lines), so they are in-sample; "held_out" entries gave
nothing. Tables, summary and ``accuracy:`` lines come once per split and once for all entries,
with the same targets.

Run from the repository root:  python benchmarks/bench_accuracy_llamacpp.py
"""

from __future__ import annotations

import json
import os
import sys

# First: makes ansible_collections.kvpin.fleet importable (benchmarks/_setup.py).
import _setup  # noqa: F401  pylint: disable=unused-import
import _splits as splits

from ansible_collections.kvpin.fleet.plugins.module_utils.plan import llamacpp_memory as lm
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.model_loaders import resolve_model
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.model_spec import LAYER_FULL, GGUFLayout, ModelSpec
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.plan_types import Traffic
from ansible_collections.kvpin.fleet.plugins.module_utils.units import GB, MiB

VALIDATION = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'data', 'llamacpp_public.json')
NAIVE_PLATFORM_FOOTPRINT = 250 * MiB     # gguf-parser --platform-footprint default "150,250"
# The pass/fail lines: the share of logged buffers the planner must hit within
# BUFFER_TOLERANCE_PCT, and the share of logged OOM / no-OOM outcomes it must call right.
BUFFER_TOLERANCE_PCT = 10.0
BUFFER_TARGET_FRACTION = 0.90
OOM_TARGET_FRACTION = 1.0

# ---------------------------------------------------------------- models the entries name

LLAMA_70B = resolve_model('meta-llama/Llama-3.3-70B-Instruct')

# llama.cpp#8035 names no model: 80 blocks + output and 32 MiB KV per layer at 8192 f16
# (8 KV heads x 128) are Llama-2/3-70B geometry; vocab 32000 (Llama-2) assumed. The
# compute buffer of CUDA0 does not depend on the vocabulary (the output layer is on the CPU
# and its logits are smaller than the attention peak either way).
LLAMA2_70B = ModelSpec(
    name='80-layer 70B (llama.cpp#8035)', source='catalog', architecture='LlamaForCausalLM',
    num_layers=80, hidden_size=8192, intermediate_size=28672, num_attention_heads=64,
    num_kv_heads=8, head_dim=128, vocab_size=32000, max_position_embeddings=4096,
    tie_word_embeddings=False, dtype_bytes=2, layer_kinds=[LAYER_FULL] * 80)

GPT_OSS_20B = resolve_model('openai/gpt-oss-20b')

# DeepSeek-R1 UD-IQ2_XXS as llama-box v0.0.114 loaded it (gpustack#1126): the Feb-2025
# GGUF caches K 128 heads x 192 and V 128 x 128 per layer. Per-block bytes are NOT in the
# source: unsloth's table gives 183 GB for the file; it is spread evenly over the 61
# blocks (an approximation: the first 3 dense blocks are smaller), so the feasibility
# rows of these entries are approximate.
_DS_FILE_BYTES = 183 * GB
_DS_IO = lm.type_bytes('Q4_K', 129280 * 7168) + lm.type_bytes('Q6_K', 129280 * 7168)
DEEPSEEK_R1 = ModelSpec(
    name='DeepSeek-R1-UD-IQ2_XXS', source='gguf', architecture='deepseek2', num_layers=61,
    hidden_size=7168, intermediate_size=18432, num_attention_heads=128, num_kv_heads=128,
    head_dim=192, vocab_size=129280, max_position_embeddings=163840,
    tie_word_embeddings=False, dtype_bytes=2, layer_kinds=[LAYER_FULL] * 61,
    num_experts=256, num_experts_per_tok=8, moe_intermediate_size=2048, num_shared_experts=1,
    quantization='gguf',
    gguf=GGUFLayout(file_type='MOSTLY_IQ2_XXS (unsloth dynamic)',
                    block_bytes=[(_DS_FILE_BYTES - _DS_IO) // 61] * 61,
                    input_bytes=lm.type_bytes('Q4_K', 129280 * 7168),
                    output_bytes=lm.type_bytes('Q6_K', 129280 * 7168), output_tied=False,
                    key_length=192, value_length=128, kv_heads_per_layer=[128] * 61,
                    n_tensors=1025))

RTX3090 = {'name': 'NVIDIA GeForce RTX 3090', 'memory_total': 24576 * MiB, 'compute_capability': '8.6'}


def _gpu(index, name, total_mib, cc):
    return {'index': index, 'name': name, 'memory_total': int(total_mib * MiB), 'memory_used': 0,
            'compute_capability': cc}


def scenario(entry):
    """How to rebuild an entry's run, or the reason it cannot be rebuilt."""
    url = entry['source_url']
    if url.endswith('/pull/8035'):
        gpus = [_gpu(0, 'RTX 4060 Ti', 16380, '8.9'), _gpu(1, 'RTX 3060', 12288, '8.6')]
        return dict(spec=LLAMA2_70B, gpus=gpus, backend='llama.cpp', version='b3200',
                    knobs={'gpu_layers': 78, 'ctx_size': 8192, 'parallel': 1,
                           'flash_attn': False, 'tensor_split': [46, 32],
                           'quantization': 'Q4_K_M'},
                    traffic=Traffic(4096, 4096, 1), compare_model=False,
                    note='tensor_split 46/32 read from the KV lines; quant unknown: model buffer '
                         'not compared; GPU sizes nominal (feasibility not compared)')
    if url.endswith('/issues/17715'):
        # the total the engine logged is already what it can allocate: no driver share to take off
        gpus = [dict(_gpu(0, 'RTX 5090 (Vulkan)', entry['gpu_total_mib'], '12.0'),
                     memory_total_cuda=int(entry['gpu_total_mib'] * MiB),
                     memory_total_cuda_source='total logged by the engine')]
        return dict(spec=GPT_OSS_20B, gpus=gpus, backend='llama.cpp', version='b7250',
                    knobs={'gpu_layers': 25, 'ctx_size': 16384, 'parallel': 1,
                           'flash_attn': bool(entry['flash_attn']), 'quantization': 'MXFP4_MOE'},
                    traffic=Traffic(16000, 384, 1), compare_model=True,
                    note='-ngl 99 = all 24 blocks + output; Vulkan backend (graph buffers '
                         'are backend-independent); MXFP4_MOE mix derived, no file read')
    if url.endswith('/issues/1126') and entry.get('n_layers_offloaded') == 42:
        gpus = [dict(RTX3090, index=i) for i in range(7)]
        return dict(spec=DEEPSEEK_R1, gpus=gpus, backend='llama-box', version='v0.0.114',
                    knobs={'gpu_layers': 42, 'ctx_size': 8192, 'parallel': 4, 'flash_attn': False,
                           'tensor_split': [23540] * 7},
                    traffic=Traffic(1024, 1024, 4), compare_model=False,
                    note='block bytes approximated from the 183 GB file size')
    if url.endswith('/issues/1126') and entry.get('n_layers_offloaded') == 49:
        gpus = [dict(RTX3090, index=i) for i in range(8)]
        return dict(spec=DEEPSEEK_R1, gpus=gpus, backend='llama-box', version='v0.0.114',
                    knobs={'gpu_layers': 49, 'ctx_size': 8192, 'parallel': 4, 'flash_attn': False,
                           'tensor_split': [27908] + [23151] * 7},
                    traffic=Traffic(1024, 1024, 4), compare_model=False,
                    note='8x RTX 3090 per the issue; block bytes approximated from the file size')
    if 'ollama/ollama/issues/5913' in url:
        return 'GPU (ROCm card) and its memory are not in the source'
    if url.endswith('/issues/4712'):
        return ('model not named and 2023 logging (scratch buffers); kept as evidence for the '
                'CUDA pool term only: +6% (-b 1) to +27% (-b 2048) measured over the printed total')
    return 'no rebuild rule for this entry'


# ---------------------------------------------------------------- naive baseline

def kv_values_per_cell(spec, layout):
    """K + V values per cell of a full-attention block (what a naive estimate multiplies)."""
    if layout is not None:
        return (layout.key_length + layout.value_length) * max(layout.kv_heads_per_layer)
    return 2 * spec.head_dim * spec.num_kv_heads


def naive_device(plan, gpu_index, spec, layout, ctx_size):
    """gguf-parser-like: same weights, KV = every offloaded block x ctx_size f16 (no SWA
    window, no padding), no compute buffer, no pool, 250 MiB footprint."""
    mem = plan.memory[gpu_index]
    blocks = plan.settings['blocks_per_gpu'][gpu_index]
    kv = blocks * ctx_size * kv_values_per_cell(spec, layout) * 2
    return {'model': mem.weights, 'kv': kv, 'compute': 0,
            'total': mem.weights + kv + NAIVE_PLATFORM_FOOTPRINT}


def pct(pred, logged):
    if logged in (None, 0) or pred is None:
        return None
    return 100.0 * (pred - logged) / logged


def fmt_pct(value):
    return '   n/a' if value is None else '%+6.1f%%' % value


# ---------------------------------------------------------------- main

def run_entries(entries, sources):
    """(buffer rows, OOM rows, skipped entries, {label: (split, why)}) over the entries."""
    rows, oom_rows, skipped, split_of = [], [], [], {}
    for number, entry in enumerate(entries):
        sc = scenario(entry)
        label = '#%d %s' % (number, entry['source_url'].split('github.com/')[-1])
        split_of[label] = splits.row_split(entry, sources)
        if isinstance(sc, str):
            skipped.append((label, sc))
            continue
        plan = lm.plan_llamacpp(sc['spec'], sc['gpus'], sc['traffic'], sc['knobs'],
                                sc['backend'], sc['version'])
        layout = sc['spec'].gguf or lm.derive_gguf_layout(sc['spec'], sc['knobs']['quantization'])[0]
        per_device = entry.get('per_device_mib') or {}
        if not per_device:
            single = {}
            for key, name in (('model_buffer_gpu_mib', 'model'), ('kv_buffer_gpu_mib', 'kv'),
                              ('compute_buffer_gpu_mib', 'compute')):
                if entry.get(key) is not None:
                    single[name] = entry[key]
            if single:
                per_device = {'GPU0': single}
        for dev_name, logged in sorted(per_device.items()):
            idx = int(''.join(ch for ch in dev_name if ch.isdigit()) or 0)
            mem = plan.memory[idx]
            naive = naive_device(plan, idx, sc['spec'], sc['spec'].gguf, sc['knobs']['ctx_size'])
            ours = {'model': mem.weights, 'kv': mem.kv_cache, 'compute': mem.terms['compute_buffer']}
            for quantity in ('model', 'kv', 'compute'):
                if logged.get(quantity) is None:
                    continue
                if quantity == 'model' and not sc['compare_model']:
                    continue
                rows.append((label, dev_name, quantity, logged[quantity], ours[quantity] / MiB,
                             naive[quantity] / MiB))
        host_kv = entry.get('host_kv_buffer_mib', entry.get('cpu_kv_buffer_mib'))
        if host_kv is not None:
            host_blocks = sc['spec'].num_layers - plan.settings['offloaded_blocks']
            dims = lm.layer_kv_dims(sc['spec'], sc['spec'].gguf)
            planned = sum(lm.kv_layer_bytes(dims[i], plan.settings['kv_cells'],
                                            plan.settings['kv_cells_swa'], 'f16', 'f16')
                          for i in range(host_blocks))
            naive = host_blocks * sc['knobs']['ctx_size'] * kv_values_per_cell(sc['spec'], layout) * 2
            rows.append((label, 'host', 'kv', host_kv, planned / MiB, naive / MiB))
        if entry.get('oom') in (True, False) and 'GPU sizes nominal' not in sc['note']:
            naive_fit = all(naive_device(plan, i, sc['spec'], sc['spec'].gguf,
                                         sc['knobs']['ctx_size'])['total'] <= g['memory_total']
                            for i, g in enumerate(sc['gpus']))
            physical_fit = all(m.weights + m.kv_cache + m.activation + m.non_torch <= m.total
                               for m in plan.memory)
            oom_rows.append((label, entry['oom'], not plan.feasible, not physical_fit,
                             not naive_fit, sc['note']))
    return rows, oom_rows, skipped, split_of


def report_scenario():
    """The field report's deployment: Llama-3.3-70B on one RTX A6000, 4k prompts."""
    a6000 = {'index': 0, 'name': 'NVIDIA RTX A6000', 'memory_total': 51527024640,
             'memory_used': 0, 'compute_capability': '8.6'}
    print('\nField report: Llama-3.3-70B GGUF on one RTX A6000 (51,527,024,640 B), llama-box, '
          'prompt p99 4096 + 512 output tokens')
    header = ('quant', 'parallel', 'planned -ngl (of 81)', 'naive -ngl (w+KV+250MiB)',
              'ratio planned/naive')
    print('%-8s %8s | %-22s | %-24s | %s' % header)
    for quant in ('Q4_K_M', 'Q5_K_M', 'Q6_K', 'Q8_0'):
        layout, _unused = lm.derive_gguf_layout(LLAMA_70B, quant)
        for parallel in (1, 2, 3, 4):
            traffic = Traffic(4096, 512, parallel)
            plan = lm.plan_llamacpp(LLAMA_70B, [a6000], traffic, {'quantization': quant},
                                    'llama-box', 'v0.0.171')
            ctx = parallel * traffic.tokens_per_sequence
            naive_k = 0
            for k in range(0, 82):
                blocks = min(k, 80)
                weights = sum(layout.block_bytes[80 - blocks:]) + (layout.output_bytes if k > 80 else 0)
                if weights + blocks * ctx * 4096 + NAIVE_PLATFORM_FOOTPRINT <= a6000['memory_total']:
                    naive_k = k
            k = plan.settings['gpu_layers']
            print('%-8s %8d | %22d | %24d | %.2f' % (quant, parallel, k, naive_k,
                                                     float(k) / naive_k if naive_k else 0.0))
    all_layers = lm.plan_llamacpp(LLAMA_70B, [a6000], Traffic(4096, 512, 4),
                                  {'quantization': 'Q4_K_M', 'gpu_layers': 81}, 'llama-box', 'v0.0.171')
    print('Q4_K_M, 4 slots, -ngl 81 (all): feasible=%s' % all_layers.feasible)
    for line in all_layers.not_fitting:
        print('  ' + line)


def report_split(split, rows, oom_rows, tables=True):
    """Buffer and OOM tables (``tables``), summary and ``accuracy:`` lines of one split."""
    errors = {'planned': [], 'naive': []}
    if tables:
        print('%-34s %-6s %-8s %10s | %10s %8s | %10s %8s' % (
            'entry', 'device', 'buffer', 'logged', 'planned', 'err', 'naive', 'err'))
    for label, dev, quantity, logged, ours, naive in rows:
        e_ours, e_naive = pct(ours, logged), pct(naive, logged)
        errors['planned'].append(abs(e_ours))
        errors['naive'].append(abs(e_naive))
        if tables:
            print('%-34s %-6s %-8s %10.1f | %10.1f %8s | %10.1f %8s' % (
                label[:34], dev, quantity, logged, ours, fmt_pct(e_ours), naive, fmt_pct(e_naive)))
    if tables:
        print('OOM vs predicted (planned: plan infeasible at the entry\'s settings; physical: '
              'resident > total, no reserve; naive: weights + KV + 250 MiB > total)')
        header = ('entry', 'logged OOM', 'planned infeas.', 'physical OOM', 'naive OOM', 'note')
        print('%-34s %-10s %-16s %-16s %-14s %s' % header)
    agree = {'planned': 0, 'physical': 0, 'naive': 0}
    for label, oom, planned, physical, naive, note in oom_rows:
        agree['planned'] += planned == oom
        agree['physical'] += physical == oom
        agree['naive'] += naive == oom
        if tables:
            print('%-34s %-10s %-16s %-16s %-14s %s' % (label[:34], oom, planned, physical, naive, note))
    n = len(rows)
    if n:
        print('Summary over %d logged buffers: mean |error| planned %.1f%%, naive %.1f%% '
              '(ratio naive/planned %.1f)' % (
                  n, sum(errors['planned']) / n, sum(errors['naive']) / n,
                  (sum(errors['naive']) / max(1e-9, sum(errors['planned'])))))
    if oom_rows:
        print('OOM agreement over %d entries: planned %d, physical %d, naive %d' % (
            len(oom_rows), agree['planned'], agree['physical'], agree['naive']))
    within = sum(1 for e in errors['planned'] if e <= BUFFER_TOLERANCE_PCT)
    print(splits.verdict_line(split, 'buffers within %.0f %% of the log on' % BUFFER_TOLERANCE_PCT,
                              within, n, 'rows', BUFFER_TARGET_FRACTION))
    print(splits.verdict_line(split, 'OOM predicted == logged on', agree['planned'], len(oom_rows),
                              'entries', OOM_TARGET_FRACTION))


def main():
    if not os.path.exists(VALIDATION):
        print('validation file not found: %s; nothing to compare' % VALIDATION)
        print('accuracy: no validation data: NOT RUN')
        report_scenario()
        return 0
    with open(VALIDATION) as handle:
        entries = json.load(handle)['entries']
    sources = splits.fitted_source_rows(splits.LLAMACPP_MODULES)
    rows, oom_rows, skipped, split_of = run_entries(entries, sources)
    print('llama-box / llama.cpp planner vs public load logs (%s), MiB per device' % VALIDATION)
    splits.print_split_preamble(entries, sources, 'entry')
    for split in splits.SPLITS + (splits.TOTAL,):
        labels = [label for label, (where, _why) in split_of.items() if split in (splits.TOTAL, where)]
        print('\n== %s: %d entries' % (splits.TITLES[split], len(labels)))
        if split != splits.TOTAL:
            for label in labels:
                print('  %s: %s' % (label, split_of[label][1]))
        report_split(split, [r for r in rows if r[0] in labels], [r for r in oom_rows if r[0] in labels],
                     tables=split != splits.TOTAL)
    print('\nSkipped entries (not rebuilt, in no score):')
    for label, reason in skipped:
        print('  %s [%s]: %s' % (label, split_of[label][0], reason))
    report_scenario()
    return 0


if __name__ == '__main__':
    sys.exit(main())
