# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""benchmarks/bench_accuracy_vllm.py counts, and does not score, the runs the planner on this
branch cannot rebuild (a V0 log without a version, a version outside
vllm_profile.SUPPORTED_TEXT, a card with no NVML total, a model not in the catalog), and plans
a card in no cuda_total.CARD_GAPS row from the NVML total its entry records. Pure: loads the
benchmark module and the data file, runs no plan outside the benchmark's own functions."""

from __future__ import annotations

import json
import os

import pytest
from benchmark_loader import load_benchmark  # pylint: disable=import-error

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH_DIR = os.path.join(ROOT, 'benchmarks')
DATA = os.path.join(BENCH_DIR, 'data')

bench = load_benchmark('bench_accuracy_vllm')


def _entries():
    with open(os.path.join(DATA, 'vllm_public.json')) as handle:
        return json.load(handle)['entries']


def _planned_row():
    return dict(next(e for e in _entries() if e['id'] == 'llmservingsim-rtx4090-llama-3.1-8b-tp1-32k'))


def test_a_supported_row_is_planned():
    assert bench.unplanned_reason(_planned_row()) is None


@pytest.mark.parametrize('version', ['0.7.2', '0.6.4.post1', '0.8.4', '0.34.0'])
def test_a_supported_v0_or_0_34_row_is_planned(version):
    assert bench.unplanned_reason(dict(_planned_row(), vllm_version=version)) is None


@pytest.mark.parametrize('version', ['0.6.0', '0.5.4', '0.4.0.post1'])
def test_a_version_outside_the_supported_range_is_counted_not_planned(version):
    why = bench.unplanned_reason(dict(_planned_row(), vllm_version=version))
    assert why.startswith('version unsupported on this branch'), why
    assert version in why


def test_a_v0_log_without_a_version_is_not_planned_as_the_assumed_version():
    assert bench.unplanned_reason(dict(_planned_row(), vllm_version=None, engine='V0')) == (
        'V0 engine, version not logged')


def test_a_card_in_no_row_needs_the_nvml_total_of_its_entry():
    row = dict(_planned_row(), gpu='NVIDIA Example GPU 99')
    assert 'no NVML total' in bench.unplanned_reason(row)
    row['gpu_nvml_total_mib'] = 49152
    assert bench.unplanned_reason(row) is None
    assert bench.nvml_total(row) == 49152 * 1024 * 1024
    assert bench.card_class(row) == 'Example GPU 99'


@pytest.mark.parametrize('bad', ['49152', 49152.0, True, -1, 0, 10 ** 9])
def test_a_bad_nvml_total_names_the_field(bad):
    row = dict(_planned_row(), gpu='NVIDIA Example GPU 99', gpu_nvml_total_mib=bad)
    why = bench.unplanned_reason(row)
    assert why.startswith('bad NVML total') and 'gpu_nvml_total_mib' in why, why


def test_a_model_outside_the_catalog_is_not_planned():
    why = bench.unplanned_reason(dict(_planned_row(), model='example-org/not-a-model-xyz'))
    assert why.startswith('model not plannable'), why


def test_score_splits_the_data_into_planned_and_counted_runs():
    sources = bench.splits.fitted_source_rows(bench.splits.VLLM_MODULES)
    records, unplanned = bench.score(_entries(), sources)
    planned_ids = set(r['entry']['id'] for r in records)
    unplanned_ids = set(e['id'] for e, _why in unplanned)
    assert not planned_ids & unplanned_ids
    assert planned_ids | unplanned_ids == set(e['id'] for e in _entries())
    assert all(why for _entry, why in unplanned)


