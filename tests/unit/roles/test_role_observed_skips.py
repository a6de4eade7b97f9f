# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The round trips a converging role skips on what the probe observed (issue 16, cold rollout):
the worker stops the other runtime's unit only where the drift says it is enabled or active, and
the watchdog looks for stale configs only where the drift says its config directory holds
entries that are no target's. The drift comes from node_state's own comparison of an
observation (what gpu_facts' observe returns), and the decisions from the roles' vars/main.yml
expressions, evaluated by Ansible. The roles decide on the drift items, never on the text of the
lines: each case is decided a second time with every line reworded, with the same answers, and
no role or playbook may match, search or regex-test a drift line (issue 35)."""

import json
import os
import re

import pytest
import yaml

from ansible_collections.kvpin.fleet.plugins.module_utils.facts.node_state import compare, parse_checks
from local_playbook import REPO_ROOT, run_tasks_on_localhost


def role_var(role, name):
    with open(os.path.join(REPO_ROOT, 'roles', role, 'vars', 'main.yml'), encoding='utf-8') as handle:
        return yaml.safe_load(handle)[name]


def drift(check, observation):
    [result] = compare(parse_checks([check]), observation)
    return list(result.drift)


def observed_state(check, observation, reword=False):
    """The role's view of the check, as node_state / kvpin_node_drift return it; ``reword``
    replaces every line by another text (what a role decides must not change)."""
    [result] = compare(parse_checks([check]), observation)
    lines = ['reworded line %d' % index for index in range(len(result.drift))] if reword else [str(line) for line in result.drift]
    return {'in_sync': result.in_sync, 'drift': lines, 'drift_items': result.drift_items}


def with_reworded(cases):
    """Each case twice: as observed, and with its lines reworded (suffix _reworded)."""
    return dict(list(cases.items()) + [(case + '_reworded', dict(
        (key, dict(value, drift=['reworded line %d' % i for i in range(len(value['drift']))]))
        for key, value in case_vars.items())) for case, case_vars in cases.items()])


def both_ways(answers):
    return dict(list(answers.items()) + [(case + '_reworded', answer) for case, answer in answers.items()])


def decisions(tmp_path, var_name, expression, cases, fixed):
    """{case: bool} of ``expression`` (as var_name) for each case's extra vars."""
    record = "{{ _seen | default({}) | combine({'%s': %s | bool}) }}"
    tasks = [{'name': 'case %s' % case, 'ansible.builtin.set_fact': {'_seen': record % (case, var_name)},
              'vars': dict(fixed, **case_vars)} for case, case_vars in cases.items()]
    keep = {'content': '{{ _seen | to_json }}', 'dest': str(tmp_path / 'seen.json'), 'mode': '0600'}
    tasks.append({'name': 'keep', 'ansible.builtin.copy': keep})
    proc = run_tasks_on_localhost(tmp_path, tasks, play_vars={var_name: expression})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    return json.loads((tmp_path / 'seen.json').read_text())


def unit(name, load='loaded', file_state='disabled', active='inactive'):
    return {'properties': {'Id': name, 'LoadState': load, 'UnitFileState': file_state, 'ActiveState': active,
                           'SubState': 'running' if active == 'active' else 'dead', 'NeedDaemonReload': 'no'},
            'error': None}


def test_the_worker_stops_the_other_runtime_only_where_the_probe_saw_it_enabled_or_running(tmp_path):
    check = {'name': 'gpustack_worker',
             'units': [{'name': 'gpustack-worker.service', 'enabled': True, 'active': True},
                       {'name': 'gpustack.service', 'enabled': False, 'active': False}]}
    ours = unit('gpustack-worker.service', load='not-found', file_state='', active='inactive')
    observed = {
        'enabled': unit('gpustack.service', file_state='enabled'),
        'running': unit('gpustack.service', active='active'),
        'stopped_disabled': unit('gpustack.service'),
        'not_installed': unit('gpustack.service', load='not-found', file_state=''),
    }
    cases = {}
    for case, other in observed.items():
        units = {'gpustack-worker.service': ours, 'gpustack.service': other}
        cases[case] = {'_gpustack_worker_state': observed_state(check, {'units': units})}
    # Our own unit's drift (a cold node) is there in every case and must not count.
    assert all(any(line.startswith('gpustack-worker.service: ') for line in c['_gpustack_worker_state']['drift'])
               for c in cases.values())
    seen = decisions(tmp_path, '_gpustack_worker_other_running', role_var('gpustack_worker', '_gpustack_worker_other_running'),
                     with_reworded(cases), {'_gpustack_worker_other_service': 'gpustack'})
    assert seen == both_ways({'enabled': True, 'running': True, 'stopped_disabled': False, 'not_installed': False})


def test_the_watchdog_looks_for_stale_configs_only_where_the_probe_saw_entries_no_target_has(tmp_path):
    config_dir = '/etc/kvpin-watchdog'
    check = {'name': 'serving_watchdog',
             'files': [{'path': config_dir, 'state': 'directory', 'mode': '0750', 'owner': 'root',
                        'group': 'kvpin-watchdog', 'entries': ['qwen.json', 'qwen.token']}]}
    directory = {'kind': 'a directory', 'mode': 0o750, 'owner': 'root', 'group': 'kvpin-watchdog'}
    observed = {
        'cold_missing': {'kind': 'missing'},
        'only_targets': dict(directory, entries=['qwen.json']),
        'mode_drift': dict(directory, mode=0o755, entries=['qwen.json', 'qwen.token']),
        'stale_entry': dict(directory, entries=['qwen.json', 'llama.json']),
        'unlistable': dict(directory, entries_error='Permission denied'),
        'not_a_directory': {'kind': 'a file'},
    }
    cases = {case: {'_serving_watchdog_state': observed_state(check, {'files': {config_dir: seen}})}
             for case, seen in observed.items()}
    seen = decisions(tmp_path, '_serving_watchdog_find_stale', role_var('serving_watchdog', '_serving_watchdog_find_stale'),
                     with_reworded(cases), {'serving_watchdog_config_dir': config_dir})
    assert seen == both_ways({'cold_missing': False, 'only_targets': False, 'mode_drift': False,
                              'stale_entry': True, 'unlistable': True, 'not_a_directory': True})


# A drift line's text is for people: a Jinja test or filter that matches, searches or
# regex-replaces on an expression naming `drift` (not `drift_items`) is a decision on the text.
TEXT_TESTS = re.compile(r"""(\bis\s+(not\s+)?(match|search|regex)\b|['"](match|search|regex)['"]|\bregex_(search|findall|replace)\b)""")
DRIFT_LINES = re.compile(r'\bdrift\b(?!_items)')


def _yaml_strings(node):
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for key, value in node.items():
            yield from _yaml_strings(key)
            yield from _yaml_strings(value)
    elif isinstance(node, list):
        for value in node:
            yield from _yaml_strings(value)


def text_decisions_on_drift(root):
    found = []
    for top in ('roles', 'playbooks'):
        for dirpath, _dirs, names in os.walk(os.path.join(root, top)):
            for name in sorted(names):
                if not name.endswith(('.yml', '.yaml')):
                    continue
                path = os.path.join(dirpath, name)
                with open(path, encoding='utf-8') as handle:
                    for text in _yaml_strings(yaml.safe_load(handle)):
                        if DRIFT_LINES.search(text) and TEXT_TESTS.search(text):
                            found.append('%s: %s' % (os.path.relpath(path, root), ' '.join(text.split())[:160]))
    return found


def test_no_role_or_playbook_decides_on_the_text_of_a_drift_line():
    assert text_decisions_on_drift(REPO_ROOT) == []


@pytest.mark.parametrize('expression', [
    "{{ _x.drift | select('match', 'a.service: enabled') | list }}",
    "{{ _x.drift | reject('search', 'missing') | list }}",
    "{{ _x.drift | map('regex_replace', '^', '') | list }}",
    "{{ (_x.drift | first) is match('.*: missing') }}",
])
def test_the_rule_catches_a_text_decision(tmp_path, expression):
    (tmp_path / 'roles').mkdir()
    (tmp_path / 'roles' / 'main.yml').write_text(yaml.safe_dump({'_decision': expression}))
    (tmp_path / 'playbooks').mkdir()
    assert len(text_decisions_on_drift(str(tmp_path))) == 1
