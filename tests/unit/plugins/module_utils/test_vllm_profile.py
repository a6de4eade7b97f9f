# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The vLLM version table: parsing, flag ranges, defaults and accounting eras."""

from __future__ import annotations

import pytest

from ansible_collections.kvpin.fleet.plugins.module_utils import vllm_profile as prof
from ansible_collections.kvpin.fleet.plugins.module_utils.plan_types import PlanInputError
from ansible_collections.kvpin.fleet.plugins.module_utils.units import GiB

V = prof.parse_version


@pytest.mark.parametrize('text, release, suffix', [
    ('0.10.1.1', (0, 10, 1, 1), None),
    ('v0.11.0', (0, 11, 0, 0), None),
    ('0.20.0rc1', (0, 20, 0, 0), 'rc1'),
    ('0.8.5.post1', (0, 8, 5, 0), 'post1'),
    ('0.33.0', (0, 33, 0, 0), None),
    (' 0.12.0 ', (0, 12, 0, 0), None),
])
def test_parse_version(text, release, suffix):
    version = V(text)
    assert version.release == release
    assert version.suffix == suffix


@pytest.mark.parametrize('text', ['0.8.4', '0.7.3', '0.34.0', '1.0.0', 'banana', '', None, '0.x'])
def test_unsupported_or_bad_versions_are_refused(text):
    with pytest.raises(PlanInputError) as err:
        V(text)
    assert err.value.field == 'backend_version'


@pytest.mark.parametrize('text', ['0.10', ' 0.12 ', 'v0.9', '0.20rc1'])
def test_a_series_without_its_release_is_refused_as_ambiguous(text):
    with pytest.raises(PlanInputError, match='ambiguous') as err:
        V(text)
    assert err.value.field == 'backend_version'


def test_unsupported_message_names_the_range():
    with pytest.raises(PlanInputError, match=r'0\.8\.5 … 0\.33\.x'):
        V('0.6.0')


@pytest.mark.parametrize('version, present', [
    ('0.8.5', True), ('0.10.1.1', True), ('0.17.0', True), ('0.17.1', True),
    ('0.18.0', False), ('0.20.0rc1', False), ('0.33.0', False)])
def test_swap_space_until_0_18(version, present):
    assert prof.flag_available('swap_space', V(version)) is present


@pytest.mark.parametrize('version, present', [
    ('0.9.2', False), ('0.10.1.1', False), ('0.10.2', True), ('0.11.0', True), ('0.33.0', True)])
def test_kv_cache_memory_bytes_from_0_10_2(version, present):
    assert prof.flag_available('kv_cache_memory_bytes', V(version)) is present


def test_capture_flags_by_version():
    assert prof.flag_available('max_seq_len_to_capture', V('0.10.2'))
    assert not prof.flag_available('max_seq_len_to_capture', V('0.11.0'))
    assert not prof.flag_available('cuda_graph_sizes', V('0.8.5'))
    assert prof.flag_available('cuda_graph_sizes', V('0.12.0'))
    assert not prof.flag_available('cuda_graph_sizes', V('0.13.0'))
    assert not prof.flag_available('max_cudagraph_capture_size', V('0.11.0'))
    assert prof.flag_available('max_cudagraph_capture_size', V('0.12.0'))


def test_render_flag_uses_equals_form():
    assert prof.render_flag('gpu_memory_utilization', '0.88') == '--gpu-memory-utilization=0.88'
    assert prof.render_flag('enable_chunked_prefill') == '--enable-chunked-prefill'
    assert prof.FLAGS['swap_space'].describe().startswith('--swap-space (< 0.18.0)')
    assert prof.flag_span('kv_cache_memory_bytes') == '--kv-cache-memory-bytes (vLLM >= 0.10.2)'


@pytest.mark.parametrize('version, util', [
    ('0.8.5', 0.9), ('0.10.1.1', 0.9), ('0.19.0', 0.9), ('0.20.0', 0.92), ('0.20.0rc1', 0.92), ('0.33.0', 0.92)])
def test_default_gpu_memory_utilization(version, util):
    assert prof.default_gpu_memory_utilization(V(version)) == util


