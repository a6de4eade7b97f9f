# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fit / held-out split of the accuracy benchmarks' validation rows (benchmarks/data/).

A fitted constant names the rows it was read from in a ``*_SOURCE_ROWS`` tuple next to it
(gathered per module in ``FITTED_SOURCE_ROWS``); the benchmarks score those rows as "fit"
and the rest as "held_out" (benchmarks/_splits.py). These tests keep the data files, the
constants and the benchmarks' split rule in agreement, so that no held-out figure is one a
constant was fitted on. Pure: reads two JSON files and imports modules."""

from __future__ import annotations

import copy
import importlib.util
import json
import os

import pytest

from ansible_collections.kvpin.fleet.plugins.module_utils.plan.fitted import Fitted, source_rows_of
from benchmark_loader import load_benchmark  # pylint: disable=import-error

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, 'benchmarks', 'data')


def _load_splits():
    """benchmarks/_splits.py, the split rule both accuracy benchmarks use."""
    spec = importlib.util.spec_from_file_location('kvpin_bench_splits',
                                                  os.path.join(ROOT, 'benchmarks', '_splits.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


splits = _load_splits()


BENCHMARKS = {
    'vllm': ('vllm_public.json', splits.VLLM_MODULES),
    'llamacpp': ('llamacpp_public.json', splits.LLAMACPP_MODULES),
}


def _entries(name):
    with open(os.path.join(DATA, BENCHMARKS[name][0])) as handle:
        return json.load(handle)['entries']


def _sources(name):
    return splits.fitted_source_rows(BENCHMARKS[name][1])


@pytest.mark.parametrize('name', sorted(BENCHMARKS))
def test_every_row_has_an_id_and_a_valid_split(name):
    entries = _entries(name)
    ids = [e.get('id') for e in entries]
    assert all(isinstance(i, str) and i for i in ids), ids
    assert len(set(ids)) == len(ids), ids
    assert all(e.get('split') in ('fit', 'held_out') for e in entries), [(e['id'], e.get('split')) for e in entries]
    assert all(isinstance(e.get('fit_for'), list) for e in entries)


def test_row_ids_are_unique_across_the_data_files():
    ids = [e['id'] for name in BENCHMARKS for e in _entries(name)]
    assert len(set(ids)) == len(ids)


@pytest.mark.parametrize('name', sorted(BENCHMARKS))
def test_split_data_agrees_with_the_constants(name):
    """Every declared source row exists and is fit; every row's fit_for is exactly the
    constants naming it; held-out rows gave nothing; fit rows say why."""
    assert splits.consistency_problems(_entries(name), _sources(name)) == []


@pytest.mark.parametrize('name', sorted(BENCHMARKS))
def test_every_fitted_constant_names_existing_fit_rows(name):
    by_id = dict((e['id'], e) for e in _entries(name))
    sources = _sources(name)
    assert sources, 'no fitted constant declares its source rows'
    for constant, rows in sources.items():
        assert rows, constant
        for row_id in rows:
            assert row_id in by_id, (constant, row_id)
            assert by_id[row_id]['split'] == 'fit', (constant, row_id)
            assert constant in by_id[row_id]['fit_for'], (constant, row_id)


def _fitted_objects(name):
    """The Fitted objects (plugins/module_utils/plan/fitted.py) of the modules a data file feeds."""
    found = []
    for module in BENCHMARKS[name][1]:
        for value in vars(module).values():
            found.extend(v for v in (value if isinstance(value, tuple) else (value,)) if isinstance(v, Fitted))
    return found


@pytest.mark.parametrize('name', sorted(BENCHMARKS))
def test_each_fitted_objects_source_rows_exist_and_are_fit(name):
    """The rows a Fitted object names are in the data, split fit, with the constant in their
    fit_for, and the benchmark's split uses exactly those rows; a Fitted read from no data row
    (an issue thread) is in no row's fit_for."""
    by_id = dict((e['id'], e) for e in _entries(name))
    objects = _fitted_objects(name)
    assert objects
    for obj in objects:
        for row_id in obj.source_rows:
            assert row_id in by_id, (obj.name, row_id)
            assert by_id[row_id]['split'] == 'fit', (obj.name, row_id)
            assert obj.name in by_id[row_id]['fit_for'], (obj.name, row_id)
        if not obj.source_rows:
            assert not [e['id'] for e in by_id.values() if obj.name in e['fit_for']], obj.name
    sources = _sources(name)
    for constant, rows in source_rows_of(*objects).items():
        assert sources[constant] == rows, constant


