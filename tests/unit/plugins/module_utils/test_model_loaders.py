# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""model_loaders: HF config dicts, model directories, weight arithmetic, resolve_model."""

from __future__ import annotations

import json
import os
import struct

import pytest
from safetensors_files import write_safetensors  # pylint: disable=import-error

from ansible_collections.kvpin.fleet.plugins.module_utils.plan import model_loaders as ml
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.model_spec import (
    LAYER_FULL, LAYER_MLA, LAYER_NO_KV, LAYER_SLIDING, ModelSpec, ModelSpecError)

FIXTURES = os.path.join(os.path.dirname(__file__), '..', '..', '..', 'fixtures', 'models')

# Hand-countable Llama: hidden 8, 2 layers, 2 heads / 1 KV head of dim 4, FFN 16, vocab 10.
TINY_LLAMA = {
    'architectures': ['LlamaForCausalLM'], 'model_type': 'llama', 'torch_dtype': 'bfloat16',
    'num_hidden_layers': 2, 'hidden_size': 8, 'intermediate_size': 16,
    'num_attention_heads': 2, 'num_key_value_heads': 1, 'head_dim': 4, 'vocab_size': 10,
    'max_position_embeddings': 256, 'tie_word_embeddings': False,
}
# embed 10*8 + lm_head 10*8 + final norm 8
# + 2 layers * (q 8*8 + k 4*8 + v 4*8 + o 8*8 + gate/up/down 3*8*16 + 2 norms * 8)
TINY_LLAMA_PARAMS = 80 + 80 + 8 + 2 * (64 + 32 + 32 + 64 + 384 + 16)


def _cfg(base, **changes):
    cfg = dict(base)
    cfg.update(changes)
    return cfg


def test_tiny_llama_param_count_term_by_term():
    assert TINY_LLAMA_PARAMS == 1352
    spec = ml.spec_from_hf_config(TINY_LLAMA, 'tiny')
    assert spec.param_count == TINY_LLAMA_PARAMS
    assert spec.weight_bytes == 2 * TINY_LLAMA_PARAMS
    assert spec.weight_bytes_exact is False
    assert 'computed from config dimensions' in spec.weight_bytes_note
    assert spec.layer_kinds == [LAYER_FULL, LAYER_FULL]
    # replicated on every TP rank: 2 layer norms * 2 layers * 8 + final norm 8, at 2 B
    assert spec.replicated_bytes == (2 * 2 * 8 + 8) * 2


def test_tied_embeddings_drop_lm_head():
    tied = ml.spec_from_hf_config(_cfg(TINY_LLAMA, tie_word_embeddings=True), 'tied')
    assert tied.param_count == TINY_LLAMA_PARAMS - 80


def test_qwen2_adds_qkv_biases_without_a_flag():
    qwen = _cfg(TINY_LLAMA, architectures=['Qwen2ForCausalLM'], model_type='qwen2')
    # q bias 8 + k bias 4 + v bias 4 per layer
    assert ml.param_count(qwen) == TINY_LLAMA_PARAMS + 2 * 16


def test_qwen3_adds_qk_norms():
    qwen3 = _cfg(TINY_LLAMA, architectures=['Qwen3ForCausalLM'], model_type='qwen3')
    assert ml.param_count(qwen3) == TINY_LLAMA_PARAMS + 2 * (2 * 4)


def test_head_dim_defaults_to_hidden_over_heads():
    cfg = dict(TINY_LLAMA)
    del cfg['head_dim']
    assert ml.spec_from_hf_config(cfg, 't').head_dim == 4


def test_moe_counts_experts_router_and_no_dense_mlp():
    moe = _cfg(TINY_LLAMA, architectures=['MixtralForCausalLM'], model_type='mixtral',
               num_local_experts=4, num_experts_per_tok=2)
    spec = ml.spec_from_hf_config(moe, 'moe')
    dense_mlp = 2 * 3 * 8 * 16
    experts = 2 * 4 * 3 * 8 * 16
    router = 2 * 4 * 8
    assert spec.param_count == TINY_LLAMA_PARAMS - dense_mlp + experts + router
    assert spec.intermediate_size == 0
    assert (spec.num_experts, spec.num_experts_per_tok, spec.moe_intermediate_size) == (4, 2, 16)


