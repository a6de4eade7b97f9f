# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""site.yml's one-line GPU report per node (was 18 lines of Jinja in the playbook)."""
from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar

try:  # ansible-core 2.19+ templates only strings marked as trusted templates
    from ansible.template import trust_as_template
except ImportError:  # pragma: no cover - 2.18
    def trust_as_template(text):
        return text

from ansible_collections.kvpin.fleet.plugins.filter.kvpin import FilterModule
from ansible_collections.kvpin.fleet.plugins.module_utils.facts.gpu_summary import GpuSummaryError, gpu_summary
from ansible_collections.kvpin.fleet.plugins.module_utils.units import GiB, MiB

A6000 = {'name': 'NVIDIA RTX A6000', 'memory_total': 48 * GiB}
RTX4090 = {'name': 'NVIDIA GeForce RTX 4090', 'memory_total': 24 * GiB}
MIXED = {'gpus': [A6000, RTX4090, A6000], 'driver_version': '570.133.20', 'cuda_driver_version': '12.8',
         'reason': None}
NONE = {'gpus': [], 'driver_version': None, 'cuda_driver_version': None,
        'reason': 'no NVIDIA driver (NVML_ERROR_DRIVER_NOT_LOADED)'}


def test_cards_grouped_by_name_sorted_with_total_versions_and_count():
    assert gpu_summary(MIXED, 'lab-mixed', 1) == (
        'lab-mixed: 1 x NVIDIA GeForce RTX 4090 + 2 x NVIDIA RTX A6000 (120.0 GiB), driver 570.133.20, '
        'CUDA 12.8, 1 deployment(s) in inventory')


def test_no_gpus_reads_no_gpus_with_dashes_and_the_reason():
    assert gpu_summary(NONE, 'cpu-1', 0) == (
        'cpu-1: no GPUs (0.0 GiB), driver -, CUDA -, 0 deployment(s) in inventory; '
        'no NVIDIA driver (NVML_ERROR_DRIVER_NOT_LOADED)')
    assert gpu_summary({}, 'cpu-1', 0) == 'cpu-1: no GPUs (0.0 GiB), driver -, CUDA -, 0 deployment(s) in inventory'


def test_total_is_rounded_to_a_tenth_of_a_gib():
    # 23.99 GiB as NVML reports an RTX 4090 (24564 MiB) -> 24.0; 10 GiB + 60 MiB -> 10.1
    assert '(24.0 GiB)' in gpu_summary({'gpus': [{'name': 'g', 'memory_total': 24564 * MiB}]}, 'h', 0)
    assert '(10.1 GiB)' in gpu_summary({'gpus': [{'name': 'g', 'memory_total': 10 * GiB + 60 * MiB}]}, 'h', 0)


# The Jinja site.yml had before this function replaced it, verbatim: the function must say the same.
OLD_JINJA = (
    "{% set kvpin_card_groups = kvpin_gpus.gpus | groupby('name') %}"
    "{% set kvpin_cards = kvpin_card_groups | map('last') | map('length')"
    " | zip(kvpin_card_groups | map('first')) | map('join', ' x ') | join(' + ') %}"
    "{% set kvpin_total_gib = ((kvpin_gpus.gpus | map(attribute='memory_total') | sum) / 1073741824) | round(1) %}"
    "{% set kvpin_reason = ('; ' ~ kvpin_gpus.reason) if kvpin_gpus.reason | default('', true) else '' %}"
    "{{ inventory_hostname }}: {{ kvpin_cards or 'no GPUs' }} ({{ kvpin_total_gib }} GiB), "
    "driver {{ kvpin_gpus.driver_version | default('-', true) }}, "
    "CUDA {{ kvpin_gpus.cuda_driver_version | default('-', true) }}, "
    "{{ kvpin_deployments | default([]) | length }} deployment(s) in inventory{{ kvpin_reason }}")


@pytest.mark.parametrize('fact, deployments', [
    (MIXED, [{'name': 'a'}]),
    (NONE, []),
    ({'gpus': [RTX4090, {'name': 'NVIDIA GeForce RTX 4090', 'memory_total': 24564 * MiB}], 'driver_version': '',
      'cuda_driver_version': '12.4', 'reason': ''}, [{'name': 'a'}, {'name': 'b'}]),
])
def test_the_same_line_the_playbook_jinja_made(fact, deployments):
    templar = Templar(loader=DataLoader(), variables={
        'kvpin_gpus': fact, 'inventory_hostname': 'node-1', 'kvpin_deployments': deployments})
    assert gpu_summary(fact, 'node-1', len(deployments)) == templar.template(trust_as_template(OLD_JINJA))


@pytest.mark.parametrize('fact, count, message', [
    ([], 0, 'kvpin_gpus must be a dict, got list'),
    ({'gpus': 'A6000'}, 0, 'kvpin_gpus.gpus must be a list, got str'),
    ({'gpus': [3]}, 0, r'kvpin_gpus.gpus\[0\] must be a dict, got int'),
    ({'gpus': [{'memory_total': 1}]}, 0, r'kvpin_gpus.gpus\[0\].name must be a string, got None'),
    ({'gpus': [{'name': 'g', 'memory_total': -1}]}, 0, r'kvpin_gpus.gpus\[0\].memory_total must be a non-negative integer, got -1'),
    ({'gpus': [{'name': 'g', 'memory_total': '48G'}]}, 0, r"memory_total must be a non-negative integer, got '48G'"),
    ({'gpus': [{'name': 'g', 'memory_total': True}]}, 0, 'memory_total must be a non-negative integer, got True'),
    ({'gpus': []}, -1, 'deployment_count must be a non-negative integer, got -1'),
])
def test_bad_facts_are_refused_naming_the_field(fact, count, message):
    with pytest.raises(GpuSummaryError, match=message):
        gpu_summary(fact, 'h', count)


def test_the_filter_is_the_function_and_names_itself_in_errors():
    kvpin_gpu_summary = FilterModule().filters()['kvpin_gpu_summary']
    assert kvpin_gpu_summary(MIXED, 'lab-mixed', 1) == gpu_summary(MIXED, 'lab-mixed', 1)
    with pytest.raises(AnsibleFilterError, match='kvpin_gpu_summary: kvpin_gpus must be a dict'):
        kvpin_gpu_summary(None, 'h')
