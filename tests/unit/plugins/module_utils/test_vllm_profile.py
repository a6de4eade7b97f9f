# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The vLLM version table: parsing, flag ranges, defaults and accounting eras."""

from __future__ import annotations

import pytest

from ansible_collections.kvpin.fleet.plugins.module_utils.plan import vllm_profile as prof
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.plan_types import PlanInputError
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


@pytest.mark.parametrize('text', ['0.6.0', '0.6.0.post1', '0.5.5', '0.4.3', 'banana', '', None, '0.x'])
def test_unsupported_or_bad_versions_are_refused(text):
    with pytest.raises(PlanInputError) as err:
        V(text)
    assert err.value.field == 'backend_version'


@pytest.mark.parametrize('text', ['0.10', ' 0.12 ', 'v0.9', '0.20rc1'])
def test_a_series_without_its_release_is_refused_as_ambiguous(text):
    with pytest.raises(PlanInputError, match='ambiguous') as err:
        V(text)
    assert err.value.field == 'backend_version'


def test_too_old_message_names_the_oldest_supported_release():
    with pytest.raises(PlanInputError, match=r'older than the oldest supported release, 0\.6\.1') as err:
        V('0.6.0')
    assert 'gpustack 0.3.0' in str(err.value)


@pytest.mark.parametrize('text', ['0.6.1', '0.6.2', '0.6.6.post1', '0.7.3', '0.8.4', '0.34.0', '0.34.1'])
def test_every_release_gpustack_pinned_through_0_34_is_supported(text):
    assert prof.version_warnings(V(text)) == []


@pytest.mark.parametrize('text', ['0.35.0', '1.0.0'])
def test_a_release_newer_than_the_newest_read_is_planned_with_a_warning(text):
    warnings = prof.version_warnings(V(text))
    assert len(warnings) == 1 and 'newer than the newest release' in warnings[0] and '0.34.0' in warnings[0]


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
    # CacheDType gained float16 in 0.18.0 (vllm/config/cache.py:14 at v0.18.0; not at v0.17.1),
    # as tests/fixtures/vllm_flags/released.json records from the released wheels
    assert 'float16' not in prof.kv_cache_dtype_choices(V('0.17.1'))
    assert 'float16' in prof.kv_cache_dtype_choices(V('0.18.0'))
    assert prof.kv_cache_dtype_bytes('auto', V('0.11.0'), 2) == 2
    assert prof.kv_cache_dtype_bytes('fp8_e5m2', V('0.11.0'), 2) == 1