def test_mla_spec_has_one_latent_kv_head():
    cfg = {
        'architectures': ['DeepseekV3ForCausalLM'], 'model_type': 'deepseek_v3',
        'num_hidden_layers': 3, 'hidden_size': 32, 'intermediate_size': 64,
        'moe_intermediate_size': 16, 'n_routed_experts': 4, 'n_shared_experts': 1,
        'num_experts_per_tok': 2, 'first_k_dense_replace': 1, 'num_attention_heads': 4,
        'q_lora_rank': 12, 'kv_lora_rank': 8, 'qk_rope_head_dim': 4, 'qk_nope_head_dim': 8,
        'v_head_dim': 8, 'vocab_size': 20, 'max_position_embeddings': 128,
        'topk_method': 'noaux_tc',
    }
    spec = ml.spec_from_hf_config(cfg, 'mla')
    assert spec.layer_kinds == [LAYER_MLA] * 3
    assert (spec.num_kv_heads, spec.head_dim) == (1, 8 + 4)
    assert (spec.kv_lora_rank, spec.qk_rope_head_dim) == (8, 4)
    h, n = 32, 3
    attn = (12 * h + 12 + 4 * 12 * 12       # q_a, q_a_norm, q_b (heads * (8 + 4))
            + 12 * h + 8                    # kv_a (kv_lora + rope), kv_a_norm
            + 4 * 16 * 8 + h * 4 * 8)       # kv_b (heads * (nope + v)), o
    dense = 3 * h * 64                      # first_k_dense_replace = 1 layer
    moe = 4 * h + 4 + 4 * 3 * h * 16 + 3 * h * 16   # router + bias, experts, shared expert
    expected = 2 * 20 * h + h + n * (attn + 2 * h) + 1 * dense + 2 * moe
    assert spec.param_count == expected
    assert spec.extra['first_k_dense_replace'] == 1


@pytest.mark.parametrize('cfg,kinds,window', [
    pytest.param(_cfg(TINY_LLAMA, architectures=['Gemma2ForCausalLM'], model_type='gemma2',
                      num_hidden_layers=4, sliding_window=4096),
                 [LAYER_SLIDING, LAYER_FULL, LAYER_SLIDING, LAYER_FULL], 4096, id='gemma2'),
    pytest.param({'architectures': ['Gemma3ForConditionalGeneration'], 'model_type': 'gemma3',
                  'text_config': _cfg(TINY_LLAMA, model_type='gemma3_text',
                                      num_hidden_layers=12, sliding_window=1024,
                                      sliding_window_pattern=6)},
                 ([LAYER_SLIDING] * 5 + [LAYER_FULL]) * 2, 1024, id='gemma3-text_config'),
    pytest.param(_cfg(TINY_LLAMA, architectures=['GptOssForCausalLM'], model_type='gpt_oss',
                      num_hidden_layers=4, sliding_window=128,
                      layer_types=['sliding_attention', 'full_attention'] * 2),
                 [LAYER_SLIDING, LAYER_FULL] * 2, 128, id='gpt-oss-layer_types'),
    pytest.param(_cfg(TINY_LLAMA, architectures=['Qwen2ForCausalLM'], model_type='qwen2',
                      sliding_window=131072, use_sliding_window=False),
                 [LAYER_FULL, LAYER_FULL], None, id='qwen2-sliding-off'),
    pytest.param(_cfg(TINY_LLAMA, architectures=['Qwen2ForCausalLM'], model_type='qwen2',
                      num_hidden_layers=3, sliding_window=64, use_sliding_window=True,
                      max_window_layers=2),
                 [LAYER_FULL, LAYER_FULL, LAYER_SLIDING], 64, id='qwen2-sliding-on'),
    pytest.param(_cfg(TINY_LLAMA, architectures=['MistralForCausalLM'], model_type='mistral',
                      sliding_window=4096),
                 [LAYER_SLIDING, LAYER_SLIDING], 4096, id='mistral-v0.1-window'),
    pytest.param(_cfg(TINY_LLAMA, architectures=['MistralForCausalLM'], model_type='mistral',
                      sliding_window=None),
                 [LAYER_FULL, LAYER_FULL], None, id='mistral-v0.3-no-window'),
    pytest.param(_cfg(TINY_LLAMA, layer_types=['linear_attention', 'full_attention']),
                 [LAYER_NO_KV, LAYER_FULL], None, id='linear-attention'),
])
def test_layer_kinds(cfg, kinds, window):
    spec = ml.spec_from_hf_config(cfg, 'x')
    assert spec.layer_kinds == kinds
    assert spec.sliding_window == window
    assert len(spec.layer_kinds) == spec.num_layers


