# -*- coding: utf-8 -*-
# Copyright (c) 2026, kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Issue 38: warm-up is not a leak (one test per warm-up shape, first run and after a restart
with the plateau learned), one step then a plateau is not a trend, alert episodes (hysteresis,
de-duplication, the state exported in the decision), the learned plateau kept in the state
file, slow leaks with latency recycled within 24 h, and replay's exact times in its messages.
The shapes come from tests/traces/families.py (its warm-up kinds with fixed parameters).

Each engine test failed on the engine before issue 38 (alerts during warm-up, no learned
plateau or episodes, the slow leak never recycled, the field report's decay recycled 27 h
after it began). Replay's message and the families generator are tested as they are."""
from __future__ import annotations

import json
import math
import os
import random
import sys

import pytest

from watchdog_program import ROOT  # pylint: disable=import-error

TRACES = os.path.join(ROOT, "tests", "traces")
sys.path.insert(0, TRACES)
import families  # noqa: E402 pylint: disable=import-error,wrong-import-position
import generate_traces  # noqa: E402 pylint: disable=import-error,wrong-import-position

MiB = 1024 * 1024
GiB = 1024 * MiB
HOUR = 3600
MEMORY = ("memory_rising", "leak_unconfirmed", "leak_with_latency", "leak_projected", "slow_decay")

# Slow warm-ups, each settling within the issue's ~6 hours: what today's engine pages on.
SHAPES = {
    "exp": {"f0": 0.55, "tau": 1.2 * HOUR},
    "steps": {"f0": 0.6, "first": 0.5, "step_at": [1.5 * HOUR, 2.5 * HOUR, 3.5 * HOUR],
              "step_h": [0.07, 0.07, 0.06]},
    "sawtooth": {"f0": 0.55, "tau": 1.0 * HOUR, "tooth": 1200.0, "tooth_h": 0.05},
    "creep": {"f0": 0.6, "creep": 0.08, "creep_end": 6 * HOUR},
}


def _run(engine, kind, start, hours, seed, base=8 * GiB, leak=0.0, leak_after=None, ttft_per_gib=0.0, shape=None,
         bursts=0, ttft_swell=0.0):
    """Feed one run of `hours` from `start`: the warm-up shape (SHAPES[kind], or `shape`), a
    +/-150 MiB sawtooth, noise, a 60 MiB daily swell (TTFT p95 +ttft_swell at its top),
    `bursts` load bursts at random times after 4 h (10..40 min, +400 MiB and TTFT p95 +32 %,
    decaying over 30 min), optionally a leak from leak_after hours with TTFT p95 following it."""
    rng = random.Random(seed)
    burst_at = [(rng.uniform(4, hours) * HOUR, rng.uniform(600, 2400)) for _burst in range(bursts)]
    out = []
    for i in range(int(hours * 60)):
        t = start + i * 60
        age = t - start
        mem = base * families._warmup_level(kind, age, shape or SHAPES[kind])  # pylint: disable=protected-access
        mem += 150 * MiB * (2.0 * ((age / 420.0) % 1.0) - 1.0) + rng.gauss(0, 15 * MiB)
        swell = math.exp(-(((t / HOUR) % 24 - 14.0) / 3.0) ** 2)
        mem += 60 * MiB * swell
        load = max([1.0 if b <= age < b + n else math.exp(-(age - b - n) / 600.0)
                    for b, n in burst_at if b <= age < b + n + 1800] or [0.0])
        mem += 400 * MiB * load
        leaked = leak * max(0.0, age / HOUR - leak_after) if leak_after is not None else 0.0
        ttft = 0.4 * (1 + ttft_swell * swell + 0.32 * load) * (1 + ttft_per_gib * (leaked * MiB) / GiB)
        ttft *= math.exp(rng.gauss(0, 0.08))
        out.append(engine.feed(t, mem + leaked * MiB, ttft_p95=ttft if age >= 300 else None,
                               restarted=i == 0 and start > 0))
    return out


def _paged(decisions):
    return [(round(d.t / HOUR, 2), d.diagnosis) for d in decisions if d.action != "none"]


