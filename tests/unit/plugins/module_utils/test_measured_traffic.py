# -*- coding: utf-8 -*-
"""Planning from measured traffic and from the engine's real KV pool (issue 36, planner half)."""
import json

import pytest

from ansible_collections.kvpin.fleet.plugins.module_utils.plan import measured_traffic as mt
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.serving_plan import (
    build_plan, plan_report, serving_plan_result)

A6000 = dict(index=0, name='NVIDIA RTX A6000', memory_total=51527024640)
BASE = dict(backend='vllm', backend_version='0.10.1.1', model='Qwen/Qwen2.5-7B-Instruct', gpus=[A6000],
            prompt_tokens_p99=4096, max_output_tokens=1024, max_concurrency=16)


def summary(requests=1000, prompt=(1552, 1707), gen=(465, 512), conc=9.0, censored=False, hours=None, truncated=0):
    out = dict(requests=requests, prompt_tokens_p99_lower=prompt[0], prompt_tokens_p99_upper=prompt[1],
               prompt_tokens_p99_censored=censored, generation_tokens_p99_lower=gen[0],
               generation_tokens_p99_upper=gen[1], generation_tokens_p99_censored=False,
               max_concurrency=conc, length_truncated=truncated, rejected=0, preemptions=0,
               restarts_seen=1, scrapes=40)
    if hours is not None:
        out['hours'] = hours
    return out


def measurement(**kw):
    return dict(traffic=summary(**kw))


def test_declared_default_keeps_the_declaration_and_prints_the_comparison():
    plan = build_plan(dict(BASE, measurement=measurement()))
    declared = build_plan(BASE)
    assert plan.args == declared.args
    rows = {r['figure']: r for r in plan.measured['traffic']['figures']}
    assert rows['prompt']['measured'] == 1707 and rows['prompt']['used'] == 4096
    assert rows['prompt']['drift'] == 'below'
    text = '\n'.join(plan_report(plan))
    assert 'prompt p99 bound' in text and 'declared 4096' in text and 'measured 1707' in text


def test_measured_source_plans_from_the_trusted_bounds():
    plan = build_plan(dict(BASE, traffic_source='measured', measurement=measurement()))
    assert 'prompt_tokens_p99 1707 + max_output_tokens 512' in plan.reasons['max_model_len']
    assert plan.reasons['traffic.prompt_tokens_p99'].startswith('1707: measured')
    assert plan.settings['max_num_seqs'] == 9           # the measured peak, not the declared 16
    assert plan.args != build_plan(BASE).args


def test_larger_source_only_grows():
    plan = build_plan(dict(BASE, traffic_source='larger', measurement=measurement(conc=40)))
    rows = {r['figure']: r['used'] for r in plan.measured['traffic']['figures']}
    assert rows == {'prompt': 4096, 'output': 1024, 'concurrency': 40}


@pytest.mark.parametrize('requests,trusted', [(298, False), (299, True)])
def test_the_299_request_rule(requests, trusted):
    plan = build_plan(dict(BASE, traffic_source='measured', measurement=measurement(requests=requests)))
    row = plan.measured['traffic']['figures'][0]
    assert (row['used'] == 1707) is trusted
    if not trusted:
        assert 'fewer than the 299' in row['reason'] and row['used'] == 4096


def test_censored_top_bucket_keeps_the_declaration():
    plan = build_plan(dict(BASE, traffic_source='measured',
                           measurement=measurement(prompt=(5000, None), censored=True)))
    row = plan.measured['traffic']['figures'][0]
    assert row['used'] == 4096 and 'censored' in row['reason'] and row['drift'] == 'above'