def test_multimodal_text_config_is_read_and_noted():
    mm = {'architectures': ['Mistral3ForConditionalGeneration'], 'model_type': 'mistral3',
          'text_config': dict(TINY_LLAMA)}
    spec = ml.spec_from_hf_config(mm, 'mm')
    assert spec.architecture == 'Mistral3ForConditionalGeneration'
    assert spec.param_count == TINY_LLAMA_PARAMS
    assert 'vision tower not counted' in spec.weight_bytes_note
    assert spec.extra['multimodal'] is True


# ------------------------------------------------------------------ quantization schemes

LINEAR = ml.TensorGroup('w', ml.ROLE_LINEAR, out_features=256, in_features=512, count=3)
EXPERT = ml.TensorGroup('e', ml.ROLE_EXPERT, out_features=64, in_features=96, count=2)
EMBED = ml.TensorGroup('emb', ml.ROLE_EMBED, out_features=100, in_features=512, count=1)


def _scheme(qc):
    return ml.quant_scheme({'quantization_config': qc}, 2)


def test_awq_bytes_packed_values_scales_and_zeros():
    s = _scheme({'quant_method': 'awq', 'bits': 4, 'group_size': 128, 'zero_point': True})
    groups = 512 // 128
    per_tensor = 256 * 512 // 2 + groups * 256 * 2 + groups * 256 // 2
    assert ml.group_stored_bytes(LINEAR, s) == 3 * per_tensor
    assert ml.group_stored_bytes(EMBED, s) == 100 * 512 * 2


def test_gptq_bytes_add_qzeros_and_g_idx():
    s = _scheme({'quant_method': 'gptq', 'bits': 4, 'group_size': 128, 'desc_act': True})
    groups = 512 // 128
    per_tensor = 256 * 512 // 2 + groups * 256 * 2 + groups * 256 // 2 + 512 * 4
    assert ml.group_stored_bytes(LINEAR, s) == 3 * per_tensor
    assert 'desc_act=True' in s.describe


def test_gptq_group_size_minus_one_is_one_group():
    s = _scheme({'quant_method': 'gptq', 'bits': 4, 'group_size': -1})
    assert ml.group_stored_bytes(LINEAR, s) == 3 * (256 * 512 // 2 + 256 * 2 + 256 // 2
                                                    + 512 * 4)


def test_awq_uneven_groups_round_up():
    s = _scheme({'quant_method': 'awq', 'bits': 4, 'group_size': 128})
    odd = ml.TensorGroup('w', ml.ROLE_LINEAR, 8, 200, 1)   # 200 inputs -> 2 groups
    assert ml.group_stored_bytes(odd, s) == 8 * 200 // 2 + 2 * 8 * 2 + 2 * 8 // 2


def test_fp8_block_scales_are_fp32_per_128x128():
    s = _scheme({'quant_method': 'fp8', 'weight_block_size': [128, 128]})
    assert ml.group_stored_bytes(LINEAR, s) == 3 * (256 * 512 + 2 * 4 * 4)
    assert ml.group_stored_bytes(EMBED, s) == 100 * 512 * 2


def test_fp8_compressed_tensors_per_channel():
    s = _scheme({'quant_method': 'compressed-tensors', 'config_groups': {'g': {
        'weights': {'num_bits': 8, 'type': 'float', 'strategy': 'channel'}}}})
    assert ml.group_stored_bytes(LINEAR, s) == 3 * (256 * 512 + 256 * 2)


def test_mxfp4_only_experts_are_4bit():
    s = _scheme({'quant_method': 'mxfp4'})
    # 96 inputs = 3 blocks of 32: 16 B values + 1 B scale each
    assert ml.group_stored_bytes(EXPERT, s) == 2 * 64 * 3 * 17
    assert ml.group_stored_bytes(LINEAR, s) == 3 * 256 * 512 * 2


