# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""cuda_total: NVML total -> the total CUDA (and vLLM, llama.cpp) sees; and the planners
budgeting from it."""

from __future__ import annotations

import pytest

from ansible_collections.kvpin.fleet.plugins.module_utils.plan import cuda_total as ct
from ansible_collections.kvpin.fleet.plugins.module_utils.plan import vllm_memory as vm
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.model_loaders import resolve_model
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.plan_types import PlanInputError, Traffic
from ansible_collections.kvpin.fleet.plugins.module_utils.units import GiB, MiB

RTX4090 = 'NVIDIA GeForce RTX 4090'
RTX4090_TOTAL = 24564 * MiB
A6000 = 'NVIDIA RTX A6000'
A6000_TOTAL = 49140 * MiB
H100 = 'NVIDIA H100 80GB HBM3'
H100_TOTAL = 81559 * MiB


# ---------------------------------------------------------------- the table
@pytest.mark.parametrize('name, mib, card', [
    ('NVIDIA GeForce RTX 4090', 24564, 'RTX 4090'),
    ('NVIDIA GeForce RTX 3090', 24576, 'RTX 3090'),
    ('NVIDIA RTX A6000', 49140, 'RTX A6000'),
    ('NVIDIA RTX A6000', 46068, 'RTX A6000'),          # ECC on: still the same card
    ('NVIDIA RTX A5000', 24564, 'RTX A5000'),
    ('NVIDIA A100-SXM4-80GB', 81920, 'A100 80GB'),
    ('NVIDIA A100 80GB PCIe', 81920, 'A100 80GB'),
    ('NVIDIA A100-PCIE-40GB', 40960, 'A100 40GB'),
    ('NVIDIA H100 80GB HBM3', 81559, 'H100 80GB'),
    ('NVIDIA L40S', 46068, 'L40S'),
    ('NVIDIA L4', 23034, 'L4'),
    ('NVIDIA A10G', 23028, 'A10G'),
    ('NVIDIA A10', 23028, 'A10'),
])
def test_fleet_cards_find_their_row(name, mib, card):
    assert ct.find_card(name, mib * MiB).card == card


@pytest.mark.parametrize('name, mib', [
    ('NVIDIA GeForce RTX 4090', 49140),   # a 48 GB 4090 is not the 24 GB card's row
    ('NVIDIA L40', 46068),                # L40 is not L40S
    ('NVIDIA B200', 183359),
    ('NVIDIA A100-SXM4-40GB', 81920),     # name and total disagree
    (None, 24564),
])
def test_other_cards_find_no_row(name, mib):
    assert ct.find_card(name, mib * MiB) is None


def test_every_row_is_sourced_and_below_the_default_margin():
    for row in ct.CARD_GAPS:
        total = row.nvml_total_mib * MiB
        assert 'https://' in row.source, row.card
        assert row.derived == row.source.startswith('DERIVED'), row.card
        # the default margin for an unknown card is never below a row's gap
        assert 0 < row.gap_bytes <= ct.default_margin_bytes(total), row.card


def test_logged_rows_reproduce_their_logs():
    # RTX 3090: 24576 MiB in nvidia-smi; the smallest CUDA total logged, torch's "total capacity of
    # 23.54 GiB" (row buccaneer-rtx3090-llama-3.1-8b-tp1-u090-fixd-fail; vLLM once logged 23.58GiB)
    r3090 = ct.find_card('NVIDIA GeForce RTX 3090', 24576 * MiB)
    assert abs((24576 * MiB - r3090.gap_bytes) / GiB - 23.54) <= 0.005 + 1e-6
    # the gap is the largest a 0.01 GiB-rounded log allows: the CUDA total is 0.005 GiB below
    assert 24576 * MiB - r3090.gap_bytes == 2354 * GiB // 100 - GiB // 200
    assert r3090.source_rows == ('buccaneer-rtx3090-llama-3.1-8b-tp1-u090-fixd-fail',)
    # H100: 81559 MiB vs llm-d's 79.18 GiB (the figure the vLLM benchmark data logs)
    h100 = ct.estimate(H100, H100_TOTAL)
    assert h100.source == 'table:H100 80GB' and abs(h100.cuda_total / GiB - 79.18) <= 0.005 + 1e-6
    # A100 40GB: deviceQuery's exact byte count
    a100 = ct.estimate('NVIDIA A100-SXM4-40GB', 40960 * MiB)
    assert a100.cuda_total == 42298834944


# ---------------------------------------------------------------- the estimate
def test_v2_reserved_is_used_when_it_is_the_larger_gap():
    row = ct.find_card(RTX4090, RTX4090_TOTAL)
    big = row.gap_bytes + 100 * MiB
    est = ct.estimate(RTX4090, RTX4090_TOTAL, big)
    # NVML v2: total = "Total physical device memory", reserved is part of it
    assert est.cuda_total == RTX4090_TOTAL - big and est.source == 'nvml_v2_reserved'
    assert 'table' not in est.source and row.card in est.explain   # the smaller one is named too


def test_table_wins_over_a_smaller_reserved_figure():
    row = ct.find_card(RTX4090, RTX4090_TOTAL)
    est = ct.estimate(RTX4090, RTX4090_TOTAL, 346 * MiB)
    assert 346 * MiB < row.gap_bytes
    assert est.cuda_total == RTX4090_TOTAL - row.gap_bytes and est.source == 'table:RTX 4090'


def test_reserved_on_an_unknown_card_is_used_alone():
    est = ct.estimate('NVIDIA B200', 183359 * MiB, 700 * MiB)
    assert est.cuda_total == 183359 * MiB - 700 * MiB and est.source == 'nvml_v2_reserved'


@pytest.mark.parametrize('reserved', [None, 0])
def test_unknown_card_without_reserved_gets_the_default_margin(reserved):
    total = 183359 * MiB
    est = ct.estimate('NVIDIA B200', total, reserved)
    assert est.source == 'default margin'
    assert est.gap == total * 2 // 100 and est.cuda_total == total - est.gap
    small = ct.estimate('Some Tiny GPU', 4096 * MiB)
    assert small.gap == 528 * MiB            # the floor: the A10's 515 MiB gap rounded up


@pytest.mark.parametrize('field, kwargs, words', [
    ('gpu.memory_total', dict(memory_total='24GB'), 'whole number'),
    ('gpu.memory_total', dict(memory_total=24.5 * GiB), 'whole number'),
    ('gpu.memory_total', dict(memory_total=True), 'whole number'),
    ('gpu.memory_total', dict(memory_total=0), '>= 1'),
    ('gpu.memory_total', dict(memory_total=-5), '>= 1'),
    ('gpu.memory_total', dict(memory_total=256 * MiB), 'not more than the memory the driver keeps'),
    ('gpu.memory_reserved', dict(memory_reserved=-1), '>= 0'),
    ('gpu.memory_reserved', dict(memory_reserved='346MiB'), 'whole number'),
    ('gpu.memory_reserved', dict(memory_reserved=1.5), 'whole number'),
    ('gpu.memory_reserved', dict(memory_reserved=RTX4090_TOTAL), '<= memory_total - 1'),
    ('gpu.memory_reserved', dict(memory_reserved=RTX4090_TOTAL * 2), '<= memory_total - 1'),
])
def test_adversarial_inputs_name_the_field(field, kwargs, words):
    args = dict(name=RTX4090, memory_total=RTX4090_TOTAL, memory_reserved=None)
    args.update(kwargs)
    with pytest.raises(PlanInputError) as err:
        ct.estimate(**args)
    assert err.value.field == field and words in str(err.value)


@pytest.mark.parametrize('given, words', [
    (RTX4090_TOTAL + 1, '<= memory_total'), (0, '>= 1'), ('23.6GiB', 'whole number'), (False, 'whole number'),
])
def test_given_cuda_total_is_checked(given, words):
    gpu = dict(index=0, name=RTX4090, memory_total=RTX4090_TOTAL, memory_total_cuda=given)
    with pytest.raises(PlanInputError) as err:
        ct.of_gpu(gpu, 'gpus[3]')
    assert err.value.field == 'gpus[3].memory_total_cuda' and words in str(err.value)


def test_gpu_facts_fields_never_raise():
    assert ct.facts_fields(RTX4090, RTX4090_TOTAL, None)[1] == 'table:RTX 4090'
    value, source = ct.facts_fields(RTX4090, RTX4090_TOTAL, RTX4090_TOTAL + 1)
    assert value is None and source.startswith('none: gpu.memory_reserved')


def test_of_gpu_prefers_the_reported_estimate_and_keeps_its_source():
    gpu = dict(name=RTX4090, memory_total=RTX4090_TOTAL, memory_reserved=None,
               memory_total_cuda=RTX4090_TOTAL - 400 * MiB, memory_total_cuda_source='table:RTX 4090')
    got = ct.of_gpu(gpu)
    assert got.cuda_total == RTX4090_TOTAL - 400 * MiB and got.source == 'table:RTX 4090'
    assert ct.of_gpu(dict(gpu, memory_total_cuda_source=None)).source == 'given'
    assert ct.of_gpu(dict(gpu, memory_total_cuda=None)).cuda_total == ct.estimate(RTX4090, RTX4090_TOTAL).cuda_total


# ---------------------------------------------------------------- the vLLM planner uses it
def _plan(gpu, util=0.9, tp=1):
    spec = resolve_model('meta-llama/Llama-3.1-8B-Instruct')
    return vm.plan_vllm(spec, [dict(gpu, index=i) for i in range(tp)], Traffic(1000, 1000, 1),
                        {'tensor_parallel_size': tp, 'gpu_memory_utilization': util,
                         'max_model_len': 8192, 'max_num_seqs': 64}, '0.11.0')


def test_vllm_budget_is_util_times_the_cuda_total_not_nvml():
    nvml_only = dict(name=H100, memory_total=H100_TOTAL)
    cuda = ct.estimate(H100, H100_TOTAL).cuda_total
    mem = _plan(nvml_only).memory[0]
    assert mem.total == cuda and mem.terms['nvml_total'] == H100_TOTAL
    # 0.11.0 pins --kv-cache-memory-bytes (whole blocks of the util budget's rest): the budget
    # is util x the CUDA total, less what does not fill a block
    block = mem.terms['kv_bytes_per_block']
    assert vm.util_bytes(cuda, 0.9) - block < mem.budget <= vm.util_bytes(cuda, 0.9)
    assert 'CUDA-visible' in mem.explain['total'] and 'table:H100 80GB' in mem.explain['total']
    assert 'not the NVML total' in mem.explain['budget']


def test_an_nvml_total_only_gpu_promises_less_kv_than_the_nvml_total_would():
    """The bug: fed the NVML total as if it were CUDA's, the plan promises util x the gap
    more KV than vLLM will allocate. From the same NVML-only gpu dict the planner now gets
    what a plan fed the CUDA total directly gets, and less than the over-promise."""
    nvml_only = dict(name=H100, memory_total=H100_TOTAL)
    cuda = ct.estimate(H100, H100_TOTAL)
    fixed = _plan(nvml_only).memory[0].terms['kv_budget']
    # a plan told the NVML total is what CUDA sees (the old behaviour)
    old = _plan(dict(nvml_only, memory_total_cuda=H100_TOTAL)).memory[0].terms['kv_budget']
    direct = _plan(dict(nvml_only, memory_total_cuda=cuda.cuda_total)).memory[0].terms['kv_budget']
    assert fixed == direct < old
    block = _plan(nvml_only).memory[0].terms['kv_bytes_per_block']    # the pin floors to whole blocks
    assert abs((old - fixed) - (vm.util_bytes(H100_TOTAL, 0.9) - vm.util_bytes(cuda.cuda_total, 0.9))) < block
    assert old - fixed > 400 * MiB


def test_v2_reserved_moves_the_vllm_budget():
    gpu = dict(name='NVIDIA B200', memory_total=183359 * MiB, memory_reserved=700 * MiB)
    mem = _plan(gpu).memory[0]
    assert mem.total == 183359 * MiB - 700 * MiB and mem.terms['driver_reserved'] == 700 * MiB
    assert 'nvml_v2_reserved' in mem.explain['total']


def test_vllm_bad_reserved_names_the_gpu_field():
    with pytest.raises(PlanInputError) as err:
        _plan(dict(name=A6000, memory_total=A6000_TOTAL, memory_reserved=-3))
    assert err.value.field == 'gpus[0].memory_reserved'
