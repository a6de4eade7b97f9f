# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The vLLM planner against real vLLM startup logs; prints tables, asserts nothing.

For every entry of benchmarks/data/vllm_public.json (real ``vllm serve`` startup numbers
with their source URLs; docs/data-sources.md says where each came from) the planner runs
with the logged settings (model from the catalog, TP,
util, max_model_len, max_num_batched_tokens, block size, enforce_eager where logged, and the
vllm_sampler knob where the log names the top-k/top-p sampler it ran: the entry's vllm_sampler with
the quoted line in vllm_sampler_quote) and the version's default
max_num_seqs (what the logged runs used), then prints predicted vs logged weights,
activation and "Available KV cache memory" per GPU, and whether the planner calls the
deployment feasible vs what happened. The verdict is the fleet's: the plan's ``feasible``, then
the node ledger (gpu_ledger) with the processes gpu_facts would list (``other_processes``, from
the run's own OOM line; none for a run whose log names none). A naive baseline (util x total - weights, what a
weights-only estimate gives) is scored the same way. The ``accuracy:`` lines state each target
and whether the planner meets it (PASS/FAIL); the exit status is 0 either way.

Every row is scored in its split (benchmarks/_splits.py): "fit" rows gave a fitted constant of
the planner (the constant's ``*_SOURCE_ROWS``) or an input from their own answer (a util rebuilt
from the row's own terms), so they are in-sample; "held_out" rows gave nothing. The table,
summary and ``accuracy:`` lines come once per split and once for all rows, with the same targets.

The GPU total fed to the planner is what gpu_facts reports in the fleet: the NVML total of
the card class (cuda_total.CARD_GAPS), not the CUDA total the log prints (kept as a column).
The planner turns it into the CUDA-visible total itself. The "old" KV column is the same plan
told that the NVML total is what CUDA sees (the planner before cuda_total): it over-states
the budget by util x the driver's share; the summary counts over-predictions both ways.

After the splits, one table per card class (cuda_total.CARD_GAPS row) and vLLM version counts
logs, failed starts, KV within tolerance, the worst KV over-prediction, verdicts and weights
within 5 %; a second table gives each class's NVML total, the CUDA-visible total cuda_total
derives from it (the runs' input) and the gap, next to the CUDA totals the logs print. The
``acceptance:`` lines check the card-class targets (>= 30 logs, >= 6 classes, >= 5 failures,
KV within max(0.5 GiB, 10 %) on >= 90 %, never > 10 % above the logged KV, verdicts 100 %,
weights within 5 %); ``card miss:`` lines name each row that misses one. A run whose log gives
the KV only in tokens ("GPU KV cache size") is scored as tokens x the model's KV bytes per token
on one GPU, when every layer is full attention (else it is not scored).

Model Runner V2 rows (vLLM 0.25+ dense models, every model from 0.29: vllm_profile.model_runner)
are planned with pin_kv_cache_memory false where the version pins by default (0.10.2 - 0.33): the
logged engine sized its own pool from a profile run whose compile-cache state the log does not give,
so the plan's unpinned cold start is scored (the side that does not over-promise).

Assumptions, stated once: an entry without a version is planned as vLLM 0.11.0 (the
source document's other revision names v0.11.0, and its graph memory was measured after KV
allocation, i.e. <= 0.19 accounting); an entry without util gets the util its own logged
terms add up to (weights + activation + non-torch + KV) / total, rounded to 0.01.

Run from the repo root: .venv/bin/python benchmarks/bench_accuracy_vllm.py
"""

from __future__ import annotations

import json
import os
import sys

# First: makes ansible_collections.kvpin.fleet importable (benchmarks/_setup.py).
from _setup import ROOT
import _splits as splits

from ansible_collections.kvpin.fleet.plugins.module_utils.plan import cuda_total as ct
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.gpu_ledger import LedgerInputError, gpu_ledger
from ansible_collections.kvpin.fleet.plugins.module_utils.plan import vllm_profile as prof
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.model_loaders import resolve_model
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.plan_types import PlanInputError, Traffic
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.serving_plan import plan_vllm_engine
from ansible_collections.kvpin.fleet.plugins.module_utils.units import GiB
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.vllm_memory import (
    kv_bytes_per_token, plan_vllm)

DATA = os.path.join(ROOT, 'benchmarks', 'data', 'vllm_public.json')
ASSUMED_VERSION = '0.11.0'
KV_TOLERANCE_FRACTION = 0.10
KV_TOLERANCE_BYTES = GiB // 2
# The pass/fail line: the share of logged runs whose KV the planner must hit within the
# tolerance above, and the share whose outcome (started / failed) it must call right.
KV_TARGET_FRACTION = 0.90
OUTCOME_TARGET_FRACTION = 1.0
# The card-class acceptance (issue 12, item 4): enough public logs over enough card classes,
# with failures among them; the plan's KV never more than 10 % above the logged KV; the
# planned weights within 5 % of "Model loading took" on every row that logs them.
MIN_LOGS = 30
MIN_CARD_CLASSES = 6
MIN_FAILURES = 5
KV_MAX_OVER_FRACTION = 0.10
WEIGHTS_TOLERANCE_FRACTION = 0.05
# What a V0 release (before vllm_profile.V1_ENGINE_SINCE) runs when max_num_seqs is not given:
# EngineArgs.max_num_seqs = 256 (vllm/engine/arg_utils.py, v0.6.x - v0.7.x); the V1 per-device
# defaults (vllm_profile.batch_defaults) start with 0.8.0.
V0_DEFAULT_MAX_NUM_SEQS = 256


def _model_name(entry):
    return entry['model']


def _util(entry):
    if entry['gpu_memory_utilization'] is not None:
        return entry['gpu_memory_utilization'], 'logged'
    terms = [entry[k] for k in ('weights_gib', 'peak_activation_gib', 'non_torch_gib', 'kv_cache_gib')]
    if any(t is None for t in terms):
        return 0.9, 'assumed 0.9'
    return round(sum(terms) / entry['gpu_total_gib'], 2), 'from logged terms'


def runs(entries):
    """One run per entry, plus the failed 32000-token Qwen3-32B run its notes record."""
    for entry in entries:
        yield entry
        if 'max-model-len 32000 is listed as FAILED' in entry.get('notes', ''):
            extra = dict(entry, max_model_len=32000, kv_cache_gib=None, weights_gib=None,
                         peak_activation_gib=None, non_torch_gib=None,
                         startup_outcome='failed: not enough KV for one 32000-token request (from notes)')
            yield extra


def nvml_total(entry):
    """What gpu_facts reports as memory_total for the entry's card: its class's NVML total, or,
    for a card in no cuda_total.CARD_GAPS row, the NVML total the source itself prints
    (``gpu_nvml_total_mib``, nvidia-smi's memory.total); None when neither is known. A card in
    no row is then planned the way the fleet would plan it: cuda_total's default margin."""
    row = ct.find_card(entry['gpu'])
    if row is not None:
        return row.nvml_total_mib * ct.MiB
    mib = entry.get('gpu_nvml_total_mib')
    if mib is None:
        return None
    if isinstance(mib, bool) or not isinstance(mib, int) or not 1024 <= mib <= 1024 * 1024:
        raise PlanInputError('%s.gpu_nvml_total_mib' % entry.get('id'),
                             'must be a whole number of MiB in [1024, 1048576], got %r' % (mib,))
    return mib * ct.MiB


# Bounds of a logged process (the ledger's own bounds apply after these).
MAX_OTHER_PROCESSES = 64
MAX_PROCESS_MIB = 1024 * 1024


def other_processes(entry):
    """The processes other than the engine that held memory on the run's GPU, as gpu_facts' GPU
    dicts list them (``processes``: pid, used_memory in bytes), from the entry's ``other_processes``
    (each {pid, used_mib} read from the run's own OOM line; a pid of None is memory the log names no
    process for, listed as pid 0). A run whose log names none ran on a GPU of its own: []. Every
    value is type- and range-checked; a bad one raises PlanInputError naming the field."""
    listed = entry.get('other_processes')
    where = '%s.other_processes' % entry.get('id')
    if listed is None:
        return []
    if not isinstance(listed, list) or len(listed) > MAX_OTHER_PROCESSES:
        raise PlanInputError(where, 'must be a list of at most %d {pid, used_mib}, got %r'
                             % (MAX_OTHER_PROCESSES, listed))
    processes = []
    for position, process in enumerate(listed):
        here = '%s[%d]' % (where, position)
        if not isinstance(process, dict):
            raise PlanInputError(here, 'must be a dict {pid, used_mib}, got %r' % (process,))
        pid, mib = process.get('pid'), process.get('used_mib')
        if pid is not None and (isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0):
            raise PlanInputError(here + '.pid', 'must be a process id (integer > 0) or null, got %r' % (pid,))
        if isinstance(mib, bool) or not isinstance(mib, (int, float)) or not 0 < mib <= MAX_PROCESS_MIB:
            raise PlanInputError(here + '.used_mib', 'must be a number of MiB in (0, %d], got %r'
                                 % (MAX_PROCESS_MIB, mib))
        processes.append({'pid': pid or 0, 'used_memory': int(mib * ct.MiB)})
    return processes


def unplanned_reason(entry):
    """Why the planner on this branch cannot rebuild the entry's run (None = it can): a V0 log
    with no version, a version the planner does not support (vllm_profile.SUPPORTED_TEXT; the
    V0 releases wait for the versions branch), a card with no NVML total, a model not in the
    catalog. Such rows are counted, not scored, so that they count as soon as the planner
    covers them."""
    if entry['vllm_version'] is None and entry.get('engine') == 'V0':
        return 'V0 engine, version not logged'
    try:
        prof.parse_version(entry['vllm_version'] or ASSUMED_VERSION)
    except PlanInputError as exc:
        return 'version unsupported on this branch (%s)' % exc
    try:
        total = nvml_total(entry)
    except PlanInputError as exc:
        return 'bad NVML total (%s)' % exc
    if total is None:
        return 'no NVML total for %r (no cuda_total.CARD_GAPS row, none in the entry)' % entry['gpu']
    try:
        other_processes(entry)
    except PlanInputError as exc:
        return 'bad other_processes (%s)' % exc
    try:
        resolve_model(_model_name(entry))
    except (PlanInputError, ValueError) as exc:
        return 'model not plannable (%s)' % exc
    return None


def default_max_num_seqs(version, gpu_name, total):
    """The max_num_seqs a logged run used when its command line set none: 256 on the V0 engine
    (V0_DEFAULT_MAX_NUM_SEQS), else the V1 per-device default (vllm_profile.batch_defaults)."""
    if not version.at_least(prof.V1_ENGINE_SINCE):
        return V0_DEFAULT_MAX_NUM_SEQS
    return prof.batch_defaults(version, gpu_name, total).max_num_seqs


def plan_entry(entry, old=False):
    """The plan from gpu_facts' view of the card (NVML total); ``old``: the same GPU with the
    NVML total passed off as the CUDA total (the planner before cuda_total)."""
    spec = resolve_model(_model_name(entry))
    total = nvml_total(entry)
    tp = entry['tensor_parallel_size']
    processes = other_processes(entry)
    gpus = [dict(index=i, name=entry['gpu'], memory_total=total, processes=processes) for i in range(tp)]
    if old:
        gpus = [dict(g, memory_total_cuda=total, memory_total_cuda_source='NVML total (old)') for g in gpus]
    version_text = entry['vllm_version'] or ASSUMED_VERSION
    version = prof.parse_version(version_text)
    util, util_source = _util(entry)
    knobs = dict(tensor_parallel_size=tp, gpu_memory_utilization=util,
                 max_model_len=entry['max_model_len'], kv_cache_dtype='auto',
                 max_num_seqs=entry['max_num_seqs'] or default_max_num_seqs(version, entry['gpu'], total))
    if entry['max_num_batched_tokens']:
        knobs['max_num_batched_tokens'] = entry['max_num_batched_tokens']
    if entry['block_size']:
        knobs['block_size'] = entry['block_size']
    if entry.get('enforce_eager'):
        knobs['enforce_eager'] = True
    runner, _why = prof.model_runner(version, spec.num_experts > 0, 'none' in spec.layer_kinds,
                                     architecture=spec.architecture)
    if runner == prof.RUNNER_V2 and prof.flag_available('kv_cache_memory_bytes', version) \
            and not version.at_least(prof.EXTENSIBLE_KV_SINCE):
        # Model Runner V2 rows: the logged engine sized its pool from a profile run whose compile
        # cache state the log does not give, so the plan's unpinned cold start (kv_budget) is scored
        # (the side that does not over-promise); V1 rows keep the default pin as before
        knobs['pin_kv_cache_memory'] = False
    if entry.get('vllm_sampler'):
        # the sampler the run's own log names (its vllm_sampler_quote line), as an operator who
        # knows the image would set the knob
        knobs['vllm_sampler'] = entry['vllm_sampler']
    traffic = Traffic(prompt_tokens_p99=entry['max_model_len'] // 2,
                      max_output_tokens=entry['max_model_len'] // 2, max_concurrency=1)
    plan = plan_vllm_engine(spec, gpus, traffic, knobs, version_text)
    naive_kv = int(plan.memory[0].total * util) - spec.weight_bytes // tp
    naive_fits = naive_kv >= entry['max_model_len'] * kv_bytes_per_token(spec, tp, spec.dtype_bytes)
    return spec, plan, util, util_source, version_text, naive_kv, naive_fits, gpus


def fleet_verdict(entry_id, plan, gpus):
    """(fits, ledger problems): what the fleet decides before launch, which is serving_plan's
    ``feasible`` and then the node's memory ledger (module_utils/gpu_ledger.py: the plan's budget and
    outside terms plus every process gpu_facts lists that is not GPUStack's, against the CUDA-visible
    total). No GPUStack ran in these logs, so no system_reserved booking fence is charged."""
    if not plan.feasible:
        return False, []
    try:
        ledger = gpu_ledger(gpus, [dict(name=entry_id, plan=plan.to_dict(), pinned=True)])
    except LedgerInputError as exc:
        raise PlanInputError('%s (ledger)' % entry_id, str(exc))
    return ledger.fits, list(ledger.problems)


def _g(n):
    return '%7.2f' % (n / GiB)


def _l(v):
    return '%7s' % ('-' if v is None else '%.2f' % v)


def logged_kv(entry, spec):
    """(bytes, how) of the run's logged KV per GPU: "Available KV cache memory" when logged;
    else "GPU KV cache size: N tokens" x the model's KV bytes per token on one GPU, for models
    whose every attention layer keeps every token (sliding-window and hybrid models count tokens
    per group, so tokens x bytes is not their KV); else (None, why)."""
    if entry['kv_cache_gib'] is not None:
        return int(entry['kv_cache_gib'] * GiB), 'GiB'
    tokens = entry.get('kv_cache_tokens')
    if tokens is None:
        return None, 'not logged'
    if any(kind != 'full' for kind in spec.layer_kinds):
        return None, 'tokens only, not full attention on every layer'
    per_token = kv_bytes_per_token(spec, entry['tensor_parallel_size'], spec.dtype_bytes)
    return tokens * per_token, 'tokens x %d B' % per_token


def within(pred_bytes, logged_gib):
    err = pred_bytes - logged_gib * GiB
    return abs(err) <= max(KV_TOLERANCE_BYTES, KV_TOLERANCE_FRACTION * abs(logged_gib * GiB)), err


def score(entries, sources):
    """(records, unplanned): one record per run the planner rebuilds (the plan, the old plan,
    the naive figures and the run's split; a run the notes add inherits its row's id and
    split), and (entry, why) for each run it cannot (``unplanned_reason``)."""
    records = []
    unplanned = []
    for entry in runs(entries):
        why_not = unplanned_reason(entry)
        if why_not is not None:
            unplanned.append((entry, why_not))
            continue
        spec, plan, util, util_source, version_text, naive_kv, naive_fits, gpus = plan_entry(entry)
        verdict, ledger_problems = fleet_verdict(entry['id'], plan, gpus)
        split, why = splits.row_split(entry, sources)
        if util_source == 'from logged terms' and split != splits.FIT:
            # util rebuilt from the row's own KV: its answer fed its input
            split, why = splits.FIT, 'util from its own logged terms'
        old_plan = plan_entry(entry, old=True)[1]
        kv_log, kv_log_how = logged_kv(entry, spec)
        records.append(dict(entry=entry, spec=spec, plan=plan, util=util, util_source=util_source,
                            kv_log=kv_log, kv_log_how=kv_log_how,
                            version_text=version_text, naive_kv=naive_kv, naive_fits=naive_fits,
                            kv_pred=min(m.terms['kv_budget'] for m in plan.memory),
                            kv_old=min(m.terms['kv_budget'] for m in old_plan.memory),
                            verdict=verdict, ledger_problems=ledger_problems,
                            started=entry_served(entry), split=split, why=why))
    mark_flaky_twins(records)
    return records, unplanned


# What the planner is given of a run (plan_entry reads these fields and nothing else that differs
# between two runs of one configuration): two runs equal on all of them are the same plan input.
PLAN_INPUT_FIELDS = ('engine', 'vllm_version', 'gpu', 'gpu_total_gib', 'model', 'dtype_quantization',
                     'tensor_parallel_size', 'gpu_memory_utilization', 'max_model_len', 'max_num_seqs',
                     'max_num_batched_tokens', 'block_size', 'kv_cache_dtype', 'enforce_eager',
                     'vllm_sampler', 'pipeline_parallel_size', 'other_processes')


def plan_input_key(entry):
    """The run's plan input, comparable: its PLAN_INPUT_FIELDS values."""
    return tuple(repr(entry.get(field)) for field in PLAN_INPUT_FIELDS)


def mark_flaky_twins(records):
    """A run that served while a twin with the same plan input failed is a configuration that
    fails some of the time: the verdict that does not crash is NO, so ``expected_fit`` is False
    for both and ``flaky_twin`` names the failed one. Every other run expects what it did."""
    failed = {}
    for r in records:
        if not r['started']:
            failed.setdefault(plan_input_key(r['entry']), r['entry']['id'])
    for r in records:
        r['flaky_twin'] = failed.get(plan_input_key(r['entry'])) if r['started'] else None
        r['expected_fit'] = r['started'] and r['flaky_twin'] is None


def entry_served(entry):
    """Whether the logged run served: it started, and did not die of CUDA OOM at its first requests.

    The planner's "feasible" promises an engine that serves without running out of memory, not one
    that only gets through startup: a run whose log shows the engine up and then a CUDA OOM in its
    first generate() (``runtime_outcome`` starting with ``cuda_oom``) is a run that did not fit."""
    if entry['startup_outcome'] != 'started':
        return False
    return not str(entry.get('runtime_outcome') or '').startswith('cuda_oom')


HEADER = ('%-32s %-8s %2s %4s %5s | %7s %7s %7s | %7s %7s | %7s %7s | %7s %7s | %7s %7s %7s %7s %7s | %-5s %-5s %-7s'
          % ('model', 'version', 'TP', 'util', 'len', 'NVML', 'CUDA est', 'CUDA log', 'W pred', 'W log',
             'A pred', 'A log', 'G pred', 'G log', 'KV pred', 'KV old', 'KV log', 'err', 'naive',
             'plan', 'naive', 'logged'))


def print_table(records):
    print(HEADER)
    print('-' * len(HEADER))
    for r in records:
        entry, spec, plan = r['entry'], r['spec'], r['plan']
        mem = plan.memory[0]
        err_text = '      -'
        if r['kv_log'] is not None:
            err_text = '%+7.2f' % ((r['kv_pred'] - r['kv_log']) / GiB)
        print('%-32s %-8s %2d %4.2f %5d | %s %s %s | %s %s | %s %s | %s %s | %s %s %s %s %s | %-5s %-5s %-7s' % (
            spec.name.split('/')[-1][:32], r['version_text'] + ('' if entry['vllm_version'] else '*'),
            entry['tensor_parallel_size'], r['util'], entry['max_model_len'], _g(mem.terms['nvml_total']),
            _g(mem.total), _l(entry['gpu_total_gib']), _g(mem.weights),
            _l(entry['weights_gib']), _g(mem.activation), _l(entry['peak_activation_gib']),
            _g(mem.cuda_graph), _l(entry['cudagraph_gib']), _g(r['kv_pred']), _g(r['kv_old']),
            _l(None if r['kv_log'] is None else r['kv_log'] / GiB), err_text, _g(r['naive_kv']),
            _verdict_text(r), 'fits' if r['naive_fits'] else 'NO',
            'started' if r['started'] else 'FAILED'))
        print('    %s: %s%s%s' % (entry['id'], r['why'], '' if r['util_source'] == 'logged' else
                                  '; util %.2f %s' % (r['util'], r['util_source']),
                                  '' if r['flaky_twin'] is None else
                                  '; started, but %s failed with the same plan input: the right '
                                  'verdict is NO' % r['flaky_twin']))
        for problem in r['ledger_problems']:
            print('    ledger refuses: %s' % problem)


def _verdict_text(r):
    """'fits', 'NO' (the plan), or 'NO-L' (a feasible plan the node ledger refuses)."""
    if r['verdict']:
        return 'fits'
    return 'NO' if not r['plan'].feasible else 'NO-L'


def summarise(records, split):
    """The summary and the ``accuracy:`` lines of one split (or of all rows)."""
    scored = planner_ok = naive_ok = 0
    over_new = over_old = 0
    worst_new = worst_old = 0
    outcome_ok = naive_outcome_ok = 0
    misses = []
    for r in records:
        entry = r['entry']
        if r['kv_log'] is not None:
            logged = r['kv_log']
            scored += 1
            ok, err = within(r['kv_pred'], logged / GiB)
            planner_ok += ok
            naive_ok += within(r['naive_kv'], logged / GiB)[0]
            over_new += r['kv_pred'] > logged
            over_old += r['kv_old'] > logged
            worst_new = max(worst_new, r['kv_pred'] - logged)
            worst_old = max(worst_old, r['kv_old'] - logged)
            if not ok:
                misses.append('%s TP%d: KV off by %+.2f GiB (weights pred %.2f vs log %s)' % (
                    r['spec'].name, entry['tensor_parallel_size'], err / GiB,
                    r['plan'].memory[0].weights / GiB, entry['weights_gib']))
        outcome_ok += r['verdict'] == r['expected_fit']
        naive_outcome_ok += r['naive_fits'] == r['expected_fit']
    outcomes = len(records)
    print('KV within 10 %% or 0.5 GiB : planner %s, naive %s' % (
        splits.share_text(planner_ok, scored), splits.share_text(naive_ok, scored)))
    print('verdict (plan, then ledger) == what happened : planner %d/%d, naive %d/%d' % (
        outcome_ok, outcomes, naive_outcome_ok, outcomes))
    print(splits.verdict_line(split, 'KV within max(0.5 GiB, 10 %) on', planner_ok, scored, 'rows',
                              KV_TARGET_FRACTION))
    print(splits.verdict_line(split, 'verdict (plan, then ledger) == what happened on', outcome_ok, outcomes, 'runs',
                              OUTCOME_TARGET_FRACTION))
    print('KV over-predicted (pred > logged, the unsafe side): from gpu_facts\' NVML total via the '
          'CUDA-visible total %d/%d (worst %+.2f GiB); NVML total taken as CUDA\'s (old) %d/%d '
          '(worst %+.2f GiB)' % (over_new, scored, worst_new / GiB, over_old, scored, worst_old / GiB))
    for line in misses:
        print('  miss: ' + line)


def card_class(entry):
    """The cuda_total.CARD_GAPS class of the entry's GPU (what gpu_facts' name matches); for a
    card in no row, its name without the vendor words."""
    row = ct.find_card(entry['gpu'])
    if row is not None:
        return row.card
    words = [w for w in str(entry['gpu']).split() if w not in ('NVIDIA', 'GeForce')]
    return ' '.join(words) or str(entry['gpu'])


def version_label(entry):
    return entry['vllm_version'] or ASSUMED_VERSION + '*'


def _kv_over_fraction(pred, logged):
    """How far the plan's KV is above the logged KV, as a share of the logged KV's size
    (+ = above, the unsafe side; a negative logged KV, a failed start, counts the same way);
    a logged KV of exactly 0 makes any positive prediction infinitely over."""
    if logged:
        return float(pred - logged) / abs(logged)
    return float('inf') if pred > 0 else 0.0


def row_checks(r):
    """Per-run facts the card tables count: KV scored / within / over, weights scored / within."""
    entry, mem = r['entry'], r['plan'].memory[0]
    out = dict(kv_scored=r['kv_log'] is not None, kv_ok=False, kv_over=None,
               w_scored=entry['weights_gib'] is not None, w_ok=False, w_err=None,
               verdict_ok=r['verdict'] == r['expected_fit'])
    if out['kv_scored']:
        out['kv_ok'] = within(r['kv_pred'], r['kv_log'] / GiB)[0]
        out['kv_over'] = _kv_over_fraction(r['kv_pred'], r['kv_log'])
    if out['w_scored']:
        logged = entry['weights_gib'] * GiB
        out['w_err'] = float(mem.weights - logged) / logged
        out['w_ok'] = abs(out['w_err']) <= WEIGHTS_TOLERANCE_FRACTION
    return out


def _over_text(fraction):
    if fraction is None:
        return '      -'
    if fraction == float('inf'):
        return '    inf'
    return '%+6.1f%%' % (100.0 * fraction)


def _count_text(hits, count):
    return '%d/%d' % (hits, count) if count else '-'


CARD_HEADER = '%-10s %-9s | %4s %5s | %7s %8s | %8s | %7s | %7s' % (
    'card', 'vLLM', 'logs', 'fails', 'KV ok', 'KV over', 'verdicts', 'W <=5%', 'W err')


def card_rows(records):
    """{(card, version): [record, ...]} in card, then version order."""
    groups = {}
    for r in records:
        groups.setdefault((card_class(r['entry']), version_label(r['entry'])), []).append(r)
    return [(key, groups[key]) for key in sorted(groups, key=lambda k: (k[0], prof.parse_version(
        k[1].rstrip('*')).release))]


def _card_line(card, version, rows):
    checks = [row_checks(r) for r in rows]
    kv = [c for c in checks if c['kv_scored']]
    weights = [c for c in checks if c['w_scored']]
    worst_over = max([c['kv_over'] for c in kv] or [None], key=lambda v: -1e9 if v is None else v)
    worst_w = max([c['w_err'] for c in weights] or [None], key=lambda v: -1.0 if v is None else abs(v))
    return '%-10s %-9s | %4d %5d | %7s %8s | %8s | %7s | %7s' % (
        card[:10], version, len(rows), sum(1 for r in rows if not r['started']),
        _count_text(sum(c['kv_ok'] for c in kv), len(kv)), _over_text(worst_over),
        _count_text(sum(c['verdict_ok'] for c in checks), len(checks)),
        _count_text(sum(c['w_ok'] for c in weights), len(weights)), _over_text(worst_w))


def print_card_tables(records):
    """Per card class and vLLM version: logs, failures, KV within max(0.5 GiB, 10 %), the worst
    KV over-prediction (+ = the plan promises more KV than the engine had), verdicts right,
    weights within 5 % and the worst weights error; then the totals the runs started from."""
    print('Per card class and vLLM version (all rows; * = version not logged, planned as %s)' % ASSUMED_VERSION)
    print('KV ok = within max(0.5 GiB, 10 %) of the logged KV; KV over = worst (pred - log) / log, '
          '+ is the unsafe side; W err = worst (pred - log) / log of the weights')
    print(CARD_HEADER)
    print('-' * len(CARD_HEADER))
    by_card = {}
    for (card, version), rows in card_rows(records):
        print(_card_line(card, version, rows))
        by_card.setdefault(card, []).extend(rows)
    print('-' * len(CARD_HEADER))
    for card in sorted(by_card):
        print(_card_line(card, 'all', by_card[card]))
    print(_card_line('ALL', 'all', records))
    print()
    print('GPU totals each run started from: NVML = memory.total as gpu_facts reports it for the class '
          '(cuda_total.CARD_GAPS), CUDA est = cuda_total.estimate() of it (what the plan budgets), '
          'gap = NVML - CUDA est; CUDA log = total_gpu_memory the logs print (not an input)')
    header = '%-10s | %9s %9s %9s %7s | %-15s | %9s' % (
        'card', 'NVML MiB', 'NVML GiB', 'CUDA est', 'gap', 'gap source', 'CUDA log')
    print(header)
    print('-' * len(header))
    for card in sorted(by_card):
        entry = by_card[card][0]['entry']
        row = ct.find_card(entry['gpu'])
        total = nvml_total(entry)
        est = ct.estimate(entry['gpu'], total)
        logged = sorted(set(r['entry']['gpu_total_gib'] for r in by_card[card]
                            if r['entry']['gpu_total_gib'] is not None))
        source = 'default margin' if row is None else ('derived' if row.derived else 'logged') + ' row'
        print('%-10s | %9d %9.2f %9.2f %7.2f | %-15s | %9s' % (
            card[:10], total // ct.MiB, est.nvml_total / GiB, est.cuda_total / GiB, est.gap / GiB,
            source, '/'.join('%.2f' % v for v in logged) or '-'))


def acceptance_lines(records, unplanned=()):
    """One ``acceptance:`` line per target of the card-class acceptance, PASS or FAIL. Only runs
    the planner rebuilds count; the ``not planned`` lines say what the others would add."""
    checks = [row_checks(r) for r in records]
    entries = set(r['entry']['id'] for r in records)
    classes = sorted(set(card_class(r['entry']) for r in records))
    failures = sum(1 for r in records if not r['started'])
    kv = [c for c in checks if c['kv_scored']]
    kv_ok = sum(c['kv_ok'] for c in kv)
    over = [c for c in kv if c['kv_over'] > KV_MAX_OVER_FRACTION]
    worst_over = max([c['kv_over'] for c in kv] or [0.0])
    verdicts = sum(c['verdict_ok'] for c in checks)
    weights = [c for c in checks if c['w_scored']]
    w_ok = sum(c['w_ok'] for c in weights)

    def line(what, ok):
        print('acceptance: %s: %s' % (what, 'PASS' if ok else 'FAIL'))

    line('public logs %d runs from %d entries (target >= %d)' % (len(records), len(entries), MIN_LOGS),
         len(records) >= MIN_LOGS)
    line('card classes %d: %s (target >= %d)' % (len(classes), ', '.join(classes), MIN_CARD_CLASSES),
         len(classes) >= MIN_CARD_CLASSES)
    line('failed starts %d (target >= %d)' % (failures, MIN_FAILURES), failures >= MIN_FAILURES)
    share = float(kv_ok) / len(kv) if kv else 0.0
    line('KV within max(0.5 GiB, 10 %%) on %d/%d logs with a logged KV (%.0f %%; target >= %.0f %%)' % (
        kv_ok, len(kv), 100.0 * share, 100.0 * KV_TARGET_FRACTION), bool(kv) and share >= KV_TARGET_FRACTION)
    line('KV never more than %.0f %% above the logged KV: %d over, worst %s' % (
        100.0 * KV_MAX_OVER_FRACTION, len(over), _over_text(worst_over).strip()), not over)
    line('verdicts (starts / fails) right on %d/%d runs (target 100 %%)' % (verdicts, len(checks)),
         verdicts == len(checks))
    line('weights within %.0f %% on %d/%d logs with logged weights (target all)' % (
        100.0 * WEIGHTS_TOLERANCE_FRACTION, w_ok, len(weights)), bool(weights) and w_ok == len(weights))
    if unplanned:
        all_classes = sorted(set(classes) | set(card_class(e) for e, _why in unplanned))
        print('not planned: %d runs (counted in no target above): with them %d runs, %d failed starts, '
              '%d card classes: %s' % (
                  len(unplanned), len(records) + len(unplanned),
                  failures + sum(1 for e, _why in unplanned if not entry_served(e)),
                  len(all_classes), ', '.join(all_classes)))
        for entry, why in unplanned:
            print('  not planned: %s [%s, vLLM %s, TP%d]: %s' % (
                entry['id'], card_class(entry), entry['vllm_version'] or '?',
                entry['tensor_parallel_size'], why))


def print_misses(records):
    """The rows that miss a card-class target, with predicted and logged figures."""
    for r in records:
        c = row_checks(r)
        why = []
        if c['kv_scored'] and not c['kv_ok']:
            why.append('KV pred %.2f vs log %.2f GiB (%s)' % (r['kv_pred'] / GiB, r['kv_log'] / GiB, r['kv_log_how']))
        if c['kv_scored'] and c['kv_over'] > KV_MAX_OVER_FRACTION:
            why.append('KV %s above the log' % _over_text(c['kv_over']).strip())
        if not c['verdict_ok']:
            why.append('verdict %s vs %s' % (_verdict_text(r),
                                             'started' if r['expected_fit'] else 'FAILED'))
        if c['w_scored'] and not c['w_ok']:
            why.append('weights pred %.2f vs log %.2f GiB (%s)' % (
                r['plan'].memory[0].weights / GiB, r['entry']['weights_gib'], _over_text(c['w_err']).strip()))
        if why:
            print('  card miss: %s [%s, vLLM %s, TP%d]: %s' % (
                r['entry']['id'], card_class(r['entry']), version_label(r['entry']),
                r['entry']['tensor_parallel_size'], '; '.join(why)))


def main():
    with open(DATA) as handle:
        entries = json.load(handle)['entries']
    sources = splits.fitted_source_rows(splits.VLLM_MODULES)
    records, unplanned = score(entries, sources)
    print('vLLM planner vs logged startups (%s); GiB per GPU; pred = kvpin plan, log = vLLM log, '
          'naive = util x total - weights' % os.path.relpath(DATA, ROOT))
    print('totals: NVML = what gpu_facts reports (the input), CUDA est = the planner\'s CUDA-visible '
          'total, CUDA log = total_gpu_memory in the log; KV old = the plan fed the NVML total as CUDA\'s')
    splits.print_split_preamble(entries, sources, 'row')
    print('the constants a fit row gave are named under it')
    for split in splits.SPLITS + (splits.TOTAL,):
        chosen = [r for r in records if split in (splits.TOTAL, r['split'])]
        print()
        print('== %s: %d runs' % (splits.TITLES[split], len(chosen)))
        if split != splits.TOTAL:
            print_table(chosen)
        summarise(chosen, split)
    print()
    print_card_tables(records)
    print()
    acceptance_lines(records, unplanned)
    print_misses(records)
    print()
    print('* version not logged: planned as vLLM %s (see module docstring)' % ASSUMED_VERSION)
    print('G = CUDA graph pool (outside the budget in this era, so it does not move KV); logged '
          'values are the memory change during capture and go negative when capture frees memory')
    mistral_per_logit = (2.12 * GiB - (8192 + 2 * 1024) * 5120 * 2) / (1024 * 131072)
    print('  outlier: Mistral-Small-3.2 (multimodal, 0.11.0) logs 2.12 GiB activation; the sort path gives '
          '~4.9 GiB. 2.12 GiB = 1024 x 131072 x %.1f B + hidden states, i.e. bf16 + fp32 logits and the '
          'FlashInfer masked logits + probs (14 B) without the full-vocab sort: 0.9.1 - 0.11 take FlashInfer '
          'when it is installed and VLLM_USE_FLASHINFER_SAMPLER is not 0, which a plan cannot see. Unless '
          'the knob vllm_sampler says flashinfer (rows whose log names the sampler pass it), the planner '
          'charges the sort path, the safe side: it predicts less KV than logged.'
          % mistral_per_logit)
    print()
    outside_table()
    print()
    reported_small_card_table()


# Issue 37's runs (vLLM 0.27 / 0.28, Qwen2.5-7B-Instruct bf16 on NVIDIA A10G / L4, --max-model-len
# 4096 --gpu-memory-utilization 0.90 --max-num-seqs 128): the engine's logged KV pool per GPU. They
# come from the issue, not from a public page, so they are not rows of vllm_public.json; and the
# Model Runner V2 constants were fitted on them (vllm_memory: V2_* "issue 37's A10G / L4 startups"),
# so they are in-sample by construction. No public 0.25 - 0.34 startup log on a 24 / 48 GB card with
# every figure a row needs was found (docs/data-sources.md).
REPORTED_A10G_TOTAL = 24146608128          # NVML memory_total of an A10G
REPORTED_A10G_POOL_GIB = {1: 3.34, 2: 11.51, 4: 15.62}


def reported_small_card_table():
    spec = resolve_model('Qwen/Qwen2.5-7B-Instruct')
    print('Issue 37\'s A10G runs (not public; in-sample: the V2 constants were fitted on them), Qwen2.5-7B '
          'bf16, util 0.90, len 4096, max_num_seqs 128, KV pool not pinned; GiB per GPU')
    header = '%-7s %2s | %7s %7s %8s | %s' % ('vLLM', 'TP', 'KV pred', 'KV log', 'err', 'within max(0.5 GiB, 10 %), never above')
    print(header)
    print('-' * len(header))
    for version in ('0.27.1', '0.28.0'):
        for tp, logged_gib in sorted(REPORTED_A10G_POOL_GIB.items()):
            gpus = [dict(index=i, name='NVIDIA A10G', memory_total=REPORTED_A10G_TOTAL) for i in range(tp)]
            plan = plan_vllm(spec, gpus, Traffic(3072, 1024, 1), dict(
                tensor_parallel_size=tp, gpu_memory_utilization=0.9, max_model_len=4096, max_num_seqs=128,
                kv_cache_dtype='auto', pin_kv_cache_memory=False), version)
            kv = min(m.terms['kv_budget'] for m in plan.memory) / GiB
            ok = kv <= logged_gib and logged_gib - kv <= max(0.5, logged_gib / 10)
            print('%-7s %2d | %7.2f %7.2f %+7.1f%% | %s' % (
                version, tp, kv, logged_gib, 100.0 * (kv - logged_gib) / logged_gib, 'yes' if ok else 'NO'))


def outside_table():
    """What must fit outside total x util, per card kind, TP and version era."""
    spec = resolve_model('meta-llama/Llama-3.3-70B-Instruct')
    cards = (('NVIDIA GeForce RTX 4090', 25757220864), ('NVIDIA RTX A6000', 51527024640),
             ('NVIDIA H100 80GB HBM3', 85520809984))
    print('Outside-the-budget terms per GPU (Llama-3.3-70B graph pool, max_num_seqs 256; GiB) '
          'and the utilization they leave')
    header = '%-24s %2s %-8s | %7s %7s %7s %7s %7s | %7s %5s' % (
        'GPU', 'TP', 'vLLM', 'context', 'NCCL', 'graphs', 'buffer', 'margin', 'outside', 'util')
    print(header)
    print('-' * len(header))
    traffic = Traffic(1000, 1000, 1)
    for name, total in cards:
        for tp in (1, 2, 4):
            for version in ('0.7.3', '0.10.1.1', '0.11.0', '0.20.0', '0.34.0'):
                gpus = [dict(index=i, name=name, memory_total=total) for i in range(tp)]
                plan = plan_vllm(spec, gpus, traffic, {'tensor_parallel_size': tp, 'max_num_seqs': 256,
                                                       'max_model_len': 4096}, version)
                t = plan.memory[0].terms
                graphs_out = plan.memory[0].cuda_graph if 'OUTSIDE' in plan.memory[0].explain['cuda_graph'] else 0
                nccl_out = t['nccl_buffers'] if prof.accounting(prof.parse_version(version)).nccl_in_baseline else 0
                print('%-24s %2d %-8s | %s %s %s %s %s | %s %5.2f' % (
                    name.replace('NVIDIA ', '')[:24], tp, version, _g(t['cuda_context']), _g(nccl_out),
                    _g(graphs_out), _g(t['profiler_underestimate_buffer']), _g(t['safety_margin']),
                    _g(t['outside_required']), plan.settings['gpu_memory_utilization']))
    print('util = floor to 0.01 of (total - outside) / total; 0.10.x (and V0, 0.7.3) charges NCCL inside the '
          'budget, 0.11+ holds it outside; 0.20+ charges the graph pool inside; 0.34 measures it inside '
          '(extensible KV cache) and holds cuBLAS handles outside.')


if __name__ == '__main__':
    main()
    sys.exit(0)
