# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Which site.yml phases --tags / --skip-tags select (module_utils/rollout_phases.py)."""
from __future__ import annotations

import pytest

from ansible_collections.kvpin.fleet.plugins.module_utils.rollout.phases import (
    MAX_TAGS,
    PHASES,
    RolloutPhaseError,
    selected_phases,
)

ALL = list(PHASES)


@pytest.mark.parametrize('run_tags, skip_tags, phases', [
    (['all'], [], ALL),                                                   # no --tags, no --skip-tags
    (['all'], ['models'], ['prereq', 'probe', 'plan', 'worker', 'watchdog']),
    (['all'], ['watchdog', 'models'], ['prereq', 'probe', 'plan', 'worker']),
    (['all'], ['prereq'], ['probe', 'plan', 'worker', 'watchdog', 'models']),
    (['probe'], [], ['probe']),
    (['worker', 'models'], [], ['worker', 'models']),
    (['watchdog'], ['watchdog'], []),                                     # skip wins, as in Ansible
    (['tagged'], [], ALL),
    (['untagged'], [], []),
    (['all'], ['tagged'], []),
    (['all'], ['all'], []),
    (['gpustack_worker_configure'], [], []),                              # a role's own tag: no phase
    (['all'], None, ALL),
    (('probe', 'plan'), frozenset(['plan']), ['probe']),
])
def test_phases_follow_ansibles_tag_rule(run_tags, skip_tags, phases):
    assert selected_phases(run_tags, skip_tags) == phases


@pytest.mark.parametrize('run_tags, skip_tags, says', [
    ('all', [], 'ansible_run_tags must be a list of tags, got str'),
    (['all'], 'models', 'ansible_skip_tags must be a list of tags, got str'),
    ({'all': 1}, [], 'ansible_run_tags must be a list of tags, got dict'),
    (['all', 3], [], 'ansible_run_tags[1] must be a string, got int'),
    (['all'], [None], 'ansible_skip_tags[0] must be a string, got NoneType'),
    (['t%d' % i for i in range(MAX_TAGS + 1)], [], 'ansible_run_tags has %d tags (at most %d)' % (MAX_TAGS + 1, MAX_TAGS)),
    (['all'], ['always'], "ansible_skip_tags has 'always': every phase needs the steps tagged always (the probe, the plans, "
                          "the comparison); skip a phase by its own tag (prereq, probe, plan, worker, watchdog, models)"),
    (['models'], ['models', 'always'], "ansible_skip_tags has 'always'"),
])
def test_tags_that_are_not_a_list_of_strings_are_refused_naming_the_variable(run_tags, skip_tags, says):
    with pytest.raises(RolloutPhaseError) as raised:
        selected_phases(run_tags, skip_tags)
    assert str(raised.value).startswith(says)
