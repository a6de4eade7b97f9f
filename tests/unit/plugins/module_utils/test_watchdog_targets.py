# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""site.yml's derivation of watchdog targets from a node's deployments, and node_state's
directory entries, which make a removed deployment's leftover watchdog visible as drift."""

from __future__ import annotations

import json

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.kvpin.fleet.plugins.filter.kvpin import FilterModule
from ansible_collections.kvpin.fleet.plugins.module_utils.facts.node_state import (
    NodeStateInputError,
    compare,
    observe,
    parse_checks,
    summarize,
)
from ansible_collections.kvpin.fleet.plugins.module_utils.rollout.watchdog_targets import watchdog_targets

DERIVE = FilterModule().filters()['kvpin_watchdog_targets']
DEPLOYMENTS = [
    {'name': 'llama-3.1-8b', 'backend': 'vllm', 'gpu_indexes': [1, 0]},
    {'name': 'qwen', 'backend': 'llama.cpp', 'watchdog': {'memory_limit_bytes': 8 << 30, 'metrics_path': '/m',
                                                          'gpustack_deployment': 'qwen-prod'}},
]


def test_one_target_per_deployment_with_the_contract_keys():
    got = DERIVE(DEPLOYMENTS, 'http://gs:80', 'key', 'v1', 'node-a', 'native')
    assert [t['name'] for t in got] == ['llama-3.1-8b', 'qwen']
    assert got[0] == {'name': 'llama-3.1-8b', 'gpustack_deployment': 'llama-3.1-8b',
                      'gpustack_server': 'http://gs:80', 'gpustack_api_key': 'key',
                      'gpustack_api_version': 'v1', 'gpustack_worker_name': 'node-a',
                      'engine_runtime': 'native', 'gpu_indexes': [0, 1], 'metrics_path': '/metrics'}
    assert got[1]['memory_limit_bytes'] == 8 << 30 and got[1]['metrics_path'] == '/m'
    assert got[1]['gpustack_deployment'] == 'qwen-prod' and got[1]['gpu_indexes'] == []


# The keys of a serving_plan result with strategy scheduled that the watchdog needs
# (docs/traffic-classes.md): plan.profiles[].name/args and plan.schedule.
SCHEDULED_PLAN = {'strategy': 'scheduled', 'args': ['--max-num-seqs=64'],
                  'profiles': [{'name': 'chat', 'args': ['--max-num-seqs=64'], 'settings': {}},
                               {'name': 'batch', 'args': ['--max-num-seqs=4', '--max-model-len=32768'], 'settings': {}}],
                  'schedule': [{'at': '00:00', 'profile': 'batch'}, {'at': '07:00', 'profile': 'chat'}]}


def test_a_scheduled_plan_gives_its_target_the_profiles_and_the_schedule():
    plans = [{'deployment': {'name': 'llama-3.1-8b'}, 'plan': SCHEDULED_PLAN},
             {'deployment': {'name': 'qwen'}, 'plan': {'strategy': 'single', 'args': ['-c', '4096']}}]
    llama, qwen = DERIVE(DEPLOYMENTS, 'http://gs:80', 'key', 'v1', 'node-a', 'native', plans)
    assert llama['profiles'] == {'chat': ['--max-num-seqs=64'], 'batch': ['--max-num-seqs=4', '--max-model-len=32768']}
    assert llama['profile_schedule'] == [{'at': '00:00', 'profile': 'batch'}, {'at': '07:00', 'profile': 'chat'}]
    assert 'profiles' not in qwen and 'profile_schedule' not in qwen
    # What the plan tells the engine, for the KV pool the watchdog reads back (none when the
    # engine switches args by the hour).
    assert qwen['measurement_context'] == {'gpu': None, 'backend_version': None, 'args': ['-c', '4096']}
    assert 'measurement_context' not in llama
    # Without plans (or with an infeasible one: no plan key) nothing changes.
    assert DERIVE(DEPLOYMENTS, 'http://gs:80', 'key', 'v1', 'node-a', 'native') == \
        DERIVE(DEPLOYMENTS, 'http://gs:80', 'key', 'v1', 'node-a', 'native', [{'deployment': {'name': 'qwen'}}])


def test_before_planning_a_traffic_classes_deployment_names_its_switch_for_the_probe():
    """site.yml's probe runs before planning ('pending'): a deployment with traffic_classes may
    turn out scheduled, so its target names the switch (empty profiles and schedule) for the
    probe to observe; a single-class deployment does not."""
    deployments = [dict(DEPLOYMENTS[0], traffic_classes=[{'name': 'chat'}]), DEPLOYMENTS[1]]
    llama, qwen = DERIVE(deployments, 'http://gs:80', 'key', 'v1', 'node-a', 'native', 'pending')
    assert llama['profiles'] == {} and llama['profile_schedule'] == []
    assert 'profiles' not in qwen and 'profile_schedule' not in qwen
    # Planned, the same deployment gets what its plan says (here: not scheduled, no switch).
    planned = DERIVE(deployments, 'http://gs:80', 'key', 'v1', 'node-a', 'native',
                     [{'deployment': {'name': 'llama-3.1-8b'}, 'plan': {'strategy': 'single', 'args': []}}])
    assert all('profile_schedule' not in target for target in planned)


@pytest.mark.parametrize('plans', ['planned', {'deployment': {}}, 3])
def test_plans_that_are_neither_a_list_nor_pending_are_refused(plans):
    with pytest.raises(AnsibleFilterError, match="kvpin_watchdog_targets: plans must be kvpin_plans.results"):
        DERIVE(DEPLOYMENTS, 'http://gs:80', 'key', 'v1', 'node-a', 'native', plans)


