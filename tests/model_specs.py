# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The ModelSpecs the planner tests share, as their config.json files state them (the field
report's Llama-3.3-70B, and Llama-3.1-8B), so each test file does not write them out again."""

from __future__ import annotations

from ansible_collections.kvpin.fleet.plugins.module_utils.plan.model_spec import LAYER_FULL, ModelSpec


def llama_70b(**over):
    """meta-llama/Llama-3.3-70B-Instruct, bf16; ``over`` replaces fields."""
    fields = dict(
        name='meta-llama/Llama-3.3-70B-Instruct', source='test', architecture='LlamaForCausalLM',
        num_layers=80, hidden_size=8192, intermediate_size=28672, num_attention_heads=64,
        num_kv_heads=8, head_dim=128, vocab_size=128256, max_position_embeddings=131072,
        tie_word_embeddings=False, dtype_bytes=2, layer_kinds=[LAYER_FULL] * 80,
        param_count=70553706496, weight_bytes=141107412992)
    fields.update(over)
    return ModelSpec(**fields)


def llama_8b():
    """meta-llama/Llama-3.1-8B-Instruct, bf16."""
    return ModelSpec(
        name='meta-llama/Llama-3.1-8B-Instruct', source='test', architecture='LlamaForCausalLM',
        num_layers=32, hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
        num_kv_heads=8, head_dim=128, vocab_size=128256, max_position_embeddings=131072,
        tie_word_embeddings=False, dtype_bytes=2, layer_kinds=[LAYER_FULL] * 32,
        param_count=8030261248, weight_bytes=16060522496)
