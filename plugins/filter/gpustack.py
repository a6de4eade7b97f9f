# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters for the GPUStack playbooks; documented in plugins/filter/<filter name>.yml, the rule
itself lives in module_utils/gpustack_records.py (unit-tested without Ansible)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.kvpin.fleet.plugins.module_utils.gpustack.records import (
    RecordInputError,
    replica_vram_claim,
)


def kvpin_gpustack_vram_claim(plan):
    """GPUSTACK_MODEL_VRAM_CLAIM (bytes, one replica) for a serving_plan ``plan``."""
    try:
        return replica_vram_claim(plan)
    except RecordInputError as exc:
        raise AnsibleFilterError('kvpin_gpustack_vram_claim: %s' % exc)


class FilterModule(object):
    """kvpin.fleet GPUStack filters."""

    def filters(self):
        return {'kvpin_gpustack_vram_claim': kvpin_gpustack_vram_claim}