def test_a_v0_row_without_max_num_seqs_is_planned_with_the_v0_default():
    """A V0 release (before vllm_profile.V1_ENGINE_SINCE) has no V1 per-device batch defaults:
    the run used EngineArgs.max_num_seqs = 256, and the row is planned, not a crash."""
    row = dict(_planned_row(), vllm_version='0.7.1', max_num_seqs=None, max_num_batched_tokens=None)
    version = bench.prof.parse_version('0.7.1')
    total = bench.nvml_total(row)
    assert bench.default_max_num_seqs(version, row['gpu'], total) == bench.V0_DEFAULT_MAX_NUM_SEQS == 256
    spec, plan = bench.plan_entry(row)[:2]
    assert plan.settings['max_num_seqs'] == 256, plan.settings
    # a V1 release keeps the per-device default
    v1 = bench.prof.parse_version('0.19.0')
    assert bench.default_max_num_seqs(v1, row['gpu'], total) == bench.prof.batch_defaults(
        v1, row['gpu'], total).max_num_seqs


def test_rows_whose_log_names_the_sampler_pass_it_to_the_planner_with_the_quote():
    """A row's vllm_sampler comes from its own log line (vllm_sampler_quote) and reaches the
    plan as the knob: the FlashInfer rows charge FlashInfer's warm-up, the fallback row the sort."""
    rows = [e for e in _entries() if e.get('vllm_sampler')]
    assert set(e['vllm_sampler'] for e in rows) == {'flashinfer', 'pytorch'}
    for row in rows:
        expected = ('Using FlashInfer for top-p & top-k sampling.' if row['vllm_sampler'] == 'flashinfer'
                    else 'Falling back to the PyTorch-native implementation of top-p & top-k sampling')
        assert expected in row['vllm_sampler_quote'] and 'topk_topp_sampler.py' in row['vllm_sampler_quote']
    row = next(e for e in rows if e['id'] == 'dennislee-a100-80gb-qwen2-7b-tp1-u025')
    with_knob = bench.plan_entry(row)[1]
    without = bench.plan_entry(dict(row, vllm_sampler=None))[1]
    assert with_knob.settings['environment']['VLLM_USE_FLASHINFER_SAMPLER'] == '1'
    assert with_knob.memory[0].activation < without.memory[0].activation
    assert with_knob.memory[0].terms['kv_budget'] > without.memory[0].terms['kv_budget']


def _record(row_id, started, **fields):
    entry = dict(_planned_row(), id=row_id, **fields)
    return dict(entry=entry, started=started)


def test_a_run_that_served_while_its_twin_failed_expects_no():
    """Same plan input, one served and one failed: NO is the right verdict for both; a run that
    differs in one planner input (util) is not a twin and keeps its own outcome."""
    records = [_record('a', True), _record('a-fail', False), _record('b', True, gpu_memory_utilization=0.5),
               _record('c', True, vllm_version='0.11.0'), _record('c2', True, vllm_version='0.11.0')]
    bench.mark_flaky_twins(records)
    by_id = {r['entry']['id']: r for r in records}
    assert by_id['a']['flaky_twin'] == 'a-fail' and by_id['a']['expected_fit'] is False
    assert by_id['a-fail']['expected_fit'] is False and by_id['a-fail']['flaky_twin'] is None
    assert by_id['b']['expected_fit'] is True and by_id['b']['flaky_twin'] is None
    assert by_id['c']['expected_fit'] is True and by_id['c2']['expected_fit'] is True


def test_the_logged_twin_pair_is_scored_no():
    sources = bench.splits.fitted_source_rows(bench.splits.VLLM_MODULES)
    records, _unplanned = bench.score(_entries(), sources)
    by_id = {r['entry']['id']: r for r in records}
    twin = by_id['buccaneer-rtx3090-qwen2.5-7b-tp1-u065']
    assert twin['started'] and twin['flaky_twin'] == 'buccaneer-rtx3090-qwen2.5-7b-tp1-u065-fail'
    assert bench.row_checks(twin)['verdict_ok'] == (not twin['plan'].feasible)


LOAD_CONTROL_FAIL = 'buccaneer-rtx3090-llama-3.1-8b-tp1-u090-fixd-fail'


