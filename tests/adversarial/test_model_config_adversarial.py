# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Hostile Hugging Face configs, as a dict (task argument) and as config.json in a model
directory (issue 11 items 6 and 8): negative or absurd geometry, wrong types (bools are ints
in Python, floats are not counts), NaN/Infinity, huge and deeply nested files, bad
quantization fields. Each is refused with a message naming the key."""

from __future__ import annotations

import json

import pytest

from model_files import SMALL_LLAMA, TINY_LLAMA, params

from ansible_collections.kvpin.fleet.plugins.module_utils.plan import model_loaders as ml
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.model_spec import ModelSpecError
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.serving_plan import serving_plan_result


def cfg(**overrides):
    config = dict(SMALL_LLAMA)
    for key, value in overrides.items():
        if value is KeyError:
            config.pop(key, None)
        else:
            config[key] = value
    return config


def refused(config, *fragments, field='model'):
    with pytest.raises(ModelSpecError) as err:
        ml.resolve_model(config)
    assert err.value.field == field
    for fragment in fragments:
        assert fragment in str(err.value), str(err.value)
    # and through the task's entry point: a normal failure naming the field, no traceback
    result = serving_plan_result(params(model=config))
    assert result['failed'] and result['field'] == field
    for fragment in fragments:
        assert fragment in result['msg']


def test_negative_sliding_window_is_refused_not_planned():
    # the example: feasible=true with negative kv_cache_tokens
    refused(cfg(sliding_window=-4096), "'sliding_window' = -4096 is out of range")
    refused(cfg(model_type='gemma2', architectures=['Gemma2ForCausalLM'], sliding_window=-1),
            "'sliding_window' = -1 is out of range")


@pytest.mark.parametrize('key, value, fragment', [
    # bools are ints in Python: True must not pass as 1 layer
    ('num_hidden_layers', True, "'num_hidden_layers' must be an integer, got True"),
    ('num_attention_heads', False, "'num_attention_heads' must be an integer, got False"),
    # floats where ints go, integral or not, and the non-finite ones JSON lets through
    ('hidden_size', 512.0, "'hidden_size' must be an integer, got 512.0"),
    ('vocab_size', 1000.5, "'vocab_size' must be an integer"),
    ('num_hidden_layers', float('nan'), "'num_hidden_layers' must be an integer, got nan"),
    ('hidden_size', float('inf'), "'hidden_size' must be an integer, got inf"),
    ('intermediate_size', '1024', "'intermediate_size' must be an integer, got '1024'"),
    ('num_key_value_heads', [2], "'num_key_value_heads' must be an integer"),
    ('head_dim', None, None),   # absent head_dim: derived, fine
    ('num_hidden_layers', 0, "'num_hidden_layers' = 0 is out of range"),
    ('num_hidden_layers', -3, "'num_hidden_layers' = -3 is out of range"),
    ('num_hidden_layers', 10 ** 6, "'num_hidden_layers' = 1000000 is out of range (1..256)"),
    ('hidden_size', 10 ** 12, "'hidden_size' = 1000000000000 is out of range"),
    ('max_position_embeddings', 0, "'max_position_embeddings' = 0 is out of range"),
    ('num_key_value_heads', 16, 'num_attention_heads (8) is not a multiple of num_key_value_heads (16)'),
    ('num_key_value_heads', 3, 'not a multiple'),
    ('vocab_size', KeyError, "'vocab_size' is missing"),
    ('torch_dtype', 'float8', "torch_dtype 'float8' is not one of"),
    ('torch_dtype', ['bfloat16'], 'torch_dtype'),
    ('sliding_window', 'big', "'sliding_window' must be an integer"),
    ('sliding_window', True, "'sliding_window' must be an integer, got True"),
    ('sliding_window', 1 << 40, "'sliding_window' = 1099511627776 is out of range"),
])
def test_geometry_of_the_wrong_type_or_range_is_refused_by_key(key, value, fragment):
    config = cfg(**{key: value})
    if fragment is None:
        assert ml.resolve_model(config).head_dim == 64
        return
    refused(config, fragment)


@pytest.mark.parametrize('overrides, fragment', [
    (dict(layer_types='sliding_attention'), "'layer_types' must be a list of strings"),
    (dict(layer_types=[1, 2, 3, 4]), "'layer_types' must be a list of strings"),
    (dict(layer_types=['full_attention'] * 3), 'layer_types has 3 entries for 4 layers'),
    (dict(layer_types=['sliding_attention'] * 4), "'sliding_window' is missing"),
    (dict(num_local_experts=8, num_experts_per_tok=16, moe_intermediate_size=64),
     "'num_experts_per_tok' = 16 is more than the 8 experts"),
    (dict(num_local_experts=8, num_experts_per_tok=2, moe_intermediate_size=64,
          first_k_dense_replace=9), "'first_k_dense_replace' = 9 is more than the 4 layers"),
    (dict(num_local_experts=8, num_experts_per_tok=2, moe_intermediate_size=64,
          n_shared_experts='one'), "'n_shared_experts' must be an integer"),
    (dict(num_local_experts=-8), "'num_experts' = -8 is out of range"),
    (dict(num_local_experts=1 << 20, num_experts_per_tok=2), "'num_experts' = 1048576 is out of range"),
    (dict(kv_lora_rank=-512), "'kv_lora_rank' = -512 is out of range"),
    (dict(model_type='qwen2', use_sliding_window=True, sliding_window=64, max_window_layers=-1),
     "'max_window_layers' = -1 is out of range"),
    (dict(model_type='gemma3_text', sliding_window=64, sliding_window_pattern=2.5),
     "'sliding_window_pattern' must be an integer"),
    (dict(num_nextn_predict_layers='x'), "'num_nextn_predict_layers' must be an integer"),
])
def test_derived_geometry_is_checked_too(overrides, fragment):
    refused(cfg(**overrides), fragment)


@pytest.mark.parametrize('qc, fragment', [
    ('fp8', 'quantization_config must be a dict'),
    ({'quant_method': 7}, 'quantization_config.quant_method must be a string'),
    ({'quant_method': 'awq', 'bits': '4'}, 'quantization_config.bits must be one of 2, 3, 4, 8'),
    ({'quant_method': 'gptq', 'bits': 5}, 'quantization_config.bits must be one of'),
    ({'quant_method': 'gptq', 'bits': True}, 'quantization_config.bits must be one of'),
    ({'quant_method': 'awq', 'bits': 4, 'group_size': 'x'}, 'quantization_config.group_size must be an integer'),
    ({'quant_method': 'awq', 'bits': 4, 'group_size': -7}, 'quantization_config.group_size = -7 is out of range'),
    ({'quant_method': 'awq', 'bits': 4, 'group_size': 1 << 30}, 'quantization_config.group_size'),
    ({'quant_method': 'fp8', 'weight_block_size': [128, 'a']}, 'weight_block_size must be two block sizes'),
    ({'quant_method': 'fp8', 'weight_block_size': [0, 128]}, 'weight_block_size must be two block sizes'),
    ({'quant_method': 'fp8', 'weight_block_size': 128}, 'weight_block_size must be two block sizes'),
    ({'quant_method': 'compressed-tensors', 'config_groups': ['g']}, 'config_groups must map'),
    ({'quant_method': 'compressed-tensors', 'config_groups': {'g': {'weights': 8}}}, 'config_groups must map'),
    ({'quant_method': 'compressed-tensors', 'config_groups': {'g': {'weights': {'num_bits': 'eight'}}}},
     'config_groups.weights.num_bits must be one of'),
    ({'quant_method': 'banana'}, "quant_method 'banana' is not supported"),
])
def test_quantization_fields_are_checked(qc, fragment):
    refused(cfg(quantization_config=qc), fragment)


@pytest.mark.parametrize('weight_bytes, fragment', [
    (-1, 'must be a positive integer number of bytes, got -1'),
    (True, 'got True'), (1.5e9, 'got 1500000000.0'), ('1G', "got '1G'"),
    (1 << 60, 'is more than any checkpoint holds'),
])
def test_weight_bytes_given_with_the_model_are_checked(weight_bytes, fragment):
    refused(cfg(weight_bytes=weight_bytes), fragment, field='weight_bytes')


@pytest.mark.parametrize('model', [['llama'], 42, 3.5, True, {'hidden_size': 8}])
def test_model_of_the_wrong_shape_is_refused(model):
    result = serving_plan_result(params(model=model))
    assert result['failed'] and result['field'] == 'model', result


# ---- config.json in a model directory

def write_config(tmp_path, text):
    (tmp_path / 'config.json').write_bytes(text if isinstance(text, bytes) else text.encode())
    return str(tmp_path)


@pytest.mark.parametrize('constant', ['NaN', 'Infinity', '-Infinity'])
def test_config_json_with_nan_or_infinity_is_refused(tmp_path, constant):
    text = json.dumps(TINY_LLAMA).replace('"hidden_size": 8', '"hidden_size": %s' % constant)
    with pytest.raises(ModelSpecError, match='not valid JSON: %s is not a JSON number' % constant):
        ml.resolve_model(write_config(tmp_path, text))


def test_huge_config_json_is_refused_without_reading_it_all(tmp_path):
    text = json.dumps(dict(TINY_LLAMA, padding='x' * (8 * 1024 * 1024)))
    with pytest.raises(ModelSpecError, match='is larger than 4194304 bytes'):
        ml.resolve_model(write_config(tmp_path, text))


def test_deeply_nested_config_json_is_refused(tmp_path):
    text = '{"a": ' + '[' * 100000 + ']' * 100000 + '}'
    with pytest.raises(ModelSpecError, match='nested too deeply'):
        ml.resolve_model(write_config(tmp_path, text))


def test_config_json_that_is_not_utf8_is_refused_without_echo(tmp_path):
    with pytest.raises(ModelSpecError) as err:
        ml.resolve_model(write_config(tmp_path, b'\xff\xfesecret-bytes'))
    assert 'not UTF-8' in str(err.value) and 'secret' not in str(err.value)


def test_config_json_that_is_a_list_is_refused(tmp_path):
    with pytest.raises(ModelSpecError, match='must hold a JSON object'):
        ml.resolve_model(write_config(tmp_path, '[1, 2]'))


def test_config_json_with_bool_layers_is_refused(tmp_path):
    text = json.dumps(dict(TINY_LLAMA, num_hidden_layers=True))
    with pytest.raises(ModelSpecError, match="'num_hidden_layers' must be an integer, got True"):
        ml.resolve_model(write_config(tmp_path, text))