def test_unsupported_quantization_names_the_model_field():
    with pytest.raises(ModelSpecError) as err:
        ml.spec_from_hf_config(_cfg(TINY_LLAMA, quantization_config={
            'quant_method': 'bitsandbytes'}), 'bnb')
    assert err.value.field == 'model'
    assert 'bitsandbytes' in str(err.value) and 'weight_bytes' in str(err.value)


def test_given_weight_bytes_win_over_computed():
    spec = ml.resolve_model(_cfg(TINY_LLAMA, weight_bytes=12345))
    assert spec.weight_bytes == 12345
    assert spec.extra['computed_weight_bytes'] == 2 * TINY_LLAMA_PARAMS


def test_unsupported_quantization_accepted_with_weight_bytes():
    spec = ml.resolve_model(_cfg(TINY_LLAMA, weight_bytes=777, quantization_config={
        'quant_method': 'bitsandbytes'}))
    assert (spec.weight_bytes, spec.quantization) == (777, 'bitsandbytes')
    assert spec.param_count == TINY_LLAMA_PARAMS
    assert spec.extra['computed_weight_bytes'] is None


# ------------------------------------------------------------------ validation

@pytest.mark.parametrize('key,value', [
    ('hidden_size', 0), ('num_hidden_layers', -1), ('num_attention_heads', 'many'),
    ('vocab_size', 10 ** 9), ('num_hidden_layers', 100000), ('head_dim', 2.5),
    ('intermediate_size', True),
])
def test_bad_dimension_names_its_key(key, value):
    with pytest.raises(ModelSpecError) as err:
        ml.spec_from_hf_config(_cfg(TINY_LLAMA, **{key: value}), 'bad')
    assert err.value.field == 'model'
    assert key in str(err.value)


def test_missing_key_is_named():
    cfg = dict(TINY_LLAMA)
    del cfg['vocab_size']
    with pytest.raises(ModelSpecError, match="'vocab_size' is missing"):
        ml.spec_from_hf_config(cfg, 'x')


def test_heads_not_multiple_of_kv_heads():
    with pytest.raises(ModelSpecError, match='not a multiple'):
        ml.spec_from_hf_config(_cfg(TINY_LLAMA, num_attention_heads=3,
                                    num_key_value_heads=2), 'x')


def test_layer_types_length_mismatch():
    with pytest.raises(ModelSpecError, match='layer_types has 1 entries for 2 layers'):
        ml.spec_from_hf_config(_cfg(TINY_LLAMA, layer_types=['full_attention']), 'x')


def test_unknown_dtype_is_named():
    with pytest.raises(ModelSpecError, match='torch_dtype'):
        ml.spec_from_hf_config(_cfg(TINY_LLAMA, torch_dtype='int3'), 'x')


# ------------------------------------------------------------------ resolve_model

def test_resolve_alias_and_repo_id_case_insensitive():
    by_alias = ml.resolve_model('LLAMA-3.3-70B')
    by_id = ml.resolve_model('meta-llama/llama-3.3-70b-instruct')
    assert by_alias.name == by_id.name == 'meta-llama/Llama-3.3-70B-Instruct'
    assert by_alias.source == 'catalog'


def test_resolve_unknown_name_lists_closest_matches():
    with pytest.raises(ModelSpecError) as err:
        ml.resolve_model('qwen3-33b')
    assert err.value.field == 'model'
    message = str(err.value)
    assert "unknown model 'qwen3-33b'" in message
    assert 'closest matches' in message and 'qwen3-32b' in message


def test_resolve_dict_takes_name_and_weight_bytes():
    spec = ml.resolve_model(_cfg(TINY_LLAMA, name='my-tiny', weight_bytes=999))
    assert (spec.name, spec.weight_bytes, spec.source) == ('my-tiny', 999, 'hf_config')


@pytest.mark.parametrize('bad', [42, None, '', ['x']])
def test_resolve_rejects_other_types(bad):
    with pytest.raises(ModelSpecError, match='expected a catalog name'):
        ml.resolve_model(bad)


def test_resolve_missing_path():
    with pytest.raises(ModelSpecError, match='does not exist'):
        ml.resolve_model('/nonexistent/model-dir')


