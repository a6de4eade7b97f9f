# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""nvml_probe against the real pynvml binding loaded over the stub libnvidia-ml.so.1.

The stub (tests/nvml_stub) re-reads its JSON fixture at every nvmlInit, so each test
points KVPIN_NVML_STUB_CONFIG at a fixture (or an edited copy in tmp_path) and probes."""

from __future__ import annotations

import copy
import itertools
import json
import os

import pytest
from nvml_stub_pynvml import stub_pynvml

from ansible_collections.kvpin.fleet.plugins.module_utils.plan import cuda_total
from ansible_collections.kvpin.fleet.plugins.module_utils.facts import nvml_probe as nvml_probe_module
from ansible_collections.kvpin.fleet.plugins.module_utils.facts.nvml_probe import (
    NvmlProbeError,
    format_compute_capability,
    format_cuda_version,
    probe,
)
from ansible_collections.kvpin.fleet.plugins.module_utils.units import MiB

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
FIXTURES = os.path.join(ROOT, 'tests', 'fixtures', 'nvml')

A6000 = 'NVIDIA RTX A6000'
RTX4090 = 'NVIDIA GeForce RTX 4090'
A6000_TOTAL = 49140 * MiB    # nvidia-smi "49140MiB" (ECC off)
RTX4090_TOTAL = 24564 * MiB  # nvidia-smi "24564MiB"


@pytest.fixture(scope='module')
def nvml():
    """The real pynvml, bound to the stub library (built here if needed)."""
    return stub_pynvml()


def fixture_path(name):
    return os.path.join(FIXTURES, name + '.json')


def load_fixture(name):
    with open(fixture_path(name)) as f:
        return json.load(f)


def use(monkeypatch, path, proc_root='/nonexistent-proc'):
    monkeypatch.setenv('KVPIN_NVML_STUB_CONFIG', path)
    # The fixtures' pids are not processes of this machine: no cgroup is read for them, even
    # where a process with the same pid happens to run here.
    monkeypatch.setattr(nvml_probe_module, 'PROC_ROOT', proc_root)


def write_fixture(tmp_path, data, name='edited.json'):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


def pair_links(facts):
    return {(p['gpu_a'], p['gpu_b']): p for p in facts['topology']}


def test_version_formats():
    assert format_cuda_version(12080) == '12.8'
    assert format_cuda_version(11040) == '11.4'
    assert format_cuda_version(12000) == '12.0'
    assert format_compute_capability(8, 9) == '8.9'


@pytest.mark.parametrize('node, names, total', [
    ('lab-a6000x4', [A6000] * 4, [A6000_TOTAL] * 4),
    ('lab-4090x4', [RTX4090] * 4, [RTX4090_TOTAL] * 4),
    ('lab-4090x2', [RTX4090] * 2, [RTX4090_TOTAL] * 2),
    ('lab-mixed', [A6000, RTX4090], [A6000_TOTAL, RTX4090_TOTAL]),
])
def test_lab_nodes_report_their_cards(nvml, monkeypatch, node, names, total):
    use(monkeypatch, fixture_path(node))
    facts = probe(nvml)
    fixture = load_fixture(node)

    assert facts['reason'] is None
    assert facts['driver_version'] == '570.133.20'
    assert facts['cuda_driver_version'] == '12.8'
    assert facts['nvml_version'] == '12.570.133.20'
    assert facts['gpu_count'] == len(names) == len(facts['gpus'])
    assert [g['index'] for g in facts['gpus']] == list(range(len(names)))
    assert [g['name'] for g in facts['gpus']] == names
    assert [g['memory_total'] for g in facts['gpus']] == total
    assert [g['uuid'] for g in facts['gpus']] == [d['uuid'] for d in fixture['devices']]
    assert len({g['uuid'] for g in facts['gpus']}) == len(names)
    for gpu, device in zip(facts['gpus'], fixture['devices']):
        a6000 = gpu['name'] == A6000
        assert gpu['compute_capability'] == ('8.6' if a6000 else '8.9')
        assert gpu['pci_device_id'] == ('0x223010de' if a6000 else '0x268410de')
        assert gpu['power_limit_watts'] == (300.0 if a6000 else 450.0)
        assert gpu['mig_mode'] is None  # neither card has MIG
        assert gpu['pci_bus_id'] == device['pci_bus_id']
        assert gpu['memory_used'] == device['memory_used']
        assert gpu['memory_reserved'] == 0
        assert gpu['memory_free'] == gpu['memory_total'] - gpu['memory_used']
        assert gpu['memory_used'] < 1024 * MiB  # idle nodes
    # every unordered pair exactly once
    assert sorted(pair_links(facts)) == list(itertools.combinations(range(len(names)), 2))


def test_a6000_pairs_are_nvlinked_and_sockets_are_not(nvml, monkeypatch):
    use(monkeypatch, fixture_path('lab-a6000x4'))
    facts = probe(nvml)
    links = pair_links(facts)
    for pair in ((0, 1), (2, 3)):
        assert links[pair] == {'gpu_a': pair[0], 'gpu_b': pair[1], 'link': 'NVLINK',
                               'p2p_read': True, 'p2p_write': True, 'nvlink': True}
    for pair in ((0, 2), (0, 3), (1, 2), (1, 3)):
        assert links[pair]['link'] == 'SYS'
        assert not (links[pair]['p2p_read'] or links[pair]['p2p_write'] or links[pair]['nvlink'])
    assert [g['nvlink_active_links'] for g in facts['gpus']] == [4, 4, 4, 4]


def test_4090s_have_no_nvlink_and_no_p2p(nvml, monkeypatch):
    use(monkeypatch, fixture_path('lab-4090x4'))
    facts = probe(nvml)
    links = pair_links(facts)
    assert {links[(0, 1)]['link'], links[(2, 3)]['link']} == {'PHB'}
    assert {links[p]['link'] for p in ((0, 2), (0, 3), (1, 2), (1, 3))} == {'NODE'}
    assert not any(p['nvlink'] or p['p2p_read'] or p['p2p_write'] for p in facts['topology'])
    assert [g['nvlink_active_links'] for g in facts['gpus']] == [None] * 4


def test_mixed_node_has_an_unbridged_a6000(nvml, monkeypatch):
    use(monkeypatch, fixture_path('lab-mixed'))
    facts = probe(nvml)
    assert [g['nvlink_active_links'] for g in facts['gpus']] == [0, None]
    assert facts['topology'] == [{'gpu_a': 0, 'gpu_b': 1, 'link': 'PHB',
                                  'p2p_read': False, 'p2p_write': False, 'nvlink': False}]


def test_running_process_is_reported_and_counted_in_used(nvml, monkeypatch):
    use(monkeypatch, fixture_path('lab-4090x2'))
    gpus = probe(nvml)['gpus']
    assert gpus[0]['processes'] == [{'pid': 41873, 'used_memory': 312 * MiB}]
    assert gpus[0]['memory_used'] == (459 + 312) * MiB
    assert gpus[1]['processes'] == []


def test_one_process_switches_between_fixtures(nvml, monkeypatch):
    counts = []
    for node in ('lab-a6000x4', 'lab-4090x2', 'lab-mixed', 'lab-a6000x4'):
        use(monkeypatch, fixture_path(node))
        counts.append(probe(nvml)['gpu_count'])
    assert counts == [4, 2, 2, 4]


def test_swapping_a_card_in_the_fixture_changes_the_facts(nvml, monkeypatch, tmp_path):
    data = load_fixture('lab-4090x2')
    a6000 = copy.deepcopy(load_fixture('lab-a6000x4')['devices'][0])
    a6000['pci_bus_id'] = data['devices'][1]['pci_bus_id']
    a6000['memory_used'] = 1000 * MiB
    data['devices'][1] = a6000
    use(monkeypatch, write_fixture(tmp_path, data))
    gpu = probe(nvml)['gpus'][1]
    assert gpu['name'] == A6000
    assert gpu['uuid'] == a6000['uuid']
    assert gpu['memory_total'] == A6000_TOTAL
    assert gpu['memory_free'] == A6000_TOTAL - 1000 * MiB
    assert gpu['compute_capability'] == '8.6'


def test_no_driver_is_an_answer_not_an_error(nvml, monkeypatch):
    use(monkeypatch, fixture_path('no-gpu'))
    facts = probe(nvml)
    assert facts['gpus'] == [] and facts['topology'] == [] and facts['gpu_count'] == 0
    assert facts['driver_version'] is None
    assert 'driver not loaded' in facts['reason']


def test_midprobe_failure_names_the_call_and_the_gpu(nvml, monkeypatch):
    use(monkeypatch, fixture_path('fail-midprobe'))
    with pytest.raises(NvmlProbeError) as err:
        probe(nvml)
    assert err.value.call == 'nvmlDeviceGetMemoryInfo_v2'
    assert err.value.where == 'GPU 1'
    assert 'Unknown Error' in str(err.value) and '999' in str(err.value)
    # the failed probe still shut NVML down: the next one starts cleanly
    use(monkeypatch, fixture_path('lab-4090x2'))
    assert probe(nvml)['gpu_count'] == 2


@pytest.mark.parametrize('fail, call, where', [
    ({'call': 'nvmlDeviceGetUUID', 'device': 0, 'error': 15}, 'nvmlDeviceGetUUID', 'GPU 0'),
    ({'call': 'nvmlDeviceGetPciInfo_v3', 'device': 1, 'error': 999}, 'nvmlDeviceGetPciInfo_v3', 'GPU 1'),
    ({'call': 'nvmlDeviceGetP2PStatus', 'error': 999}, 'nvmlDeviceGetP2PStatus', 'GPUs 0 and 1'),
    ({'call': 'nvmlSystemGetDriverVersion', 'error': 999}, 'nvmlSystemGetDriverVersion', None),
    ({'call': 'nvmlDeviceGetCount_v2', 'error': 999}, 'nvmlDeviceGetCount_v2', None),
    ({'call': 'nvmlInitWithFlags', 'error': 17}, 'nvmlInitWithFlags', None),
    # a lost GPU answering an optional query is still a failure, not "unsupported"
    ({'call': 'nvmlDeviceGetMigMode', 'device': 1, 'error': 15}, 'nvmlDeviceGetMigMode', 'GPU 1'),
])
def test_any_failing_call_is_named(nvml, monkeypatch, tmp_path, fail, call, where):
    data = load_fixture('lab-4090x2')
    data['fail'] = fail
    use(monkeypatch, write_fixture(tmp_path, data))
    with pytest.raises(NvmlProbeError) as err:
        probe(nvml)
    assert (err.value.call, err.value.where) == (call, where)


def test_unsupported_optional_queries_become_null(nvml, monkeypatch, tmp_path):
    data = load_fixture('lab-4090x2')
    for device in data['devices']:
        device['power_limit_mw'] = device['enforced_power_limit_mw'] = None
    data['fail'] = [
        {'call': 'nvmlDeviceGetComputeRunningProcesses_v3', 'error': 3},
        {'call': 'nvmlSystemGetNVMLVersion', 'error': 3},
        {'call': 'nvmlDeviceGetTopologyCommonAncestor', 'error': 3},
    ]
    use(monkeypatch, write_fixture(tmp_path, data))
    facts = probe(nvml)
    assert facts['nvml_version'] is None
    assert [g['power_limit_watts'] for g in facts['gpus']] == [None, None]
    assert [g['processes'] for g in facts['gpus']] == [None, None]
    assert facts['topology'][0]['link'] is None


def test_enforced_power_limit_wins_over_the_management_limit(nvml, monkeypatch, tmp_path):
    data = load_fixture('lab-4090x2')
    data['devices'][0]['enforced_power_limit_mw'] = 350000  # e.g. capped by nvidia-smi -pl
    data['devices'][1]['enforced_power_limit_mw'] = None    # driver without an enforced limit
    use(monkeypatch, write_fixture(tmp_path, data))
    assert [g['power_limit_watts'] for g in probe(nvml)['gpus']] == [350.0, 450.0]


def test_mig_capable_gpu_reports_its_modes(nvml, monkeypatch, tmp_path):
    data = load_fixture('lab-4090x2')
    data['devices'][0]['mig_mode'] = {'current': 1, 'pending': 0}
    use(monkeypatch, write_fixture(tmp_path, data))
    gpus = probe(nvml)['gpus']
    assert gpus[0]['mig_mode'] == {'current': True, 'pending': False}
    assert gpus[1]['mig_mode'] is None


def test_memory_v1_fallback_counts_reserved_as_used(nvml, monkeypatch, tmp_path):
    data = load_fixture('lab-4090x2')
    data['devices'][1]['memory_reserved'] = 346 * MiB
    use(monkeypatch, write_fixture(tmp_path, data, 'v2.json'))
    v2 = probe(nvml)['gpus'][1]
    data['fail'] = {'call': 'nvmlDeviceGetMemoryInfo_v2', 'error': 13}  # old driver: no v2 symbol
    use(monkeypatch, write_fixture(tmp_path, data, 'v1.json'))
    v1 = probe(nvml)['gpus'][1]
    assert v2['memory_reserved'] == 346 * MiB and v1['memory_reserved'] is None
    assert v2['memory_used'] == 459 * MiB
    assert v1['memory_used'] == (459 + 346) * MiB
    assert v1['memory_free'] == v2['memory_free'] == RTX4090_TOTAL - (459 + 346) * MiB


def test_broken_fixture_fails_loudly(nvml, monkeypatch, tmp_path, capfd):
    path = tmp_path / 'broken.json'
    path.write_text('{"driver_version": "570.133.20", "devices": [}')
    use(monkeypatch, str(path))
    with pytest.raises(NvmlProbeError) as err:
        probe(nvml)
    assert err.value.call == 'nvmlInitWithFlags'
    assert 'kvpin nvml stub' in capfd.readouterr().err


def test_stub_reads_json_string_escapes(nvml, monkeypatch, tmp_path):
    data = load_fixture('lab-4090x2')
    data['devices'][0]['name'] = 'Lab "GPU" \u00b5\u20ac\U0001F600 \\ /'
    path = tmp_path / 'escaped.json'
    path.write_text(json.dumps(data, ensure_ascii=True))  # \uXXXX escapes incl. a surrogate pair
    use(monkeypatch, str(path))
    assert probe(nvml)['gpus'][0]['name'] == 'Lab "GPU" \u00b5\u20ac\U0001F600 \\ /'


def test_stub_answers_gpustacks_nvlink_field_query(nvml, monkeypatch):
    """GPUStack 2.3 reads a GPU's NVLink count through nvmlDeviceGetFieldValues."""
    use(monkeypatch, fixture_path('lab-mixed'))
    nvml.nvmlInit()
    try:
        a6000, rtx4090 = (nvml.nvmlDeviceGetHandleByIndex(i) for i in (0, 1))
        fields = [nvml.NVML_FI_DEV_NVLINK_LINK_COUNT, nvml.NVML_FI_DEV_MEMORY_TEMP]
        count, temp = nvml.nvmlDeviceGetFieldValues(a6000, fields)
        assert (count.nvmlReturn, count.valueType, count.value.uiVal) == (0, nvml.NVML_VALUE_TYPE_UNSIGNED_INT, 4)
        assert temp.nvmlReturn == nvml.NVML_ERROR_NOT_SUPPORTED
        assert nvml.nvmlDeviceGetFieldValues(rtx4090, fields[:1])[0].nvmlReturn == nvml.NVML_ERROR_NOT_SUPPORTED
        # GPUStack's optional calls exist and answer NOT_SUPPORTED (not FunctionNotFound)
        with pytest.raises(nvml.NVMLError_NotSupported):
            nvml.nvmlDeviceGetTemperature(a6000, nvml.NVML_TEMPERATURE_GPU)
        with pytest.raises(nvml.NVMLError_NotSupported):
            nvml.nvmlDeviceGetNumGpuCores(a6000)
        assert nvml.nvmlDeviceGetMinorNumber(rtx4090) == 1
        assert nvml.nvmlDeviceGetPciInfo_v3(rtx4090).busIdLegacy == '0000:02:00.0'
    finally:
        nvml.nvmlShutdown()


