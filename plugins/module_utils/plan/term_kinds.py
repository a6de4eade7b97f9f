# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What kind of figure each memory term of a plan is (GpuMemory.term_kinds): computed from
tensor shapes, copied from the engine's source, read off the device, a fitted guess, a
policy margin, or arithmetic on the others. The plan says so per term, so that a reader
knows which numbers are physics and which are fitted (plugins/module_utils/plan/fitted.py) or
chosen."""

from __future__ import annotations

from ansible_collections.kvpin.fleet.plugins.module_utils.plan import cuda_total as ct

SHAPES = 'shapes'              # tensor shapes x dtype bytes, as the engine allocates them
ENGINE = 'engine'              # a constant or rule copied from the engine's source
MEASURED = 'measured'          # read off this device (NVML) or a logged figure for its card
FITTED = 'fitted'              # a Fitted constant (fitted.py) scaled by the plan: a guess
SHAPES_FITTED = 'shapes+fitted'   # shapes plus a fitted part (the explanation names it)
POLICY = 'policy'              # a margin or guard the planner chooses, not physics
DERIVED = 'derived'            # a sum, difference, count or budget of the other terms
UNCLASSIFIED = 'unclassified'  # a term missing from the tables below (a unit test fails on it)
KINDS = (SHAPES, ENGINE, MEASURED, FITTED, SHAPES_FITTED, POLICY, DERIVED)

HEADLINE = ('total', 'budget', 'weights', 'activation', 'non_torch', 'cuda_graph', 'kv_cache', 'headroom')

VLLM = {
    'total': MEASURED, 'budget': DERIVED, 'weights': SHAPES_FITTED, 'activation': SHAPES_FITTED,
    'non_torch': FITTED, 'cuda_graph': SHAPES_FITTED, 'kv_cache': DERIVED, 'headroom': DERIVED,
    'weights_sharded': SHAPES, 'weights_replicated': SHAPES, 'weights_kv_proj_replication': SHAPES,
    # Marlin layout below compute capability 10: shapes; the 256-wide layout: fitted
    'weights_mxfp4_expert_padding': SHAPES_FITTED,
    'weights_v2_load_residual': FITTED,
    'weights_pp_layers': SHAPES, 'weights_pp_embedding': SHAPES, 'weights_pp_lm_head': SHAPES,
    'activation_sampler_warmup': SHAPES_FITTED,      # the sort path's residual is fitted
    'activation_hidden_states': SHAPES, 'activation_forward_pass': SHAPES,
    'activation_pp_intermediate_tensors': SHAPES,
    'activation_unexplained_reserve': POLICY,
    'cuda_graph_nodes': FITTED, 'cuda_graph_intermediates': SHAPES, 'cuda_graph_collectives': FITTED,
    'non_torch_growth': FITTED, 'tp_workspaces': FITTED, 'nccl_buffers': FITTED,
    'pp_nccl_buffers': FITTED, 'cuda_context': FITTED,
    'outside_cuda_context': FITTED, 'outside_nccl_buffers': FITTED, 'outside_pp_nccl_buffers': FITTED,
    'outside_cuda_graph_pool': SHAPES_FITTED, 'outside_cublas_workspaces': FITTED,
    'profiler_underestimate_buffer': ENGINE, 'extensible_margin': ENGINE,
    'extensible_transient_peak': DERIVED,
    'safety_margin': POLICY, 'cold_compile_margin': FITTED,
    'kv_budget_warm': DERIVED, 'kv_budget_cold': DERIVED,
    'v2_runner_buffers': SHAPES, 'cold_compile_transient': FITTED, 'cold_compile_pinned_segments': FITTED,
    'kv_budget': DERIVED, 'kv_bytes_per_token': SHAPES, 'kv_bytes_per_block': SHAPES,
    'kv_blocks_stage': DERIVED, 'pp_stage': DERIVED, 'pp_stage_layers': DERIVED,
    'outside_resident': DERIVED, 'outside_required': DERIVED,
    'nvml_total': MEASURED,
}

LLAMACPP = {
    'total': MEASURED, 'budget': POLICY, 'weights': SHAPES, 'activation': SHAPES_FITTED,
    'non_torch': FITTED, 'cuda_graph': ENGINE, 'kv_cache': SHAPES, 'headroom': DERIVED,
    'model_buffer': SHAPES, 'kv_buffer': SHAPES,
    'compute_buffer': SHAPES_FITTED,             # live-tensor counts fitted (HIDDEN_LIVE_AT_*)
    'cuda_pool_growth': SHAPES, 'cuda_context': FITTED, 'nvml_total': MEASURED,
}
# finer terms named '<prefix>.<part>' take the kind of the prefix's term
LLAMACPP_PREFIXES = {'compute.': SHAPES_FITTED, 'pool.': SHAPES}


def driver_reserved_kind(cuda):
    """MEASURED for NVML's reserved figure, a logged table row or a given CUDA total; POLICY
    for the default margin or a derived table row (cuda_total.CudaTotal.source)."""
    if cuda.source == ct.SOURCE_DEFAULT:
        return POLICY
    if cuda.source.startswith(ct.SOURCE_TABLE_PREFIX):
        card = cuda.source[len(ct.SOURCE_TABLE_PREFIX):]
        if any(row.card == card and row.derived for row in ct.CARD_GAPS):
            return POLICY
    return MEASURED


def term_kinds(table, terms, cuda, prefixes=None):
    """{term: kind} for the headline terms and every finer term of one GpuMemory; a term the
    tables miss is UNCLASSIFIED (the plan still works; tests/unit/plugins/module_utils/
    test_term_kinds.py fails on it)."""
    out = dict((name, table.get(name, UNCLASSIFIED)) for name in HEADLINE)
    for name in terms:
        if name == 'driver_reserved':
            out[name] = driver_reserved_kind(cuda)
            continue
        kind = table.get(name)
        for prefix, prefix_kind in (prefixes or {}).items():
            if kind is None and name.startswith(prefix):
                kind = prefix_kind
        out[name] = kind or UNCLASSIFIED
    return out
