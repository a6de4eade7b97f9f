# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Byte units. Every memory figure in kvpin.fleet is an int number of bytes; these
constants and helpers are the only place sizes are converted for people to read."""

from __future__ import annotations

KiB = 1024
MiB = 1024 ** 2
GiB = 1024 ** 3
GB = 1000 ** 3


def fmt_bytes(n):
    """Human-readable binary size, e.g. ``fmt_bytes(35 * GiB) == '35.00 GiB'``."""
    n = int(n)
    sign = '-' if n < 0 else ''
    n = abs(n)
    for unit, size in (('GiB', GiB), ('MiB', MiB), ('KiB', KiB)):
        if n >= size:
            return '%s%.2f %s' % (sign, n / size, unit)
    return '%s%d B' % (sign, n)


def fmt_gib(n):
    """A size always in GiB with two decimals (table cells), e.g. ``fmt_gib(512 * MiB) == '0.50 GiB'``."""
    return '%.2f GiB' % (n / GiB)


def ceil_div(numerator, denominator):
    """Ceiling division of ints (vLLM's cdiv): the count of ``denominator``-sized pieces that
    hold ``numerator``."""
    return -(-numerator // denominator)