def test_cuda_total_estimate_from_v2_reserved_table_and_v1(nvml, monkeypatch, tmp_path):
    """memory_total_cuda: NVML v2 reserved where it is the larger gap, the card's table row
    otherwise, the table row on the v1 fallback (no reserved figure)."""
    data = load_fixture('lab-4090x2')
    data['devices'][0]['memory_reserved'] = 600 * MiB    # above the 4090 row's logged gap
    data['devices'][1]['memory_reserved'] = 346 * MiB    # below it: the table row wins
    use(monkeypatch, write_fixture(tmp_path, data, 'v2.json'))
    v2 = probe(nvml)['gpus']
    assert v2[0]['memory_total_cuda'] == RTX4090_TOTAL - 600 * MiB
    assert v2[0]['memory_total_cuda_source'] == 'nvml_v2_reserved'
    row = cuda_total.find_card(RTX4090, RTX4090_TOTAL)
    assert v2[1]['memory_total_cuda'] == RTX4090_TOTAL - row.gap_bytes
    assert v2[1]['memory_total_cuda_source'] == 'table:RTX 4090'
    data['fail'] = {'call': 'nvmlDeviceGetMemoryInfo_v2', 'error': 13}  # old driver: no v2 symbol
    use(monkeypatch, write_fixture(tmp_path, data, 'v1.json'))
    v1 = probe(nvml)['gpus']
    assert [g['memory_total_cuda_source'] for g in v1] == ['table:RTX 4090'] * 2
    assert all(g['memory_total_cuda'] == RTX4090_TOTAL - row.gap_bytes for g in v1)


