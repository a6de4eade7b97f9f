# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Jinja2 filters of kvpin.fleet. Each filter is documented in the sidecar file
plugins/filter/<filter name>.yml (what ansible-doc -t filter reads); the arithmetic lives
in module_utils so it is unit-tested without Ansible."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.kvpin.fleet.plugins.module_utils.system_reserved import (
    SystemReservedError,
    system_reserved,
)


def kvpin_system_reserved(plans, ram_gib, vram_min_gib=0):
    """GPUStack ``system_reserved`` ({ram, vram} in whole GiB) from a node's plans."""
    try:
        return system_reserved(plans, ram_gib, vram_min_gib)
    except SystemReservedError as exc:
        raise AnsibleFilterError('kvpin_system_reserved: %s' % exc)


class FilterModule(object):
    """kvpin.fleet filters."""

    def filters(self):
        return {'kvpin_system_reserved': kvpin_system_reserved}