def test_resolve_passes_specs_through():
    spec = ml.resolve_model('qwen3-0.6b')
    assert ml.resolve_model(spec) is spec
    assert isinstance(spec, ModelSpec)


def test_non_positive_weight_bytes_rejected():
    with pytest.raises(ModelSpecError) as err:
        ml.resolve_model(_cfg(TINY_LLAMA, weight_bytes=-5))
    assert err.value.field == 'weight_bytes'


# ------------------------------------------------------------------ model directories

def _write_safetensors(path, payload_bytes, tensors=None):
    """A structurally valid safetensors file (tests/safetensors_files.py), BF16 tensors.
    ``tensors``: {name: bytes}; default one tensor 'w' of ``payload_bytes``."""
    write_safetensors(path, tensors or {'w': payload_bytes})


def test_model_dir_with_index_is_exact():
    spec = ml.resolve_model(os.path.join(FIXTURES, 'tiny-llama-indexed'))
    assert spec.source == 'model_dir'
    assert spec.name == 'tiny-llama-indexed'
    assert spec.weight_bytes == 2704 == 2 * TINY_LLAMA_PARAMS
    assert spec.weight_bytes_exact is True
    assert 'total_size' in spec.weight_bytes_note


def test_model_dir_without_weights_computes_from_dims():
    spec = ml.spec_from_model_dir(os.path.join(FIXTURES, 'tiny-qwen2-noweights'))
    # embed 50*16 (tied) + final norm 16 + 4 layers * (q 256+16, k 128+8, v 128+8, o 256,
    # mlp 3*16*32, 2 norms * 16)
    assert spec.param_count == 800 + 16 + 4 * (272 + 136 + 136 + 256 + 1536 + 32)
    assert spec.weight_bytes_exact is False
    assert spec.layer_kinds == [LAYER_FULL, LAYER_FULL, LAYER_FULL, LAYER_SLIDING]


def test_model_dir_sums_safetensors_payloads(tmp_path):
    (tmp_path / 'config.json').write_text(json.dumps(TINY_LLAMA))
    _write_safetensors(str(tmp_path / 'model-00001-of-00002.safetensors'), 1000)
    _write_safetensors(str(tmp_path / 'model-00002-of-00002.safetensors'), 704)
    # Mistral-format duplicate of the same weights: engines load one or the other.
    _write_safetensors(str(tmp_path / 'consolidated.safetensors'), 1704)
    spec = ml.resolve_model(str(tmp_path))
    assert spec.weight_bytes == 1704
    assert spec.weight_bytes_exact is True
    assert 'sum of tensor sizes in 2 safetensors header(s)' == spec.weight_bytes_note


def test_model_dir_headers_skip_tied_lm_head_and_mtp_layers(tmp_path):
    # Qwen3-1.7B's checkpoint stores lm_head.weight although its embeddings are tied, and
    # DeepSeek-V3's stores an MTP layer past num_hidden_layers: vLLM loads neither.
    (tmp_path / 'config.json').write_text(json.dumps(_cfg(TINY_LLAMA, tie_word_embeddings=True)))
    _write_safetensors(str(tmp_path / 'model.safetensors'), 0, tensors={
        'model.embed_tokens.weight': 160, 'model.layers.0.mlp.up_proj.weight': 1200,
        'model.layers.1.mlp.up_proj.weight': 1200, 'lm_head.weight': 160,
        'model.layers.2.eh_proj.weight': 512})
    spec = ml.resolve_model(str(tmp_path))
    assert spec.weight_bytes == 160 + 1200 + 1200
    assert '160 B not counted (lm_head stored although tie_word_embeddings' in \
        spec.weight_bytes_note
    assert '512 B not counted (layers past num_hidden_layers' in spec.weight_bytes_note


def test_model_dir_index_minus_tied_lm_head(tmp_path):
    cfg = _cfg(TINY_LLAMA, tie_word_embeddings=True)
    (tmp_path / 'config.json').write_text(json.dumps(cfg))
    (tmp_path / 'model.safetensors.index.json').write_text(json.dumps({
        'metadata': {'total_size': 5000},
        'weight_map': {'lm_head.weight': 'model-00002-of-00002.safetensors',
                       'model.embed_tokens.weight': 'model-00001-of-00002.safetensors'}}))
    spec = ml.resolve_model(str(tmp_path))
    assert spec.weight_bytes == 5000 - 10 * 8 * 2
    assert 'minus 160 B of lm_head' in spec.weight_bytes_note


