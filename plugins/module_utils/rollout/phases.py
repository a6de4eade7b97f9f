# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Which of site.yml's phases a run selects, from ``--tags`` and ``--skip-tags``.

Each phase needs what the earlier ones compute: the worker and watchdog phases compare the node
with the desired state, which is rendered from the plans, which are made from the probe. Tagging
those read-only steps with every phase that needs them breaks ``--skip-tags``: a task is skipped
when *any* of its tags is skipped, so ``--skip-tags models`` used to skip the probe and the plans
too, and the run died on a missing fact. site.yml tags them ``always``: the probe and what it
reads run on every run, the plans and the comparison only when a phase that needs them is
selected, as computed here (Ansible's own rule, per phase tag)."""


# In the order site.yml runs them.
PHASES = ('prereq', 'probe', 'plan', 'worker', 'watchdog', 'models')
# A run names a handful of tags; a list longer than this is not from a command line.
MAX_TAGS = 1000


class RolloutPhaseError(ValueError):
    """Tags that are not a list of strings, or a run that skips what every phase needs."""


def _tags(value, field):
    if value is None:
        return frozenset()
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple, set, frozenset)):
        raise RolloutPhaseError('%s must be a list of tags, got %s' % (field, type(value).__name__))
    if len(value) > MAX_TAGS:
        raise RolloutPhaseError('%s has %d tags (at most %d)' % (field, len(value), MAX_TAGS))
    for index, tag in enumerate(value):
        if not isinstance(tag, str):
            raise RolloutPhaseError('%s[%d] must be a string, got %s' % (field, index, type(tag).__name__))
    return frozenset(value)


def phase_selected(phase, run_tags, skip_tags):
    """True when a task tagged only ``phase`` would run (ansible's Taggable.evaluate_tags)."""
    if phase in skip_tags or 'all' in skip_tags or 'tagged' in skip_tags:
        return False
    return 'all' in run_tags or 'tagged' in run_tags or phase in run_tags


def selected_phases(run_tags, skip_tags=None):
    """The phases (in run order) that ``--tags run_tags --skip-tags skip_tags`` selects.
    Ansible gives ``ansible_run_tags`` as ``['all']`` and ``ansible_skip_tags`` as ``[]`` by
    default."""
    run = _tags(run_tags, 'ansible_run_tags')
    skip = _tags(skip_tags, 'ansible_skip_tags')
    if 'always' in skip:
        raise RolloutPhaseError(
            "ansible_skip_tags has 'always': every phase needs the steps tagged always (the probe, the plans, "
            "the comparison); skip a phase by its own tag (%s)" % ', '.join(PHASES))
    return [phase for phase in PHASES if phase_selected(phase, run, skip)]
