# -*- coding: utf-8 -*-
# Copyright (c) 2026, kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The field report's slow decay under a daily traffic swell (tests/traces generate_traces.
field_report): decay with TTFT tracking it is recycled before its 36 h mark; the same RSS ramp
with flat TTFT and no limit only alerts; a slow p95 rise with flat RSS alerts naming placement
or preemption; the swell alone triggers nothing. The committed public trace per class, and
further seeds generated here."""
from __future__ import annotations

import os
import sys

import pytest

from watchdog_program import ROOT  # pylint: disable=import-error

TRACES = os.path.join(ROOT, "tests", "traces")

sys.path.insert(0, TRACES)
import generate_traces  # noqa: E402 pylint: disable=import-error,wrong-import-position

HOUR = 3600


def _run(wd, rows):
    engine = wd.DecisionEngine({})
    return [engine.feed(t, mem, ttft_p95=ttft) for t, mem, ttft, _pre in rows]


def _public(wd, manifest, kind):
    entry = manifest["field_report_%s" % kind]
    return wd.replay(os.path.join(TRACES, entry["file"]), entry["config"], out=open(os.devnull, "w"))


def _check(kind, decisions):
    recycles = [d for d in decisions if d.action == "recycle"]
    alerts = {d.diagnosis for d in decisions if d.action == "alert"}
    if kind == "decay":
        assert recycles, "decay not recycled"
        assert recycles[0].t - HOUR <= 36 * HOUR
        assert recycles[0].diagnosis in ("slow_decay", "leak_with_latency")
    elif kind == "ramp":
        assert not recycles, [(d.t / HOUR, d.diagnosis) for d in recycles]
        assert "memory_rising" in alerts
    elif kind == "ttft":
        assert not recycles
        latency = [d for d in decisions if d.diagnosis == "latency_only" and d.action == "alert"]
        assert latency and "placement or preemption" in latency[-1].reason
        assert not alerts - {"latency_only"}
    else:
        assert not recycles and not alerts, alerts


@pytest.mark.parametrize("kind", generate_traces.FIELD_REPORT_CLASSES)
def test_public_field_report_trace(wd, manifest, kind):
    _check(kind, _public(wd, manifest, kind))


def test_slow_decay_is_recognised_against_the_same_hours_a_day_earlier(wd, manifest):
    first = [d for d in _public(wd, manifest, "decay") if d.action == "recycle"][0]
    if first.diagnosis == "slow_decay":
        assert "a daily swell repeats, this does not" in first.reason


@pytest.mark.parametrize("kind,seed", [("decay", 7002), ("swell", 7002)])
def test_field_report_classes_on_more_seeds(wd, kind, seed):
    _check(kind, _run(wd, generate_traces.field_report(kind, seed)))
