# -*- coding: utf-8 -*-
# Copyright (c) 2026, kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""site.yml wires scheduled traffic classes to the watchdog's profile switch, without the lab.

ansible-playbook on localhost runs site.yml's own play vars (copied verbatim) and its watchdog
State tasks (taken from site.yml) around the real probe (kvpin.fleet.gpu_facts over the NVML
stub, lab-4090x2's cards) and the real plan phase (playbooks/tasks/plan_deployments.yml): before
planning the watchdog's desired state names the switch units of a deployment with
traffic_classes (so the one probe round trip observes them); after planning it holds the plan's
profiles and one OnCalendar per window edge, on the same paths. A deployment that gives its
traffic both ways, or neither, fails in the plan phase with a message naming the fields.
"""
from __future__ import annotations

import copy
import json
import os

import pytest
import yaml

from local_playbook import REPO_ROOT, run_tasks_on_localhost
from nvml_stub_pynvml import stub_library_path

SITE = os.path.join(REPO_ROOT, 'playbooks', 'site.yml')
PLAN_TASKS = os.path.join(REPO_ROOT, 'playbooks', 'tasks', 'plan_deployments.yml')
FIXTURE = os.path.join(REPO_ROOT, 'tests', 'fixtures', 'nvml', 'lab-4090x2.json')
CLASSES = [
    {'name': 'chat', 'prompt_tokens_p99': 2048, 'max_output_tokens': 512, 'max_concurrency': 8,
     'hours': '06:00-18:00'},
    {'name': 'batch', 'prompt_tokens_p99': 30000, 'max_output_tokens': 2048, 'max_concurrency': 2,
     'hours': '18:00-06:00'},
]
SCHEDULED = {'name': 'day-night', 'backend': 'llama-box', 'backend_version': 'v0.0.171',
             'model': 'meta-llama/Llama-3.1-8B-Instruct', 'gpu_indexes': [0],
             'traffic_classes': CLASSES, 'engine': {'quantization': 'Q4_K_M'}}
SINGLE_CLASS = {'name': 'plain', 'backend': 'vllm', 'backend_version': '0.10.1.1',
                'model': 'meta-llama/Llama-3.1-8B-Instruct', 'gpu_indexes': [1],
                'traffic': {'prompt_tokens_p99': 4096, 'max_output_tokens': 512, 'max_concurrency': 8},
                'engine': {'gpu_memory_utilization': 0.8}}


def _site_play_and_task(name):
    with open(SITE, encoding='utf-8') as handle:
        plays = yaml.safe_load(handle)
    play = next(p for p in plays if 'tasks' in p)
    [task] = [t for t in play['tasks'] if t.get('name') == name]
    return play, copy.deepcopy(task)


def _dump(work, label, expression):
    return {'name': 'Result %s' % label,
            'ansible.builtin.copy': {'content': '{{ %s | to_json }}' % expression,
                                     'dest': str(work / ('%s.json' % label)), 'mode': '0600'}}


def run_site_phases(tmp_path, monkeypatch, deployments):
    """site.yml's watchdog State before the probe, the probe, the plan phase, the State after
    planning; returns (CompletedProcess, {label: value} of the dumped results)."""
    play, before = _site_play_and_task('State | what the watchdog role manages')
    _unused, after = _site_play_and_task('State | the watchdogs as this node\'s plans make them')
    play_vars = copy.deepcopy(play['vars'])
    play_vars.update(kvpin_deployments=deployments, gpustack_server_url='http://gpustack.invalid',
                     gpustack_api_key='test-key-not-secret', gpustack_api_version='v1',
                     gpustack_worker_runtime='native', kvpin_gpustack_worker_name='lab-4090x2')
    watchdog_files = "serving_watchdog_desired_state.files | map(attribute='path') | list"
    tasks = [
        before,
        _dump(tmp_path, 'targets_before', 'serving_watchdog_targets'),
        _dump(tmp_path, 'files_before', watchdog_files),
        _dump(tmp_path, 'units_before', 'serving_watchdog_desired_state.units'),
        _dump(tmp_path, 'rows_before', 'serving_watchdog_desired_state.files'),
        {'name': 'Probe', 'kvpin.fleet.gpu_facts': {'library_path': stub_library_path()}},
        {'name': 'Plan', 'ansible.builtin.include_tasks': PLAN_TASKS},
        after,
        _dump(tmp_path, 'targets_after', 'serving_watchdog_targets'),
        _dump(tmp_path, 'files_after', "serving_watchdog_desired_state.files"),
        _dump(tmp_path, 'units_after', 'serving_watchdog_desired_state.units'),
        _dump(tmp_path, 'plans', "kvpin_plans.results | map(attribute='plan') | list"),
    ]
    for task in (before, after):
        task.pop('tags', None)
        task.pop('when', None)
    monkeypatch.setenv('KVPIN_NVML_STUB_CONFIG', FIXTURE)
    proc = run_tasks_on_localhost(tmp_path, tasks, play_vars=play_vars)
    results = {}
    for path in tmp_path.glob('*.json'):
        results[path.stem] = json.loads(path.read_text())
    return proc, results


@pytest.fixture(scope='module')
def scheduled_run(tmp_path_factory):
    monkeypatch = pytest.MonkeyPatch()
    try:
        proc, results = run_site_phases(tmp_path_factory.mktemp('site'), monkeypatch, [SCHEDULED, SINGLE_CLASS])
    finally:
        monkeypatch.undo()
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    return results


def test_before_planning_the_probe_observes_the_switch_units_of_a_traffic_classes_deployment(scheduled_run):
    targets = {t['name']: t for t in scheduled_run['targets_before']}
    assert targets['day-night']['profiles'] == {} and targets['day-night']['profile_schedule'] == []
    assert 'profile_schedule' not in targets['plain']
    files = scheduled_run['files_before']
    assert '/etc/systemd/system/kvpin-profile-switch-day-night.service' in files
    assert '/etc/systemd/system/kvpin-profile-switch-day-night.timer' in files
    assert not [f for f in files if 'kvpin-profile-switch-plain' in f]
    assert 'kvpin-profile-switch-day-night.timer' in [u['name'] for u in scheduled_run['units_before']]


def test_before_planning_the_state_is_paths_only_and_after_it_has_every_sha1(scheduled_run):
    # site.yml's first pass renders no content (the probe reads each file's sha1 for the later
    # comparison); the pass after planning has the sha1 of every file with content.
    before = {f['path']: f for f in scheduled_run['rows_before']}
    after = {f['path']: f for f in scheduled_run['files_after']}
    assert not [path for path, row in before.items() if 'sha1' in row]
    read = sorted(path for path, row in before.items() if row.get('read_sha1'))
    assert '/etc/systemd/system/kvpin-profile-switch-day-night.timer' in read
    assert read == sorted(path for path, row in after.items() if 'sha1' in row)
    assert not [path for path, row in after.items() if 'read_sha1' in row]


def test_after_planning_the_targets_hold_the_plans_profiles_and_a_timer_edge_per_window(scheduled_run):
    plan = scheduled_run['plans'][0]
    assert plan['strategy'] == 'scheduled'
    assert plan['schedule'] == [{'at': '06:00', 'profile': 'chat'}, {'at': '18:00', 'profile': 'batch'}]
    target = {t['name']: t for t in scheduled_run['targets_after']}['day-night']
    assert target['profile_schedule'] == plan['schedule']
    assert target['profiles'] == {p['name']: p['args'] for p in plan['profiles']}
    assert target['profiles']['chat'] != target['profiles']['batch']
    # The same paths and units as the probe observed: the comparison needs no second round trip.
    files = {f['path']: f for f in scheduled_run['files_after']}
    assert set(files) <= set(scheduled_run['files_before'])
    assert {u['name'] for u in scheduled_run['units_after']} <= {u['name'] for u in scheduled_run['units_before']}
    timer = files['/etc/systemd/system/kvpin-profile-switch-day-night.timer']
    assert timer['sha1'] and timer['mode'] == '0644'
    assert {'name': 'kvpin-profile-switch-day-night.timer', 'enabled': True, 'active': True} in \
        scheduled_run['units_after']
    # The single-class deployment gets no switch.
    assert 'profile_schedule' not in {t['name']: t for t in scheduled_run['targets_after']}['plain']


@pytest.mark.parametrize('change,message', [
    ({'traffic': {'prompt_tokens_p99': 1, 'max_output_tokens': 1, 'max_concurrency': 1}},
     'kvpin_deployments entry day-night: give either traffic or traffic_classes, not both'),
    ({'traffic_classes': None}, 'kvpin_deployments entry day-night: traffic or traffic_classes is required'),
    ({'traffic_classes': {'name': 'chat'}}, 'kvpin_deployments entry day-night: traffic_classes must be a non-empty list'),
    ({'traffic_classes': []}, 'kvpin_deployments entry day-night: traffic_classes must be a non-empty list'),
])
def test_traffic_given_both_ways_or_neither_fails_naming_the_fields(tmp_path, monkeypatch, change, message):
    deployment = dict(SCHEDULED, **change)
    if deployment.get('traffic_classes') is None:
        del deployment['traffic_classes']
    proc, _results = run_site_phases(tmp_path, monkeypatch, [deployment])
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert message in out, out[-4000:]
    assert 'Traceback' not in out


def test_a_bad_traffic_class_is_refused_by_the_planner_naming_the_class_field(tmp_path, monkeypatch):
    bad = dict(SCHEDULED, traffic_classes=[dict(CLASSES[0], hours='25:00-06:00'), CLASSES[1]])
    proc, _results = run_site_phases(tmp_path, monkeypatch, [bad])
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "invalid traffic_classes[0].hours: '25:00-06:00' is not a time of day" in out, out[-4000:]
    assert 'Traceback' not in out
