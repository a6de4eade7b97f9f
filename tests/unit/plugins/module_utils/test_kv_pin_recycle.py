# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A recycled vLLM instance keeps its KV pool (issue 13, item 4).

The watchdog recycles an instance with DELETE /model-instances/{id}; GPUStack recreates it from
the same model record, so the recycled instance runs the record's backend_parameters. Where the
vLLM version has --kv-cache-memory-bytes (0.10.2+) the plan pins the pool there by default, so
the recycled instance gets the first start's pool even when its torch.compile runs cold (which
a profiled budget charges as activation, vllm#54383). Before 0.10.2 the plan says why it cannot,
pins --gpu-memory-utilization only, and charges a cold-compile margin inside the budget."""

from __future__ import annotations

import pytest

from model_specs import llama_70b  # pylint: disable=import-error
from ansible_collections.kvpin.fleet.plugins.module_utils.gpustack import records as rec
from ansible_collections.kvpin.fleet.plugins.module_utils.plan import vllm_memory as vm
from ansible_collections.kvpin.fleet.plugins.module_utils.plan import vllm_profile as prof
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.plan_types import Traffic
from ansible_collections.kvpin.fleet.plugins.module_utils.units import GiB, fmt_bytes

A6000_TOTAL = 51527024640
FLAG = '--kv-cache-memory-bytes='
TRAFFIC = Traffic(prompt_tokens_p99=11000, max_output_tokens=2000, max_concurrency=32)


def gpus(used=0):
    """Four A6000s; ``used`` bytes per GPU held by a running instance (what gpu_facts reports
    on a rerun while the deployment serves)."""
    return [dict(index=i, name='NVIDIA RTX A6000', memory_total=A6000_TOTAL, memory_used=used,
                 memory_free=A6000_TOTAL - used) for i in range(4)]


def plan(version, used=0, **knobs):
    knobs.setdefault('tensor_parallel_size', 4)
    return vm.plan_vllm(llama_70b(), gpus(used), TRAFFIC, knobs, version)


def pinned_value(args):
    values = [a[len(FLAG):] for a in args if a.startswith(FLAG)]
    assert len(values) <= 1, args
    return int(values[0]) if values else None


def model_record(p):
    """The model record gpustack_model writes for a plan (what GPUStack restarts from)."""
    return rec.desired_model_fields(dict(
        name='llama-70b', source='huggingface', huggingface_repo_id='meta-llama/Llama-3.3-70B-Instruct',
        backend='vLLM', backend_version=p.backend_version, backend_parameters=p.args,
        vram_claim_bytes=p.vram_claim_bytes))


def recycle(record):
    """What a recycled instance is started with: the watchdog DELETEs the instance, GPUStack's
    model controller recreates the replica from the unchanged model record; its argv is the
    record's backend_parameters."""
    return list(record['backend_parameters'])


@pytest.mark.parametrize('version', ['0.10.2', '0.11.0', '0.18.0', '0.20.0', '0.33.0'])
def test_recycled_instance_carries_the_first_starts_kv_bytes(version):
    first = plan(version)
    assert first.feasible
    record = model_record(first)
    pinned = pinned_value(record['backend_parameters'])
    assert pinned is not None and pinned > 0
    # The rerun after a recycle sees the new instance's memory in use: same plan, same record,
    # so the deploy play changes nothing and GPUStack keeps restarting with the same pool.
    rerun = plan(version, used=40 * GiB)
    assert rerun.args == first.args
    assert rec.plan_model_change(record, model_record(rerun), 'present')['action'] == 'none'
    assert pinned_value(recycle(record)) == pinned == first.settings['kv_cache_memory_bytes']
    # vLLM still checks free >= total x util at startup with the pool pinned (init_device), so a
    # recycled instance starts only once its predecessor's memory is released: the plan says so
    requested = vm.util_bytes(first.memory[0].total, first.settings['gpu_memory_utilization'])
    assert not any('free at startup' in w for w in first.warnings)
    assert sum('free at startup' in w and 'previous instance' in w for w in rerun.warnings) == 4
    assert any(fmt_bytes(requested) in w for w in rerun.warnings)
    for mem in first.memory:
        assert mem.kv_cache == pinned
        assert mem.terms['cold_compile_margin'] == 0


@pytest.mark.parametrize('version', ['0.10.2', '0.20.0', '0.33.0'])
def test_pinned_bytes_never_exceed_what_the_budget_leaves(version):
    p = plan(version)
    pinned = p.settings['kv_cache_memory_bytes']
    for mem in p.memory:
        requested = vm.util_bytes(mem.total, p.settings['gpu_memory_utilization'])
        charged = mem.weights + mem.activation + mem.non_torch
        if 'INSIDE' in mem.explain['cuda_graph']:
            charged += mem.cuda_graph
        assert pinned <= requested - charged
        assert requested - charged - pinned < mem.terms['kv_bytes_per_block']   # whole blocks only
        assert pinned % mem.terms['kv_bytes_per_block'] == 0
        assert mem.budget == charged + pinned
    reason = p.reasons['kv_cache_memory_bytes']
    assert reason.startswith('pinned (default; vLLM %s has --kv-cache-memory-bytes' % version)
    for term in ('weights', 'activation', 'non-torch', 'recycled instance'):
        assert term in reason
    assert ('CUDA graphs' in reason) == prof.accounting(prof.parse_version(version)).cuda_graphs.startswith('in')