def test_fp32_checkpoint_is_sized_as_loaded_in_16_bit(tmp_path):
    cfg = _cfg(TINY_LLAMA, torch_dtype='float32')
    assert ml.spec_from_hf_config(cfg, 'f32').weight_bytes == 2 * TINY_LLAMA_PARAMS
    (tmp_path / 'config.json').write_text(json.dumps(cfg))
    _write_safetensors(str(tmp_path / 'model.safetensors'), 4 * TINY_LLAMA_PARAMS)
    spec = ml.resolve_model(str(tmp_path))
    assert spec.weight_bytes == 2 * TINY_LLAMA_PARAMS
    assert 'fp32 checkpoint (%d B stored)' % (4 * TINY_LLAMA_PARAMS) in spec.weight_bytes_note


def test_model_dir_partial_shards_are_refused_even_with_an_index_total(tmp_path):
    # issue 39: a partial download is refused; the index's total is what nothing on disk backs
    (tmp_path / 'config.json').write_text(json.dumps(TINY_LLAMA))
    (tmp_path / 'model.safetensors.index.json').write_text(json.dumps({
        'metadata': {'total_size': 2704},
        'weight_map': {'a': 'model-00001-of-00002.safetensors',
                       'b': 'model-00002-of-00002.safetensors'}}))
    _write_safetensors(str(tmp_path / 'model-00001-of-00002.safetensors'), 100)
    with pytest.raises(ModelSpecError, match=r'1 shard\(s\) missing \(model-00002-of-00002.safetensors\)'):
        ml.resolve_model(str(tmp_path))


def test_model_dir_bad_safetensors_header(tmp_path):
    (tmp_path / 'config.json').write_text(json.dumps(TINY_LLAMA))
    (tmp_path / 'model.safetensors').write_bytes(struct.pack('<Q', 4) + b'{no}')
    with pytest.raises(ModelSpecError, match='header cannot be parsed'):
        ml.resolve_model(str(tmp_path))


def test_model_dir_index_without_total_size_falls_back(tmp_path):
    (tmp_path / 'config.json').write_text(json.dumps(TINY_LLAMA))
    (tmp_path / 'model.safetensors.index.json').write_text('{"weight_map": {}}')
    _write_safetensors(str(tmp_path / 'model.safetensors'), 2704)
    assert ml.resolve_model(str(tmp_path)).weight_bytes == 2704


def test_model_dir_truncated_safetensors(tmp_path):
    (tmp_path / 'config.json').write_text(json.dumps(TINY_LLAMA))
    (tmp_path / 'model.safetensors').write_bytes(struct.pack('<Q', 10 ** 6) + b'{}')
    with pytest.raises(ModelSpecError, match='exceeds the file size'):
        ml.resolve_model(str(tmp_path))


def test_model_dir_without_config(tmp_path):
    with pytest.raises(ModelSpecError) as err:
        ml.resolve_model(str(tmp_path))
    assert err.value.field == 'model' and 'config.json' in str(err.value)


def test_model_dir_with_broken_config(tmp_path):
    (tmp_path / 'config.json').write_text('{not json')
    with pytest.raises(ModelSpecError, match='not valid JSON'):
        ml.resolve_model(str(tmp_path))


def test_catalog_name_wins_over_a_same_named_directory(tmp_path, monkeypatch):
    # The controller plans catalog names in its own working directory: a local folder called
    # like the HF id (a downloaded snapshot, say) must not be read instead of the catalog.
    (tmp_path / 'meta-llama' / 'Llama-3.3-70B-Instruct').mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    spec = ml.resolve_model("meta-llama/Llama-3.3-70B-Instruct")
    assert spec.param_count == 70553706496


def test_home_relative_paths_are_expanded(tmp_path, monkeypatch):
    monkeypatch.setenv('HOME', str(tmp_path))
    with pytest.raises(ModelSpecError) as error:
        ml.resolve_model("~/models/missing.gguf")
    assert str(tmp_path) in str(error.value)
