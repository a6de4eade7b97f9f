# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""serving_plan's RETURN documents what the planners return: every key of ``plan``, of each
``plan.memory`` entry and of its ``terms`` appears in the docs, and every documented key is
returned by some plan (no stale entry). Plans cover both backends, vLLM accounting eras
(0.7.3 V0 / 0.10.2 / 0.11 / 0.20 / 0.33 / 0.34), TP 1-4, PCIe and NVLink cards, flash attention on and off, several
GPUs with layer offload and a GPU without int8 tensor cores."""

from __future__ import annotations

import itertools
import re

import pytest
import yaml

from ansible_collections.kvpin.fleet.plugins.modules import serving_plan as module
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.serving_plan import (
    SERVING_PLAN_ARGUMENT_SPEC, serving_plan_result)

CARDS = {
    '4090': ('NVIDIA GeForce RTX 4090', 25757220864, '8.9'),
    'a6000': ('NVIDIA RTX A6000', 51527024640, '8.6'),
    'h100': ('NVIDIA H100 80GB HBM3', 85520809984, '9.0'),
    'v100': ('Tesla V100-SXM2-32GB', 34359738368, '7.0'),
}


def _gpus(card, count):
    name, total, cc = CARDS[card]
    return [dict(index=i, uuid='GPU-%d' % i, name=name, memory_total=total, memory_used=0,
                 memory_free=total, compute_capability=cc) for i in range(count)]


def _params(**changes):
    params = dict((name, spec.get('default')) for name, spec in SERVING_PLAN_ARGUMENT_SPEC.items())
    params.update(prompt_tokens_p99=4000, max_output_tokens=1000, max_concurrency=4, fail_on_infeasible=False)
    params.update(changes)
    return params


def _cases():
    for version, card, tp, knobs in itertools.product(
            ('0.10.2', '0.11.0', '0.20.0', '0.33.0', '0.34.0'), ('4090', 'h100'), (1, 2, 4),
            ({}, {'pin_kv_cache_memory': True}, {'enforce_eager': True})):
        yield 'vllm', _params(backend='vllm', backend_version=version, model='meta-llama/Llama-3.3-70B-Instruct',
                              gpus=_gpus(card, tp), tensor_parallel_size=tp, **knobs)
    yield 'vllm', _params(backend='vllm', backend_version='0.20.0', model='openai/gpt-oss-20b', gpus=_gpus('h100', 1))
    for tp in (1, 4):    # the V0 engine (no --kv-cache-memory-bytes to pin)
        yield 'vllm', _params(backend='vllm', backend_version='0.7.3', model='meta-llama/Llama-3.3-70B-Instruct',
                              gpus=_gpus('4090', tp), tensor_parallel_size=tp)
    # with the watchdog's measurement (the measured key: declared vs measured, planned vs actual KV)
    yield 'vllm', _params(backend='vllm', backend_version='0.32.0', model='openai/gpt-oss-20b', gpus=_gpus('h100', 1),
                          traffic_source='measured', measurement=dict(
                              traffic=dict(requests=400, prompt_tokens_p99_upper=2000, generation_tokens_p99_upper=500,
                                           max_concurrency=3), kv_pool=dict(kv_cache_tokens=1000)))
    # pipeline parallelism across an RTX A6000 and an RTX 4090 (stage terms, the pipeline key)
    yield 'vllm', _params(backend='vllm', backend_version='0.11.0', model='Qwen/Qwen2.5-32B-Instruct',
                          gpus=_gpus('a6000', 1) + [dict(_gpus('4090', 1)[0], index=1)],
                          pipeline_parallel_size=2)
    # several traffic classes (strategy, profiles, schedule, alternatives): a scheduled plan
    yield 'vllm', _params(backend='vllm', backend_version='0.10.1.1', model='meta-llama/Llama-3.3-70B-Instruct',
                          gpus=_gpus('a6000', 4), tensor_parallel_size=4, kv_cache_dtype='fp8',
                          prompt_tokens_p99=None, max_output_tokens=None, max_concurrency=None, traffic_classes=[
                              dict(name='chat', prompt_tokens_p99=2048, max_output_tokens=512, max_concurrency=64,
                                   hours='07:00-23:00'),
                              dict(name='batch', prompt_tokens_p99=29200, max_output_tokens=2048, max_concurrency=7,
                                   hours='23:00-07:00')])
    for backend, version in (('llama-box', 'v0.0.171'), ('llama.cpp', 'b5000')):
        for card, count, knobs in (('a6000', 1, {'quantization': 'Q4_K_M'}),
                                   ('4090', 2, {'quantization': 'Q8_0', 'gpu_layers': 20}),
                                   ('a6000', 2, {'quantization': 'Q4_K_M', 'flash_attn': True}),
                                   ('v100', 1, {'quantization': 'Q4_K_M'})):
            yield 'llama', _params(backend=backend, backend_version=version, model='meta-llama/Llama-3.3-70B-Instruct',
                                   gpus=_gpus(card, count), **knobs)


@pytest.fixture(scope='module')
def returned():
    """{'plan': keys, 'memory': keys, 'terms': {family: keys}} over every case."""
    seen = {'plan': set(), 'memory': set(), 'terms': {'vllm': set(), 'llama': set()}}
    for family, params in _cases():
        result = serving_plan_result(params)
        assert 'plan' in result, result.get('msg')
        seen['plan'] |= set(result['plan'])
        for gpu in result['plan']['memory']:
            seen['memory'] |= set(gpu)
            seen['terms'][family] |= set(gpu['terms'])
    return seen


@pytest.fixture(scope='module')
def documented():
    doc = yaml.safe_load(module.RETURN)['plan']['contains']
    memory = doc['memory']['contains']
    terms = dict(memory['terms']['contains'])
    # llama.cpp's dotted buffer names are no identifiers, which ansible-test (2.21) refuses as
    # return keys: they are documented as "C(name) - what" items of terms' description.
    for line in memory['terms']['description']:
        dotted = re.match(r'C\(((?:compute|pool)\.[a-z0-9_]+)\) - ', line)
        if dotted:
            terms[dotted.group(1)] = {'returned': 'backend llama-box or llama.cpp', 'description': line}
    return {'plan': set(doc), 'memory': set(memory), 'terms': terms}


def test_every_plan_key_is_documented_and_returned(returned, documented):
    assert returned['plan'] == documented['plan']


def test_every_memory_key_is_documented_and_returned(returned, documented):
    assert returned['memory'] == documented['memory']


def test_every_term_is_documented_and_returned(returned, documented):
    all_returned = returned['terms']['vllm'] | returned['terms']['llama']
    assert sorted(all_returned - set(documented['terms'])) == [], 'returned but not documented'
    assert sorted(set(documented['terms']) - all_returned) == [], 'documented but never returned'


def test_each_term_names_the_backends_that_return_it(returned, documented):
    for name, doc in documented['terms'].items():
        text = doc['returned']
        if name in returned['terms']['vllm'] and name in returned['terms']['llama']:
            assert text == 'always', name
        elif name in returned['terms']['vllm']:
            assert text.startswith('backend vllm'), (name, text)
        else:
            assert text.startswith('backend llama-box or llama.cpp'), (name, text)
