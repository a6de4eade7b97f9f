# -*- coding: utf-8 -*-
# Copyright (c) 2026, kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Replay: a recorded CSV trace through the decision engine."""

from __future__ import annotations

import csv
import math
import sys
from typing import Dict, List, Optional

from .decision import Decision, DecisionEngine


# ---------------------------------------------------------------------------
# Replay.
# ---------------------------------------------------------------------------
def _exact_number(value: float) -> str:
    """A time exactly as read, for messages: 3600 for a whole number, else every digit Python
    needs to give the same float back (%g's six digits made 1700000001 and 1700000000 both
    read 1.7e+09)."""
    if value == int(value) and abs(value) < 2 ** 53:
        return str(int(value))
    return repr(value)


def _row_float(row: Dict[str, object], key: str, line: int, required: bool) -> Optional[float]:
    """A finite number from one trace cell, or a ValueError naming the row and column."""
    raw = row.get(key)
    if raw is None:
        if required:
            raise ValueError("row %d: short row, no %s" % (line, key))
        return None
    text = str(raw).strip()
    if not text:
        if required:
            raise ValueError("row %d: %s is empty" % (line, key))
        return None
    try:
        value = float(text)
    except ValueError:
        raise ValueError("row %d: %s is not a number: %r" % (line, key, text[:40])) from None
    if math.isnan(value) or math.isinf(value):
        raise ValueError("row %d: %s must be finite, got %s" % (line, key, text[:40]))
    if value < 0:
        raise ValueError("row %d: %s must be >= 0, got %s" % (line, key, text[:40]))
    return value


def replay(trace_path: str, config: Dict[str, object], out=None,
           actions_only: bool = False) -> List[Decision]:
    """Feed a CSV trace (t_seconds, rss_bytes[, ttft_p95_seconds, preemptions_total]) through
    the engine. Malformed rows (short, non-numeric, NaN, inf, negative, time not strictly
    increasing) are refused with their row number (the header is row 1)."""
    out = out or sys.stdout
    engine = DecisionEngine(config)
    decisions = []
    with open(trace_path, "r", encoding="utf-8", newline="") as handle:
        reader = csv.DictReader(handle)
        if not reader.fieldnames or "t_seconds" not in reader.fieldnames \
                or "rss_bytes" not in reader.fieldnames:
            raise ValueError("%s: header must start with t_seconds,rss_bytes" % trace_path)
        last_t = None
        for index, row in enumerate(reader):
            line = index + 2
            if None in row:
                raise ValueError("%s: row %d: more cells than the header has columns" % (trace_path, line))
            try:
                t = _row_float(row, "t_seconds", line, True)
                mem = _row_float(row, "rss_bytes", line, True)
                ttft = _row_float(row, "ttft_p95_seconds", line, False)
                preempt = _row_float(row, "preemptions_total", line, False)
            except ValueError as exc:
                raise ValueError("%s: %s" % (trace_path, exc)) from None
            if last_t is not None and t <= last_t:
                raise ValueError("%s: row %d: t_seconds %s %s the previous row's %s" % (
                    trace_path, line, _exact_number(t), "repeats" if t == last_t else "goes back from",
                    _exact_number(last_t)))
            last_t = t
            d = engine.feed(t, mem, ttft_p95=ttft, preemptions=preempt)
            decisions.append(d)
            if not actions_only or d.action != "none":
                out.write(d.to_json() + "\n")
    return decisions
