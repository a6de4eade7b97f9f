# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""module_utils/saved_gpu_facts.py: saved gpu_facts output read back for planning offline;
both accepted shapes, and every bad input refused naming the file and the field."""
from __future__ import annotations

import json

import pytest

from ansible_collections.kvpin.fleet.plugins.module_utils.facts import saved_gpu_facts as saved
from ansible_collections.kvpin.fleet.plugins.module_utils.facts.saved_gpu_facts import (
    SavedGpuFactsError,
    read_saved_gpu_facts,
)

GPU = {'index': 0, 'name': 'NVIDIA RTX A6000', 'memory_total': 51527024640, 'memory_used': 70254592,
       'memory_free': 51456770048, 'processes': []}
FACT = {'driver_version': '570.133.20', 'cuda_driver_version': '12.8', 'nvml_version': None,
        'gpu_count': 1, 'reason': None, 'gpus': [GPU]}


def write(tmp_path, document):
    path = tmp_path / 'facts.json'
    path.write_text(document if isinstance(document, str) else json.dumps(document))
    return str(path)


@pytest.mark.parametrize('document', [{'ansible_facts': {'kvpin_gpus': FACT}, 'changed': False}, FACT])
def test_module_result_and_bare_fact_read_the_same(tmp_path, document):
    assert read_saved_gpu_facts(write(tmp_path, document), required=True) == FACT


def test_gpu_count_follows_the_list_not_the_file(tmp_path):
    assert read_saved_gpu_facts(write(tmp_path, dict(FACT, gpu_count=7)))['gpu_count'] == 1


def test_no_gpus_is_fine_without_deployments_and_refused_with_them(tmp_path):
    path = write(tmp_path, dict(FACT, gpus=[], reason='NVML library not found'))
    assert read_saved_gpu_facts(path)['gpus'] == []
    with pytest.raises(SavedGpuFactsError, match=r'kvpin_gpus.gpus is empty \(reason: NVML library not found\)'):
        read_saved_gpu_facts(path, required=True)


@pytest.mark.parametrize('document,message', [
    ('{not json', r'not JSON'),
    ('"a string"', r'kvpin_gpus: a dict with a gpus list expected, got str'),
    ({'ansible_facts': {}}, r'ansible_facts.kvpin_gpus: missing or not a dict'),
    ({'ansible_facts': {'kvpin_gpus': FACT}, 'failed': True, 'msg': 'NVML: driver not loaded'},
     r'the saved gpu_facts run failed: NVML: driver not loaded'),
    (dict(FACT, gpus={'0': GPU}), r'kvpin_gpus.gpus: must be a list, got dict'),
    (dict(FACT, gpus=[dict(GPU, index=i) for i in range(17)]), r'17 GPUs; a node has at most 16'),
    (dict(FACT, gpus=[dict(GPU, memory_total=49140)]), r'gpus\[0\].memory_total: 49140 B is less than any GPU'),
    (dict(FACT, gpus=[dict(GPU, memory_total='51527024640')]), r'gpus\[0\].memory_total: must be a positive'),
    (dict(FACT, gpus=[dict(GPU, memory_used=-1)]), r'gpus\[0\].memory_used: must be bytes between 0'),
    (dict(FACT, gpus=[GPU, GPU]), r'gpus\[1\].index: GPU 0 is listed twice'),
    (dict(FACT, driver_version=570), r'kvpin_gpus.driver_version: must be a string or null, got int'),
])
def test_bad_input_names_the_file_and_the_field(tmp_path, document, message):
    path = write(tmp_path, document)
    with pytest.raises(SavedGpuFactsError, match=message) as error:
        read_saved_gpu_facts(path)
    assert str(error.value).startswith(path)


def test_missing_file_and_oversized_file(tmp_path, monkeypatch):
    with pytest.raises(SavedGpuFactsError, match=r'cannot read the saved gpu_facts output'):
        read_saved_gpu_facts(str(tmp_path / 'absent.json'))
    monkeypatch.setattr(saved, 'MAX_BYTES', 100)
    with pytest.raises(SavedGpuFactsError, match=r'more than 100 bytes'):
        read_saved_gpu_facts(write(tmp_path, FACT))