def test_a_censored_busy_hour_blocks_the_window_bound_and_hours_raise_it():
    hours = {'10': summary(requests=400, prompt=(2746, 3020)), '02': summary(requests=500, prompt=(101, 111))}
    plan = build_plan(dict(BASE, traffic_source='measured', measurement=measurement(hours=hours)))
    assert plan.measured['traffic']['figures'][0]['used'] == 3020      # the day hour, not the window
    hours['10']['prompt_tokens_p99_censored'] = True
    plan = build_plan(dict(BASE, traffic_source='measured', measurement=measurement(hours=hours)))
    assert plan.measured['traffic']['figures'][0]['used'] == 4096


def test_truncated_output_is_not_trusted():
    plan = build_plan(dict(BASE, traffic_source='measured', measurement=measurement(truncated=50)))
    row = plan.measured['traffic']['figures'][1]
    assert row['used'] == 1024 and 'cut at their length limit' in row['reason']


def test_day_night_hours_print_a_traffic_classes_proposal_never_applied():
    hours = {'%02d' % h: summary(requests=400, prompt=(2746, 3020), conc=12) for h in range(8, 20)}
    hours.update({'%02d' % h: summary(requests=400, prompt=(365, 412), conc=3) for h in list(range(20, 24)) + list(range(0, 8))})
    plan = build_plan(dict(BASE, measurement=measurement(hours=hours)))
    proposal = plan.measured['traffic']['traffic_classes_proposal']
    assert [(c['name'], c['hours'], c['prompt_tokens_p99']) for c in proposal] == [
        ('busy', '08:00-20:00', 3020), ('quiet', '20:00-08:00', 412)]
    assert 'proposal (not applied) traffic_classes' in '\n'.join(plan_report(plan))
    assert plan.args == build_plan(BASE).args


def _kv_measurement(plan, tokens, **over):
    out = dict(kv_pool=dict(kv_cache_tokens=tokens), gpu=A6000['name'], backend_version=plan.backend_version,
               args=list(plan.args))
    out.update(over)
    return out


