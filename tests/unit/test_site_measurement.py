# -*- coding: utf-8 -*-
# Copyright (c) 2026, kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""site.yml brings each deployment's measurement home (issue 36.4), with ansible-playbook on
localhost: the probe task's `measurements` and the report's measurement line are taken verbatim
from playbooks/site.yml, the plans come from playbooks/tasks/plan_deployments.yml (the real
serving_plan action), the GPUs from the real gpu_facts over the NVML stub. The measurement files
stand where the watchdogs would have written them: a deployment with traffic_source measured
plans from its file; one without a file keeps its declaration and says why; an unusable file is
named in the report and planned without; the inventory's own `measurement` wins over the node's.
"""
from __future__ import annotations

import json
import os
import re

import pytest
import yaml

from local_playbook import REPO_ROOT, run_tasks_on_localhost
from nvml_stub_pynvml import stub_library_path

SITE = os.path.join(REPO_ROOT, 'playbooks', 'site.yml')
PLAN_TASKS = os.path.join(REPO_ROOT, 'playbooks', 'tasks', 'plan_deployments.yml')
FIXTURE = os.path.join(REPO_ROOT, 'tests', 'fixtures', 'nvml', 'lab-a6000x4.json')


def _site_task(name):
    with open(SITE, encoding='utf-8') as handle:
        plays = yaml.safe_load(handle)
    tasks = next(p for p in plays if 'tasks' in p)['tasks']
    return next(t for t in tasks if t.get('name') == name)


def _measured(requests, prompt_upper, generation_upper, concurrency):
    figures = dict(requests=requests, prompt_tokens_p99_lower=prompt_upper * 0.9,
                   prompt_tokens_p99_upper=prompt_upper, prompt_tokens_p99_censored=False,
                   generation_tokens_p99_lower=generation_upper * 0.9, generation_tokens_p99_upper=generation_upper,
                   generation_tokens_p99_censored=False, max_concurrency=concurrency, length_truncated=0,
                   rejected=0, preemptions=0, restarts_seen=0)
    return {'traffic': figures, 'kv_pool': None, 'gpu': None, 'backend_version': None, 'args': None,
            'measured_at': '2026-12-07T06:00:00Z'}


def deployment(name, **over):
    out = {'name': name, 'backend': 'vllm', 'backend_version': '0.10.1.1',
           'model': 'meta-llama/Llama-3.1-8B-Instruct', 'gpu_indexes': [0], 'traffic_source': 'measured',
           'traffic': {'prompt_tokens_p99': 8192, 'max_output_tokens': 1024, 'max_concurrency': 8},
           'engine': {}}
    out.update(over)
    return out


@pytest.fixture(scope='module')
def stub_library():
    return stub_library_path()


def test_each_deployment_is_planned_from_what_its_node_measured(tmp_path, stub_library, monkeypatch):
    files = {name: str(tmp_path / name / 'measurement.json') for name in ('chat', 'new', 'broken', 'given')}
    for name in ('chat', 'broken', 'given'):
        os.makedirs(os.path.dirname(files[name]))
    with open(files['chat'], 'w', encoding='utf-8') as handle:
        json.dump(_measured(1200, 2048, 512, 6), handle)
    with open(files['broken'], 'w', encoding='utf-8') as handle:
        handle.write('{"traffic": {"requests": -1}}')
    with open(files['given'], 'w', encoding='utf-8') as handle:
        json.dump(_measured(1200, 1024, 256, 2), handle)
    probe = _site_task('Probe | read the GPUs and the managed files, units and health of each node')
    report = _site_task('Probe and plan | report')
    measurement_line = [line for line in report['ansible.builtin.debug']['msg'].splitlines()
                        if 'kvpin_measurements' in line]
    assert len(measurement_line) == 1
    tasks = [
        {'name': 'Inventory and the watchdog role\'s paths', 'ansible.builtin.set_fact': {
            'kvpin_deployments': [deployment('chat'), deployment('new'), deployment('broken'),
                                  deployment('given', measurement=_measured(1200, 4096, 512, 4))],
            'serving_watchdog_measurement_files': files, 'kvpin_watchdog_enabled': True}},
        {'name': 'Probe', 'kvpin.fleet.gpu_facts': {'library_path': stub_library,
                                                    'measurements': probe['kvpin.fleet.gpu_facts']['measurements']}},
        {'name': 'Plan', 'ansible.builtin.include_tasks': PLAN_TASKS},
        {'name': 'Report', 'ansible.builtin.debug': {
            'msg': '{{ [] ' + measurement_line[0].strip() + ' }}'}},
        {'name': 'Plans', 'ansible.builtin.debug': {
            'msg': "{{ kvpin_plans.results | map(attribute='plan') | map(attribute='settings') "
                   "| map(attribute='max_model_len') | list }}"}},
        {'name': 'Warnings', 'ansible.builtin.debug': {
            'msg': "{{ kvpin_plans.results | map(attribute='plan') | map(attribute='warnings') | list }}"}},
    ]
    monkeypatch.setenv('KVPIN_NVML_STUB_CONFIG', FIXTURE)
    proc = run_tasks_on_localhost(tmp_path, tasks)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    lens = re.search(r'"msg": \[\s*(\d+),\s*(\d+),\s*(\d+),\s*(\d+)\s*\]', out)
    assert lens, out[-3000:]
    chat, new, broken, given = (int(v) for v in lens.groups())
    # chat: the measured 2048 + 512 (rounded up to a power of two); the others: the declaration
    # (8192 + 1024), but `given`, whose inventory measurement wins over its node's file.
    assert chat == 4096 and new == broken == 16384 and given == 8192
    assert ('broken: measurement file %s not used (invalid measurement.traffic.requests' % files['broken']) in out
    assert out.count('no traffic measured for this deployment yet') == 2     # new and broken