@pytest.mark.parametrize("kind", sorted(SHAPES))
def test_first_warm_up_raises_no_alert(wd, kind):
    """The engine before issue 38 paged 'memory rising' during each of these warm-ups (the issue's first ~6 h)."""
    engine = wd.DecisionEngine({})
    decisions = _run(engine, kind, 0, 10, seed=1)
    assert _paged(decisions) == []


@pytest.mark.parametrize("kind", sorted(SHAPES))
def test_warm_up_after_a_restart_is_judged_against_the_learned_plateau(wd, kind, tmp_path):
    """A 14 h run teaches the plateau (kept in the state file); the next start's warm-up of the
    same shape raises nothing, also in a fresh engine that reads the state file."""
    state = str(tmp_path / "state.json")
    engine = wd.DecisionEngine({"state_file": state})
    first = _run(engine, kind, 0, 14, seed=2)
    assert engine.learned_plateau() is not None
    saved = json.load(open(state, encoding="utf-8"))
    assert len(saved["plateaus"]) == 1 and saved["plateaus"][0]["plateau"] > 6 * GiB
    second = _run(engine, kind, 14 * HOUR, 8, seed=3)
    assert _paged(first + second) == []
    fresh = wd.DecisionEngine({"state_file": state})
    assert fresh.learned_plateau() == pytest.approx(engine.learned_plateau(), abs=1)
    third = _run(fresh, kind, 0, 8, seed=4)
    assert any(d.warmup_hold for d in third)
    assert _paged(third) == []


def test_a_leak_above_the_learned_plateau_is_still_caught(wd):
    """A guard for the fix (passes today): the plateau may only excuse a rise up to it, so
    200 MiB/h from 1 h after a restart, TTFT following, is recycled within 8 h."""
    engine = wd.DecisionEngine({})
    _run(engine, "exp", 0, 14, seed=5)
    second = _run(engine, "exp", 14 * HOUR, 12, seed=6, leak=200.0, leak_after=1.0, ttft_per_gib=0.5)
    recycles = [d for d in second if d.action == "recycle"]
    assert recycles and recycles[0].t - (15 * HOUR) <= 8 * HOUR


# Pools added late, in jumps: 76 % at once, flat for 3 h (the hold settles there), then 4 %
# more at 3, 4, 5 and 6 h.
LATE_STEPS = {"f0": 0.6, "first": 0.4, "step_at": [3.0 * HOUR, 4.0 * HOUR, 5.0 * HOUR, 6.0 * HOUR],
              "step_h": [0.04, 0.04, 0.04, 0.04]}


def test_a_restart_climbing_back_in_late_steps_is_quiet_below_the_earlier_plateau(wd):
    """The hold ends settled in the flat hours, the late jumps then look like a rise: the first
    start pages (nothing tells them from a leak yet), a later start climbing back to the level
    the first one held does not (until warmup_hold_max_seconds; the engine before this paged
    'memory rising' 5.25 h after the restart). A leak above that level is still caught
    (test_a_leak_above_the_learned_plateau_is_still_caught)."""
    engine = wd.DecisionEngine({})
    first = _run(engine, "steps", 0, 14, seed=1, shape=LATE_STEPS)
    assert [p for p in _paged(first) if p[1] == "memory_rising"], "the first start's late steps page"
    assert engine.learned_plateau() is not None
    second = _run(engine, "steps", 14 * HOUR, 10, seed=2, shape=LATE_STEPS)
    assert _paged(second) == []
    assert any("earlier start's plateau" in d.reason for d in second)