def test_less_kv_than_planned_resizes_max_num_seqs_on_the_real_pool():
    params = dict(BASE, max_concurrency=64, prompt_tokens_p99=8192)
    plan = build_plan(params)
    planned_ms = plan.settings['max_num_seqs']
    actual = plan.kv_cache_tokens // 2
    again = build_plan(dict(params, measurement=_kv_measurement(plan, actual)))
    kv = again.measured['kv_pool']
    assert kv['same_config'] and kv['short'] and kv['flagged']
    expected = (actual // 16) // -(-(8192 + 1024) // 16)
    assert again.settings['max_num_seqs'] == expected < planned_ms
    assert '--max-num-seqs=%d' % expected in again.args
    assert 'sized on the KV pool the engine really got' in again.reasons['max_num_seqs']
    assert 'KV pool: planned %d tokens, actual %d tokens' % (plan.kv_cache_tokens, actual) in '\n'.join(
        plan_report(again))


def test_kv_read_back_of_another_card_or_args_is_reported_not_acted_on():
    plan = build_plan(BASE)
    for over in (dict(gpu='NVIDIA GeForce RTX 4090'), dict(backend_version='0.11.0'),
                 dict(args=plan.args[:-1])):
        again = build_plan(dict(BASE, measurement=_kv_measurement(plan, plan.kv_cache_tokens // 2, **over)))
        assert not again.measured['kv_pool']['same_config']
        assert again.args == plan.args


def test_histogram_pin_on_032_within_ten_percent_and_absent_before():
    plan = build_plan(dict(BASE, backend_version='0.32.0'))
    flag = [a for a in plan.args if a.startswith('--custom-histogram-buckets=')]
    assert len(flag) == 1
    bounds = json.loads(flag[0].split('=', 1)[1])['request_tokens']
    assert bounds[-1] == plan.settings['max_model_len']
    assert all(b > a for a, b in zip(bounds, bounds[1:]))
    assert all(b / a <= 1.1 + 1e-9 for a, b in zip(bounds, bounds[1:]) if a >= mt.FINE_FROM)
    assert not any('custom-histogram' in a for a in build_plan(dict(BASE, backend_version='0.31.0')).args)


@pytest.mark.parametrize('max_model_len', [1, 50, 8192, 131072, 10 * 1024 * 1024])
def test_histogram_bounds_stay_within_the_measurable_limit(max_model_len):
    bounds = mt.histogram_buckets(max_model_len)
    assert len(bounds) <= mt.MAX_HISTOGRAM_BOUNDS and bounds[-1] == max_model_len
    top = [b for b in bounds if b >= max(max_model_len / 10, mt.FINE_FROM)]
    assert all(b / a <= 1.1 + 1e-9 for a, b in zip(top, top[1:]))


def test_traffic_source_without_a_measurement_keeps_the_declaration_and_not_with_classes():
    # A deployment new to the fleet has no measurement yet (its watchdog writes the first one
    # after the rollout): the declared traffic is planned, and the plan says why.
    declared = build_plan(dict(BASE))
    for source in ('measured', 'larger'):
        plan = build_plan(dict(BASE, traffic_source=source))
        assert plan.args == declared.args
        assert any('no traffic measured for this deployment yet' in w for w in plan.warnings)
        rows = plan.measured['traffic']['figures']
        assert all(r['used'] == r['declared'] and 'no traffic measured' in r['reason'] for r in rows)
        assert plan.measured['kv_pool'] is None
    result = serving_plan_result(dict(BASE, measurement=measurement(), prompt_tokens_p99=None,
                                      max_output_tokens=None, max_concurrency=None,
                                      traffic_classes=[dict(name='a', prompt_tokens_p99=1, max_output_tokens=1,
                                                            max_concurrency=1)]))
    assert result['failed'] and result['field'] == 'measurement'


def test_without_measurement_the_plan_dict_has_no_measured_key():
    assert 'measured' not in build_plan(BASE).to_dict()
    assert build_plan(dict(BASE, measurement=measurement())).to_dict()['measured']['traffic']['requests'] == 1000


def _with_95(prompt_95, gen_95=600, **kw):
    out = measurement(**kw)
    out['traffic'].update(prompt_tokens_p99_upper_95=prompt_95, generation_tokens_p99_upper_95=gen_95)
    return out


def test_a_measurement_with_the_95_percent_bound_plans_from_it():
    # The sample p99's bucket edge (1707) may sit below the population p99; the order statistic
    # at or above it with 95 % confidence is in the next bucket (1877): the plan sizes on that.
    plan = build_plan(dict(BASE, traffic_source='measured', measurement=_with_95(1877)))
    rows = {r['figure']: r for r in plan.measured['traffic']['figures']}
    assert rows['prompt']['used'] == 1877 and rows['output']['used'] == 600
    assert '95 %-confidence bound of the p99' in rows['prompt']['reason']
    assert 'prompt_tokens_p99 1877 + max_output_tokens 600' in plan.reasons['max_model_len']
    # without it (an older or hand-made summary): the sample p99's edge, and the reason says so
    plan = build_plan(dict(BASE, traffic_source='measured', measurement=measurement()))
    rows = {r['figure']: r for r in plan.measured['traffic']['figures']}
    assert rows['prompt']['used'] == 1707 and 'carries no 95 % bound' in rows['prompt']['reason']


def test_a_95_percent_bound_in_the_inf_bucket_keeps_the_declaration():
    plan = build_plan(dict(BASE, traffic_source='measured', measurement=_with_95(None)))
    rows = {r['figure']: r for r in plan.measured['traffic']['figures']}
    assert rows['prompt']['used'] == BASE['prompt_tokens_p99']
    assert '95 %-confidence bound of the p99 of the window is in the +Inf bucket' in rows['prompt']['reason']


def test_a_95_percent_bound_below_the_sample_p99_is_a_named_error():
    result = serving_plan_result(dict(BASE, traffic_source='measured', measurement=_with_95(1000)))
    assert result['failed'] and result['field'] == 'measurement.traffic.prompt_tokens_p99_upper_95'
    assert '1000' in result['msg'] and '1707' in result['msg']
