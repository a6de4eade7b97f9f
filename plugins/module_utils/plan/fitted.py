# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Fitted constants of the memory models: a value read off measurements (log lines, issue
reports), not derived from tensor shapes or an engine's source, kept together with what it
was read from.

A ``Fitted`` carries the constant's value, how to print it, what it was fitted on and the
``benchmarks/data/*.json`` rows (their ``id``s) it was read from. The explanation text of a
plan prints ``describe()`` instead of repeating the number, and each module's
``FITTED_SOURCE_ROWS`` (the fit / held-out split of the accuracy benchmarks,
benchmarks/_splits.py) is built from its ``Fitted`` objects with ``source_rows_of``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

from ansible_collections.kvpin.fleet.plugins.module_utils.units import fmt_bytes

BYTES = 'bytes'


@dataclass(frozen=True)
class Fitted:
    """One fitted constant.

    ``name``: 'module.CONSTANT', the module-level name the code uses for the value (the key of
    FITTED_SOURCE_ROWS and of the data rows' ``fit_for``). ``value``: the integer the code
    computes with. ``unit``: 'bytes' or 'bytes <per what>' (printed with fmt_bytes), else a
    format with one ``{}`` for the number ('{} B per logit'). ``scale``: the value is in
    1/scale of that unit (SAMPLER_SORT_RESIDUAL_X100: 100). ``fitted_on``: what it was read
    off, in words. ``source_rows``: the benchmarks/data row ids it was read from; () when the
    source is not a data row (an issue thread)."""
    name: str
    value: int
    unit: str
    fitted_on: str
    source_rows: Tuple[str, ...] = ()
    scale: int = 1

    def shown(self):
        """The value in its unit: '0.61 GiB', '29.76 MiB per channel', '0.19 B per logit'."""
        if self.unit == BYTES or self.unit.startswith(BYTES + ' '):
            return fmt_bytes(self.value // self.scale) + self.unit[len(BYTES):]
        number = ('%g' % (float(self.value) / self.scale)) if self.scale != 1 else str(self.value)
        return self.unit.format(number)

    def describe(self):
        """'fitted <value> on <what>', the text an explanation prints for this constant."""
        return 'fitted %s on %s' % (self.shown(), self.fitted_on)


def describe_together(constants):
    """'fitted <value>, <value> on <what>' for constants fitted on the same thing."""
    fitted_on = set(constant.fitted_on for constant in constants)
    if len(fitted_on) != 1:
        raise ValueError('describe_together: the constants were fitted on different things')
    return 'fitted %s on %s' % (', '.join(constant.shown() for constant in constants), fitted_on.pop())


def source_rows_of(*constants):
    """{'module.CONSTANT': (row id, ...)} of the constants read from data rows (a module's
    FITTED_SOURCE_ROWS)."""
    out = {}
    for constant in constants:
        if constant.source_rows:
            if constant.name in out:
                raise ValueError('fitted constant %s declared twice' % constant.name)
            out[constant.name] = tuple(constant.source_rows)
    return out
