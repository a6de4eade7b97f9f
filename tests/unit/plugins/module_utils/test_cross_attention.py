"""The cross-attention layer kind (encoder-decoder models, Whisper): its vLLM KV cost, the
Whisper config loader, the vLLM plan and the refusals (old vLLM, pipeline stages, llama.cpp).

Hand arithmetic follows vLLM's vllm/v1/kv_cache_interface.py (0.10.2+):
  AttentionSpec.page_size_bytes = 2 x block_size x num_kv_heads x head_size x dtype bytes
  FullAttentionSpec.max_memory_usage_bytes  = cdiv(max_model_len, block_size) x page
  CrossAttentionSpec.max_memory_usage_bytes = cdiv(max_num_encoder_input_tokens, block_size) x page
with max_num_encoder_input_tokens = Whisper's max_source_positions (1500)."""
from __future__ import annotations

import json

import pytest
from safetensors_files import write_safetensors  # pylint: disable=import-error

from ansible_collections.kvpin.fleet.plugins.module_utils.plan import attention_kinds as ak
from ansible_collections.kvpin.fleet.plugins.module_utils.plan import llamacpp_memory as lm
from ansible_collections.kvpin.fleet.plugins.module_utils.plan import model_loaders as ml
from ansible_collections.kvpin.fleet.plugins.module_utils.plan import vllm_memory as vm
from ansible_collections.kvpin.fleet.plugins.module_utils.plan import vllm_profile as prof
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.model_catalog import CATALOG
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.model_spec import ModelSpecError, check_spec
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.plan_types import PlanInputError, Traffic
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.serving_plan import plan_vllm_engine
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.vllm_memory import plan_vllm

