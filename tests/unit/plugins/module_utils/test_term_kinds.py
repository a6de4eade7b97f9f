# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""GpuMemory.term_kinds (plugins/module_utils/plan/term_kinds.py): every term of every plan says
whether it is shapes, engine source, measured, fitted, policy or derived, and the terms the
Fitted constants feed say 'fitted'. The plans are those of serving_plan's RETURN doc test
(both backends, vLLM eras, TP 1-4, pipeline parallelism, offload)."""

from __future__ import annotations

import importlib.util
import os

import pytest

from ansible_collections.kvpin.fleet.plugins.module_utils.plan import cuda_total as ct
from ansible_collections.kvpin.fleet.plugins.module_utils.plan import term_kinds as tk
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.serving_plan import serving_plan_result
from ansible_collections.kvpin.fleet.plugins.module_utils.units import GiB

HERE = os.path.dirname(os.path.abspath(__file__))


def _return_doc_cases():
    path = os.path.join(os.path.dirname(HERE), 'modules', 'test_serving_plan_return_doc.py')
    spec = importlib.util.spec_from_file_location('kvpin_return_doc_cases', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return list(module._cases())


CASES = _return_doc_cases()


def _memories():
    for backend, params in CASES:
        result = serving_plan_result(params)
        assert 'plan' in result, result.get('msg')
        for memory in result['plan']['memory']:
            yield backend, memory


MEMORIES = list(_memories())


def test_every_term_of_every_plan_has_a_kind():
    assert len(MEMORIES) > 50
    for backend, memory in MEMORIES:
        kinds = memory['term_kinds']
        assert set(kinds) == set(memory['terms']) | set(tk.HEADLINE), (backend, set(kinds) ^ set(memory['terms']))
        assert set(kinds.values()) <= set(tk.KINDS), (backend, kinds)


VLLM_OTHERS = {'activation_sampler_warmup': tk.SHAPES_FITTED, 'safety_margin': tk.POLICY,
               'activation_unexplained_reserve': tk.POLICY, 'weights_sharded': tk.SHAPES,
               'kv_bytes_per_token': tk.SHAPES, 'profiler_underestimate_buffer': tk.ENGINE}
LLAMACPP_EXPECTED = {'cuda_context': tk.FITTED, 'compute_buffer': tk.SHAPES_FITTED,
                     'compute.attention_peak': tk.SHAPES_FITTED, 'model_buffer': tk.SHAPES,
                     'kv_buffer': tk.SHAPES}


def test_the_terms_fitted_constants_feed_are_marked_fitted():
    fitted_vllm = ('cuda_context', 'non_torch_growth', 'tp_workspaces', 'nccl_buffers', 'cuda_graph_nodes',
                   'cuda_graph_collectives', 'cold_compile_margin', 'non_torch')
    seen = set()
    for backend, memory in MEMORIES:
        kinds = memory['term_kinds']
        if backend == 'vllm':
            for name in fitted_vllm:
                if name in kinds:
                    assert kinds[name] == tk.FITTED, name
                    seen.add(name)
            expected = VLLM_OTHERS
        else:
            expected = LLAMACPP_EXPECTED
        for name, kind in expected.items():
            if name in kinds:
                assert kinds[name] == kind, (backend, name)
                seen.add(name)
    assert seen == set(fitted_vllm) | set(VLLM_OTHERS) | set(LLAMACPP_EXPECTED)


def test_driver_reserved_kind_follows_where_the_gap_came_from():
    assert tk.driver_reserved_kind(ct.estimate('NVIDIA H100 80GB HBM3', 85520809984)) == tk.MEASURED
    assert tk.driver_reserved_kind(ct.estimate('NVIDIA RTX A5000', 25757220864)) == tk.POLICY     # derived row
    assert tk.driver_reserved_kind(ct.estimate('Some Future GPU', 100 * GiB)) == tk.POLICY          # default margin
    assert tk.driver_reserved_kind(ct.estimate('Some Future GPU', 100 * GiB, 4 * GiB)) == tk.MEASURED  # NVML v2


def test_a_term_missing_from_the_tables_reads_unclassified_not_a_traceback():
    cuda = ct.estimate('NVIDIA H100 80GB HBM3', 85520809984)
    kinds = tk.term_kinds(tk.VLLM, ['weights_sharded', 'brand_new_term'], cuda)
    assert kinds['brand_new_term'] == tk.UNCLASSIFIED and kinds['weights_sharded'] == tk.SHAPES
    assert tk.UNCLASSIFIED not in tk.KINDS


@pytest.mark.parametrize('table', [tk.VLLM, tk.LLAMACPP], ids=['vllm', 'llamacpp'])
def test_tables_use_only_the_documented_kinds(table):
    assert set(table.values()) <= set(tk.KINDS)
    assert set(tk.HEADLINE) <= set(table)
