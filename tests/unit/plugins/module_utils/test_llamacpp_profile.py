# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The llama-box / llama.cpp version table: placement rule, flash-attention flags, padding."""

from __future__ import annotations

import pytest

from ansible_collections.kvpin.fleet.plugins.module_utils.plan import llamacpp_profile as prof
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.plan_types import PlanInputError


def test_llama_box_uses_mid_2025_rules():
    p = prof.engine_profile('llama-box', 'v0.0.171')
    assert p.generation == prof.GENERATION_2025
    assert not p.output_layer_first
    assert not p.flash_attn_tristate
    assert p.v_quant_without_fa == 'reset_f16'
    assert p.parallel_sets_http_threads
    assert p.flag('gpu_layers') == '--gpu-layers'


def test_llama_box_newer_than_read_release_warns():
    p = prof.engine_profile('llama-box', '0.0.200')
    assert p.warnings and 'v0.0.171' in p.warnings[0]


@pytest.mark.parametrize('version', ['b7347', '7347', 'b6000'])
def test_llama_cpp_before_pr_18148_offloads_output_last(version):
    p = prof.engine_profile('llama.cpp', version)
    assert not p.output_layer_first
    # -ngl 1: the last block, no output layer
    assert prof.gpu_blocks_and_output(p, 80, 1) == (79, 1, False)
    # -ngl 80: all blocks, output stays on the CPU; -ngl 81 adds it
    assert prof.gpu_blocks_and_output(p, 80, 80) == (0, 80, False)
    assert prof.gpu_blocks_and_output(p, 80, 81) == (0, 80, True)


def test_llama_cpp_after_pr_18148_offloads_output_first():
    p = prof.engine_profile('llama.cpp', 'b7710')
    assert p.output_layer_first and not p.warnings
    assert prof.gpu_blocks_and_output(p, 80, 1) == (80, 0, True)
    assert prof.gpu_blocks_and_output(p, 80, 2) == (79, 1, True)
    assert prof.gpu_blocks_and_output(p, 80, 81) == (0, 80, True)
    assert prof.gpu_blocks_and_output(p, 80, 0) == (80, 0, False)


def test_build_between_known_boundaries_warns_and_assumes_new_rule():
    p = prof.engine_profile('llama.cpp', 'b7500')
    assert p.output_layer_first
    assert p.warnings and 'b7347' in p.warnings[0] and 'b7710' in p.warnings[0]


def test_flash_attn_flag_by_build():
    old = prof.engine_profile('llama.cpp', 'b6000')
    new = prof.engine_profile('llama.cpp', 'b%d' % prof.FLASH_ATTN_TRISTATE_FROM_BUILD)
    box = prof.engine_profile('llama-box', 'v0.0.171')
    assert prof.flash_attn_args(old, True) == ['--flash-attn']
    assert prof.flash_attn_args(old, False) == []          # off = no switch
    assert prof.flash_attn_args(new, True) == ['--flash-attn', 'on']
    assert prof.flash_attn_args(new, False) == ['--flash-attn', 'off']
    assert prof.flash_attn_args(box, False) == ['--no-flash-attn']
    assert old.v_quant_without_fa == 'error'


def test_kv_padding_by_build():
    old = prof.engine_profile('llama.cpp', 'b6000')
    new = prof.engine_profile('llama.cpp', 'b%d' % prof.KV_PAD_ALWAYS_256_FROM_BUILD)
    assert (old.kv_padding(False), old.kv_padding(True)) == (32, 256)
    assert (new.kv_padding(False), new.kv_padding(True)) == (256, 256)


def test_flags_are_separate_tokens_without_equals():
    for flags in (prof.FLAGS_LLAMA_BOX, prof.FLAGS_LLAMA_CPP):
        assert all(v is None or ('=' not in v and v.startswith('-')) for v in flags.values())


@pytest.mark.parametrize('engine,version', [
    ('llama.cpp', 'server-cuda'), ('llama.cpp', ''), ('llama-box', 'b6000'), ('llama-box', None),
    ('vllm', '0.10.0')])
def test_bad_versions_are_refused(engine, version):
    with pytest.raises(PlanInputError) as err:
        prof.engine_profile(engine, version)
    assert err.value.field in ('backend_version', 'backend')


@pytest.mark.parametrize('version, has_fit', [
    ('b6000', False), ('b%d' % prof.FIT_LAST_BUILD_WITHOUT, False),
    ('b%d' % prof.FIT_FIRST_BUILD_WITH, True), ('b7710', True), ('b9585', True)])
def test_fit_exists_from_its_first_build(version, has_fit):
    p = prof.engine_profile('llama.cpp', version)
    assert p.has_fit is has_fit
    assert prof.fit_args(p) == (['--fit', 'off'] if has_fit else [])
    assert any('--fit off' in rule for rule in p.rules) is has_fit


def test_fit_boundaries_are_ordered_and_the_gap_warns_without_emitting():
    assert prof.FIT_LAST_BUILD_WITHOUT < prof.FIT_FIRST_BUILD_WITH
    gap = prof.engine_profile('llama.cpp', 'b%d' % (prof.FIT_FIRST_BUILD_WITH - 1))
    assert prof.fit_args(gap) == []
    assert any('--fit off is not pinned' in w and 'b%d' % prof.FIT_FIRST_BUILD_WITH in w for w in gap.warnings)


def test_llama_box_never_gets_fit():
    box = prof.engine_profile('llama-box', 'v0.0.171')
    assert not box.has_fit and prof.fit_args(box) == [] and box.flag('fit') is None
