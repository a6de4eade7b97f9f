# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Fitted constants (plugins/module_utils/plan/fitted.py): each carries its value and its source in
one object, the modules' FITTED_SOURCE_ROWS derive from those objects, and no explanation
string repeats a fitted number as a literal (they print ``describe()``). The split of the data
rows each object names is checked in tests/unit/test_validation_split.py."""

from __future__ import annotations

import ast
import glob
import os
import re

import pytest

from ansible_collections.kvpin.fleet.plugins.module_utils.plan import fitted as ft
from ansible_collections.kvpin.fleet.plugins.module_utils.plan import llamacpp_memory as lm
from ansible_collections.kvpin.fleet.plugins.module_utils.plan import llamacpp_profile as lp
from ansible_collections.kvpin.fleet.plugins.module_utils.plan import vllm_memory as vm
from ansible_collections.kvpin.fleet.plugins.module_utils.plan import vllm_profile as vp
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.model_loaders import resolve_model
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.plan_types import Traffic
from ansible_collections.kvpin.fleet.plugins.module_utils.units import GiB, MiB

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))))
MODULES = (vm, vp, lm, lp)


def fitted_objects(module):
    """The Fitted objects a module defines at module level (alone or in a tuple)."""
    found = []
    for value in vars(module).values():
        items = value if isinstance(value, tuple) else (value,)
        found.extend(item for item in items if isinstance(item, ft.Fitted))
    return found


# ---------------------------------------------------------------- the object
def test_describe_prints_the_value_in_its_unit_and_what_it_was_fitted_on():
    one = ft.Fitted('m.ONE', 3 * GiB // 2, ft.BYTES, 'rows a and b', ('a', 'b'))
    assert one.describe() == 'fitted 1.50 GiB on rows a and b'
    per = ft.Fitted('m.PER', 8 * MiB, ft.BYTES + ' per layer', 'row c', ('c',))
    assert per.shown() == '8.00 MiB per layer'
    scaled = ft.Fitted('m.X100', 19, '{} B per logit', 'seven rows', scale=100)
    assert scaled.shown() == '0.19 B per logit'
    assert ft.Fitted('m.PAD', 256, '{}-wide padding', 'two rows').describe() == (
        'fitted 256-wide padding on two rows')


def test_fitted_is_frozen():
    one = ft.Fitted('m.ONE', 1, ft.BYTES, 'x')
    with pytest.raises(Exception):
        one.value = 2


def test_source_rows_of_skips_constants_without_rows_and_refuses_a_name_twice():
    a = ft.Fitted('m.A', 1, ft.BYTES, 'x', ('r1', 'r2'))
    b = ft.Fitted('m.B', 1, ft.BYTES, 'an issue thread')
    assert ft.source_rows_of(a, b) == {'m.A': ('r1', 'r2')}
    with pytest.raises(ValueError, match='m.A declared twice'):
        ft.source_rows_of(a, a)


def test_describe_together_wants_one_source():
    a = ft.Fitted('m.A', 4, '{} live', 'the same rows', ('r',))
    b = ft.Fitted('m.B', 2, '{} at FFN', 'the same rows', ('r',))
    assert ft.describe_together((a, b)) == 'fitted 4 live, 2 at FFN on the same rows'
    with pytest.raises(ValueError):
        ft.describe_together((a, ft.Fitted('m.C', 1, '{}', 'other rows')))


# ---------------------------------------------------------------- the modules' constants
@pytest.mark.parametrize('module', MODULES, ids=lambda m: m.__name__.rsplit('.', 1)[-1])
def test_each_fitted_object_is_its_modules_constant(module):
    """The name is the module-level constant the code computes with, and the value is its."""
    objects = fitted_objects(module)
    assert objects
    short = module.__name__.rsplit('.', 1)[-1]
    for obj in objects:
        prefix, constant = obj.name.split('.', 1)
        assert prefix == short, obj.name
        assert getattr(module, constant) == obj.value, obj.name
        assert obj.fitted_on.strip() and obj.describe().startswith('fitted ')


@pytest.mark.parametrize('module', MODULES, ids=lambda m: m.__name__.rsplit('.', 1)[-1])
def test_fitted_source_rows_derive_from_the_fitted_objects(module):
    assert module.FITTED_SOURCE_ROWS == ft.source_rows_of(*fitted_objects(module))


def test_every_vllm_fitted_constant_is_an_object():
    names = set(obj.name for obj in fitted_objects(vm))
    assert names == set([
        'vllm_memory.CUDA_CONTEXT_BYTES', 'vllm_memory.NON_TORCH_GROWTH_BYTES',
        'vllm_memory.TP_WORKSPACE_BYTES', 'vllm_memory.NCCL_BYTES_PER_CHANNEL_CONNECTION',
        'vllm_memory.SAMPLER_SORT_RESIDUAL_X100', 'vllm_memory.GRAPH_BYTES_PER_LAYER',
        'vllm_memory.GRAPH_COLLECTIVE_BYTES_PER_CONNECTION', 'vllm_memory.COLD_COMPILE_KV_FRACTION_X1000',
        # Model Runner V2 (issue 37)
        'vllm_memory.COLD_COMPILE_TRANSIENT_COPIES', 'vllm_memory.COLD_COMPILE_PINNED_COPIES',
        'vllm_memory.V2_LOAD_RESIDUAL_BYTES'])


# ---------------------------------------------------------------- no fitted number as a literal
_NUMBER = r'~?\d+(?:\.\d+)?\s*(?:GiB|MiB|KiB|GB|MB|B\b|%)'
FITTED_NUMBER = re.compile(r'\bfitted\b[^\n]{0,60}?' + _NUMBER + '|' + _NUMBER + r'[^\n]{0,40}?\bfitted\b'
                           r'|\bfitted\b[:\s]+(?:on\s+)?~?\d', re.IGNORECASE)
DOC_BLOCKS = ('DOCUMENTATION', 'EXAMPLES', 'RETURN')


def literal_fitted_numbers(source):
    """(line, text) of each string literal in Python source that puts a number next to
    'fitted', outside docstrings, the DOCUMENTATION/EXAMPLES/RETURN blocks and the arguments
    of a Fitted(...) call (where the source's own figures belong)."""
    tree = ast.parse(source)
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            skip.add(id(node.value))                                      # docstrings
        elif isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id in DOC_BLOCKS for t in node.targets):
            skip.update(id(n) for n in ast.walk(node.value))
        elif isinstance(node, ast.Call) and getattr(node.func, 'id', getattr(node.func, 'attr', '')) == 'Fitted':
            skip.update(id(n) for n in ast.walk(node))
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip
            and FITTED_NUMBER.search(node.value)]


