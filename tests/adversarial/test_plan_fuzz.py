# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Fuzzing serving_plan with random and boundary inputs (issue 11 items 6-8): every input
either fails as the task fails (a message naming the field; or an infeasible plan, whose terms
are still sound) or yields a plan in which every term is finite and non-negative and what is
resident on each GPU stays within its total. Nothing else: no exception escapes."""

from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings, strategies as st

from model_files import GiB

from ansible_collections.kvpin.fleet.plugins.module_utils.plan.plan_types import (
    MEMORY_AMOUNTS, RESIDENT_TERMS)
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.serving_plan import serving_plan_result

# Bounded so the whole file runs in seconds: a few hundred examples, no per-example deadline
# (the shared CI machine's load varies; planning time is measured in benchmarks, not here).
FUZZ = settings(max_examples=120, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

BOUNDARY_INTS = [-(1 << 63), -1, 0, 1, 2, 3, 7, 255, 256, 257, 4096, 1 << 20, 1 << 31, 1 << 62]
JUNK = st.one_of(st.none(), st.booleans(), st.text(max_size=6), st.lists(st.integers(0, 4), max_size=2),
                 st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(BOUNDARY_INTS))


def maybe_junk(good):
    """Mostly plausible values (so that most examples reach the planners), sometimes boundary
    values or the wrong type."""
    return st.integers(0, 11).flatmap(lambda pick: JUNK if pick == 0 else good)


SMALL_COUNTS = st.integers(1, 16)
MODEL_CONFIG = st.fixed_dictionaries({
    'architectures': st.sampled_from([['LlamaForCausalLM'], ['Qwen2ForCausalLM'], ['Gemma2ForCausalLM'],
                                      ['MistralForCausalLM'], ['GptOssForCausalLM']]),
    'model_type': st.sampled_from(['llama', 'qwen2', 'gemma2', 'mistral', 'gpt_oss']),
    'torch_dtype': maybe_junk(st.sampled_from(['bfloat16', 'float16', 'float32'])),
    'num_hidden_layers': maybe_junk(st.integers(1, 12)),
    'hidden_size': maybe_junk(st.sampled_from([64, 128, 512, 1024, 4096])),
    'intermediate_size': maybe_junk(st.sampled_from([128, 1024, 4096, 14336])),
    'num_attention_heads': maybe_junk(st.sampled_from([1, 2, 4, 8, 32])),
    'num_key_value_heads': maybe_junk(st.sampled_from([1, 2, 4, 8])),
    'vocab_size': maybe_junk(st.integers(1, 200000)),
    'max_position_embeddings': maybe_junk(st.sampled_from([16, 2048, 32768, 131072])),
}, optional={
    'head_dim': maybe_junk(st.sampled_from([32, 64, 128])),
    'sliding_window': maybe_junk(st.integers(-4096, 8192)),
    'tie_word_embeddings': st.booleans(),
    'weight_bytes': maybe_junk(st.integers(1, 1 << 42)),
    'num_local_experts': maybe_junk(st.integers(0, 16)),
    'num_experts_per_tok': maybe_junk(st.integers(0, 8)),
    'layer_types': maybe_junk(st.lists(st.sampled_from(['full_attention', 'sliding_attention']),
                                       max_size=12)),
})
MODEL = st.one_of(MODEL_CONFIG, MODEL_CONFIG, st.sampled_from(['qwen3-0.6b', 'llama-3.1-8b', 'gpt-oss-20b',
                                                               'gemma-2-9b', 'no-such-model']), JUNK)
GPU_MEMORY = maybe_junk(st.sampled_from([8 * GiB, 24 * GiB, 48 * GiB, 80 * GiB, 141 * GiB]))


@st.composite
def gpu_lists(draw):
    count = draw(st.integers(0, 11).map(lambda pick: min(pick, 8) // 2 + (pick > 0)))   # 0..5, mostly 1..4
    total = draw(GPU_MEMORY)
    gpus = []
    for index in range(count):
        entry = {'index': index, 'name': 'NVIDIA H100', 'memory_total': total,
                 'compute_capability': '9.0'}
        if draw(st.integers(0, 19)) == 0:
            entry[draw(st.sampled_from(['index', 'name', 'memory_total', 'memory_free',
                                        'compute_capability']))] = draw(JUNK)
        gpus.append(entry)
    return draw(maybe_junk(st.just(gpus)))


VLLM_KNOBS = st.fixed_dictionaries({}, optional={
    'tensor_parallel_size': maybe_junk(st.sampled_from([1, 2, 4, 8, 'auto'])),
    'gpu_memory_utilization': maybe_junk(st.floats(0.01, 1.0)),
    'max_model_len': maybe_junk(st.integers(16, 1 << 17)),
    'max_num_seqs': maybe_junk(st.integers(1, 1024)),
    'kv_cache_dtype': maybe_junk(st.sampled_from(['auto', 'fp8', 'fp8_e5m2'])),
    'block_size': maybe_junk(st.sampled_from([16, 32])),
    'enforce_eager': maybe_junk(st.booleans()),
})
LLAMA_KNOBS = st.fixed_dictionaries({'quantization': maybe_junk(st.sampled_from(['Q4_K_M', 'Q8_0', 'F16']))},
                                    optional={
    'gpu_layers': maybe_junk(st.integers(-1, 200)),
    'ctx_size': maybe_junk(st.integers(1, 1 << 20)),
    'parallel': maybe_junk(st.integers(1, 64)),
    'flash_attn': maybe_junk(st.booleans()),
    'cache_type_k': maybe_junk(st.sampled_from(['f16', 'q8_0', 'q4_0'])),
    'cache_type_v': maybe_junk(st.sampled_from(['f16', 'q8_0'])),
    'tensor_split': maybe_junk(st.lists(st.floats(0, 10), min_size=1, max_size=5)),
    'vram_reserve_bytes': maybe_junk(st.integers(0, 8 * GiB)),
})
ENGINE = st.one_of(
    st.tuples(st.just('vllm'), maybe_junk(st.sampled_from(['0.10.1.1', '0.11.0', '0.20.0', '0.33.0', '0.10'])),
              VLLM_KNOBS),
    st.tuples(st.just('llama.cpp'), maybe_junk(st.sampled_from(['b6327', 'b7800'])), LLAMA_KNOBS),
    st.tuples(st.just('llama-box'), maybe_junk(st.just('v0.0.171')), LLAMA_KNOBS),
)


def check_sound(plan):
    """What the issue requires of every plan that comes back."""
    assert plan['memory']
    for gpu in plan['memory']:
        for name in MEMORY_AMOUNTS:
            value = gpu[name]
            assert math.isfinite(value) and value >= 0, (name, value)
        for name, value in gpu['terms'].items():
            assert math.isfinite(value), (name, value)
            if name != 'kv_budget' or plan['feasible']:
                assert value >= 0, (name, value)
        assert math.isfinite(gpu['headroom'])
        if plan['feasible']:
            assert gpu['headroom'] >= 0
            assert sum(gpu[name] for name in RESIDENT_TERMS) <= gpu['total']
    assert plan['kv_cache_tokens'] >= 0
    assert math.isfinite(plan['max_concurrency_at_max_len']) and plan['max_concurrency_at_max_len'] >= 0


@FUZZ
@given(model=MODEL, gpus=gpu_lists(), engine=ENGINE,
       prompt=maybe_junk(st.integers(1, 1 << 17)), output=maybe_junk(st.integers(1, 1 << 14)),
       concurrency=maybe_junk(st.integers(1, 512)), fail_on_infeasible=st.booleans())
def test_serving_plan_refuses_by_field_or_returns_a_sound_plan(model, gpus, engine, prompt, output,
                                                               concurrency, fail_on_infeasible):
    backend, version, knobs = engine
    params = dict(backend=backend, backend_version=version, model=model, gpus=gpus,
                  prompt_tokens_p99=prompt, max_output_tokens=output, max_concurrency=concurrency,
                  fail_on_infeasible=fail_on_infeasible, **knobs)
    result = serving_plan_result(params)
    if 'plan' not in result:
        # refused: the input, named
        assert result['failed'] and result.get('field'), result
        assert result['msg'].startswith('serving_plan: invalid %s' % result['field'])
        return
    check_sound(result['plan'])
    if result.get('failed'):
        # infeasible under fail_on_infeasible: says what does not fit
        assert not result['plan']['feasible'] and 'infeasible' in result['msg']


BOUNDARY_GPUS = [[], [{'index': 0, 'name': 'x', 'memory_total': 1}],
                 [{'index': 0, 'name': 'x', 'memory_total': 1 << 42}],
                 [{'index': i, 'name': 'x', 'memory_total': 80 * GiB} for i in range(16)]]


@FUZZ
@given(gpus=st.sampled_from(BOUNDARY_GPUS), model=st.sampled_from(['qwen3-0.6b', 'llama-3.3-70b', 'deepseek-v3']),
       prompt=st.sampled_from([1, 10 * 1024 * 1024]), output=st.sampled_from([1, 10 * 1024 * 1024]),
       concurrency=st.sampled_from([1, 100000]),
       engine=st.sampled_from([('vllm', '0.10.1.1', {}), ('vllm', '0.33.0', {}),
                               ('llama.cpp', 'b6327', {'quantization': 'Q4_K_M'})]))
def test_boundary_traffic_and_gpus_are_planned_soundly_or_refused(gpus, model, prompt, output, concurrency,
                                                                  engine):
    backend, version, knobs = engine
    result = serving_plan_result(dict(backend=backend, backend_version=version, model=model, gpus=gpus,
                                      prompt_tokens_p99=prompt, max_output_tokens=output,
                                      max_concurrency=concurrency, fail_on_infeasible=False, **knobs))
    if 'plan' not in result:
        assert result['failed'] and result.get('field'), result
        return
    check_sound(result['plan'])