def _first_start_under_swell(engine, seed):
    """12 h of a first start: an exponential warm-up from 6.8 to 10 GiB (tau 1.5 h) under a
    +/-200 MiB sawtooth while the day's swell lifts TTFT p95 by up to 60 % (peak 6 h after the
    start)."""
    rng = random.Random(seed)
    out = []
    for i in range(12 * 60):
        t = i * 60
        mem = 10 * GiB * (0.68 + 0.32 * (1 - math.exp(-t / (1.5 * HOUR))))
        mem += 200 * MiB * (2 * ((t / 900.0) % 1) - 1) + rng.gauss(0, 15 * MiB)
        ttft = 0.4 * (1 + 0.6 * math.exp(-((t / HOUR - 6.0) / 3.0) ** 2))
        out.append(engine.feed(t, mem, ttft_p95=ttft * math.exp(rng.gauss(0, 0.05)) if t >= 300 else None))
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_first_warm_up_under_the_rising_swell_is_not_recycled(wd, seed):
    """Memory warming up and TTFT climbing the day's swell look like a leak with latency for
    hours; the hourly floors since the start decelerate, so the young engine alerts but its
    recycle waits (the engine before this recycled it 4.2..4.4 h after the start)."""
    decisions = _first_start_under_swell(wd.DecisionEngine({}), seed)
    assert [d for d in decisions if d.action == "recycle"] == []
    deferred = [d for d in decisions if "recycle deferred" in d.reason]
    assert deferred and all(d.action == "alert" and d.t < 8 * HOUR for d in deferred)
    assert "decelerate" in deferred[-1].reason


def test_a_leak_from_the_start_is_recycled_once_its_floors_show_a_steady_pace(wd):
    """A guard for the deferral: 300 MiB/h from the start, TTFT following, no limit known. Its
    hourly floors rise as fast late as early, so the recycle comes long before the 8 h cap
    (about 2 h later than without the deferral: 4 floors are needed)."""
    decisions = _run(wd.DecisionEngine({}), "exp", 0, 12, seed=1, leak=300.0, leak_after=0.0,
                     ttft_per_gib=0.3, shape={"f0": 1.0, "tau": HOUR})
    recycles = [d for d in decisions if d.action == "recycle"]
    assert recycles and recycles[0].t <= 6 * HOUR and recycles[0].diagnosis == "leak_with_latency"
    assert any("4 tell a leak from a warm-up" in d.reason for d in decisions if d.t < recycles[0].t)


def test_state_file_problems_are_notes_not_errors(wd, tmp_path):
    bad = tmp_path / "state.json"
    bad.write_text('{"plateaus": [{"plateau": -5, "settle_seconds": 1}]}')
    engine = wd.DecisionEngine({"state_file": str(bad)})
    assert engine.learned_plateau() is None and "finite and positive" in engine.state_note
    bad.write_text("x" * 70000)
    engine = wd.DecisionEngine({"state_file": str(bad)})
    assert "larger than" in engine.state_note
    engine = wd.DecisionEngine({"state_file": str(tmp_path / "missing" / "state.json")})
    assert engine.state_note is None            # no file yet: a first start
    _run(engine, "exp", 0, 13, seed=7)
    assert "not written" in engine.state_note   # its directory is missing: noted, not raised


@pytest.mark.parametrize("text, note", [
    ("{not json", "is not JSON"),
    ('{"plateaus": {"plateau": 1}}', "has no list 'plateaus'"),
    ('[1, 2]', "has no list 'plateaus'"),
    ('{"plateaus": [{"plateau": true, "settle_seconds": 60}]}', "plateaus[0].plateau is True"),
    ('{"plateaus": [{"plateau": 1e300, "settle_seconds": 60}]}', "not a finite and positive"),
    ('{"plateaus": [{"plateau": 5e9}]}', "plateaus[0].settle_seconds is None"),
    ('{"plateaus": ["x"]}', "plateaus[0].plateau is None"),
])
def test_a_hostile_state_file_is_ignored_with_a_note(wd, tmp_path, text, note):
    path = tmp_path / "state.json"
    path.write_text(text)
    engine = wd.DecisionEngine({"state_file": str(path)})
    assert engine.learned_plateau() is None and note in engine.state_note and str(path) in engine.state_note


def test_only_the_newest_plateaus_are_kept(wd, tmp_path):
    path = tmp_path / "state.json"
    path.write_text(json.dumps({"plateaus": [{"plateau": float(i + 1) * GiB, "settle_seconds": 3600}
                                             for i in range(12)]}))
    engine = wd.DecisionEngine({"state_file": str(path), "plateaus_kept": 3})
    assert [p["plateau"] / GiB for p in engine.plateaus] == [10.0, 11.0, 12.0]
    assert engine.state_note is None and engine.learned_plateau() == 12 * GiB