def test_the_scan_flags_the_old_literals_and_passes_describe():
    """The scan below is not vacuous: the explanation texts this change replaced are caught."""
    old = '''
def explain(x):
    a = 'CUDA context + driver, outside torch (fitted: 0.61 GiB used at startup on H100, llm-d)'
    b = ('non-torch growth %s (cuBLAS/attention workspaces, fitted '
         '0.13 GiB llm-d TP1)' % x)
    c = 'topk_topp_sampler.py; only the sort residual, 0.19 B per logit, is fitted on the 7 llm-d rows'
    d = 'peak widths fitted on llama.cpp#8035 (CUDA0 1108.5 MiB)'
    return a, b, c, d
'''
    assert sorted(line for line, _text in literal_fitted_numbers(old)) == [3, 4, 6, 7]
    new = '''
X = Fitted('m.X', 1, 'bytes', 'llm-d (78.57 of 79.18 GiB free at startup, fitted 0.61 GiB)')
def explain():
    """Docstring: the fitted 0.19 B residual."""
    return 'CUDA context + driver, outside torch (%s)' % X.describe(), {'fitted_sort_residual': 1}
'''
    assert literal_fitted_numbers(new) == []


@pytest.mark.parametrize('path', sorted(
    os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, 'plugins', '**', '*.py'), recursive=True)))
def test_no_explanation_string_repeats_a_fitted_number(path):
    with open(os.path.join(ROOT, path)) as handle:
        found = literal_fitted_numbers(handle.read())
    assert found == [], 'print the Fitted object\'s describe() instead: %s' % found


# ---------------------------------------------------------------- the explanations print them
A6000 = {'uuid': 'GPU-a6000', 'name': 'NVIDIA RTX A6000', 'memory_total': 51527024640,
         'memory_used': 0, 'memory_free': 51527024640, 'compute_capability': '8.6'}


def _a6000s(count):
    return [dict(A6000, index=i, uuid='GPU-a6000-%d' % i) for i in range(count)]


def test_a_vllm_plan_explains_its_fitted_terms_with_describe():
    spec = resolve_model('meta-llama/Llama-3.3-70B-Instruct')
    traffic = Traffic(prompt_tokens_p99=4096, max_output_tokens=512, max_concurrency=4)
    # 0.24: the V1 runner (0.25+ runs this dense model on Model Runner V2, which charges no NCCL
    # collectives in its graphs: test_vllm_runner_v2.py checks its fitted terms' explanations)
    plan = vm.plan_vllm(spec, _a6000s(4), traffic, {'tensor_parallel_size': 4}, '0.24.0')
    explain = plan.memory[0].explain
    assert vm.CUDA_CONTEXT.describe() in explain['cuda_context']
    assert vm.NON_TORCH_GROWTH.describe() in explain['non_torch']
    assert vm.TP_WORKSPACE.describe() in explain['non_torch']
    assert vm.NCCL_PER_CHANNEL_CONNECTION.describe() in explain['nccl_buffers']
    assert vm.GRAPH_PER_LAYER.describe() in explain['cuda_graph']
    assert vm.GRAPH_COLLECTIVES.describe() in explain['cuda_graph']          # PCIe, TP 4: NCCL in graphs
    assert vm.SAMPLER_SORT_RESIDUAL.describe() in explain['activation']


def test_an_unpinned_vllm_plan_describes_its_cold_compile_margin():
    spec = resolve_model('meta-llama/Llama-3.1-8B-Instruct')
    traffic = Traffic(prompt_tokens_p99=4096, max_output_tokens=512, max_concurrency=4)
    plan = vm.plan_vllm(spec, _a6000s(1), traffic, {'tensor_parallel_size': 1}, '0.10.1.1')
    assert vm.COLD_COMPILE_MARGIN.describe() in plan.memory[0].explain['kv_cache']


def test_mxfp4_padding_explains_with_describe():
    spec = resolve_model('openai/gpt-oss-20b')
    _weights, terms, explain = vm.weights_per_gpu(spec, 1)
    assert terms['weights_mxfp4_expert_padding'] > 0
    assert vp.MXFP4_EXPERT_PAD.describe() in explain


def test_a_llamacpp_plan_explains_its_fitted_terms_with_describe():
    spec = resolve_model('meta-llama/Llama-3.3-70B-Instruct')
    traffic = Traffic(prompt_tokens_p99=4096, max_output_tokens=512, max_concurrency=4)
    plan = lm.plan_llamacpp(spec, _a6000s(1), traffic, {'quantization': 'Q4_K_M'}, 'llama-box', 'v0.0.171')
    explain = plan.memory[0].explain
    assert explain['cuda_context'] == lm.CUDA_CONTEXT.describe()
    assert ft.describe_together(lm.HIDDEN_LIVE) in explain['compute_buffer']