RTX4090_TOTAL = 25757220864        # NVML memory_total of an RTX 4090 (24564 MiB)
WHISPER = 'openai/whisper-large-v3'
# whisper-large-v3 config.json: d_model 1280, 32 + 32 layers, 20 heads (head_dim 64), 1500 encoder
# positions, 448 decoder positions; 2 B (fp16) KV
PAGE_PER_TOKEN_LAYER = 2 * 20 * 64 * 2                 # K and V, 20 heads x 64, 2 B: 5,120 B
PAGE_LAYER = 16 * PAGE_PER_TOKEN_LAYER                 # page_size_bytes at block size 16: 81,920 B
CROSS_BLOCKS = -(-1500 // 16)                          # 94
CROSS_BYTES_PER_REQUEST = 32 * CROSS_BLOCKS * PAGE_LAYER    # 246,415,360 B (235 MiB)
SELF_BYTES_AT_448 = 32 * -(-448 // 16) * PAGE_LAYER       # 73,400,320 B (70 MiB)


def whisper_config(**over):
    config = {k: v for k, v in CATALOG[WHISPER].items() if not k.startswith('_')}
    config.update(over)
    return config


def whisper():
    return ml.resolve_model(WHISPER)


def rtx4090(n=1):
    return [dict(index=i, name='NVIDIA GeForce RTX 4090', memory_total=RTX4090_TOTAL, memory_used=0,
                 memory_free=RTX4090_TOTAL) for i in range(n)]


TRAFFIC = Traffic(prompt_tokens_p99=200, max_output_tokens=200, max_concurrency=8)


# ---------------------------------------------------------------- the kind

def test_cross_is_a_kind_of_its_own():
    kind = ak.kind_of('cross')
    assert isinstance(kind, ak.CrossAttention) and kind.caches_kv and kind.kv_heads and not kind.slides
    assert kind.vllm_since == prof.CROSS_ATTENTION_SINCE == (0, 10, 2)
    assert kind.v0_kind is None and kind.llamacpp_refusal and kind.vllm_pipeline_refusal


@pytest.mark.parametrize('tp, expected', [(1, 2 * 20 * 64 * 2), (2, 2 * 10 * 64 * 2), (4, 2 * 5 * 64 * 2)])
def test_bytes_per_token_are_k_and_v_per_kv_head_per_rank(tp, expected):
    assert ak.kind_of('cross').vllm_bytes_per_token(whisper(), tp, 2) == expected
    assert ak.kind_of('cross').vllm_bytes_per_token(whisper(), tp, 1) == expected // 2     # fp8 KV


@pytest.mark.parametrize('tokens', [1, 16, 448, 1500, 100000])
def test_blocks_per_request_are_fixed_by_the_encoder_length(tokens):
    cross = ak.kind_of('cross')
    assert cross.vllm_blocks_per_request(tokens, 16, 0, 2048, 1500) == CROSS_BLOCKS == 94
    assert cross.vllm_blocks_per_request(tokens, 32, 0, 2048, 1500) == 47
    assert cross.vllm_blocks_per_request(tokens, 16, 0, 2048, 1) == 1


@pytest.mark.parametrize('encoder_len', [0, -1])
def test_blocks_per_request_without_an_encoder_length_is_refused(encoder_len):
    with pytest.raises(PlanInputError) as raised:
        ak.kind_of('cross').vllm_blocks_per_request(448, 16, 0, 2048, encoder_len)
    assert 'max_encoder_len' in str(raised.value)


def test_whisper_kv_layout_is_two_groups_and_the_cross_group_ignores_the_decoder_length():
    layout = vm.kv_layout(whisper(), 1, 2, 16, 2048)
    assert layout.groups == {'full': 1, 'cross': 1} and layout.group_size == 32 and layout.hybrid
    assert layout.bytes_per_block == 32 * PAGE_LAYER == 2621440             # 2.50 MiB
    assert layout.bytes_per_token == 64 * PAGE_PER_TOKEN_LAYER == 327680
    assert layout.blocks_per_request(448) == 28 + 94
    assert layout.blocks_per_request(1) == 1 + 94
    assert layout.blocks_per_request(448) * layout.bytes_per_block == SELF_BYTES_AT_448 + CROSS_BYTES_PER_REQUEST
    assert SELF_BYTES_AT_448 + CROSS_BYTES_PER_REQUEST == 319815680
    assert 'ceil(max_encoder_len 1500 / bs) = 94 blocks' in layout.rule


# ---------------------------------------------------------------- the loader

def test_whisper_large_v3_spec_from_its_config():
    spec = whisper()
    assert spec.architecture == 'WhisperForConditionalGeneration'
    assert spec.num_layers == 64 and spec.layer_kinds == ['full', 'cross'] * 32
    assert (spec.hidden_size, spec.num_attention_heads, spec.num_kv_heads, spec.head_dim) == (1280, 20, 20, 64)
    assert spec.max_encoder_len == 1500 and spec.max_position_embeddings == 448
    assert spec.tie_word_embeddings and spec.quantization is None
    # transformers modeling_whisper, tensor by tensor: conv front end, 32 encoder layers, 32
    # decoder layers (self + cross attention), learned positions, proj_out tied
    d, ff = 1280, 5120
    encoder = (128 * d * 3 + d) + (d * d * 3 + d) + 1500 * d + 32 * (4 * d * d + 3 * d + 2 * d * ff + ff + d + 4 * d) + 2 * d
    decoder = 51866 * d + 448 * d + 32 * (8 * d * d + 6 * d + 2 * d * ff + ff + d + 6 * d) + 2 * d
    assert spec.param_count == encoder + decoder == 1543490560
    assert spec.param_count == pytest.approx(1.55e9, rel=0.005)      # model card: large-v3 1550 M
    assert spec.weight_bytes == 2 * spec.param_count                  # fp16 checkpoint
    assert 0 < spec.replicated_bytes < spec.weight_bytes
    assert ml.resolve_model('whisper-large-v3').name == WHISPER


def test_proj_out_is_tied_whatever_the_config_says():
    # vllm/model_executor/models/whisper.py: proj_out.tie_weights(embed_tokens), proj_out. skipped on load
    tied = ml.spec_from_hf_config(whisper_config(), 'w')
    untied = ml.spec_from_hf_config(whisper_config(tie_word_embeddings=False), 'w')
    assert untied.param_count == tied.param_count and untied.tie_word_embeddings


def _write_safetensors(path, tensors):
    """A structurally valid safetensors file (tests/safetensors_files.py) of F16 tensors."""
    write_safetensors(path, tensors, dtype='F16')


def test_a_whisper_model_directory_loads_with_its_safetensors_bytes(tmp_path):
    # a small Whisper (533,760 B of weights by its dimensions): the headers must hold about that
    (tmp_path / 'config.json').write_text(json.dumps(whisper_config(
        encoder_layers=4, decoder_layers=2, d_model=64, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=100, max_source_positions=150,
        max_target_positions=44, num_mel_bins=8)))
    _write_safetensors(str(tmp_path / 'model.safetensors'), {
        'model.encoder.layers.3.fc1.weight': 300000, 'model.decoder.layers.1.fc1.weight': 200000,
        'model.decoder.embed_tokens.weight': 60000, 'proj_out.weight': 60000})
    spec = ml.resolve_model(str(tmp_path))
    assert spec.source == 'model_dir' and spec.layer_kinds == ['full', 'cross'] * 2
    # encoder layer 3 is past the 2 decoder layers and still loaded; proj_out is tied, not loaded
    assert spec.weight_bytes == 560000 and spec.weight_bytes_exact
    assert '60000 B not counted (lm_head stored although tie_word_embeddings is true)' in spec.weight_bytes_note


def test_a_whisper_model_directory_with_a_bad_number_is_refused_naming_it(tmp_path):
    (tmp_path / 'config.json').write_text(json.dumps(whisper_config(max_source_positions='1500')))
    _write_safetensors(str(tmp_path / 'model.safetensors'), {'w': 10})
    with pytest.raises(ModelSpecError) as raised:
        ml.resolve_model(str(tmp_path))
    assert "'max_source_positions'" in str(raised.value)


WHISPER_KEYS = ('d_model', 'encoder_layers', 'decoder_layers', 'encoder_attention_heads',
                'decoder_attention_heads', 'encoder_ffn_dim', 'decoder_ffn_dim', 'vocab_size',
                'max_source_positions', 'max_target_positions', 'num_mel_bins')


@pytest.mark.parametrize('key', WHISPER_KEYS)
@pytest.mark.parametrize('value', [-1500, 0, 1 << 40, '1500', 1500.0, True, [1500]])
def test_bad_numbers_are_refused_naming_the_key(key, value):
    with pytest.raises(ModelSpecError) as raised:
        ml.spec_from_hf_config(whisper_config(**{key: value}), 'w')
    assert "'%s'" % key in str(raised.value)


@pytest.mark.parametrize('key', WHISPER_KEYS)
def test_a_missing_key_is_refused_naming_it(key):
    config = whisper_config()
    del config[key]
    with pytest.raises(ModelSpecError) as raised:
        ml.spec_from_hf_config(config, 'w')
    assert "config key '%s' is missing" % key in str(raised.value)


@pytest.mark.parametrize('over, words', [
    ({'decoder_layers': 129}, "'decoder_layers' = 129 is out of range (1..128)"),   # 258 KV layers
    ({'max_source_positions': (1 << 20) + 1}, "'max_source_positions'"),
    ({'d_model': 1290}, "'d_model' (1290) is not a multiple of 'encoder_attention_heads' (20)"),
    ({'decoder_attention_heads': 24}, "'d_model' (1280) is not a multiple of 'decoder_attention_heads' (24)"),
    ({'encoder_attention_heads': 24}, "'encoder_attention_heads' (24)"),
    ({'tie_word_embeddings': 'yes'}, "'tie_word_embeddings' must be true or false"),
    ({'quantization_config': {'quant_method': 'awq'}}, "'quantization_config'"),
    ({'torch_dtype': 'int4'}, 'torch_dtype'),
])
def test_adversarial_configs_are_refused(over, words):
    with pytest.raises(ModelSpecError) as raised:
        ml.spec_from_hf_config(whisper_config(**over), 'w')
    assert words in str(raised.value)


@pytest.mark.parametrize('value, words', [
    (None, 'max_encoder_len is missing but 32 layers are cross-attention'),
    (0, 'max_encoder_len = 0 is out of range'),
    ('1500', 'max_encoder_len must be an integer'),
    (1 << 21, 'is out of range'),
])
def test_check_spec_refuses_cross_layers_without_a_sane_encoder_length(value, words):
    import dataclasses
    with pytest.raises(ModelSpecError) as raised:
        check_spec(dataclasses.replace(whisper(), max_encoder_len=value))
    assert words in str(raised.value)


def test_given_weight_bytes_are_checked_too():
    assert ml.spec_from_hf_config(whisper_config(), 'w', weight_bytes=3087007232).weight_bytes == 3087007232
    with pytest.raises(ModelSpecError) as raised:
        ml.spec_from_hf_config(whisper_config(), 'w', weight_bytes=-1)
    assert raised.value.field == 'weight_bytes'


# ---------------------------------------------------------------- the vLLM plan

def test_whisper_plan_fits_a_24_gb_card_and_counts_cross_blocks_per_request():
    plan = plan_vllm(whisper(), rtx4090(), TRAFFIC, {}, '0.11.0')
    assert plan.feasible, plan.not_fitting
    assert plan.settings['max_model_len'] == 448                    # max_target_positions
    pool = plan.settings['kv_cache_memory_bytes']
    assert pool % (32 * PAGE_LAYER) == 0
    blocks = pool // (32 * PAGE_LAYER)
    # concurrency = usable blocks (one null block held back) / (self blocks at 448 + the fixed 94
    # cross blocks), never blocks / 28
    assert plan.max_concurrency_at_max_len == pytest.approx((blocks - 1) / (28 + 94), abs=0.01)
    assert plan.kv_cache_tokens <= (blocks - 1) * 448 // (28 + 94)
    assert any('ceil(max_encoder_len 1500 / bs) = 94 blocks' in rule for rule in plan.rules)
    # vLLM turns chunked prefill off for encoder-decoder models: the plan neither claims nor passes it
    assert plan.settings['enable_chunked_prefill'] is False
    assert not any(arg.startswith('--enable-chunked-prefill') for arg in plan.args)
    assert 'encoder-decoder' in plan.reasons['enable_chunked_prefill']


def test_cross_blocks_do_not_shrink_with_a_shorter_max_model_len():
    spec = whisper()
    short, full = (vm.kv_layout(spec, 1, 2, 16, 2048).blocks_per_request(n) for n in (64, 448))
    assert full - short == 28 - 4            # only the self-attention group follows the length
    assert short == 4 + 94


def test_tensor_parallel_halves_the_per_rank_kv():
    one = vm.kv_layout(whisper(), 1, 2, 16, 2048)
    two = vm.kv_layout(whisper(), 2, 2, 16, 2048)
    assert two.bytes_per_block * 2 == one.bytes_per_block
    assert two.blocks_per_request(448) == one.blocks_per_request(448)


def test_a_batch_below_max_model_len_is_refused_without_chunked_prefill():
    with pytest.raises(PlanInputError) as raised:
        plan_vllm(whisper(), rtx4090(), TRAFFIC, {'max_num_batched_tokens': 256}, '0.11.0')
    assert raised.value.field == 'max_num_batched_tokens' and '448' in str(raised.value)


@pytest.mark.parametrize('version', ['0.10.1.1', '0.9.2', '0.8.5', '0.7.3', '0.6.1'])
def test_vllm_before_0_10_2_is_refused_naming_the_release(version):
    with pytest.raises(PlanInputError) as raised:
        plan_vllm(whisper(), rtx4090(), TRAFFIC, {}, version)
    assert 'cross-attention' in str(raised.value) and '0.10.2' in str(raised.value)


def test_pipeline_stages_are_refused():
    with pytest.raises(PlanInputError) as raised:
        plan_vllm_engine(whisper(), rtx4090(2), TRAFFIC, {'pipeline_parallel_size': 2}, '0.11.0')
    assert raised.value.field == 'pipeline_parallel_size' and 'SupportsPP' in str(raised.value)


# ---------------------------------------------------------------- llama.cpp

@pytest.mark.parametrize('backend, version', [('llama-box', 'v0.0.171'), ('llama.cpp', 'b6000')])
def test_llamacpp_refuses_naming_the_kind(backend, version):
    with pytest.raises(PlanInputError) as raised:
        lm.plan_llamacpp(whisper(), rtx4090(), TRAFFIC, {'quantization': 'Q8_0'}, backend, version)
    message = str(raised.value)
    assert raised.value.field == 'model' and "'cross'" in message and '32 cross-attention' in message
    assert 'vLLM' in message


def test_the_encoder_pass_bounds_the_forward_activation_from_below():
    # the profile run passes max_encoder_len (1500) positions through the encoder: with fewer
    # batched tokens than that, the forward term is sized on 1500 tokens
    spec = whisper()
    _peak, small, explain = vm.activation_peak(spec, 1, 8, 512)
    assert small['activation_forward_pass'] == 1500 * 2 * (4 * 1280 + 3 * 5120) == 61440000
    assert 'the encoder pass: max_encoder_len' in explain
    _peak, default, explain = vm.activation_peak(spec, 1, 8, 2048)
    assert default['activation_forward_pass'] == 2048 * 2 * (4 * 1280 + 3 * 5120)
    assert 'encoder pass' not in explain
    plan = plan_vllm(spec, rtx4090(), TRAFFIC, {'max_num_batched_tokens': 512}, '0.11.0')
    assert plan.feasible and plan.memory[0].terms['activation_forward_pass'] == 61440000