def test_one_step_then_a_plateau_is_not_a_trend(wd):
    """A 2 GiB step (a cache filling over 20 minutes) 20 h into a quiet run: no alert, no
    recycle, in the window or a season later."""
    engine = wd.DecisionEngine({})
    rng = random.Random(8)
    decisions = []
    for i in range(48 * 60):
        t = i * 60
        mem = 6 * GiB * families._warmup_level("exp", t, {"f0": 0.6, "tau": 600.0})  # pylint: disable=protected-access
        mem += 2 * GiB * min(1.0, max(0.0, (t - 20 * HOUR) / 1200.0))
        mem += 150 * MiB * (2.0 * ((t / 420.0) % 1.0) - 1.0) + rng.gauss(0, 15 * MiB)
        decisions.append(engine.feed(t, mem, ttft_p95=0.4 * math.exp(rng.gauss(0, 0.08))))
    assert _paged(decisions) == []


def test_alert_episode_is_one_until_it_clears_and_is_in_the_decision(wd):
    """A 50 MiB/h leak without latency and no limit: one memory episode, however the
    evaluations flap, held with its diagnosis, counted in alert_episodes_total."""
    shape = [s for s in generate_traces.specs() if s.name == "leak_50mib_quiet"][0]
    engine = wd.DecisionEngine(dict(shape.config))
    decisions = [engine.feed(t, m, ttft_p95=tt) for t, m, tt, _p in generate_traces.generate(shape)]
    alerts = [d for d in decisions if d.action == "alert"]
    assert alerts and {d.diagnosis for d in alerts} == {"memory_rising"}
    starts = [b for a, b in zip(decisions, decisions[1:]) if b.action == "alert" and a.action != "alert"]
    assert len(starts) == 1
    assert decisions[-1].alert_episodes_total == 1
    assert alerts[-1].alert_episode == "memory_rising" and alerts[-1].alert_episode_since == starts[0].t
    assert json.loads(alerts[-1].to_json())["alert_episode"] == "memory_rising"


def test_a_short_alert_condition_is_pending_not_paged(wd):
    """Hysteresis on entry: a condition seen once is no episode; one seen again after a gap
    longer than the entry time starts counting anew."""
    engine = wd.DecisionEngine({"alert_enter_seconds": 1800})
    # A latency condition (a load burst lifts TTFT for minutes); a memory one pages at once.
    d = wd.Decision(t=100.0, action="alert", reason="r", phase="evaluating", diagnosis="latency_only")
    engine._episode(d, 100.0)  # pylint: disable=protected-access
    assert d.action == "none" and "alert pending" in d.reason and d.alert_episodes_total == 0
    d = wd.Decision(t=400.0, action="none", reason="r", phase="evaluating", diagnosis="steady")
    engine._episode(d, 400.0)  # pylint: disable=protected-access
    d = wd.Decision(t=700.0, action="alert", reason="r", phase="evaluating", diagnosis="latency_only")
    engine._episode(d, 700.0)  # pylint: disable=protected-access
    assert d.action == "none" and engine.pending_since == 100.0   # seen again within the entry time
    d = wd.Decision(t=2500.0, action="alert", reason="r", phase="evaluating", diagnosis="latency_only")
    engine._episode(d, 2500.0)  # pylint: disable=protected-access
    assert d.action == "none" and engine.pending_since == 2500.0  # a gap as long as it: begins anew
    d = wd.Decision(t=3400.0, action="alert", reason="r", phase="evaluating", diagnosis="latency_only")
    engine._episode(d, 3400.0)  # pylint: disable=protected-access
    assert d.action == "none" and engine.pending_since == 2500.0  # seen again: still pending
    d = wd.Decision(t=4400.0, action="alert", reason="r", phase="evaluating", diagnosis="latency_only")
    engine._episode(d, 4400.0)  # pylint: disable=protected-access
    assert d.action == "alert" and d.alert_episodes_total == 1 and d.alert_episode == "latency_only"
    d = wd.Decision(t=4500.0, action="alert", reason="r", phase="evaluating", diagnosis="memory_rising")
    engine._episode(d, 4500.0)  # pylint: disable=protected-access
    assert d.diagnosis == "latency_only" and d.alert_episodes_total == 1   # one episode, its condition kept


