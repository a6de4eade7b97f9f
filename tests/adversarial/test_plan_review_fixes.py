# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Planner findings of the adversarial review: Unicode digits in tensor_parallel_size, traffic
classes compared in KV tokens on a hybrid layout, llama.cpp requests beyond the trained context,
concurrency cut to the slot limit without a word, unbounded tensor_split entries."""

from __future__ import annotations

import pytest

from model_files import SMALL_LLAMA, gpu, params

from ansible_collections.kvpin.fleet.plugins.module_utils.plan import serving_plan as sp
from ansible_collections.kvpin.fleet.plugins.module_utils.plan import vllm_memory as vm
from ansible_collections.kvpin.fleet.plugins.module_utils.plan import vllm_pipeline
from ansible_collections.kvpin.fleet.plugins.module_utils.plan import vllm_profile as prof
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.model_loaders import resolve_model
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.serving_plan import serving_plan_result

LLAMA_CPP = dict(backend='llama.cpp', backend_version='b6327', quantization='Q8_0')


def refused(result, field, *fragments):
    assert result.get('failed') and result.get('field') == field, result
    for fragment in fragments:
        assert fragment in result['msg'], result['msg']


# ---------------------------------------------------------------- 1. Unicode digits
@pytest.mark.parametrize('value', ['²', '４', '١', '0' * 5000],
                         ids=['superscript', 'fullwidth', 'arabic', 'overlong'])
def test_tensor_parallel_size_unicode_or_overlong_digits_refused_by_name(value):
    refused(serving_plan_result(params(tensor_parallel_size=value)), 'tensor_parallel_size',
            'must be an integer or "auto"')


def test_tensor_parallel_size_ascii_digits_with_spaces_still_accepted():
    result = serving_plan_result(params(tensor_parallel_size=' 1 '))
    assert not result.get('failed'), result.get('msg')
    assert result['plan']['settings']['tensor_parallel_size'] == 1


def test_compute_capability_unicode_digits_refused_by_name():
    refused(serving_plan_result(params(gpus=[gpu(compute_capability='٨.٦')])), 'gpus[0].compute_capability',
            'must be a string like "8.6"')


# ---------------------------------------------------------------- 2. traffic classes in KV blocks
HYBRID_CLASSES = [dict(name='long', prompt_tokens_p99=7000, max_output_tokens=1000, max_concurrency=1),
                  dict(name='short', prompt_tokens_p99=500, max_output_tokens=100, max_concurrency=100)]


def class_params(classes, **overrides):
    p = params(traffic_classes=classes, **overrides)
    for option in ('prompt_tokens_p99', 'max_output_tokens', 'max_concurrency'):
        p.pop(option)
    return p


def test_hybrid_traffic_classes_compared_in_blocks_not_overstated_tokens():
    # gemma-2 (sliding + full layers): kv_cache_tokens = concurrency x max_model_len (76559) is
    # above the 68800 tokens the classes need, but 100 short requests hold 77 blocks each and the
    # long one 885: 8585 blocks against the 8383 the engine has - not feasible
    result = serving_plan_result(class_params(HYBRID_CLASSES, model='gemma-2-9b', max_num_seqs=512))
    plan = result['plan']
    assert not plan['feasible'] and result.get('failed')
    single = plan['profiles'][0]
    assert single['kv_cache_tokens'] > single['demand_tokens']          # the misleading token figures
    assert single['demand_blocks'] == 1 * 885 + 100 * 77 == 8585
    assert single['kv_cache_blocks'] == 8383
    assert 'the KV pool has 8383 blocks < 8585 needed by the busiest window' in ' '.join(single['not_fitting'])
    assert 'long 1 x 885 + short 100 x 77' in single['reasons']['kv_pool']


def test_hybrid_traffic_classes_feasible_only_with_the_blocks_to_show():
    # fewer short requests: 885 + 90 x 77 = 7815 blocks fit the 8383; the reason says so in blocks
    classes = [HYBRID_CLASSES[0], dict(HYBRID_CLASSES[1], max_concurrency=90)]
    result = serving_plan_result(class_params(classes, model='gemma-2-9b', max_num_seqs=512))
    assert not result.get('failed'), result.get('msg')
    single = result['plan']['profiles'][0]
    assert single['feasible'] and single['kv_cache_blocks'] >= single['demand_blocks'] == 885 + 90 * 77
    assert 'blocks >= 7815 needed by the busiest window' in single['reasons']['kv_pool']


def pool_from_output(spec, plan):
    """The pool rebuilt from what the plan outputs (its pinned settings and each GPU's KV bytes),
    independently of the evaluation that sized it: (usable blocks, layouts)."""
    settings = plan.settings
    version = prof.parse_version(plan.backend_version)
    tp, block_size, mnbt = settings['tensor_parallel_size'], settings['block_size'], settings['max_num_batched_tokens']
    if plan.pipeline:
        kv_bytes = prof.kv_cache_dtype_bytes(settings['kv_cache_dtype'], version, spec.dtype_bytes)
        layouts = [vm.kv_layout(vllm_pipeline.stage_spec(spec, *stage['layers']), tp, kv_bytes, block_size, mnbt)
                   for stage in plan.pipeline['stages']]
        # each stage's GPUs hold whole blocks of that stage's layout; the engine gives every stage
        # the smallest count, less the null block
        fewest = min(m.kv_cache // layouts[index].bytes_per_block
                     for index, stage in enumerate(plan.pipeline['stages'])
                     for m in plan.memory if m.index in stage['gpus'])
        return max(0, fewest - prof.accounting(version).held_back_blocks(fewest)), layouts
    spec = vm.engine_spec(spec, version)
    kv_bytes = prof.kv_cache_dtype_bytes(settings['kv_cache_dtype'], version, spec.dtype_bytes)
    layout = vm.kv_layout(spec, tp, kv_bytes, block_size, mnbt)
    # each GPU's KV bytes are whole blocks (a pinned pool: the usable ones + the null block)
    fewest = min(m.kv_cache // layout.bytes_per_block for m in plan.memory)
    return max(0, fewest - prof.accounting(version).held_back_blocks(fewest)), [layout]


@pytest.mark.parametrize('model', ['gemma-2-9b', 'qwen3-0.6b', 'small'])
@pytest.mark.parametrize('version', ['0.6.6', '0.10.1.1', '0.11.0', '0.34.0'])
@pytest.mark.parametrize('knobs', [{}, {'kv_cache_dtype': 'fp8'}, {'gpus': [gpu(0), gpu(1)], 'tensor_parallel_size': 2}],
                         ids=['plain', 'fp8', 'tp2'])
def test_the_carried_pool_is_the_pool_the_plan_outputs(model, version, knobs):
    # one fact, three readers: the pool the plan hands traffic_classes, the pool its settings and
    # per-GPU KV bytes give, and its own kv_cache_tokens
    p = params(model=SMALL_LLAMA if model == 'small' else model, backend_version=version, **knobs)
    plan = sp.build_plan(p)
    pool = plan.kv_pool
    usable, layouts = pool_from_output(resolve_model(p['model']), plan)
    assert (pool.usable_blocks, list(pool.layouts)) == (usable, layouts)
    max_len = plan.settings['max_model_len']
    per_max_len = pool.blocks_per_request(max_len)
    if pool.layouts[0].hybrid:
        assert int(pool.usable_blocks / per_max_len * max_len) == plan.kv_cache_tokens
    else:
        assert pool.usable_blocks * plan.settings['block_size'] == plan.kv_cache_tokens


def test_the_carried_pool_of_a_pipeline_plan_is_the_pool_the_plan_outputs():
    p = params(model='gemma-2-9b', pipeline_parallel_size=2, gpus=[gpu(0), gpu(1)])
    plan = sp.build_plan(p)
    usable, layouts = pool_from_output(resolve_model(p['model']), plan)
    assert (plan.kv_pool.usable_blocks, list(plan.kv_pool.layouts)) == (usable, layouts)
    assert usable == plan.pipeline['engine_kv_blocks'] and len(layouts) == 2


def test_the_carried_pool_is_not_output_and_only_vllm_has_one():
    # in-process hand-over to traffic_classes: the plan's output keys stay what RETURN documents
    plan = sp.build_plan(params(model=SMALL_LLAMA))
    out = plan.to_dict()
    assert plan.kv_pool is not None and 'kv_pool' not in out
    assert out['kv_cache_tokens'] == plan.kv_pool.usable_blocks * out['settings']['block_size']
    assert sp.build_plan(params(**LLAMA_CPP)).kv_pool is None


# ---------------------------------------------------------------- 3. beyond the trained context
H100 = [gpu(0, total=80 << 30, name='NVIDIA H100 80GB HBM3')]


def test_llamacpp_request_beyond_trained_context_not_feasible():
    result = serving_plan_result(params(model='qwen3-0.6b', prompt_tokens_p99=1000000, max_output_tokens=1000,
                                        gpus=H100, **LLAMA_CPP))
    plan = result['plan']
    assert not plan['feasible'] and result.get('failed')
    assert 'requests need 1001000 tokens' in ' '.join(plan['not_fitting'])
    assert 'the model supports 40960' in ' '.join(plan['not_fitting'])


def test_llamacpp_warns_on_the_slot_share_not_the_whole_ctx_size():
    # 1024 slots of 192 tokens: ctx_size 196608 is far above the trained 4096, each slot is not
    result = serving_plan_result(params(max_concurrency=1024, **LLAMA_CPP))
    plan = result['plan']
    assert plan['settings']['ctx_size'] > 4096 >= plan['settings']['slot_ctx']
    assert not any('exceeds the trained context' in w for w in plan['warnings']), plan['warnings']
    # a user ctx_size whose slot share is beyond it still warns, with that share
    result = serving_plan_result(params(parallel=1, ctx_size=8192, **LLAMA_CPP))
    assert any('per slot share 8192 exceeds the trained context 4096' in w for w in result['plan']['warnings'])


# ---------------------------------------------------------------- 4. concurrency above the slot limit
def test_llamacpp_concurrency_above_slot_limit_warned_and_reason_truthful():
    result = serving_plan_result(params(max_concurrency=5000, **LLAMA_CPP))
    plan = result['plan']
    assert plan['settings']['parallel'] == 1024
    assert 'min(max_concurrency 5000, at most 1024 slots) = 1024' in plan['reasons']['parallel']
    assert any('parallel 1024 is below the declared concurrency 5000' in w for w in plan['warnings'])


# ---------------------------------------------------------------- 5. tensor_split bounds
@pytest.mark.parametrize('split', [[1e308, 1e308], [5e-324, 1], [1, 1e7]])
def test_tensor_split_entries_out_of_range_refused(split):
    result = serving_plan_result(params(tensor_split=split, gpus=[gpu(0), gpu(1)], **LLAMA_CPP))
    bad = split[0] if split[0] != 1 else split[1]
    refused(result, 'tensor_split', 'must be 0 or between 1e-06 and 1e+06', repr(bad))


@pytest.mark.parametrize('split', [[0, 1], [3, 1], [24000, 48000], [0.25, 0.75]])
def test_tensor_split_ordinary_entries_accepted(split):
    result = serving_plan_result(params(tensor_split=split, gpus=[gpu(0), gpu(1)], **LLAMA_CPP))
    assert not result.get('failed'), result.get('msg')