def test_cuda_total_of_the_lab_cards(nvml, monkeypatch):
    use(monkeypatch, os.path.join(FIXTURES, 'lab-mixed.json'))
    for gpu in probe(nvml)['gpus']:
        assert 0 < gpu['memory_total_cuda'] < gpu['memory_total']
        assert gpu['memory_total_cuda_source'].startswith('table:')


def test_read_cgroup_reads_a_bounded_membership_and_none_when_absent(tmp_path):
    from ansible_collections.kvpin.fleet.plugins.module_utils.facts.nvml_probe import CGROUP_KEEP, read_cgroup
    (tmp_path / '77').mkdir()
    (tmp_path / '77' / 'cgroup').write_text('0::/system.slice/gpustack.service\n')
    assert read_cgroup(77, str(tmp_path)) == '0::/system.slice/gpustack.service'
    (tmp_path / '78').mkdir()
    (tmp_path / '78' / 'cgroup').write_text('12:memory:/docker/abc\n' * 1000)
    assert len(read_cgroup(78, str(tmp_path))) == CGROUP_KEEP
    assert read_cgroup(79, str(tmp_path)) is None
    # This test process is on the host: its own membership is readable through /proc.
    assert read_cgroup(os.getpid()) is not None


def test_a_process_whose_cgroup_is_readable_carries_it(nvml, monkeypatch, tmp_path):
    (tmp_path / '41873').mkdir()
    (tmp_path / '41873' / 'cgroup').write_text('0::/system.slice/gpustack.service\n')
    use(monkeypatch, fixture_path('lab-4090x2'), proc_root=str(tmp_path))
    gpus = probe(nvml)['gpus']
    assert gpus[0]['processes'] == [{'pid': 41873, 'used_memory': 312 * MiB,
                                     'cgroup': '0::/system.slice/gpustack.service'}]