def test_issue_slow_leak_with_latency_is_recycled_within_24_hours(wd):
    """The issue's unseen trace: 48 MiB/h from 2.5 h after the start, TTFT p95 following it,
    27.5 h long - never recycled by the engine before issue 38."""
    engine = wd.DecisionEngine({})
    decisions = _run(engine, "exp", 0, 27.5, seed=9, leak=48.0, leak_after=2.5, ttft_per_gib=0.35)
    recycles = [d for d in decisions if d.action == "recycle"]
    assert recycles, "never recycled"
    assert 2.5 * HOUR < recycles[0].t <= (2.5 + 24) * HOUR
    assert recycles[0].diagnosis in ("slow_decay", "leak_with_latency")


@pytest.mark.parametrize("seed", [2, 3, 4, 5, 6])
def test_a_slow_leak_whose_ttft_rises_under_the_threshold_in_12_hours_is_recycled_within_24(wd, seed):
    """40 MiB/h from 3 h after a quick warm-up, TTFT p95 +30 % per GiB leaked: +14 % over the
    12 h long window (under ttft_min_relative_rise), +28 % over 24 h. TTFT is judged over up to
    twice the window once 18 h have passed the hold; the engine before this never recycled
    these seeds in 30 h (alerted only)."""
    engine = wd.DecisionEngine({})
    decisions = _run(engine, "exp", 0, 30, seed=seed, leak=40.0, leak_after=3.0, ttft_per_gib=0.3,
                     shape={"f0": 0.9, "tau": 0.3 * HOUR})
    recycles = [d for d in decisions if d.action == "recycle"]
    assert recycles, "never recycled"
    assert 3 * HOUR < recycles[0].t <= (3 + 24) * HOUR
    assert recycles[0].diagnosis == "leak_with_latency" and "TTFT p95 +" in recycles[0].reason


@pytest.mark.parametrize("seed", [5, 8, 12])
def test_a_slow_leak_under_load_bursts_and_a_ttft_swell_is_recycled_within_24(wd, seed):
    """35 MiB/h from 3 h, TTFT p95 +25 % per GiB leaked, under a daily TTFT swell (+15 %) and six
    load bursts: the bursts' hours scatter TTFT's hourly medians, so their rise, though
    +15 % and more, missed Mann-Kendall at mk_alpha. Once the memory floors pass the long
    window's full test, TTFT confirms at long_window_ttft_alpha; the engine before this never
    recycled these seeds in 30 h (alerted only)."""
    engine = wd.DecisionEngine({})
    decisions = _run(engine, "exp", 0, 30, seed=seed, leak=35.0, leak_after=3.0, ttft_per_gib=0.25,
                     shape={"f0": 0.9, "tau": 0.3 * HOUR}, bursts=6, ttft_swell=0.15)
    recycles = [d for d in decisions if d.action == "recycle"]
    assert recycles, "never recycled"
    assert 3 * HOUR < recycles[0].t <= (3 + 24) * HOUR
    assert recycles[0].diagnosis == "leak_with_latency" and "TTFT p95 +" in recycles[0].reason


def test_load_bursts_after_earlier_ones_gave_back_as_much_are_not_recycled(wd):
    """A leak-free trace of the tune family cache_step (seed 21) that the engine recycled as
    'leak_with_latency' at 49.5 h: load bursts that follow each other lift memory and TTFT p95
    together for hours, as a leak does, and the hourly floors of this run already rose as much
    and came back. A rise must now add what the run's load has given back before it counts."""
    trace = families.generate("cache_step", 21)
    engine = wd.DecisionEngine({})
    starts = set(trace.starts[1:])
    decisions = [engine.feed(t, mem, ttft_p95=ttft, preemptions=pre, restarted=t in starts)
                 for t, mem, ttft, pre in trace.rows if t < 54 * HOUR]
    assert [(round(d.t / HOUR, 2), d.diagnosis) for d in decisions if d.action == "recycle"] == []
    assert engine.undone_rise_bytes() > wd.DEFAULTS["confirm_rise_bytes"]