@pytest.mark.parametrize('dtype, version, match', [
    ('bfloat16', '0.10.1.1', r'needs vLLM >= 0\.11\.0'),
    ('float16', '0.17.1', r'needs vLLM >= 0\.18\.0'),
    ('fp8_inc', '0.11.0', 'Gaudi'),
    ('int4', '0.11.0', 'unknown'),
    ('nvfp4', '0.32.0', 'nvfp4.*not modelled'),
    ('turboquant_k8v4', '0.34.0', 'per-token-scaled KV cache whose page size'),
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


# ------------------------------------------------------------------ V0 engine (0.6.x, 0.7.x)
@pytest.mark.parametrize('version, profiler', [
    ('0.6.1', prof.V0_FREE_DELTA), ('0.6.3.post1', prof.V0_FREE_DELTA),
    ('0.6.4', prof.V0_DEVICE_NON_TORCH), ('0.6.4.post1', prof.V0_DEVICE_NON_TORCH),
    ('0.6.5', prof.V0_MEMORY_PROFILING), ('0.6.6.post1', prof.V0_MEMORY_PROFILING),
    ('0.7.3', prof.V0_MEMORY_PROFILING),
])
def test_v0_releases_use_their_own_profiler(version, profiler):
    acct = prof.accounting(V(version))
    assert acct.engine == 'v0' and acct.v0_profiler == profiler
    assert acct.cuda_graphs == prof.GRAPHS_OUTSIDE and acct.nccl_in_baseline is False
    assert acct.holds_null_block is False and acct.capture_size_rule == 'v0_max_num_seqs'
    assert all(version in rule for rule in acct.rules)


@pytest.mark.parametrize('version', ['0.8.0', '0.8.4', '0.8.5', '0.34.0'])
def test_v1_from_0_8_0(version):
    acct = prof.accounting(V(version))
    assert acct.engine == 'v1' and acct.holds_null_block and acct.held_back_blocks(1000) == 1


def test_v0_watermark_holds_one_percent_of_the_blocks_back():
    acct = prof.accounting(V('0.6.2'))
    assert acct.held_back_blocks(1000) == 10 and acct.held_back_blocks(99) == 0


@pytest.mark.parametrize('version', ['0.6.1', '0.7.3'])
def test_v0_flags(version):
    v = V(version)
    assert not prof.flag_available('kv_cache_memory_bytes', v)
    assert not prof.flag_available('enable_extensible_kv_cache', v)
    assert prof.flag_available('swap_space', v) and prof.flag_available('max_seq_len_to_capture', v)
    assert prof.default_gpu_memory_utilization(v) == 0.9 and prof.default_block_size(v) == 16


@pytest.mark.parametrize('version, max_model_len, chunked, mnbt', [
    ('0.6.2', 16384, False, 16384),     # <= 32k: off, the whole prompt in one batch
    ('0.6.2', 65536, True, 512),        # > 32k: on, SchedulerConfig default 512 before 0.6.5
    ('0.7.3', 16384, False, 16384),
    ('0.7.3', 65536, True, 2048),       # 2048 from 0.6.5
    ('0.7.3', 32768, False, 32768),     # "> 32768", not ">="
    ('0.7.3', 1024, False, 2048),       # max(max_model_len, 2048)
])
def test_v0_chunked_prefill_rule(version, max_model_len, chunked, mnbt):
    pre = prof.v0_prefill_defaults(V(version), max_model_len, False)
    assert (pre.chunked_prefill, pre.max_num_batched_tokens) == (chunked, mnbt)
    assert version in pre.rule


def test_v0_does_not_chunk_sliding_window_models_by_default():
    assert prof.v0_prefill_defaults(V('0.7.3'), 65536, True).chunked_prefill is False


def test_v0_user_batch_below_max_model_len_needs_chunked_prefill():
    pre = prof.v0_prefill_defaults(V('0.7.3'), 16384, False, 4096)
    assert pre.chunked_prefill and pre.max_num_batched_tokens == 4096 and 'refuses' in pre.rule


def test_v0_capture_sizes_go_up_to_max_num_seqs_padded():
    assert prof.cudagraph_capture_sizes(V('0.7.3'), 30, 16384)[-1] == 32
    assert prof.cudagraph_capture_sizes(V('0.6.2'), 256, 16384) == [1, 2, 4] + list(range(8, 257, 8))
    assert prof.cudagraph_capture_sizes(V('0.6.2'), 3, 16384) == [1, 2, 4]


def test_v0_has_no_batch_defaults_independent_of_max_model_len():
    with pytest.raises(ValueError, match='V0'):
        prof.batch_defaults(V('0.7.3'), 'NVIDIA H100 80GB HBM3', int(79.18 * GiB))


@pytest.mark.parametrize('version, gpu, mnbt, seqs', [
    ('0.8.0', A6000, 2048, 1024), ('0.8.3', H100, 8192, 1024), ('0.8.3', A100, 2048, 1024),
    ('0.8.4', A6000, 2048, 256), ('0.8.4', H100, 8192, 1024),
])
def test_batch_defaults_0_8_0_to_0_8_4_by_device_name(version, gpu, mnbt, seqs):
    defaults = prof.batch_defaults(V(version), gpu[0], gpu[1])
    assert (defaults.max_num_batched_tokens, defaults.max_num_seqs) == (mnbt, seqs)


# ------------------------------------------------------------------ 0.34: extensible KV cache
def test_0_34_extensible_kv_cache_era():
    v = V('0.34.0')
    acct = prof.accounting(v)
    assert acct.extensible_kv_default and not prof.accounting(V('0.33.0')).extensible_kv_default
    assert any('extensible KV cache is on by default' in rule for rule in acct.rules)
    assert prof.flag_available('enable_extensible_kv_cache', v)
    assert prof.flag_available('kv_cache_memory_bytes', v)
    assert prof.default_block_size(v) == 64 and prof.default_block_size(V('0.33.0')) == 16
    assert prof.EXTENSIBLE_DEFAULT_UTILIZATION == 1.0


def test_extensible_kv_bytes_is_vllm_measure_kv_cache_bytes():
    # a util cap well above what is free: headroom - margin binds; margin = the 1 GiB floor
    kv, margin = prof.extensible_kv_bytes(requested=80 * GiB, consumed=20 * GiB, headroom=58 * GiB,
                                          transient_peak=1 * GiB)
    assert margin == 1 * GiB and kv == 58 * GiB - 1 * GiB - 1 * GiB
    # a large transient peak: margin = 0.75 x transient
    kv, margin = prof.extensible_kv_bytes(80 * GiB, 20 * GiB, 58 * GiB, 4 * GiB)
    assert margin == 3 * GiB and kv == 58 * GiB - 3 * GiB - 4 * GiB
    # a low util cap binds before free memory does
    kv, margin = prof.extensible_kv_bytes(40 * GiB, 20 * GiB, 58 * GiB, 1 * GiB)
    assert kv == 40 * GiB - 20 * GiB - 1 * GiB
    assert prof.extensible_kv_bytes(10 * GiB, 20 * GiB, 58 * GiB, 1 * GiB)[0] == 0
