# -*- coding: utf-8 -*-
# Copyright (c) 2026, kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""site.yml's per-GPU ledger in the plan phase, with ansible-playbook on localhost.

The probe is the real kvpin.fleet.gpu_facts over the NVML stub (a lab fixture's cards), the
plans come from playbooks/tasks/plan_deployments.yml (the real serving_plan action), and the
ledger from playbooks/tasks/gpu_ledger.yml, which site.yml imports in its plan phase. After them
stands a task that changes the node (a file written) in place of the worker phase: a pair of
deployments that overcommits a GPU fails the node in the plan phase and that file is never
written; a pair that fits gets there.
"""
from __future__ import annotations

import ast
import os
import re

import pytest
import yaml

from local_playbook import REPO_ROOT, run_tasks_on_localhost
from nvml_stub_pynvml import stub_library_path

SITE = os.path.join(REPO_ROOT, 'playbooks', 'site.yml')
PLAN_TASKS = os.path.join(REPO_ROOT, 'playbooks', 'tasks', 'plan_deployments.yml')
LEDGER_TASKS = os.path.join(REPO_ROOT, 'playbooks', 'tasks', 'gpu_ledger.yml')
FIXTURE = os.path.join(REPO_ROOT, 'tests', 'fixtures', 'nvml', 'lab-a6000x4.json')


def test_site_runs_the_ledger_in_the_plan_phase_before_the_worker_phase():
    with open(SITE, encoding='utf-8') as handle:
        plays = yaml.safe_load(handle)
    play = next(p for p in plays if 'tasks' in p)
    tasks = play['tasks']
    names = [t.get('name', '') for t in tasks]
    ledger = next(i for i, t in enumerate(tasks) if t.get('ansible.builtin.import_tasks') == 'tasks/gpu_ledger.yml')
    plan = next(i for i, t in enumerate(tasks) if t.get('ansible.builtin.import_tasks') == 'tasks/plan_deployments.yml')
    assert plan < ledger < names.index('Worker | GPUStack worker config and unit')
    # It runs whenever the plans do (tagged always, gated on the phases that need the plans:
    # --skip-tags models must not skip it; tests/unit/test_site_phase_tags.py).
    assert tasks[ledger]['tags'] == tasks[plan]['tags'] == ['always']
    assert tasks[ledger]['when'] == tasks[plan]['when'] == 'kvpin_plans_needed'
    [gate] = re.findall(r"kvpin_rollout_phases \| intersect\((\[[^]]*\])\) \| length > 0", play['vars']['kvpin_plans_needed'])
    assert set(ast.literal_eval(gate)) == {'plan', 'worker', 'watchdog', 'models'}


@pytest.fixture(scope='module')
def stub_library():
    return stub_library_path()


def deployment(name, util):
    return {'name': name, 'backend': 'vllm', 'backend_version': '0.10.1.1',
            'model': 'meta-llama/Llama-3.1-8B-Instruct', 'gpu_indexes': [0],
            'traffic': {'prompt_tokens_p99': 4096, 'max_output_tokens': 512, 'max_concurrency': 8},
            'engine': {'gpu_memory_utilization': util}}


def run_plan_phase(tmp_path, stub_library, deployments, monkeypatch, fixture=FIXTURE, **extra_vars):
    marker = tmp_path / 'node-changed'
    tasks = [
        {'name': 'Inventory', 'ansible.builtin.set_fact': dict(
            kvpin_deployments=deployments, gpustack_worker_runtime='native', **extra_vars)},
        {'name': 'Probe', 'kvpin.fleet.gpu_facts': {'library_path': stub_library}},
        {'name': 'Plan', 'ansible.builtin.include_tasks': PLAN_TASKS},
        {'name': 'Ledger', 'ansible.builtin.include_tasks': LEDGER_TASKS},
        {'name': 'Ledger report', 'ansible.builtin.debug': {'var': 'kvpin_gpu_ledger.report'}},
        {'name': 'Stand-in for the worker phase: the node changes',
         'ansible.builtin.copy': {'content': 'changed\n', 'dest': str(marker), 'mode': '0600'}},
    ]
    monkeypatch.setenv('KVPIN_NVML_STUB_CONFIG', fixture)
    return run_tasks_on_localhost(tmp_path, tasks), marker


def test_an_overcommitting_pair_fails_the_node_in_the_plan_phase_before_anything_changes(
        tmp_path, stub_library, monkeypatch):
    proc, marker = run_plan_phase(tmp_path, stub_library, [deployment('chat', 0.5), deployment('code', 0.5)],
                                  monkeypatch)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert 'the per-GPU ledger refuses the plans: GPU 0 (NVIDIA RTX A6000): memory overcommitted by' in out
    assert 'deployments on it: chat, code' in out
    assert not marker.exists()
    assert 'changed=0' in out and 'failed=1' in out


def test_a_pair_that_fits_passes_to_the_next_phase(tmp_path, stub_library, monkeypatch):
    proc, marker = run_plan_phase(tmp_path, stub_library, [deployment('chat', 0.42), deployment('code', 0.42)],
                                  monkeypatch)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert marker.exists()
    assert 'GPU 0 NVIDIA RTX A6000: memory' in out and 'chat' in out and 'code' in out


def test_plan_yml_reports_the_overcommit_without_failing(tmp_path, stub_library, monkeypatch):
    # playbooks/plan.yml includes the same tasks with kvpin_gpu_ledger_refuse: false.
    proc, marker = run_plan_phase(tmp_path, stub_library, [deployment('chat', 0.5), deployment('code', 0.5)],
                                  monkeypatch, kvpin_gpu_ledger_refuse=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert 'OVERCOMMITTED by' in out


def test_on_mixed_cards_the_planners_gpu_choice_is_charged_next_to_a_pinned_deployment(
        tmp_path, stub_library, monkeypatch):
    """lab-mixed's cards (A6000 at 0, RTX 4090 at 1): an 8B vLLM deployment without gpu_indexes
    is planned on the GPU the planner chose (not refused for mixed cards), that choice pins it,
    and the ledger charges it there only, next to a deployment pinned to the other card."""
    chosen = deployment('chat', 0.5)
    del chosen['gpu_indexes']
    pinned = dict(deployment('code', 0.85), gpu_indexes=[1])
    proc, marker = run_plan_phase(tmp_path, stub_library, [chosen, pinned], monkeypatch,
                                  fixture=os.path.join(REPO_ROOT, 'tests', 'fixtures', 'nvml', 'lab-mixed.json'))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert marker.exists()
    assert 'do not pin their GPUs' not in out
    assert 'GPU 0 NVIDIA RTX A6000: memory' in out and 'GPU 1 NVIDIA GeForce RTX 4090: memory' in out
    ledger_lines = [line for line in out.splitlines() if ': memory ' in line]
    assert any('GPU 0 NVIDIA RTX A6000' in line and 'chat' in line and 'code' not in line for line in ledger_lines), out
    assert any('GPU 1 NVIDIA GeForce RTX 4090' in line and 'code' in line and 'chat' not in line
               for line in ledger_lines), out
