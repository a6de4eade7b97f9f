"""Each layer kind owns its KV cost: vLLM bytes per token and blocks per request, llama.cpp
K/V values per cell (plugins/module_utils/plan/attention_kinds.py)."""
from __future__ import annotations

import pytest

from ansible_collections.kvpin.fleet.plugins.module_utils.plan import attention_kinds as ak
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.model_spec import GGUFLayout, ModelSpec
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.plan_types import PlanInputError


def spec(**over):
    fields = dict(
        name='t', source='test', architecture='X', num_layers=4, hidden_size=4096, intermediate_size=14336,
        num_attention_heads=32, num_kv_heads=8, head_dim=128, vocab_size=32000, max_position_embeddings=32768,
        tie_word_embeddings=False, dtype_bytes=2, layer_kinds=['full'] * 4, sliding_window=4096,
        kv_lora_rank=512, qk_rope_head_dim=64, weight_bytes=1)
    fields.update(over)
    return ModelSpec(**fields)


def test_every_kind_name_maps_to_its_class():
    assert ak.LAYER_KINDS == ('full', 'sliding', 'mla', 'none', 'cross')
    assert [type(ak.kind_of(name)) for name in ak.LAYER_KINDS] == [
        ak.FullAttention, ak.SlidingWindowAttention, ak.LatentAttention, ak.LinearAttention, ak.CrossAttention]


@pytest.mark.parametrize('name', ['encoder', None, ['full']])
def test_unknown_kind_is_refused_naming_it(name):
    with pytest.raises(PlanInputError) as raised:
        ak.kind_of(name)
    assert raised.value.field == 'model' and repr(name) in str(raised.value)


@pytest.mark.parametrize('name, tp, expected', [
    ('full', 1, 2 * 8 * 128 * 2),
    ('full', 4, 2 * 2 * 128 * 2),
    ('full', 16, 2 * 1 * 128 * 2),        # fewer KV heads than ranks: replicated, never below one head
    ('sliding', 2, 2 * 4 * 128 * 2),
    ('mla', 1, (512 + 64) * 2),
    ('mla', 8, (512 + 64) * 2),           # the latent is not split by TP
    ('none', 1, 0),
])
def test_vllm_bytes_per_token(name, tp, expected):
    assert ak.kind_of(name).vllm_bytes_per_token(spec(), tp, 2) == expected


def test_vllm_blocks_per_request_full_grows_with_length_sliding_is_bounded():
    full, sliding = ak.kind_of('full'), ak.kind_of('sliding')
    assert full.vllm_blocks_per_request(8193, 16, 4096, 2048) == 513
    assert full.vllm_blocks_per_request(100000, 16, 4096, 2048) == 6250
    bound = -(-(4096 - 1 + 2048) // 16) + 1
    assert sliding.vllm_blocks_per_request(100000, 16, 4096, 2048) == bound
    assert sliding.vllm_blocks_per_request(1000, 16, 4096, 2048) == -(-1000 // 16) + 1


def test_vllm_forced_block_size_only_for_mla():
    assert ak.vllm_forced_block_size(['full', 'sliding', 'none']) is None
    size, reason = ak.vllm_forced_block_size(['mla', 'mla'])
    assert size == 64 and 'FlashMLA' in reason


def test_llamacpp_dims_without_a_file():
    s = spec()
    assert ak.kind_of('full').llamacpp_dims(s, None, 0) == ak.LayerKV(1024, 1024, False)
    assert ak.kind_of('sliding').llamacpp_dims(s, None, 0) == ak.LayerKV(1024, 1024, True)
    assert ak.kind_of('mla').llamacpp_dims(s, None, 0) == ak.LayerKV(576, 512, False)
    assert ak.kind_of('none').llamacpp_dims(s, None, 0) == ak.LayerKV(0, 0, False)


def test_llamacpp_dims_from_the_file_per_layer():
    layout = GGUFLayout(file_type=None, block_bytes=[1] * 4, input_bytes=1, output_bytes=1, output_tied=False,
                        key_length=192, value_length=128, kv_heads_per_layer=[128, 64, 0, 8], n_tensors=1)
    s = spec()
    assert ak.kind_of('mla').llamacpp_dims(s, layout, 0) == ak.LayerKV(192 * 128, 128 * 128, False)
    assert ak.kind_of('sliding').llamacpp_dims(s, layout, 1) == ak.LayerKV(192 * 64, 128 * 64, True)
    assert ak.kind_of('none').llamacpp_dims(s, layout, 2) == ak.LayerKV(0, 0, False)


def test_v0_engine_plans_sliding_as_full_and_has_no_mla():
    assert [ak.kind_of(name).v0_kind for name in ak.LAYER_KINDS] == ['full', 'full', None, 'none', None]
