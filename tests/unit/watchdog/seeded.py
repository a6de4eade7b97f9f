# -*- coding: utf-8 -*-
# Copyright (c) 2026, kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Replay freshly seeded variants of the committed trace shapes through the decision engine.

The committed traces (tests/traces/data) are one seed per shape: a claim about a rate needs
many. This draws new seeds from the same generator (tests/traces/generate_traces.py), feeds
the rows to DecisionEngine in-process and scores each run. Nothing here decides: the engine
is the code under test, fed exactly as `replay` feeds it (t, anon+swap, TTFT p95, preemption
counter per 60 s sample).

Run as a script to print the measured rates (what the bounds in test_watchdog_seeds.py rest on):
    .venv/bin/python tests/unit/watchdog/seeded.py [SEEDS]
"""
from __future__ import annotations

import dataclasses
import os
import sys
from typing import Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
TRACES = os.path.join(os.path.dirname(os.path.dirname(HERE)), "traces")
HOUR = 3600.0
WEEK = 7 * 24 * HOUR
# Decisions that say "memory is rising" (an alert or a recycle).
MEMORY_DIAGNOSES = ("memory_rising", "leak_unconfirmed", "leak_with_latency", "leak_projected")
# New seeds: far from the committed ones (101..503) and from the benchmark's sweep (seed*1000+k).
SEED_BASE = 7_000_000


def generator():
    sys.path.insert(0, TRACES)
    try:
        import generate_traces  # pylint: disable=import-error,import-outside-toplevel
    finally:
        sys.path.remove(TRACES)
    return generate_traces


def shapes() -> Dict[str, object]:
    return {spec.name: spec for spec in generator().specs()}


def seeded_spec(shape, index: int, duration: Optional[float] = None):
    """The committed shape with seed SEED_BASE + 1000 * shape.seed + index (and a shorter
    duration when given: the generator's draws for the first hours do not depend on it)."""
    over = {"seed": SEED_BASE + 1000 * shape.seed + index}
    if duration is not None:
        over["duration"] = int(duration)
    return dataclasses.replace(shape, **over)


@dataclasses.dataclass
class Run:
    seed: int
    hours_evaluated: float = 0.0      # hours of samples past warm-up and collection
    recycles: List[float] = dataclasses.field(default_factory=list)        # t of each recycle
    episodes: List[float] = dataclasses.field(default_factory=list)        # t each memory alarm began
    alarm_before_leak: Optional[float] = None   # t of the first memory alarm before the leak
    detection_delay_h: Optional[float] = None   # leak start -> first alarm episode begun after it
    recycle_delay_h: Optional[float] = None     # leak start -> first recycle after it


def run(wd, spec, config=None, stop_after=None) -> Run:
    """Feed one generated trace to a fresh DecisionEngine (DEFAULTS + the shape's config +
    `config`). An alarm *episode* is a run of consecutive evaluations with a memory diagnosis;
    only an episode that began after the leak start is a detection (a false alarm raised
    before it and still standing is not). stop_after="recycle" / "detection" ends the replay at
    the first recycle / detection after the leak start (nothing later is scored)."""
    cfg = dict(wd.DEFAULTS)
    cfg.update(spec.config)
    cfg.update(config or {})
    engine = wd.DecisionEngine(cfg)
    result = Run(seed=spec.seed)
    leak_start = spec.leak_start
    in_episode = False
    evaluated = 0
    for t, mem, ttft, preempt in generator().generate(spec):
        d = engine.feed(t, mem, ttft_p95=ttft, preemptions=preempt)
        fresh = d.action == "recycle" or engine.last_eval_t == t   # an evaluation, not a carry
        if d.phase in ("evaluating", "settling"):   # settling: evaluated, memory rises excused
            evaluated += 1
        if d.action == "recycle":
            result.recycles.append(t)
            if leak_start is not None and t > leak_start and result.recycle_delay_h is None:
                result.recycle_delay_h = (t - leak_start) / HOUR
        if fresh or d.phase != "evaluating":   # carried repeats change nothing
            alarm = d.diagnosis in MEMORY_DIAGNOSES
            if alarm and not in_episode:
                result.episodes.append(t)
                if leak_start is not None and t < leak_start and result.alarm_before_leak is None:
                    result.alarm_before_leak = t
                if leak_start is not None and t > leak_start and result.detection_delay_h is None:
                    result.detection_delay_h = (t - leak_start) / HOUR
            in_episode = alarm and d.action != "recycle"
        if stop_after == "recycle" and result.recycle_delay_h is not None:
            break
        if stop_after == "detection" and result.detection_delay_h is not None:
            break
    result.hours_evaluated = evaluated * generator().INTERVAL / HOUR
    return result


def percentile(values: List[float], q: float) -> float:
    """Nearest-rank percentile of a non-empty list (q in 0..100)."""
    ordered = sorted(values)
    rank = max(1, int(-(-q * len(ordered) // 100)))
    return ordered[rank - 1]


def main(argv):  # pragma: no cover - a report for humans
    import time  # pylint: disable=import-outside-toplevel
    sys.path.insert(0, os.path.dirname(TRACES))   # tests/: its conftest puts the collection on sys.path
    import conftest  # noqa: F401  pylint: disable=import-error,import-outside-toplevel,unused-import
    from watchdog_program import load_watchdog_program  # pylint: disable=import-error,import-outside-toplevel
    wd = load_watchdog_program()
    seeds = int(argv[1]) if len(argv) > 1 else 50
    over = dict(a.split("=", 1) for a in argv[2:])
    over = {k: float(v) for k, v in over.items()}
    all_shapes = shapes()
    # The classes and lengths test_watchdog_seeds.py replays.
    for name, hours, stop in (("leak_200mib_ttft", 16, "recycle"), ("leak_50mib_quiet", 9, "detection")):
        start = time.time()
        runs = [run(wd, seeded_spec(all_shapes[name], i, hours * HOUR), over, stop_after=stop)
                for i in range(seeds)]
        quiet = [r for r in runs if r.alarm_before_leak is None]
        det = [r.detection_delay_h for r in quiet if r.detection_delay_h is not None]
        rec = [r.recycle_delay_h for r in runs if r.recycle_delay_h is not None]
        pre_rec = sum(1 for r in runs if any(t <= all_shapes[name].leak_start for t in r.recycles))
        print("%-17s seeds %d, alarmed before the leak %d, recycled before it %d; quiet seeds %d, "
              "detected %d: p50 %s p90 %s max %s h; recycled %d: p50 %s p90 %s h  (%.0f s)" % (
                  name, seeds, seeds - len(quiet), pre_rec, len(quiet), len(det),
                  _h(det, 50), _h(det, 90), _h(det, 100), len(rec), _h(rec, 50), _h(rec, 90),
                  time.time() - start))
    for name, cfg in (("steady_7d_a", {}), ("steady_7d_b", {}), ("bursts_7d", {}),
                      ("steady_7d_a", {"confidence": 0.5})):
        start = time.time()
        runs = [run(wd, seeded_spec(all_shapes[name], i, 6 * HOUR), dict(over, **cfg)) for i in range(seeds)]
        hours = sum(r.hours_evaluated for r in runs)
        print("%-17s %-18s seeds %d, %.0f h evaluated (%.2f weeks): false recycles %d, alarm episodes %d  (%.0f s)" % (
            name, cfg or "", seeds, hours, hours * HOUR / WEEK, sum(len(r.recycles) for r in runs),
            sum(len(r.episodes) for r in runs), time.time() - start))


def _h(values, q):
    return "%.2f" % percentile(values, q) if values else "-"


if __name__ == "__main__":
    main(sys.argv)
