# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Plan offline: a node's ``kvpin_gpus`` fact read back from a file that saved
kvpin.fleet.gpu_facts' output on the controller, so that playbooks/plan.yml plans a fleet (or a
fleet that does not exist yet) without connecting to it.

Accepted file contents (JSON):

- the module's result as ``ansible <nodes> -m kvpin.fleet.gpu_facts --tree DIR`` writes it per
  host, or as a task registers it: ``{"ansible_facts": {"kvpin_gpus": {...}}, ...}``;
- the fact's value alone: ``{"gpus": [...], "driver_version": ..., ...}``.

The read is bounded (MAX_BYTES) and every GPU the planners read goes through the planners' own
check (serving_plan.check_gpus: types and ranges, naming ``gpus[i].key``)."""


import json

from ansible_collections.kvpin.fleet.plugins.module_utils.plan.plan_types import MAX_GPUS, PlanInputError, check_gpus

# A node's facts with 16 GPUs, their processes and the topology are a few tens of KiB; a file
# beyond this is not gpu_facts output.
MAX_BYTES = 4 << 20
TEXT_FIELDS = ('driver_version', 'cuda_driver_version', 'nvml_version', 'reason')


class SavedGpuFactsError(ValueError):
    """The saved facts cannot be read or are not gpu_facts output; the message names the file
    and the field."""


def read_saved_gpu_facts(path, required=False):
    """The ``kvpin_gpus`` fact saved in the file ``path`` (see the module docstring), checked.
    ``required``: the node has deployments, so it must have at least one GPU."""
    try:
        with open(path, 'rb') as handle:
            raw = handle.read(MAX_BYTES + 1)
    except (OSError, TypeError) as exc:
        raise SavedGpuFactsError('%s: cannot read the saved gpu_facts output: %s' % (path, exc))
    if len(raw) > MAX_BYTES:
        raise SavedGpuFactsError('%s: more than %d bytes; gpu_facts output of one node is far smaller'
                                 % (path, MAX_BYTES))
    try:
        document = json.loads(raw.decode('utf-8'))
    except (UnicodeDecodeError, ValueError) as exc:
        raise SavedGpuFactsError('%s: not JSON (%s)' % (path, exc))
    return saved_gpu_facts(document, path, required)


def saved_gpu_facts(document, source='saved gpu_facts', required=False):
    """The checked ``kvpin_gpus`` fact from a parsed document (module result or the fact)."""
    fact = document
    where = 'kvpin_gpus'
    if isinstance(document, dict) and 'ansible_facts' in document:
        facts = document['ansible_facts']
        if not isinstance(facts, dict) or not isinstance(facts.get('kvpin_gpus'), dict):
            raise SavedGpuFactsError('%s: ansible_facts.kvpin_gpus: missing or not a dict (is this the output '
                                     'of kvpin.fleet.gpu_facts?)' % source)
        fact = facts['kvpin_gpus']
        where = 'ansible_facts.kvpin_gpus'
    if isinstance(document, dict) and document.get('failed'):
        raise SavedGpuFactsError('%s: the saved gpu_facts run failed: %s'
                                 % (source, str(document.get('msg', ''))[:200]))
    if not isinstance(fact, dict) or 'gpus' not in fact:
        raise SavedGpuFactsError('%s: %s: a dict with a gpus list expected, got %s'
                                 % (source, where, type(fact).__name__))
    gpus = fact['gpus']
    if not isinstance(gpus, list):
        raise SavedGpuFactsError('%s: %s.gpus: must be a list, got %s' % (source, where, type(gpus).__name__))
    if len(gpus) > MAX_GPUS:
        raise SavedGpuFactsError('%s: %s.gpus: %d GPUs; a node has at most %d'
                                 % (source, where, len(gpus), MAX_GPUS))
    if gpus:
        try:
            check_gpus(gpus)
        except PlanInputError as exc:
            raise SavedGpuFactsError('%s: %s.%s' % (source, where, exc))
    elif required:
        raise SavedGpuFactsError('%s: %s.gpus is empty (reason: %s) but the node has deployments to plan'
                                 % (source, where, str(fact.get('reason'))[:200]))
    for key in TEXT_FIELDS:
        value = fact.get(key)
        if value is not None and not isinstance(value, str):
            raise SavedGpuFactsError('%s: %s.%s: must be a string or null, got %s'
                                     % (source, where, key, type(value).__name__))
    checked = dict(fact)
    checked['gpu_count'] = len(gpus)
    return checked