H100 = ('NVIDIA H100 80GB HBM3', int(79.18 * GiB))
A100 = ('NVIDIA A100-SXM4-80GB', int(79.15 * GiB))
A6000 = ('NVIDIA RTX A6000', 51527024640)
B200 = ('NVIDIA B200', int(178 * GiB))


@pytest.mark.parametrize('version, gpu, mnbt, seqs', [
    ('0.8.5', H100, 8192, 1024),
    ('0.8.5', A100, 8192, 1024),      # no A100 exception before 0.9
    ('0.10.1.1', A100, 2048, 256),
    ('0.10.1.1', H100, 8192, 1024),
    ('0.10.1.1', A6000, 2048, 256),
    ('0.27.0', B200, 8192, 1024),
    ('0.28.0', B200, 16384, 1024),
    ('0.28.0', A6000, 2048, 256),
])
def test_batch_defaults_by_device_and_version(version, gpu, mnbt, seqs):
    defaults = prof.batch_defaults(V(version), gpu[0], gpu[1])
    assert (defaults.max_num_batched_tokens, defaults.max_num_seqs) == (mnbt, seqs)
    assert version.split('rc')[0] in defaults.rule


@pytest.mark.parametrize('version, graphs, nccl_baseline', [
    ('0.8.5', prof.GRAPHS_OUTSIDE, False),
    ('0.10.1.1', prof.GRAPHS_OUTSIDE, False),
    ('0.11.0', prof.GRAPHS_OUTSIDE, True),
    ('0.17.0', prof.GRAPHS_OUTSIDE, True),
    ('0.18.0', prof.GRAPHS_OPT_IN, True),
    ('0.19.0', prof.GRAPHS_OPT_IN, True),
    ('0.20.0', prof.GRAPHS_INSIDE, True),
    ('0.33.0', prof.GRAPHS_INSIDE, True),
])
def test_accounting_eras(version, graphs, nccl_baseline):
    acct = prof.accounting(V(version))
    assert acct.cuda_graphs == graphs
    assert acct.nccl_in_baseline is nccl_baseline
    assert all(version in rule for rule in acct.rules)


def test_kv_cache_dtype_choices_by_version():
    assert prof.kv_cache_dtype_choices(V('0.10.1.1')) == ['auto', 'fp8', 'fp8_e4m3', 'fp8_e5m2']
    assert 'bfloat16' in prof.kv_cache_dtype_choices(V('0.11.0'))
    assert 'float16' not in prof.kv_cache_dtype_choices(V('0.18.0'))
    assert 'float16' in prof.kv_cache_dtype_choices(V('0.19.0'))
    assert prof.kv_cache_dtype_bytes('auto', V('0.11.0'), 2) == 2
    assert prof.kv_cache_dtype_bytes('fp8_e5m2', V('0.11.0'), 2) == 1


@pytest.mark.parametrize('dtype, version, match', [
    ('bfloat16', '0.10.1.1', r'needs vLLM >= 0\.11\.0'),
    ('float16', '0.18.0', r'needs vLLM >= 0\.19\.0'),
    ('fp8_inc', '0.11.0', 'Gaudi'),
    ('int4', '0.11.0', 'unknown'),
])
def test_kv_cache_dtype_refused(dtype, version, match):
    with pytest.raises(PlanInputError, match=match) as err:
        prof.kv_cache_dtype_bytes(dtype, V(version), 2)
    assert err.value.field == 'kv_cache_dtype'


def test_capture_sizes_follow_the_version_rule():
    sizes = prof.cudagraph_capture_sizes(V('0.10.1.1'), 32, 2048)
    assert sizes[:4] == [1, 2, 4, 8] and sizes[-1] == 512 and len(sizes) == 67
    sizes = prof.cudagraph_capture_sizes(V('0.12.0'), 32, 2048)
    assert sizes[-1] == 64          # min(max_num_seqs * 2, 512)
    assert prof.cudagraph_capture_sizes(V('0.12.0'), 1024, 256)[-1] == 256   # <= max_num_batched_tokens
