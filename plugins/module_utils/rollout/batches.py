# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The rollout's batch sizes (the play keyword ``serial``), checked before Ansible reads them.

Ansible turns each batch with ``int()`` (``ansible.utils.helpers.pct_to_int``): ``'ten'`` fails
with a bare "invalid literal for int()" and no field, ``0`` or ``-1`` silently become the whole
fleet at once, and ``'150%'`` is more than the fleet. A rollout in batches exists so that a bad
change stops before it reaches every node, so each of those is refused here, naming the field."""


import re

# A fleet of thousands is still served by a few dozen batch sizes; more is a mistake.
MAX_BATCHES = 100
MAX_BATCH_NODES = 100000
_PERCENT = re.compile(r'^\s*(\d{1,3})\s*%\s*$')
_COUNT = re.compile(r'^\s*(\d{1,6})\s*$')


_WANTED = "each batch must be a node count (e.g. 2) or a share of the fleet (e.g. '25%')"


class RolloutBatchError(ValueError):
    """A batch size Ansible would misread or that would defeat rolling out in batches."""


def _batch(value, field):
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise RolloutBatchError('%s: %s, got %s %r' % (field, _WANTED, type(value).__name__, value))
    if isinstance(value, int):
        count = value
    else:
        percent = _PERCENT.match(value)
        if percent:
            share = int(percent.group(1))
            if not 1 <= share <= 100:
                raise RolloutBatchError("%s: a share of the fleet must be 1%%..100%%, got %r" % (field, value))
            return '%d%%' % share
        count_match = _COUNT.match(value)
        if count_match is None:
            raise RolloutBatchError('%s: %s, got %r' % (field, _WANTED, value))
        count = int(count_match.group(1))
    if not 1 <= count <= MAX_BATCH_NODES:
        raise RolloutBatchError("%s: a batch must be 1..%d nodes, got %r (Ansible would run a batch "
                                "of %r as the whole fleet at once; say '100%%' for that)"
                                % (field, MAX_BATCH_NODES, value, value))
    return count


def rollout_batches(value, field='kvpin_serial'):
    """``value`` (one batch or a list of them: Ansible repeats the last) with every batch checked:
    a node count as an int, a share of the fleet as ``'N%'``."""
    if isinstance(value, (list, tuple)):
        if not value or len(value) > MAX_BATCHES:
            raise RolloutBatchError('%s: a list of batches must hold 1..%d entries, got %d'
                                    % (field, MAX_BATCHES, len(value)))
        return [_batch(item, '%s[%d]' % (field, index)) for index, item in enumerate(value)]
    return _batch(value, field)
