# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The sampler the image really runs (issue 37, item 4): with vllm_sampler unset, an image whose
build files install FlashInfer makes a 0.9.1 - 0.11.x plan charge FlashInfer's warm-up (vLLM takes
it by itself when installed), naming the evidence; unknown images stay on the sort path."""

from __future__ import annotations

import pytest

from ansible_collections.kvpin.fleet.plugins.module_utils.plan import vllm_memory as vm
from ansible_collections.kvpin.fleet.plugins.module_utils.plan import vllm_profile as prof
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.model_loaders import resolve_model
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.plan_types import PlanInputError, Traffic

H100 = 85520809984


def plan(version, **knobs):
    knobs.setdefault('tensor_parallel_size', 1)
    gpus = [dict(index=0, name='NVIDIA H100 80GB HBM3', memory_total=H100)]
    return vm.plan_vllm(resolve_model('meta-llama/Llama-3.1-8B-Instruct'), gpus, Traffic(1000, 1000, 1024), knobs,
                        version)


@pytest.mark.parametrize('image, carries', [
    ('vllm/vllm-openai:v0.11.0', prof.IMAGE_FLASHINFER),
    ('docker.io/vllm/vllm-openai:v0.10.1.1@sha256:abc', prof.IMAGE_FLASHINFER),
    ('gpustack/runner:cuda12.8-vllm0.11.0-linux-amd64', prof.IMAGE_FLASHINFER),
    ('gpustack/runner:cuda12.8-vllm0.11.0', None),             # architecture not named
    ('gpustack/runner:cuda12.8-vllm0.11.0-linux-arm64', None),
    ('gpustack/gpustack:v0.7.1', prof.IMAGE_NO_FLASHINFER),
    ('example.org/my/vllm:1', None),
])
def test_image_evidence(image, carries):
    got, evidence = prof.image_flashinfer(image)
    assert got == carries and image in evidence


def test_known_flashinfer_image_charges_flashinfer_where_vllm_takes_it_by_itself():
    unknown = plan('0.11.0')
    image = plan('0.11.0', vllm_image='vllm/vllm-openai:v0.11.0')
    assert image.memory[0].activation < unknown.memory[0].activation
    assert image.kv_cache_tokens > unknown.kv_cache_tokens
    assert 'vllm/vllm-openai' in image.reasons['vllm_sampler'] and 'takes it by itself' in image.reasons['vllm_sampler']
    assert 'environment' not in image.settings           # nothing pinned: vLLM's own default
    # an explicit knob wins over the image
    pinned = plan('0.11.0', vllm_image='vllm/vllm-openai:v0.11.0', vllm_sampler='pytorch')
    assert pinned.memory[0].activation == unknown.memory[0].activation


@pytest.mark.parametrize('image', ['gpustack/gpustack:v0.7.1', 'gpustack/runner:cuda12.8-vllm0.11.0',
                                   'example.org/my/vllm:1'])
def test_unknown_or_no_flashinfer_image_stays_on_the_safe_side(image):
    assert plan('0.11.0', vllm_image=image).memory[0].activation == plan('0.11.0').memory[0].activation
    assert image in plan('0.11.0', vllm_image=image).reasons['vllm_sampler']


def test_opt_in_releases_keep_the_sort_path_with_a_flashinfer_image():
    # 0.12 - 0.16 take FlashInfer only with VLLM_USE_FLASHINFER_SAMPLER=1
    with_image = plan('0.12.0', vllm_image='vllm/vllm-openai:v0.12.0')
    assert with_image.memory[0].activation == plan('0.12.0').memory[0].activation
    assert 'opt-in from 0.12' in with_image.reasons['vllm_sampler']


def test_bad_image_is_refused_naming_the_field():
    for bad in ('', 'has space:1', 'x' * 600, 7):
        with pytest.raises(PlanInputError) as err:
            plan('0.11.0', vllm_image=bad)
        assert err.value.field == 'vllm_image'
