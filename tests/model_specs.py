# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the planner tests share, so each test file does not write it out again: ModelSpecs as
their config.json files state them (the field report's Llama-3.3-70B, and Llama-3.1-8B), NVML
card totals, a GPU list, and the field report's plan (Llama-3.3-70B, TP 4 on four A6000)."""

from __future__ import annotations

from ansible_collections.kvpin.fleet.plugins.module_utils.plan.model_spec import LAYER_FULL, ModelSpec
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.plan_types import Traffic
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.vllm_memory import plan_vllm

A6000_TOTAL = 51527024640          # NVML memory_total of an RTX A6000 (49140 MiB)
RTX4090_TOTAL = 25757220864        # NVML memory_total of an RTX 4090 (24564 MiB)
# The field report's traffic: prompt p99 11k, 2k output, 32 concurrent.
FIELD_TRAFFIC = Traffic(prompt_tokens_p99=11000, max_output_tokens=2000, max_concurrency=32)


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


def gpus(n, total=A6000_TOTAL, name='NVIDIA RTX A6000'):
    """n idle cards of one kind, as gpu_facts reports them."""
    return [dict(index=i, name=name, memory_total=total, memory_used=0, memory_free=total) for i in range(n)]


def field_plan(version='0.10.1.1', **knobs):
    """The field report's deployment planned with vLLM ``version`` (TP 4 unless knobs say)."""
    knobs.setdefault('tensor_parallel_size', 4)
    return plan_vllm(llama_70b(), gpus(4), FIELD_TRAFFIC, knobs, version)
