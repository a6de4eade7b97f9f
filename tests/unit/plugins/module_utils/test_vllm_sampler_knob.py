# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The engine option vllm_sampler: which top-k/top-p sampler the profile run's warm-up goes
through (vllm_profile.sampler_path), what the plan charges for it, the engine environment it
pins (VLLM_USE_FLASHINFER_SAMPLER) and the reason the plan gives; bad values are refused naming
the field. Byte counts are the shapes of vllm_memory (per logit of the [R, vocab] warm-up)."""

from __future__ import annotations

import pytest

from ansible_collections.kvpin.fleet.plugins.module_utils.plan import cuda_total as ct
from ansible_collections.kvpin.fleet.plugins.module_utils.plan import vllm_memory as vm
from ansible_collections.kvpin.fleet.plugins.module_utils.plan import vllm_profile as prof
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.model_loaders import resolve_model
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.plan_types import PlanInputError, Traffic
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.serving_plan import plan_vllm_engine
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.vllm_memory import plan_vllm

QWEN2_7B = 'Qwen/Qwen2-7B-Instruct'
TRAFFIC = Traffic(prompt_tokens_p99=8192, max_output_tokens=8192, max_concurrency=1)
KNOBS = dict(gpu_memory_utilization=0.5, max_model_len=16384, max_num_seqs=256)
ENV = 'VLLM_USE_FLASHINFER_SAMPLER'


def a100(tp=1):
    total = ct.find_card('NVIDIA A100 80GB').nvml_total_mib * ct.MiB
    return [dict(index=i, name='NVIDIA A100-SXM4-80GB', memory_total=total) for i in range(tp)]


def plan(version, sampler=None, model=QWEN2_7B, tp=1, **knobs):
    knobs = dict(KNOBS, tensor_parallel_size=tp, **knobs)
    if sampler is not None:
        knobs['vllm_sampler'] = sampler
    return plan_vllm(resolve_model(model), a100(tp), TRAFFIC, knobs, version)


def test_flashinfer_charges_masked_logits_and_probs_without_the_sort():
    """FlashInfer's top_k_top_p_sampling_from_logits: model-dtype logits 2 B + fp32 logits 4 B +
    fp32 masked logits 4 B + fp32 probs 4 B per logit, no sort, no fitted residual."""
    spec = resolve_model(QWEN2_7B)
    terms, path = vm.sampler_warmup_terms(spec, 256, 2048, prof.parse_version('0.10.1.1'), 'flashinfer')
    logits = 256 * spec.vocab_size
    assert path == 'flashinfer'
    assert terms == {'logits_model_dtype': logits * 2, 'logits_fp32': logits * 4,
                     'flashinfer_masked_logits_probs': logits * 8}


@pytest.mark.parametrize('version', ['0.10.1.1', '0.11.0', '0.12.0', '0.16.0'])
def test_flashinfer_leaves_more_kv_than_the_default_sort_path(version):
    default, flashinfer = plan(version), plan(version, 'flashinfer')
    d_mem, f_mem = default.memory[0], flashinfer.memory[0]
    vocab = resolve_model(QWEN2_7B).vocab_size
    logits = 256 * vocab
    # the sort's 32 B + the fitted 0.19 B residual, less FlashInfer's 8 B, per logit
    saved = logits * (vm.SAMPLER_SORT_BYTES - vm.SAMPLER_FLASHINFER_BYTES) + logits * vm.SAMPLER_SORT_RESIDUAL_X100 // 100
    assert d_mem.terms['activation_sampler_warmup'] - f_mem.terms['activation_sampler_warmup'] == saved
    assert f_mem.terms['kv_budget'] > d_mem.terms['kv_budget']
    assert flashinfer.settings['environment'][ENV] == '1'
    assert 'flashinfer' in flashinfer.reasons['vllm_sampler'] and ENV + '=1' in flashinfer.reasons['vllm_sampler']
    assert any(r.startswith(ENV + '=1 set in the engine environment') for r in flashinfer.rules)


def test_unset_charges_the_sort_path_and_says_why_it_is_the_safe_side():
    default = plan('0.10.1.1')
    assert 'environment' not in default.settings or ENV not in default.settings['environment']
    reason = default.reasons['vllm_sampler']
    assert reason.startswith('not set: charged the PyTorch sort path')
    assert 'larger' in reason and 'safe side' in reason and 'vllm_sampler: flashinfer' in reason
    assert default.memory[0].terms['activation_sampler_warmup'] == sum(
        vm.sampler_warmup_terms(resolve_model(QWEN2_7B), 256, 2048, prof.parse_version('0.10.1.1'))[0].values())


def test_pytorch_charges_the_sort_path_and_pins_it_in_the_environment():
    default, pytorch = plan('0.11.0'), plan('0.11.0', 'pytorch')
    assert pytorch.memory[0].terms['activation_sampler_warmup'] == default.memory[0].terms['activation_sampler_warmup']
    assert pytorch.memory[0].terms['kv_budget'] == default.memory[0].terms['kv_budget']
    assert pytorch.settings['environment'][ENV] == '0'
    assert pytorch.reasons['vllm_sampler'].startswith('set by the user (pytorch)')


def test_from_0_17_neither_path_sorts_so_the_charge_does_not_move():
    default, flashinfer = plan('0.19.0'), plan('0.19.0', 'flashinfer')
    assert flashinfer.memory[0].terms['activation_sampler_warmup'] == default.memory[0].terms['activation_sampler_warmup']
    assert flashinfer.memory[0].terms['kv_budget'] == default.memory[0].terms['kv_budget']
    assert 'sorts on neither path' in flashinfer.reasons['vllm_sampler']
    assert flashinfer.settings['environment'][ENV] == '1'


@pytest.mark.parametrize('bad', ['FlashInfer', 'triton', 'sort', '', 1, True, ['flashinfer']])
def test_a_bad_value_is_refused_naming_the_field(bad):
    with pytest.raises(PlanInputError) as err:
        plan('0.10.1.1', bad)
    assert err.value.field == 'vllm_sampler'
    assert 'pytorch, flashinfer' in str(err.value)


@pytest.mark.parametrize('version', ['0.8.5', '0.7.3', '0.9.0'])
def test_flashinfer_before_0_9_1_is_refused_naming_the_field(version):
    with pytest.raises(PlanInputError) as err:
        plan(version, 'flashinfer')
    assert err.value.field == 'vllm_sampler' and '0.9.1' in str(err.value)
    assert plan(version, 'pytorch').feasible == plan(version).feasible     # pytorch: the path it runs


def test_the_knob_reaches_each_pipeline_stage_and_its_environment():
    spec = resolve_model(QWEN2_7B)
    knobs = dict(KNOBS, pipeline_parallel_size=2, tensor_parallel_size=1)
    default = plan_vllm_engine(spec, a100(2), TRAFFIC, knobs, '0.10.1.1')
    flashinfer = plan_vllm_engine(spec, a100(2), TRAFFIC, dict(knobs, vllm_sampler='flashinfer'), '0.10.1.1')
    assert flashinfer.settings['environment'][ENV] == '1'
    assert flashinfer.memory[-1].activation < default.memory[-1].activation
    with pytest.raises(PlanInputError) as err:
        plan_vllm_engine(spec, a100(2), TRAFFIC, dict(knobs, vllm_sampler='fast'), '0.10.1.1')
    assert err.value.field == 'vllm_sampler'
