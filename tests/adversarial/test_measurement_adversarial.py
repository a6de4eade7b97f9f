# -*- coding: utf-8 -*-
"""Hostile ``measurement`` / ``traffic_source`` inputs to serving_plan: every one a failed task
naming the field and the value, never a traceback, never a plan from bad numbers."""
import copy
import math

import pytest

from ansible_collections.kvpin.fleet.plugins.module_utils.plan.serving_plan import serving_plan_result

GPU = dict(index=0, name='NVIDIA RTX A6000', memory_total=51527024640)
BASE = dict(backend='vllm', backend_version='0.10.1.1', model='Qwen/Qwen2.5-7B-Instruct', gpus=[GPU],
            prompt_tokens_p99=4096, max_output_tokens=1024, max_concurrency=16, traffic_source='measured')
GOOD = dict(traffic=dict(requests=1000, prompt_tokens_p99_upper=1707, prompt_tokens_p99_lower=1552,
                         prompt_tokens_p99_censored=False, generation_tokens_p99_upper=512,
                         generation_tokens_p99_censored=False, max_concurrency=9),
            kv_pool=dict(kv_cache_tokens=100000), gpu=GPU['name'], backend_version='0.10.1.1', args=['--x=1'])


def _with(path, value):
    out = copy.deepcopy(GOOD)
    node = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return out


CASES = [
    ('measurement', 'not a dict', 'measurement'),
    ('measurement', dict(GOOD, extra=1), 'unknown key'),
    (('traffic', 'requests'), -1, 'measurement.traffic.requests'),
    (('traffic', 'requests'), True, 'measurement.traffic.requests'),
    (('traffic', 'requests'), 10.5, 'whole number'),
    (('traffic', 'requests'), float('nan'), 'measurement.traffic.requests'),
    (('traffic', 'requests'), 10 ** 30, 'measurement.traffic.requests'),
    (('traffic', 'prompt_tokens_p99_upper'), float('inf'), 'measurement.traffic.prompt_tokens_p99_upper'),
    (('traffic', 'prompt_tokens_p99_upper'), '1707', 'measurement.traffic.prompt_tokens_p99_upper'),
    (('traffic', 'prompt_tokens_p99_upper'), 1000, 'above the upper bound'),
    (('traffic', 'prompt_tokens_p99_censored'), 'no', 'measurement.traffic.prompt_tokens_p99_censored'),
    (('traffic', 'max_concurrency'), -3, 'measurement.traffic.max_concurrency'),
    (('traffic', 'max_concurrency'), 1e9, 'measurement.traffic.max_concurrency'),
    (('traffic', 'hours'), [1, 2], 'measurement.traffic.hours'),
    (('traffic', 'hours'), {'24': {}}, 'measurement.traffic.hours'),
    (('traffic', 'hours'), {'1': {}}, 'measurement.traffic.hours'),
    (('traffic', 'hours'), {'03': {'requests': 'many'}}, 'measurement.traffic.hours.03.requests'),
    (('traffic', 'hours'), {'%02d' % h: {} for h in range(24)} | {'x': {}}, 'measurement.traffic.hours'),
    (('traffic',), ['requests'], 'measurement.traffic'),
    (('kv_pool',), 5, 'measurement.kv_pool'),
    (('kv_pool', 'kv_cache_tokens'), 0, 'measurement.kv_pool.kv_cache_tokens'),
    (('kv_pool', 'kv_cache_tokens'), None, 'measurement.kv_pool.kv_cache_tokens'),
    (('kv_pool', 'kv_cache_tokens'), 1 << 50, 'measurement.kv_pool.kv_cache_tokens'),
    (('kv_pool', 'kv_cache_bytes'), -1, 'measurement.kv_pool.kv_cache_bytes'),
    (('gpu',), 7, 'measurement.gpu'),
    (('gpu',), 'x' * 5000, 'measurement.gpu'),
    (('args',), '--max-num-seqs=4', 'measurement.args'),
    (('args',), ['--a'] * 1000, 'measurement.args'),
    (('args',), [1, 2], 'measurement.args'),
]


@pytest.mark.parametrize('path,value,needle', CASES)
def test_bad_measurement_is_a_named_error(path, value, needle):
    measurement = value if path == 'measurement' else _with(path, value)
    result = serving_plan_result(dict(BASE, measurement=measurement))
    assert result.get('failed') is True and 'plan' not in result, result
    assert result['field'].startswith('measurement'), result
    assert needle in result['msg'], result['msg']


@pytest.mark.parametrize('source', ['MEASURED', '', 'auto', 3])
def test_bad_traffic_source_is_named(source):
    result = serving_plan_result(dict(BASE, traffic_source=source, measurement=GOOD))
    assert result['failed'] and result['field'] == 'traffic_source' and repr(source) in result['msg']


def test_huge_measured_bounds_are_capped_never_crash():
    measurement = _with(('traffic', 'prompt_tokens_p99_upper'), 10 * 1024 * 1024)
    measurement['traffic']['prompt_tokens_p99_lower'] = 5000000
    result = serving_plan_result(dict(BASE, measurement=measurement, fail_on_infeasible=False))
    assert 'plan' in result, result
    assert not math.isnan(result['plan']['kv_cache_tokens'])


def test_the_good_measurement_plans():
    result = serving_plan_result(dict(BASE, measurement=GOOD))
    assert not result.get('failed'), result