@pytest.mark.parametrize("floors,undone", [
    ([], 0), ([5.0], 0), ([5.0, 6.0, 7.0, 8.0], 0),          # only rising: nothing given back
    ([5.0, 5.0, 5.0], 0),
    ([5.0, 5.6, 5.1, 5.2], 0.5),                             # up 0.6, back to 5.1: 0.5 undone
    ([5.0, 5.3, 5.0, 5.9, 5.2, 5.4], 0.7),                   # the larger of two bursts
    ([5.0, 6.0, 7.0], 0), ([5.0, 6.0, 7.0, 6.8], 0.2),       # the newest floor is no peak; a dip is
    ([6.0, 5.0, 5.5, 5.2, 7.0], 0.3),                        # prominence over the higher low
])
def test_undone_rise_is_the_largest_hourly_floor_rise_given_back(wd, floors, undone):
    engine = wd.DecisionEngine({})
    for i, floor in enumerate(floors):
        engine.season.append(((i + 1) * HOUR, floor * GiB, None))
    assert engine.undone_rise_bytes() == pytest.approx(undone * GiB)


def test_a_rise_with_the_limit_in_reach_needs_no_more_than_confirm_rise_bytes(wd):
    """Bursts earlier in the run gave back several hundred MiB of hourly floor, so a rise with
    no limit in reach must add as much before it is confirmed; with the limit projected within
    the horizon there is no time to spare, and confirm_rise_bytes (256 MiB) is enough, as before."""
    engine = wd.DecisionEngine({})
    for i, floor in enumerate([5.0, 5.0, 5.8, 5.1, 5.0]):
        engine.season.append(((i + 1) * HOUR, floor * GiB, None))
    slope = 200 * MiB / HOUR
    assert engine.confirm_needed_seconds(slope) == pytest.approx(0.8 * GiB / slope)
    assert engine.confirm_needed_seconds(slope, near_limit=True) == pytest.approx(
        max(wd.DEFAULTS["confirm_seconds"], wd.DEFAULTS["confirm_rise_bytes"] / slope))
    assert engine.confirm_needed_seconds(1 * MiB / HOUR) == wd.DEFAULTS["confirm_max_seconds"]


def test_field_report_decay_recycled_within_24_hours_of_its_start(wd, manifest):
    """The committed field-report decay (36 h, -18 % throughput, RSS monotonic, p95 tracking):
    the engine before issue 38 recycled it 27 h after it starts."""
    entry = manifest["field_report_decay"]
    decisions = wd.replay(os.path.join(TRACES, entry["file"]), entry["config"], out=open(os.devnull, "w"))
    first = next(d for d in decisions if d.action == "recycle")
    assert first.t - entry["leak_start"] <= 24 * HOUR, (first.t - entry["leak_start"]) / HOUR


def test_replay_time_going_back_names_both_times_exactly(wd, tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("t_seconds,rss_bytes\n1700000001,100\n1700000000,100\n")
    with pytest.raises(ValueError) as err:
        wd.replay(str(trace), {}, out=open(os.devnull, "w"))
    assert "t_seconds 1700000000 goes back from the previous row's 1700000001" in str(err.value)
    trace.write_text("t_seconds,rss_bytes\n10.25,100\n10.125,100\n")
    with pytest.raises(ValueError) as err:
        wd.replay(str(trace), {}, out=open(os.devnull, "w"))
    assert "t_seconds 10.125 goes back from the previous row's 10.25" in str(err.value)


def test_trace_families_are_split_and_deterministic():
    assert families.split("tune") and families.split("held_out")
    assert set(families.split("tune")) | set(families.split("held_out")) == set(families.FAMILIES)
    for name in families.FAMILIES:
        a, b = families.generate(name, 3), families.generate(name, 3)
        assert a.rows[:50] == b.rows[:50] and a.shape == b.shape
    leaking = [n for n, f in families.FAMILIES.items() if f.leaking]
    for name in leaking:
        trace = families.generate(name, 1)
        assert trace.leak_bytes_per_hour >= 30 * MiB and trace.leak_start is not None
        assert all(s < trace.leak_start for s in trace.starts)
