# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Built-in model catalog: HF repo id -> the ``config.json`` keys the planner reads.

Data only. Values are copied from each repo's ``config.json`` on the Hugging Face Hub
(``_source``); keys the planner does not read (rope scaling, token ids, ...) are left
out. ``_weight_bytes`` is the checkpoint's ``metadata.total_size`` from
``model.safetensors.index.json`` where a public copy of that number was found
(``_weight_bytes_source``); without it the loader computes stored bytes from the
dimensions. Keys starting with ``_`` are catalog metadata, not config.
"""

from __future__ import annotations

HF = 'https://huggingface.co/%s/blob/main/config.json'


def _total(size, where):
    """``_weight_bytes`` keys: a checkpoint's metadata.total_size and where it was found
    (public repositories quoting the index; searched by the exact number)."""
    return {'_weight_bytes': size, '_weight_bytes_source': where}


def _entry(repo, base, **overrides):
    """A config dict for ``repo``: ``base`` plus overrides, with its source URL."""
    entry = dict(base)
    entry.update(overrides)
    entry.setdefault('_source', HF % repo)
    return repo, entry


_LLAMA31_8B = {
    'architectures': ['LlamaForCausalLM'], 'model_type': 'llama', 'torch_dtype': 'bfloat16',
    'num_hidden_layers': 32, 'hidden_size': 4096, 'intermediate_size': 14336,
    'num_attention_heads': 32, 'num_key_value_heads': 8, 'head_dim': 128,
    'vocab_size': 128256, 'max_position_embeddings': 131072, 'tie_word_embeddings': False,
    'attention_bias': False,
}
_LLAMA_70B = dict(_LLAMA31_8B, num_hidden_layers=80, hidden_size=8192, intermediate_size=28672,
                  num_attention_heads=64, num_key_value_heads=8)
_LLAMA31_405B = dict(_LLAMA31_8B, num_hidden_layers=126, hidden_size=16384,
                     intermediate_size=53248, num_attention_heads=128, num_key_value_heads=8)
# Llama 3.1 8B / 70B totals: quoted in public repos (find_string "total_size": 16060522496 /
# 141107412992; e.g. the zml examples and an O'Reilly book transcript), equal to 2 B x the
# published parameter counts 8,030,261,248 and 70,553,706,496.
_TOTAL_8B = 16060522496
_TOTAL_70B = 141107412992
_TOTAL_SRC_8B = ('meta-llama/Llama-3.1-8B model.safetensors.index.json, quoted e.g. in '
                 'zml/zml examples (find_string "total_size": 16060522496)')
_TOTAL_SRC_70B = ('meta-llama Llama-3.x-70B model.safetensors.index.json, quoted in public '
                  'repos (find_string "total_size": 141107412992)')

_QWEN2_7B = {
    'architectures': ['Qwen2ForCausalLM'], 'model_type': 'qwen2', 'torch_dtype': 'bfloat16',
    'num_hidden_layers': 28, 'hidden_size': 3584, 'intermediate_size': 18944,
    'num_attention_heads': 28, 'num_key_value_heads': 4, 'vocab_size': 152064,
    'max_position_embeddings': 131072, 'tie_word_embeddings': False,
    'use_sliding_window': False, 'sliding_window': 131072, 'max_window_layers': 28,
}
_QWEN2_72B = dict(_QWEN2_7B, num_hidden_layers=80, hidden_size=8192, intermediate_size=29568,
                  num_attention_heads=64, num_key_value_heads=8, max_window_layers=80)
_QWEN25_14B = dict(_QWEN2_7B, num_hidden_layers=48, hidden_size=5120, intermediate_size=13824,
                   num_attention_heads=40, num_key_value_heads=8, max_window_layers=48)
_QWEN25_32B = dict(_QWEN2_7B, num_hidden_layers=64, hidden_size=5120, intermediate_size=27648,
                   num_attention_heads=40, num_key_value_heads=8, max_window_layers=64)

_QWEN3_BASE = {
    'architectures': ['Qwen3ForCausalLM'], 'model_type': 'qwen3', 'torch_dtype': 'bfloat16',
    'head_dim': 128, 'vocab_size': 151936, 'max_position_embeddings': 40960,
    'use_sliding_window': False, 'sliding_window': None, 'attention_bias': False,
}
_QWEN3_MOE = dict(_QWEN3_BASE, architectures=['Qwen3MoeForCausalLM'], model_type='qwen3_moe',
                  tie_word_embeddings=False, decoder_sparse_step=1, mlp_only_layers=[])

_MISTRAL_SMALL_24B_TEXT = {
    'num_hidden_layers': 40, 'hidden_size': 5120, 'intermediate_size': 32768,
    'num_attention_heads': 32, 'num_key_value_heads': 8, 'head_dim': 128,
    'vocab_size': 131072, 'tie_word_embeddings': False, 'sliding_window': None,
}

_GEMMA2_BASE = {
    'architectures': ['Gemma2ForCausalLM'], 'model_type': 'gemma2', 'torch_dtype': 'bfloat16',
    'vocab_size': 256000, 'max_position_embeddings': 8192, 'sliding_window': 4096,
    'tie_word_embeddings': True,
}
_GEMMA3_TEXT_BASE = {
    'model_type': 'gemma3_text', 'vocab_size': 262208, 'max_position_embeddings': 131072,
    'sliding_window': 1024, 'sliding_window_pattern': 6, 'head_dim': 256,
    'tie_word_embeddings': True, 'torch_dtype': 'bfloat16',
}

_DEEPSEEK_V3 = {
    'architectures': ['DeepseekV3ForCausalLM'], 'model_type': 'deepseek_v3',
    'torch_dtype': 'bfloat16', 'num_hidden_layers': 61, 'hidden_size': 7168,
    'intermediate_size': 18432, 'moe_intermediate_size': 2048, 'n_routed_experts': 256,
    'n_shared_experts': 1, 'num_experts_per_tok': 8, 'first_k_dense_replace': 3,
    'moe_layer_freq': 1, 'topk_method': 'noaux_tc', 'num_attention_heads': 128,
    'num_key_value_heads': 128, 'q_lora_rank': 1536, 'kv_lora_rank': 512,
    'qk_rope_head_dim': 64, 'qk_nope_head_dim': 128, 'v_head_dim': 128,
    'vocab_size': 129280, 'max_position_embeddings': 163840, 'tie_word_embeddings': False,
    'num_nextn_predict_layers': 1,
    'quantization_config': {'activation_scheme': 'dynamic', 'fmt': 'e4m3',
                            'quant_method': 'fp8', 'weight_block_size': [128, 128]},
}

_GPT_OSS_20B = {
    'architectures': ['GptOssForCausalLM'], 'model_type': 'gpt_oss', 'torch_dtype': 'bfloat16',
    'num_hidden_layers': 24, 'hidden_size': 2880, 'intermediate_size': 2880,
    'num_attention_heads': 64, 'num_key_value_heads': 8, 'head_dim': 64,
    'num_local_experts': 32, 'num_experts_per_tok': 4, 'experts_per_token': 4,
    'vocab_size': 201088, 'max_position_embeddings': 131072, 'sliding_window': 128,
    'tie_word_embeddings': False, 'attention_bias': True,
    'layer_types': ['sliding_attention', 'full_attention'] * 12,
    'quantization_config': {
        'quant_method': 'mxfp4',
        'modules_to_not_convert': ['model.layers.*.self_attn', 'model.layers.*.mlp.router',
                                   'model.embed_tokens', 'lm_head']},
}

CATALOG = dict([
    # ---- Meta Llama 3.x
    _entry('meta-llama/Llama-3.1-8B', _LLAMA31_8B,
           _weight_bytes=_TOTAL_8B, _weight_bytes_source=_TOTAL_SRC_8B),
    _entry('meta-llama/Llama-3.1-8B-Instruct', _LLAMA31_8B,
           _weight_bytes=_TOTAL_8B, _weight_bytes_source=_TOTAL_SRC_8B),
    _entry('meta-llama/Llama-3.1-70B', _LLAMA_70B,
           _weight_bytes=_TOTAL_70B, _weight_bytes_source=_TOTAL_SRC_70B),
    _entry('meta-llama/Llama-3.3-70B-Instruct', _LLAMA_70B,
           _weight_bytes=_TOTAL_70B, _weight_bytes_source=_TOTAL_SRC_70B),
    _entry('meta-llama/Llama-3.1-405B', _LLAMA31_405B),
    # Compressed-tensors FP8 (per-channel weight scales, dynamic per-token activations);
    # lm_head is in the ignore list.
    _entry('RedHatAI/Llama-3.3-70B-Instruct-FP8-dynamic', _LLAMA_70B, quantization_config={
        'quant_method': 'compressed-tensors', 'format': 'float-quantized',
        'ignore': ['lm_head'],
        'config_groups': {'group_0': {
            'targets': ['Linear'],
            'weights': {'num_bits': 8, 'type': 'float', 'strategy': 'channel',
                        'symmetric': True, 'dynamic': False},
            'input_activations': {'num_bits': 8, 'type': 'float', 'strategy': 'token',
                                  'symmetric': True, 'dynamic': True}}}}),
    # GPTQ int4, group 128, act-order (desc_act), symmetric (as users of the checkpoint
    # describe it); GPTQ kernels run in fp16, deployments pass --dtype half.
    _entry('hugging-quants/Meta-Llama-3.1-70B-Instruct-GPTQ-INT4', _LLAMA_70B,
           torch_dtype='float16', quantization_config={
               'quant_method': 'gptq', 'bits': 4, 'group_size': 128, 'desc_act': True,
               'sym': True}),

    # ---- Qwen2 / Qwen2.5
    _entry('Qwen/Qwen2-7B', _QWEN2_7B),
    _entry('Qwen/Qwen2-72B', _QWEN2_72B),
    # Qwen2-7B-Instruct: the Qwen2-7B config with a 32768-token max_position_embeddings.
    # Checked against the repo's config.json as a public model report quotes it in full
    # (find_string "Qwen2-7B-Instruct/config.json": hidden 3584, intermediate 18944, 28 layers,
    # 28 heads, 4 KV heads, vocab 152064, max_position_embeddings 32768, untied, bf16; its
    # tensor inventory: 339 tensors, 7,615,616,512 parameters).
    _entry('Qwen/Qwen2-7B-Instruct', _QWEN2_7B, max_position_embeddings=32768),
    _entry('Qwen/Qwen2.5-7B', _QWEN2_7B),
    _entry('Qwen/Qwen2.5-7B-Instruct', _QWEN2_7B, max_position_embeddings=32768,
           **_total(15231233024, 'Qwen2.5-7B-Instruct index total_size, quoted with the '
                                 'official config in a public metadata-sources note')),
    _entry('Qwen/Qwen2.5-14B', _QWEN25_14B),
    _entry('Qwen/Qwen2.5-14B-Instruct', _QWEN25_14B, max_position_embeddings=32768,
           **_total(29540067328, 'Qwen2.5-14B index total_size checked by a public script '
                                 '(14,770,033,664 params, 579 tensors)')),
    _entry('Qwen/Qwen2.5-32B', _QWEN25_32B,
           **_total(65527752704, 'Qwen/Qwen2.5-32B size_bytes / index total_size quoted in '
                                 'public repos (17 shards, 771 tensors)')),
    _entry('Qwen/Qwen2.5-32B-Instruct', _QWEN25_32B, max_position_embeddings=32768),
    _entry('Qwen/Qwen2.5-72B', _QWEN2_72B),
    _entry('Qwen/Qwen2.5-72B-Instruct', _QWEN2_72B, max_position_embeddings=32768,
           **_total(145412407296, 'Qwen2.5-72B-Instruct index total_size, quoted with the '
                                  'official config in a public metadata-sources note')),
    # AWQ checkpoint pads intermediate_size 29568 -> 29696 so that it splits into 128-wide
    # groups across tensor-parallel ranks.
    _entry('Qwen/Qwen2.5-72B-Instruct-AWQ', _QWEN2_72B, max_position_embeddings=32768,
           intermediate_size=29696, max_window_layers=70, torch_dtype='float16',
           quantization_config={'quant_method': 'awq', 'bits': 4, 'group_size': 128,
                                'version': 'gemm', 'zero_point': True,
                                'modules_to_not_convert': None}),

    # ---- Qwen3 dense (0.6B-4B tie embeddings)
    _entry('Qwen/Qwen3-0.6B', _QWEN3_BASE, num_hidden_layers=28, hidden_size=1024,
           intermediate_size=3072, num_attention_heads=16, num_key_value_heads=8,
           tie_word_embeddings=True, max_window_layers=28),
    _entry('Qwen/Qwen3-1.7B', _QWEN3_BASE, num_hidden_layers=28, hidden_size=2048,
           intermediate_size=6144, num_attention_heads=16, num_key_value_heads=8,
           tie_word_embeddings=True, max_window_layers=28),
    _entry('Qwen/Qwen3-4B', _QWEN3_BASE, num_hidden_layers=36, hidden_size=2560,
           intermediate_size=9728, num_attention_heads=32, num_key_value_heads=8,
           tie_word_embeddings=True, max_window_layers=36,
           **_total(8044936192, 'Qwen3-4B official weight bytes table in a public repo')),
    _entry('Qwen/Qwen3-8B', _QWEN3_BASE, num_hidden_layers=36, hidden_size=4096,
           intermediate_size=12288, num_attention_heads=32, num_key_value_heads=8,
           tie_word_embeddings=False, max_window_layers=36,
           **_total(16381470720, 'Qwen3-8B index total_size (399 tensors), quoted in public '
                                 'repos')),
    _entry('Qwen/Qwen3-14B', _QWEN3_BASE, num_hidden_layers=40, hidden_size=5120,
           intermediate_size=17408, num_attention_heads=40, num_key_value_heads=8,
           tie_word_embeddings=False, max_window_layers=40,
           **_total(29536614400, 'Qwen3-14B official weight bytes table in a public repo')),
    _entry('Qwen/Qwen3-32B', _QWEN3_BASE, num_hidden_layers=64, hidden_size=5120,
           intermediate_size=25600, num_attention_heads=64, num_key_value_heads=8,
           tie_word_embeddings=False, max_window_layers=64,
           _weight_bytes=65524246528,
           _weight_bytes_source='Qwen/Qwen3-32B model.safetensors.index.json (17 shards), '
                                'quoted verbatim in public repos (find_string '
                                '"total_size": 65524246528)'),
    # DeepSeek-R1-0528-Qwen3-8B: the Qwen3-8B architecture distilled from R1-0528 (its model
    # card: "distilling the chain-of-thought from DeepSeek-R1-0528 to post-train Qwen3 8B Base",
    # quoted in public GGUF READMEs). What is checked: the KV shape, by vLLM's own figure in
    # the solodba RTX 3090 log (benchmarks/data): 4.50 GiB for 32768 tokens = 147456 B/token =
    # 36 layers x 8 KV heads x 128 x 2 x 2 B; the 131072-token context, by Xinference's model
    # page for deepseek-r1-0528-qwen3 ("Context Length: 131072"). Not checked against the
    # repo's config.json (no public copy found): hidden/intermediate/vocab are Qwen3-8B's, so
    # the weights this entry gives are Qwen3-8B's until a config copy confirms them.
    _entry('deepseek-ai/DeepSeek-R1-0528-Qwen3-8B', _QWEN3_BASE, num_hidden_layers=36,
           hidden_size=4096, intermediate_size=12288, num_attention_heads=32,
           num_key_value_heads=8, tie_word_embeddings=False, max_window_layers=36,
           max_position_embeddings=131072),
    # ---- Qwen3 MoE
    _entry('Qwen/Qwen3-30B-A3B', _QWEN3_MOE, num_hidden_layers=48, hidden_size=2048,
           intermediate_size=6144, moe_intermediate_size=768, num_experts=128,
           num_experts_per_tok=8, num_attention_heads=32, num_key_value_heads=4,
           max_window_layers=48,
           **_total(61064245248, 'Qwen3-30B-A3B index total_size (16 shards), quoted in '
                                 'public repos')),
    _entry('Qwen/Qwen3-235B-A22B', _QWEN3_MOE, num_hidden_layers=94, hidden_size=4096,
           intermediate_size=12288, moe_intermediate_size=1536, num_experts=128,
           num_experts_per_tok=8, num_attention_heads=64, num_key_value_heads=4,
           max_window_layers=94,
           **_total(470187269120, 'Qwen3-235B-A22B index metadata.total_size, matched '
                                  'against an independent tensor inventory in a public repo')),

    # ---- Mistral
    _entry('mistralai/Mistral-7B-Instruct-v0.3', {
        'architectures': ['MistralForCausalLM'], 'model_type': 'mistral',
        'torch_dtype': 'bfloat16', 'num_hidden_layers': 32, 'hidden_size': 4096,
        'intermediate_size': 14336, 'num_attention_heads': 32, 'num_key_value_heads': 8,
        'head_dim': 128, 'vocab_size': 32768, 'max_position_embeddings': 32768,
        'sliding_window': None, 'tie_word_embeddings': False},
        **_total(14496047104, 'Mistral-7B-v0.3 index total_size, quoted in public repos')),
    _entry('mistralai/Mistral-Small-24B-Instruct-2501', _MISTRAL_SMALL_24B_TEXT,
           architectures=['MistralForCausalLM'], model_type='mistral', torch_dtype='bfloat16',
           max_position_embeddings=32768),
    # Multimodal: Pixtral vision tower + projector (~0.4B) besides the text decoder.
    _entry('mistralai/Mistral-Small-3.2-24B-Instruct-2506', {
        'architectures': ['Mistral3ForConditionalGeneration'], 'model_type': 'mistral3',
        'torch_dtype': 'bfloat16',
        'text_config': dict(_MISTRAL_SMALL_24B_TEXT, model_type='mistral',
                            max_position_embeddings=131072)}),
    _entry('mistralai/Mixtral-8x7B-Instruct-v0.1', {
        'architectures': ['MixtralForCausalLM'], 'model_type': 'mixtral',
        'torch_dtype': 'bfloat16', 'num_hidden_layers': 32, 'hidden_size': 4096,
        'intermediate_size': 14336, 'num_attention_heads': 32, 'num_key_value_heads': 8,
        'num_local_experts': 8, 'num_experts_per_tok': 2, 'vocab_size': 32000,
        'max_position_embeddings': 32768, 'sliding_window': None,
        'tie_word_embeddings': False},
        **_total(93405585408, 'Mixtral-8x7B index total_size, quoted in public repos')),

    # ---- Gemma 2 / 3 (gated repos: config mirrored in public repos)
    _entry('google/gemma-2-9b', _GEMMA2_BASE, num_hidden_layers=42, hidden_size=3584,
           intermediate_size=14336, num_attention_heads=16, num_key_value_heads=8,
           head_dim=256,
           **_total(18483411968, 'gemma-2-9b index total_size (464 tensors, 4 shards), quoted '
                                 'in public repos')),
    _entry('google/gemma-2-27b', _GEMMA2_BASE, num_hidden_layers=46, hidden_size=4608,
           intermediate_size=36864, num_attention_heads=32, num_key_value_heads=16,
           head_dim=128),
    _entry('google/gemma-3-12b-it', {
        'architectures': ['Gemma3ForConditionalGeneration'], 'model_type': 'gemma3',
        'torch_dtype': 'bfloat16',
        'text_config': dict(_GEMMA3_TEXT_BASE, num_hidden_layers=48, hidden_size=3840,
                            intermediate_size=15360, num_attention_heads=16,
                            num_key_value_heads=8)}),
    _entry('google/gemma-3-27b-it', {
        'architectures': ['Gemma3ForConditionalGeneration'], 'model_type': 'gemma3',
        'torch_dtype': 'bfloat16',
        'text_config': dict(_GEMMA3_TEXT_BASE, num_hidden_layers=62, hidden_size=5376,
                            intermediate_size=21504, num_attention_heads=32,
                            num_key_value_heads=16, head_dim=128)}),

    # ---- Microsoft
    _entry('microsoft/phi-4', {
        'architectures': ['Phi3ForCausalLM'], 'model_type': 'phi3', 'torch_dtype': 'bfloat16',
        'num_hidden_layers': 40, 'hidden_size': 5120, 'intermediate_size': 17920,
        'num_attention_heads': 40, 'num_key_value_heads': 10, 'vocab_size': 100352,
        'max_position_embeddings': 16384, 'sliding_window': None,
        'tie_word_embeddings': False},
        **_total(29319014400, 'microsoft/phi-4 index total_size, quoted in public repos')),

    # ---- DeepSeek (MLA, FP8 block-quantized checkpoints; one MTP layer vLLM skips)
    _entry('deepseek-ai/DeepSeek-V3', _DEEPSEEK_V3),
    _entry('deepseek-ai/DeepSeek-R1', _DEEPSEEK_V3),

    # ---- OpenAI gpt-oss (MXFP4 experts, alternating sliding(128)/full layers)
    _entry('openai/gpt-oss-20b', _GPT_OSS_20B, _weight_bytes=13761264768,
           _weight_bytes_source='openai/gpt-oss-20b model.safetensors.index.json, quoted in '
                                'public repos (find_string "total_size": 13761264768)'),
    _entry('openai/gpt-oss-120b', _GPT_OSS_20B, num_hidden_layers=36, num_local_experts=128,
           layer_types=['sliding_attention', 'full_attention'] * 18,
           _weight_bytes=65248815744,
           _weight_bytes_source='openai/gpt-oss-120b safetensors tensor bytes 65,248,815,744 '
                                '(files 65,248,893,184 with headers), quoted in a public '
                                'inventory test (find_string 65248815744)'),

    # ---- OpenAI Whisper (encoder-decoder: per decoder layer one self- and one cross-attention KV
    # layer over max_source_positions = 1500 encoder positions; one model.safetensors, no index:
    # stored bytes computed, 1,543,490,560 params x 2 B). tie_word_embeddings is absent from the
    # config (WhisperConfig default true: proj_out is the token embedding).
    _entry('openai/whisper-large-v3', {
        'architectures': ['WhisperForConditionalGeneration'], 'model_type': 'whisper', 'torch_dtype': 'float16',
        'd_model': 1280, 'encoder_layers': 32, 'decoder_layers': 32, 'num_hidden_layers': 32,
        'encoder_attention_heads': 20, 'decoder_attention_heads': 20, 'encoder_ffn_dim': 5120,
        'decoder_ffn_dim': 5120, 'vocab_size': 51866, 'num_mel_bins': 128,
        'max_source_positions': 1500, 'max_target_positions': 448}),
])

# Short names -> catalog name (matched case-insensitively, like catalog names).
ALIASES = {
    'llama-3.1-8b': 'meta-llama/Llama-3.1-8B',
    'llama-3.1-8b-instruct': 'meta-llama/Llama-3.1-8B-Instruct',
    'llama-3.1-70b': 'meta-llama/Llama-3.1-70B',
    'llama-3.3-70b': 'meta-llama/Llama-3.3-70B-Instruct',
    'llama-3.3-70b-instruct': 'meta-llama/Llama-3.3-70B-Instruct',
    'llama-3.1-405b': 'meta-llama/Llama-3.1-405B',
    'llama-3.3-70b-fp8': 'RedHatAI/Llama-3.3-70B-Instruct-FP8-dynamic',
    'llama-3.1-70b-gptq-int4': 'hugging-quants/Meta-Llama-3.1-70B-Instruct-GPTQ-INT4',
    'qwen2-7b': 'Qwen/Qwen2-7B',
    'qwen2-72b': 'Qwen/Qwen2-72B',
    'qwen2.5-7b': 'Qwen/Qwen2.5-7B-Instruct',
    'qwen2.5-14b': 'Qwen/Qwen2.5-14B-Instruct',
    'qwen2.5-32b': 'Qwen/Qwen2.5-32B-Instruct',
    'qwen2.5-72b': 'Qwen/Qwen2.5-72B-Instruct',
    'qwen2.5-72b-awq': 'Qwen/Qwen2.5-72B-Instruct-AWQ',
    'qwen3-0.6b': 'Qwen/Qwen3-0.6B',
    'qwen3-1.7b': 'Qwen/Qwen3-1.7B',
    'qwen3-4b': 'Qwen/Qwen3-4B',
    'qwen3-8b': 'Qwen/Qwen3-8B',
    'qwen3-14b': 'Qwen/Qwen3-14B',
    'qwen3-32b': 'Qwen/Qwen3-32B',
    'qwen3-30b-a3b': 'Qwen/Qwen3-30B-A3B',
    'qwen3-235b-a22b': 'Qwen/Qwen3-235B-A22B',
    'mistral-7b': 'mistralai/Mistral-7B-Instruct-v0.3',
    'mistral-small-24b': 'mistralai/Mistral-Small-24B-Instruct-2501',
    'mistral-small-3.2-24b': 'mistralai/Mistral-Small-3.2-24B-Instruct-2506',
    'mixtral-8x7b': 'mistralai/Mixtral-8x7B-Instruct-v0.1',
    'gemma-2-9b': 'google/gemma-2-9b',
    'gemma-2-27b': 'google/gemma-2-27b',
    'gemma-3-12b': 'google/gemma-3-12b-it',
    'gemma-3-27b': 'google/gemma-3-27b-it',
    'phi-4': 'microsoft/phi-4',
    'deepseek-v3': 'deepseek-ai/DeepSeek-V3',
    'deepseek-r1': 'deepseek-ai/DeepSeek-R1',
    'gpt-oss-20b': 'openai/gpt-oss-20b',
    'gpt-oss-120b': 'openai/gpt-oss-120b',
    'whisper-large-v3': 'openai/whisper-large-v3',
}