def test_a_run_next_to_other_processes_is_refused_by_the_node_ledger_not_by_the_plan():
    """The Fix-D run: vLLM 0.17.1 at util 0.90 on an RTX 3090 that other processes held 1.68 GiB
    of passed its startup check, allocated KV and died of CUDA OOM warming up. The plan alone (a
    GPU of its own) fits, as its idle twin started; the fleet's verdict also charges the
    processes gpu_facts lists in the node ledger, which refuses it naming them and the bytes."""
    row = next(e for e in _entries() if e['id'] == LOAD_CONTROL_FAIL)
    spec, plan, _u, _s, _v, _n, _f, gpus = bench.plan_entry(row)
    assert plan.feasible
    assert [p['pid'] for p in gpus[0]['processes']] == [4257, 11017, 0]
    fits, problems = bench.fleet_verdict(row['id'], plan, gpus)
    assert not fits
    assert len(problems) == 1 and 'memory overcommitted' in problems[0], problems
    assert 'pid 4257 87598039 B' in problems[0] and 'processes outside GPUStack' in problems[0]
    # on a GPU of its own (no process listed) the same plan passes the ledger too
    idle = dict(row, other_processes=None)
    planned_idle = bench.plan_entry(idle)
    plan_idle, gpus_idle = planned_idle[1], planned_idle[7]
    assert gpus_idle[0]['processes'] == []
    assert bench.fleet_verdict(row['id'], plan_idle, gpus_idle) == (True, [])


def test_the_scored_record_uses_the_fleet_verdict():
    sources = bench.splits.fitted_source_rows(bench.splits.VLLM_MODULES)
    records, _unplanned = bench.score(_entries(), sources)
    by_id = {r['entry']['id']: r for r in records}
    fail = by_id[LOAD_CONTROL_FAIL]
    assert fail['plan'].feasible and fail['verdict'] is False and fail['ledger_problems']
    assert bench.row_checks(fail)['verdict_ok'] and bench._verdict_text(fail) == 'NO-L'
    # every other run's verdict is its plan's: none lists other processes
    for r in records:
        if r['entry'].get('other_processes') is None:
            assert r['verdict'] == r['plan'].feasible and not r['ledger_problems'], r['entry']['id']


def test_other_processes_are_a_plan_input_so_the_idle_run_is_no_twin_of_the_loaded_one():
    procs = [{'pid': 7, 'used_mib': 1500}]
    records = [_record('idle', True), _record('loaded-fail', False, other_processes=procs),
               _record('loaded', True, other_processes=procs)]
    bench.mark_flaky_twins(records)
    by_id = {r['entry']['id']: r for r in records}
    assert by_id['idle']['expected_fit'] is True and by_id['idle']['flaky_twin'] is None
    assert by_id['loaded']['flaky_twin'] == 'loaded-fail'


@pytest.mark.parametrize('bad, field', [
    ('1.68 GiB', 'other_processes'),
    ([{'pid': 1, 'used_mib': 1}] * 65, 'other_processes'),
    (['4257'], 'other_processes[0]'),
    ([{'pid': -3, 'used_mib': 10}], 'other_processes[0].pid'),
    ([{'pid': True, 'used_mib': 10}], 'other_processes[0].pid'),
    ([{'pid': '4257', 'used_mib': 10}], 'other_processes[0].pid'),
    ([{'pid': 4257, 'used_mib': '83.54'}], 'other_processes[0].used_mib'),
    ([{'pid': 4257, 'used_mib': 0}], 'other_processes[0].used_mib'),
    ([{'pid': 4257, 'used_mib': float('nan')}], 'other_processes[0].used_mib'),
    ([{'pid': 4257, 'used_mib': 10 ** 9}], 'other_processes[0].used_mib'),
    ([{'pid': 4257}], 'other_processes[0].used_mib'),
])
def test_bad_other_processes_are_counted_not_planned_naming_the_field(bad, field):
    row = dict(_planned_row(), other_processes=bad)
    why = bench.unplanned_reason(row)
    assert why is not None and why.startswith('bad other_processes'), why
    assert '%s.%s' % (row['id'], field) in why, why