@pytest.mark.parametrize('version', ['0.8.5', '0.9.2', '0.10.1.1'])
def test_before_0_10_2_no_flag_the_plan_says_why_and_charges_a_cold_margin(version):
    first = plan(version)
    record = model_record(first)
    assert pinned_value(recycle(record)) is None
    assert 'kv_cache_memory_bytes' not in first.settings
    reason = first.reasons['kv_cache_memory_bytes']
    assert reason.startswith('not passed: vLLM %s has no --kv-cache-memory-bytes (vLLM >= 0.10.2)' % version)
    assert '--gpu-memory-utilization=%g is pinned explicitly' % first.settings['gpu_memory_utilization'] in reason
    assert '--gpu-memory-utilization=%g' % first.settings['gpu_memory_utilization'] in record['backend_parameters']
    for mem in first.memory:
        margin = mem.terms['cold_compile_margin']
        requested = vm.util_bytes(mem.total, first.settings['gpu_memory_utilization'])
        charged = mem.weights + mem.activation + mem.non_torch      # graphs outside before 0.20
        warm_kv = requested - charged                                 # what a warm profile leaves
        assert mem.budget == requested
        assert margin == -(-warm_kv * vm.COLD_COMPILE_KV_FRACTION_X1000 // 1000) > 0
        assert mem.terms['kv_budget'] == warm_kv - margin
        assert mem.kv_cache <= mem.terms['kv_budget']
        assert 'cold-compile margin' in mem.explain['kv_cache']


def test_the_cold_margin_costs_kv_compared_with_the_warm_budget():
    # Same deployment, same util: the unpinned plan holds fewer blocks than the pinned one by
    # about the margin (5 % of the KV budget), the side that does not promise KV it lacks.
    pinned = plan('0.10.2')
    unpinned = plan('0.10.2', pin_kv_cache_memory=False)
    assert pinned_value(unpinned.args) is None
    assert unpinned.reasons['kv_cache_memory_bytes'].startswith(
        'not passed: pin_kv_cache_memory false (set by the user)')
    assert unpinned.kv_cache_tokens < pinned.kv_cache_tokens
    terms = unpinned.memory[0].terms
    assert terms['kv_bytes_per_token'] == pinned.memory[0].terms['kv_bytes_per_token']
    lost = (pinned.kv_cache_tokens - unpinned.kv_cache_tokens) * terms['kv_bytes_per_token']
    margin = terms['cold_compile_margin']
    assert margin - terms['kv_bytes_per_block'] <= lost <= margin + terms['kv_bytes_per_block']


def test_user_pin_on_an_old_version_is_refused_naming_the_field():
    with pytest.raises(Exception) as err:
        plan('0.10.1.1', pin_kv_cache_memory=True)
    assert err.value.field == 'pin_kv_cache_memory'
    # false is accepted there: it is what that version does anyway
    assert pinned_value(plan('0.10.1.1', pin_kv_cache_memory=False).args) is None


def test_no_pool_to_pin_is_planned_unpinned():
    # 70B bf16 on one card: the charged terms exceed the budget; nothing is pinned, the plan
    # stays infeasible with the charged terms named (not a 1-block pin that hides it).
    p = vm.plan_vllm(llama_70b(), gpus()[:1], TRAFFIC, {'tensor_parallel_size': 1}, '0.33.0')
    assert not p.feasible
    assert pinned_value(p.args) is None
    assert 'no KV pool to pin' in p.reasons['kv_cache_memory_bytes']
    assert any('exceed the budget' in line for line in p.not_fitting)


def test_pin_default_helper_follows_the_flag_table():
    for text in ('0.10.1.1', '0.10.2', '0.33.0'):
        version = prof.parse_version(text)
        pin, why = prof.kv_bytes_pin_default(version)
        assert pin == prof.flag_available('kv_cache_memory_bytes', version)
        assert text in why and '--kv-cache-memory-bytes (vLLM >= 0.10.2)' in why


def test_0_34_keeps_the_extensible_cache_unless_the_deployment_pins():
    # 0.34's extensible KV cache sizes the pool after warm-up (not from the profile) and the flag
    # would turn it off: not pinned by default; pin_kv_cache_memory: true pins it on every restart
    default = plan('0.34.0')
    assert pinned_value(default.args) is None
    assert '--enable-extensible-kv-cache' in default.args
    assert default.reasons['kv_cache_memory_bytes'].startswith('not passed: vLLM 0.34.0 sizes its KV cache after warm-up')
    assert all(mem.terms['cold_compile_margin'] == 0 for mem in default.memory)
    pinned = plan('0.34.0', pin_kv_cache_memory=True)
    record = model_record(pinned)
    assert '--enable-extensible-kv-cache' not in record['backend_parameters']
    assert pinned_value(recycle(record)) == pinned.settings['kv_cache_memory_bytes'] > 0
    assert pinned.reasons['kv_cache_memory_bytes'].startswith('pinned (pin_kv_cache_memory set by the user)')


def test_v0_has_no_flag_and_no_torch_compile_so_no_cold_margin():
    p = plan('0.7.3')
    assert pinned_value(p.args) is None
    reason = p.reasons['kv_cache_memory_bytes']
    assert reason.startswith('not passed: vLLM 0.7.3 has no --kv-cache-memory-bytes')
    assert 'no cold-compile margin' in reason and 'V0 engine' in reason
    assert all(mem.terms['cold_compile_margin'] == 0 for mem in p.memory)
