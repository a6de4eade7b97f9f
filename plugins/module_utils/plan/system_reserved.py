# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""GPUStack's ``system_reserved`` block for one worker, from that node's plans.

GPUStack reads ``system_reserved: {ram: <GiB>, vram: <GiB>}`` as integers and converts
them with ``int(value) << 30`` (gpustack/config/config.py ``get_system_reserved``, 0.7.1
and 2.3.0): RAM is reserved once per worker, VRAM once per GPU. So the per-GPU byte
figure the plans ask for is rounded UP to whole GiB, never down (rounding down would hand
the scheduler VRAM the plans said to keep free).
"""

from __future__ import annotations

from ansible_collections.kvpin.fleet.plugins.module_utils.plan.plan_types import type_name
from ansible_collections.kvpin.fleet.plugins.module_utils.units import GiB, ceil_div


class SystemReservedError(ValueError):
    """An input the computation cannot use; the message names it."""


def _non_negative_int(value, what):
    if isinstance(value, bool):
        raise SystemReservedError('%s must be an integer, got a boolean' % what)
    try:
        as_int = int(value)
    except (TypeError, ValueError):
        raise SystemReservedError('%s must be an integer, got %r' % (what, value))
    if as_int != value and not (isinstance(value, str) and str(as_int) == value.strip()):
        raise SystemReservedError('%s must be a whole number, got %r' % (what, value))
    if as_int < 0:
        raise SystemReservedError('%s must not be negative, got %d' % (what, as_int))
    return as_int


def ceil_gib(n_bytes):
    """Whole GiB that hold ``n_bytes`` (rounded up)."""
    return ceil_div(int(n_bytes), GiB)


def plans_vram_reserved_bytes(plans):
    """The largest ``system_reserved_bytes`` over ``plans`` (0 when none asks for any).

    ``plans`` is a list of serving_plan ``plan`` dicts; a plan without the key (or with
    None, as an infeasible plan may carry) reserves nothing."""
    if plans is None:
        return 0
    if not isinstance(plans, (list, tuple)):
        raise SystemReservedError('plans must be a list of serving_plan plan dicts, got %s'
                                  % type_name(plans))
    largest = 0
    for position, plan in enumerate(plans):
        if not isinstance(plan, dict):
            raise SystemReservedError('plans[%d] must be a dict, got %s' % (position, type_name(plan)))
        value = plan.get('system_reserved_bytes')
        if value is None:
            continue
        largest = max(largest, _non_negative_int(value, 'plans[%d].system_reserved_bytes' % position))
    return largest


def system_reserved(plans, ram_gib, vram_min_gib=0):
    """``{'ram': GiB, 'vram': GiB}`` for GPUStack's config.yaml.

    vram = max(ceil(max over plans of system_reserved_bytes / GiB), vram_min_gib);
    ram  = ram_gib as given (GPUStack reserves it once per worker)."""
    ram = _non_negative_int(ram_gib, 'ram_gib')
    vram_min = _non_negative_int(vram_min_gib, 'vram_min_gib')
    vram_from_plans = ceil_gib(plans_vram_reserved_bytes(plans))
    return {'ram': ram, 'vram': max(vram_from_plans, vram_min)}
