# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""fp8 KV only with the operator's consent (issue 37): without ``allow_fp8_kv`` a plan never
changes the KV dtype; it caps max_num_seqs (or refuses an impossible plan) and says what fp8
would buy in tokens and concurrency. With it the plan switches as before. An explicit
kv_cache_dtype is always obeyed. The field report's verdicts (0.92 refused, 0.88 accepted at
TP 4) hold either way."""

from __future__ import annotations

import os

import pytest
import yaml

from model_specs import (  # pylint: disable=import-error
    A6000_TOTAL, FIELD_TRAFFIC, RTX4090_TOTAL, field_plan, gpus, llama_70b, llama_8b)
from ansible_collections.kvpin.fleet.plugins.module_utils.plan import serving_plan
from ansible_collections.kvpin.fleet.plugins.module_utils.plan import vllm_memory as vm
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.plan_types import PlanInputError, Traffic
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.vllm_memory import plan_vllm
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.vllm_pipeline import plan_vllm_pipeline

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..', '..', '..'))


def rtx4090_plan(**knobs):
    # 8 x 7k-token requests on one 24 GB card
    return plan_vllm(llama_8b(), gpus(1, RTX4090_TOTAL, 'NVIDIA GeForce RTX 4090'),
                     Traffic(7000, 1000, 8), knobs, '0.11.0')


def _no_fp8(plan):
    assert plan.settings['kv_cache_dtype'] == 'auto'
    assert not any(arg.startswith('--kv-cache-dtype') for arg in plan.args)
    assert not any('switched to fp8' in w for w in plan.warnings)


@pytest.mark.parametrize('make', [field_plan, rtx4090_plan], ids=['field_report_a6000_tp4', 'rtx4090_8x7k'])
def test_without_consent_no_fp8_and_concurrency_capped_with_the_reason(make):
    plan = make()
    _no_fp8(plan)
    assert plan.feasible
    declared = 32 if make is field_plan else 8
    assert plan.settings['max_num_seqs'] < declared
    assert 'the declared traffic cannot oversubscribe the KV pool' in plan.reasons['max_num_seqs']
    assert any('below the declared concurrency %d' % declared in w for w in plan.warnings)
    # what fp8 would buy: the consenting plan's own numbers, in tokens and in sequences
    with_fp8 = make(allow_fp8_kv=True)
    assert with_fp8.settings['kv_cache_dtype'] == 'fp8'
    reason = plan.reasons['kv_cache_dtype']
    assert reason.startswith('auto (the model dtype, 2 B)')
    assert 'allow_fp8_kv' in reason
    assert '%d KV tokens' % with_fp8.kv_cache_tokens in reason
    assert '%d KV tokens' % plan.kv_cache_tokens in reason
    assert 'max_num_seqs %d' % with_fp8.settings['max_num_seqs'] in reason
    assert with_fp8.kv_cache_tokens > 1.9 * plan.kv_cache_tokens
    assert any('allow_fp8_kv' in w and str(with_fp8.settings['max_num_seqs']) in w for w in plan.warnings)


def test_with_consent_fp8_and_the_same_reasons_as_before():
    plan = field_plan(allow_fp8_kv=True)
    assert plan.settings['kv_cache_dtype'] == 'fp8'
    assert '--kv-cache-dtype=fp8' in plan.args
    assert plan.reasons['kv_cache_dtype'].startswith('fp8: with the model dtype the KV pool holds too little')
    assert 'allow_fp8_kv' in plan.reasons['kv_cache_dtype']
    assert any('long-context retrieval' in w for w in plan.warnings)
    # consent is not a request: a plan the model dtype holds stays in the model dtype
    small = plan_vllm(llama_70b(), gpus(4), Traffic(2000, 500, 2),
                      {'tensor_parallel_size': 4, 'allow_fp8_kv': True}, '0.10.1.1')
    _no_fp8(small)
    assert small.reasons['kv_cache_dtype'] == 'auto (the model dtype, 2 B): the pool holds the declared traffic'


@pytest.mark.parametrize('consent', [None, True, False])
def test_explicit_kv_cache_dtype_always_obeyed(consent):
    knobs = {'kv_cache_dtype': 'auto'}
    if consent is not None:
        knobs['allow_fp8_kv'] = consent
    plan = field_plan(**knobs)
    _no_fp8(plan)
    assert plan.reasons['kv_cache_dtype'] == 'set by the user (auto)'
    knobs['kv_cache_dtype'] = 'fp8'
    plan = field_plan(**knobs)
    assert plan.settings['kv_cache_dtype'] == 'fp8' and '--kv-cache-dtype=fp8' in plan.args
    assert plan.reasons['kv_cache_dtype'] == 'set by the user (fp8)'


def test_impossible_in_the_model_dtype_is_refused_without_consent_and_says_what_fp8_buys():
    # 1 x 100k tokens at TP 4: one sequence fits in fp8 (1 B) but not in bf16
    traffic = Traffic(100000, 2000, 1)
    plan = plan_vllm(llama_70b(), gpus(4), traffic, {'tensor_parallel_size': 4}, '0.10.1.1')
    consent = plan_vllm(llama_70b(), gpus(4), traffic, {'tensor_parallel_size': 4, 'allow_fp8_kv': True}, '0.10.1.1')
    assert consent.feasible and consent.settings['kv_cache_dtype'] == 'fp8'
    assert not plan.feasible
    _no_fp8(plan)
    assert any('one 131072-token sequence needs' in line for line in plan.not_fitting)
    fp8 = [s for s in plan.suggestions if 'allow_fp8_kv' in s]
    assert fp8 and '%d KV tokens' % consent.kv_cache_tokens in fp8[0]
    assert 'fp8 needs the operator\'s consent' in plan.reasons['kv_cache_dtype']


@pytest.mark.parametrize('consent', [False, True])
def test_field_report_verdicts_hold_with_and_without_consent(consent):
    refused = field_plan(gpu_memory_utilization=0.92, allow_fp8_kv=consent)
    assert refused.feasible is False
    assert any('CUDA graph pool' in line and 'more than total x (1 - 0.92)' in line for line in refused.not_fitting)
    accepted = field_plan(gpu_memory_utilization=0.88, allow_fp8_kv=consent)
    assert accepted.feasible is True
    assert '--gpu-memory-utilization=0.88' in accepted.args
    assert accepted.settings['kv_cache_dtype'] == ('fp8' if consent else 'auto')


def test_allow_fp8_kv_must_be_a_bool_naming_the_field():
    with pytest.raises(PlanInputError) as err:
        field_plan(allow_fp8_kv='yes please')
    assert err.value.field == 'allow_fp8_kv'
    with pytest.raises(PlanInputError) as err:
        serving_plan.check_knob_type('allow_fp8_kv', 1)
    assert err.value.field == 'allow_fp8_kv'


def test_pipeline_plans_accept_the_option_and_never_switch():
    plan = plan_vllm_pipeline(llama_70b(), gpus(4), FIELD_TRAFFIC,
                              {'pipeline_parallel_size': 2, 'tensor_parallel_size': 2, 'allow_fp8_kv': True},
                              '0.11.0')
    assert plan.settings['kv_cache_dtype'] == 'auto'
    assert 'allow_fp8_kv' in plan.reasons['kv_cache_dtype']


def test_option_is_a_vllm_knob_documented_and_passed_by_the_playbook():
    assert serving_plan.KNOB_TYPES['allow_fp8_kv'] == dict(type='bool')
    assert 'allow_fp8_kv' in serving_plan.VLLM_KNOBS and 'allow_fp8_kv' in vm.KNOWN_KNOBS
    with open(os.path.join(REPO, 'playbooks', 'tasks', 'plan_deployments.yml')) as handle:
        text = handle.read()
    assert '{{ deployment.engine.allow_fp8_kv | default(omit) }}' in text


def test_field_report_inventories_consent_where_the_report_chose_fp8():
    for path in ('inventory/lab/host_vars/lab-a6000x4.yml', 'inventory/example/host_vars/gpu-a6000-01.yml'):
        with open(os.path.join(REPO, path)) as handle:
            deployments = yaml.safe_load(handle)['kvpin_deployments']
        field = [d for d in deployments if d['model'] == 'meta-llama/Llama-3.3-70B-Instruct']
        assert field and all(d['engine']['allow_fp8_kv'] is True for d in field), path


def test_traffic_classes_without_consent_fail_and_say_what_fp8_would_buy():
    # the field report's dilemma (docs/traffic-classes.md): it fits only in fp8
    from ansible_collections.kvpin.fleet.plugins.module_utils.plan.serving_plan import (
        SERVING_PLAN_ARGUMENT_SPEC, serving_plan_result)
    gpu = dict(name='NVIDIA RTX A6000', memory_total=A6000_TOTAL, memory_used=0, memory_free=A6000_TOTAL)
    classes = [dict(name='chat', prompt_tokens_p99=2048, max_output_tokens=512, max_concurrency=64,
                    hours='07:00-23:00'),
               dict(name='batch', prompt_tokens_p99=30000, max_output_tokens=2048, max_concurrency=4,
                    hours='00:00-06:00')]
    base = dict((name, spec.get('default')) for name, spec in SERVING_PLAN_ARGUMENT_SPEC.items())
    base.update(backend='vllm', backend_version='0.10.1.1', model='meta-llama/Llama-3.3-70B-Instruct',
                gpus=[dict(gpu, index=i, uuid='GPU-%d' % i) for i in range(4)], tensor_parallel_size=4,
                traffic_classes=classes)
    refused = serving_plan_result(base)
    assert refused.get('failed')
    assert 'allow_fp8_kv' in refused['msg'] and 'KV tokens' in refused['msg']
    assert not any('--kv-cache-dtype=fp8' in p['args'] for p in refused['plan']['profiles'])
    accepted = serving_plan_result(dict(base, allow_fp8_kv=True))
    assert not accepted.get('failed'), accepted.get('msg')
    assert all('--kv-cache-dtype=fp8' in p['args'] for p in accepted['plan']['profiles'])