@pytest.mark.parametrize('plan,message', [
    (dict(SCHEDULED_PLAN, profiles=[{'name': 'chat'}]), r'plan.profiles\[0\] needs a name and an args list'),
    (dict(SCHEDULED_PLAN, schedule=[{'at': '07:00', 'profile': 'weekend'}]), r'plan.schedule\[0\] needs'),
])
def test_a_malformed_scheduled_plan_is_refused_naming_the_field(plan, message):
    with pytest.raises(AnsibleFilterError, match=message):
        DERIVE(DEPLOYMENTS, 'http://gs:80', 'key', 'v1', 'node-a', 'native', [{'deployment': {'name': 'qwen'}, 'plan': plan}])


def test_container_workers_get_container_engines():
    assert {t['engine_runtime'] for t in DERIVE(DEPLOYMENTS, 'http://gs', None, 'auto', 'n', 'container')} == \
        {'container'}


@pytest.mark.parametrize('url', [None, ''])
def test_no_server_url_derives_nothing(url):
    assert watchdog_targets(DEPLOYMENTS, url, 'k', 'auto', 'node-a', 'native') == []


@pytest.mark.parametrize('args,message', [
    (([{'backend': 'vllm'}], 'http://gs', 'k', 'auto', 'n', 'native'), r'kvpin_deployments\[0\] needs a name'),
    (([{'name': 'a', 'gpu_indexes': [-1]}], 'http://gs', 'k', 'auto', 'n', 'native'), 'gpu_indexes'),
    ((DEPLOYMENTS, 'http://gs', 'k', 'v9', 'n', 'native'), 'gpustack_api_version'),
    ((DEPLOYMENTS, 'http://gs', 'k', 'auto', '', 'native'), 'worker name'),
])
def test_bad_input_is_a_filter_error(args, message):
    with pytest.raises(AnsibleFilterError, match='kvpin_watchdog_targets: .*' + message):
        DERIVE(*args)


def _dir_check(path, entries):
    return parse_checks([{'name': 'serving_watchdog',
                          'files': [{'path': str(path), 'state': 'directory', 'entries': entries}]}])


def test_an_unexpected_directory_entry_is_drift_and_survives_the_json_round_trip(tmp_path):
    (tmp_path / 'llama.json').write_text('{}')
    (tmp_path / 'llama.token').write_text('k')
    checks = _dir_check(tmp_path, ['llama.json', 'llama.token'])
    assert summarize(compare(checks, json.loads(json.dumps(observe(checks)))))['in_sync']
    (tmp_path / 'removed.json').write_text('{}')
    result = summarize(compare(checks, json.loads(json.dumps(observe(checks)))))
    assert not result['in_sync']
    assert result['drift'] == ['serving_watchdog: %s: unexpected entries removed.json' % tmp_path]


def test_entries_not_observed_is_drift(tmp_path):
    checks = _dir_check(tmp_path, [])
    observed = observe(parse_checks([{'name': 'x', 'files': [{'path': str(tmp_path), 'state': 'directory'}]}]))
    assert compare(checks, observed)[0].drift == ['%s: entries not observed' % tmp_path]


@pytest.mark.parametrize('spec,message', [
    ({'state': 'file', 'entries': ['a']}, 'only applies to state directory'),
    ({'state': 'directory', 'entries': ['a/b']}, 'must be a list of file names'),
    ({'state': 'directory', 'entries': 'a'}, 'must be a list of file names'),
])
def test_entries_input_errors(tmp_path, spec, message):
    with pytest.raises(NodeStateInputError, match=message):
        parse_checks([{'name': 'x', 'files': [dict(spec, path=str(tmp_path))]}])


DUE = FilterModule().filters()['kvpin_due_args']


@pytest.mark.parametrize('at,profile', [('00:00', 'batch'), ('06:59', 'batch'), ('07:00', 'chat'), ('23:59', 'chat')])
def test_the_due_args_are_those_of_the_window_we_are_in(at, profile):
    wanted = [p['args'] for p in SCHEDULED_PLAN['profiles'] if p['name'] == profile][0]
    assert DUE(SCHEDULED_PLAN, at) == wanted


def test_the_due_args_of_an_unscheduled_plan_are_its_args():
    assert DUE({'strategy': 'single', 'args': ['-c', '4096']}, '12:00') == ['-c', '4096']
    assert DUE({'args': ['--max-num-seqs=8']}, '12:00') == ['--max-num-seqs=8']


def test_the_due_args_agree_with_the_switch_program_every_minute():
    """The playbook (controller) and the switch timer (node) pick the same profile at every
    minute of the day, for edges that wrap across midnight too."""
    from watchdog_program import load_watchdog_program  # pylint: disable=import-error,import-outside-toplevel
    program = load_watchdog_program()
    for schedule in (SCHEDULED_PLAN['schedule'], [{'at': '07:30', 'profile': 'chat'}, {'at': '23:15', 'profile': 'batch'}]):
        plan = dict(SCHEDULED_PLAN, schedule=schedule)
        args = {p['name']: p['args'] for p in plan['profiles']}
        for minute in range(1440):
            at = '%02d:%02d' % divmod(minute, 60)
            assert DUE(plan, at) == args[program.due_profile(schedule, minute)], at


@pytest.mark.parametrize('at', ['7:00', '0700', None, '07:0x'])
def test_a_bad_time_is_refused(at):
    with pytest.raises(AnsibleFilterError, match='the time must be HH:MM'):
        DUE(SCHEDULED_PLAN, at)