def test_no_held_out_row_is_a_source_of_a_fitted_constant():
    held_out = set(e['id'] for name in BENCHMARKS for e in _entries(name) if e['split'] == 'held_out')
    for name in BENCHMARKS:
        for constant, rows in _sources(name).items():
            assert not held_out.intersection(rows), (constant, sorted(held_out.intersection(rows)))


def test_the_check_flags_a_held_out_row_named_as_a_source():
    """The check above is not vacuous: name a held-out row as a constant's source and both the
    consistency check and the benchmarks' split rule refuse to call it held-out."""
    entries = _entries('vllm')
    sources = dict(_sources('vllm'))
    held = next(e for e in entries if e['split'] == 'held_out')
    sources['vllm_memory.CUDA_CONTEXT_BYTES'] = sources['vllm_memory.CUDA_CONTEXT_BYTES'] + (held['id'],)
    problems = splits.consistency_problems(entries, sources)
    assert any(p.startswith(held['id'] + ': held-out, but a source of vllm_memory.CUDA_CONTEXT_BYTES')
               for p in problems), problems
    assert splits.row_split(held, sources)[0] == 'fit'


def test_the_check_flags_missing_rows_bad_splits_and_stale_fit_for():
    entries = copy.deepcopy(_entries('llamacpp'))
    sources = dict(_sources('llamacpp'))
    sources['llamacpp_memory.HIDDEN_LIVE_AT_FFN'] = ('no-such-row',)
    entries[0]['split'] = 'train'
    held = next(e for e in entries if e['split'] == 'held_out')
    held['answer_derived_inputs'] = 'ctx_size from its own KV line'
    problems = '\n'.join(splits.consistency_problems(entries, sources))
    assert "source row 'no-such-row' is not in the data" in problems
    assert "split 'train' is not one of fit, held_out" in problems
    assert 'fit_for' in problems                      # the rows HIDDEN_LIVE_AT_FFN no longer names
    assert held['id'] + ': held-out, but an input came from its own answer' in problems
    assert splits.row_split(held, sources)[0] == 'fit'


def test_vllm_held_out_rows_log_their_util():
    """Without a logged util the benchmark rebuilds it from the row's own KV: its answer would
    feed its input, so such a row is never held-out."""
    for entry in _entries('vllm'):
        if entry['gpu_memory_utilization'] is None:
            assert entry['split'] == 'fit' and entry.get('answer_derived_inputs'), entry['id']


def test_each_benchmark_has_scored_held_out_rows():
    vllm_held = [e for e in _entries('vllm') if e['split'] == 'held_out']
    assert [e for e in vllm_held if e['kv_cache_gib'] is not None], 'no held-out vLLM KV row'
    bench = load_benchmark('bench_accuracy_llamacpp')
    rebuilt = [e for e in _entries('llamacpp') if e['split'] == 'held_out'
               and not isinstance(bench.scenario(e), str)
               and (e.get('per_device_mib') or e.get('oom') in (True, False))]
    assert rebuilt, 'no held-out llama.cpp row the benchmark rebuilds and scores'


def test_verdict_lines_name_the_split_and_fail_without_rows():
    assert splits.verdict_line('held_out', 'KV on', 1, 1, 'rows', 0.8) == (
        'accuracy: held_out: KV on 1/1 rows (100 %; target >= 80 %): PASS')
    assert splits.verdict_line('fit', 'KV on', 3, 4, 'rows', 0.8).endswith(': FAIL')
    assert splits.verdict_line('held_out', 'KV on', 0, 0, 'rows', 0.8).endswith('(0 %; target >= 80 %): FAIL')
