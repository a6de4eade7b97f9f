# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""site.yml's phase tags: --skip-tags <phase> skips that phase alone. The steps later phases
need (the desired state, the probe, the plans, the comparison) are tagged `always` and gated on
kvpin_rollout_phases, so Ansible still lists them; tagged with every phase, as they were, a
--skip-tags models skipped the probe and the plans too and the run died on a missing fact.
Runs the real site.yml with --list-tasks: no connection to any host."""
from __future__ import annotations

import os
import re

import pytest
import yaml

from local_playbook import PLAYBOOK, REPO_ROOT, run_repo_playbook

SITE = os.path.join(REPO_ROOT, 'playbooks', 'site.yml')
# What every phase after it needs, by task name in site.yml's first play.
NEEDED = ['Probe | read the GPUs and the managed files, units and health of each node',
          'Plan deployment memory and engine flags',
          "Charge the node's deployments together, per GPU",
          'State | compare each node with what the roles would write']
# Needed by every phase, so not gated (read-only): the phases themselves, what the probe
# reads and the probe.
EVERY_RUN = {'Phases | what --tags and --skip-tags select', 'State | what the worker role manages',
             'State | what the watchdog role manages', NEEDED[0]}
PHASE_TASKS = {'worker': 'Worker | GPUStack worker config and unit',
               'watchdog': "Watchdog | memory-slope watchdog on the node's serving unit",
               'models': 'Deploy each planned model with its pinned arguments and VRAM claim'}


def _list_tasks(tmp_path, *args):
    proc = run_repo_playbook(tmp_path, 'site.yml', '--list-tasks', *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return [re.sub(r'\s+TAGS: .*$', '', line).strip() for line in proc.stdout.splitlines()]


@pytest.fixture(autouse=True)
def _needs_ansible():
    if not os.path.exists(PLAYBOOK):
        pytest.skip('ansible-playbook is not in the repository venv')


@pytest.mark.parametrize('skipped', sorted(PHASE_TASKS) + ['probe', 'plan', 'prereq'])
def test_skipping_one_phase_keeps_what_the_others_need(tmp_path, skipped):
    listed = _list_tasks(tmp_path, '--skip-tags', skipped)
    for needed in NEEDED:
        assert needed in listed, (skipped, needed, listed)
    for phase, task in PHASE_TASKS.items():
        assert (task in listed) == (phase != skipped), (skipped, phase, listed)


def test_every_step_is_gated_on_the_selected_phases():
    """`always` alone would run a step for --tags probe that only later phases need (the plans,
    which fail a node on an infeasible plan): each, but what every run needs (EVERY_RUN), is
    gated on kvpin_rollout_phases. The tasks
    with a phase's own tag reference it too, so that --skip-tags always (which skips the probe
    they read) stops the run with kvpin_rollout_phases' message, not a missing fact."""
    with open(SITE, encoding='utf-8') as handle:
        play = next(p for p in yaml.safe_load(handle) if 'tasks' in p)
    always = [t for t in play['tasks'] if 'always' in (t.get('tags') or [])]
    assert len(always) >= len(NEEDED) + len(EVERY_RUN) - 1
    for task in always:
        assert task.get('tags') == ['always'], task['name']
    # kvpin_rollout_phases and the play variables made from it (which phases need the plans, the
    # desired state): each fails the same way under --skip-tags always.
    gates = {name for name, value in play['vars'].items() if 'kvpin_rollout_phases' in str(value)}
    assert gates >= {'kvpin_rollout_phases', 'kvpin_plans_needed', 'kvpin_state_needed'}, gates
    for task in play['tasks']:
        if task['name'] in EVERY_RUN:
            continue
        when = task.get('when')
        when = when if isinstance(when, list) else [when]
        assert any(gate in str(when[0]) for gate in gates), task['name']
