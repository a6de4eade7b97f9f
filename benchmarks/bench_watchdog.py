# -*- coding: utf-8 -*-
# Copyright (c) 2026, kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Replay every trace of tests/traces through the watchdog decision engine; print a table.

Columns: alert_h / recycle_h = hours from the leak start to the first "memory rising" decision
and to the first recycle (detection delay); false = recycles that should not have happened;
memalrt_h = on leak-free traces (and traces whose only trend is latency), hours spent in a
"memory rising" alert (a sample counts 1 minute); ok = the trace met its expectation.
Targets: a 50 MiB/h leak detected within 3 h of its start; zero false recycles over the
7-day non-leaking traces. No asserts: this is a report, the unit tests hold the guarantees.

Run: .venv/bin/python benchmarks/bench_watchdog.py [--regenerate] [--seeds N]
(--seeds N also replays N freshly seeded variants of each leak-free 7-day shape.)
--field-report [SEEDS]: the field report's slow decay under a daily swell - leak-to-recycle delay
at 50/200/2000 MiB/h with TTFT tracking the leak, and false recycles / alert episodes over
21-day leak-free traces with the swell and a restart every 5 days (SEEDS of each, default 2).
--families [SEEDS]: the randomised trace families of tests/traces/families.py (tune and held-out,
docs/testing.md), SEEDS seeds each (default 50), fed in process with the restart flag the daemon
has (pid / restart_count): per family alert episodes per week, recycles, % of leaking seeds
recycled within 24 h of the leak start, recycles before the leak starts, the worst seed.
Targets on the held-out families: <= 1 alert episode per week and 0 recycles leak-free;
>= 95 % of leaking seeds (>= 30 MiB/h, TTFT following) recycled within 24 h; no recycle before
a leak starts. --jobs N runs the seeds in N processes (default 2); --only A,B replays only the
named families or splits (tune, held_out).
"""

from __future__ import annotations

import io
import json
import os
import sys
import time

# First: makes ansible_collections.kvpin.fleet importable (benchmarks/_setup.py): the watchdog
# package imports two of the collection's modules from there in a checkout.
from _setup import ROOT  # noqa: E402  pylint: disable=wrong-import-position

PROGRAM = os.path.join(ROOT, "roles", "serving_watchdog", "files", "kvpin_watchdog.py")
TRACES = os.path.join(ROOT, "tests", "traces")
HOUR = 3600.0
# Decisions that say "memory is rising" (an alert or a recycle): what detection means here.
MEMORY_DIAGNOSES = ("memory_rising", "leak_unconfirmed", "leak_with_latency", "leak_projected", "slow_decay")


def load_program():
    """The watchdog program's package (the tests' loader, tests/watchdog_program.py)."""
    tests_dir = os.path.join(ROOT, "tests")
    if tests_dir not in sys.path:
        sys.path.insert(0, tests_dir)
    from watchdog_program import load_watchdog_program  # pylint: disable=import-error,import-outside-toplevel
    return load_watchdog_program()


def score(entry, decisions):
    """Detection delays and false recycles of one replay, judged against the manifest entry."""
    leak_start = entry.get("leak_start")
    cap_at = entry.get("cap_reached_at")
    first_alert = first_recycle = None
    recycles = [d for d in decisions if d.action == "recycle"]
    alerts = [d for d in decisions if d.action == "alert"]
    if leak_start is not None:
        after = [d for d in decisions if d.t >= leak_start]
        a = next((d for d in after if d.diagnosis in MEMORY_DIAGNOSES), None)
        r = next((d for d in after if d.action == "recycle"), None)
        first_alert = None if a is None else (a.t - leak_start) / HOUR
        first_recycle = None if r is None else (r.t - leak_start) / HOUR
    expect = entry["expect"]
    if expect == "recycle":
        false_recycles = 0
        ok = bool(recycles)
    elif expect == "no_recycle_after_cap":
        # Plateau reached at cap_at; allow one evaluation window for the trend to fade.
        false_recycles = len([d for d in recycles if d.t >= cap_at])
        ok = false_recycles == 0
    else:  # alert_only, no_recycle
        false_recycles = len(recycles)
        ok = false_recycles == 0 and (expect != "alert_only" or bool(alerts))
    # Hours in which memory was reported rising on a trace that never leaks.
    leak_free = expect == "no_recycle" or leak_start is None
    mem_alert_h = (sum(1 for d in decisions if d.diagnosis in MEMORY_DIAGNOSES) * 60.0 / HOUR
                   if leak_free else None)
    return {"first_alert_h": first_alert, "false_mem_alert_h": mem_alert_h, "first_recycle_h": first_recycle,
            "recycles": len(recycles), "alert_samples": len(alerts),
            "false_recycles": false_recycles, "ok": ok,
            "diagnoses": sorted({d.diagnosis for d in recycles + alerts if d.diagnosis})}


def seed_sweep(program, seeds):
    """Extra 7-day leak-free traces (not stored), each shape with `seeds` new seeds: false recycles."""
    sys.path.insert(0, TRACES)
    import generate_traces  # noqa: E402 pylint: disable=import-outside-toplevel
    import dataclasses  # pylint: disable=import-outside-toplevel
    shapes = [s for s in generate_traces.specs() if s.expect == "no_recycle"]
    print()
    print("seed sweep: %d leak-free 7-day traces per shape" % seeds)
    print("%-14s %6s %8s %14s %16s" % ("shape", "traces", "days", "false_recycles", "mem_alert_hours"))
    total_false = 0
    total_days = 0.0
    for shape in shapes:
        false = 0
        alert_samples = 0
        for k in range(seeds):
            spec = dataclasses.replace(shape, seed=shape.seed * 1000 + k + 1)
            engine = program.DecisionEngine(dict(program.DEFAULTS, **spec.config))
            for t, mem, ttft, pre in generate_traces.generate(spec):
                d = engine.feed(t, mem, ttft_p95=ttft, preemptions=pre)
                false += d.action == "recycle"
                alert_samples += d.diagnosis in MEMORY_DIAGNOSES
        days = seeds * shape.duration / 86400.0
        total_false += false
        total_days += days
        print("%-14s %6d %8.0f %14d %16.1f" % (shape.name, seeds, days, false,
                                               alert_samples * generate_traces.INTERVAL / HOUR))
    print("seed sweep summary: %d false recycles over %.0f leak-free days" % (total_false, total_days))


def alert_episodes(decisions):
    """Runs of consecutive alert decisions (one episode = one page to a human)."""
    episodes, inside = 0, False
    for d in decisions:
        if d.action == "alert" and not inside:
            episodes += 1
        inside = d.action == "alert"
    return episodes


def field_report_sweep(program, seeds):
    sys.path.insert(0, TRACES)
    import generate_traces  # noqa: E402 pylint: disable=import-outside-toplevel
    mib = 1024 * 1024
    print()
    print("field report: leak-to-recycle delay, RSS leak from hour 1 with TTFT p95 tracking it "
          "(+22 %% per 2.1 GiB leaked), daily swell, no limit; %d seeds" % seeds)
    print("%-10s %-28s %-28s %s" % ("rate", "first alert h (per seed)", "first recycle h (per seed)", "diagnoses"))
    for rate in (50, 200, 2000):
        alerts, recycles, diags = [], [], set()
        for k in range(seeds):
            rows = generate_traces.field_report(
                "decay", 8100 + k, hours=48, rate_bytes_per_hour=rate * mib,
                decay_ttft_36h=0.22 * rate / 60.0)
            engine = program.DecisionEngine(dict(program.DEFAULTS))
            first_a = first_r = None
            for t, mem, ttft, _pre in rows:
                d = engine.feed(t, mem, ttft_p95=ttft)
                if d.diagnosis in MEMORY_DIAGNOSES and first_a is None and t >= HOUR:
                    first_a = (t - HOUR) / HOUR
                if d.action == "recycle" and first_r is None:
                    first_r = (t - HOUR) / HOUR
                    diags.add(d.diagnosis)
                    break
            alerts.append(first_a)
            recycles.append(first_r)

        def fmt(values):
            return "/".join("-" if v is None else "%.1f" % v for v in values)
        print("%-10s %-28s %-28s %s" % ("%d MiB/h" % rate, fmt(alerts), fmt(recycles), ",".join(sorted(diags))))
    print()
    print("field report: leak-free 21-day traces, daily swell (TTFT +20 %%, RSS +60 MiB at peak), "
          "restart every 5 days; %d seeds" % seeds)
    print("%-6s %6s %10s %15s %18s" % ("seed", "days", "recycles", "alert_episodes", "episodes_per_week"))
    total_r = total_e = 0
    for k in range(seeds):
        rows = generate_traces.field_report("swell", 8200 + k, hours=21 * 24,
                                            restarts=tuple(d * 86400 for d in (5, 10, 15, 20)))
        engine = program.DecisionEngine(dict(program.DEFAULTS))
        decisions = [engine.feed(t, mem, ttft_p95=ttft) for t, mem, ttft, _pre in rows]
        rec = len([d for d in decisions if d.action == "recycle"])
        eps = alert_episodes(decisions)
        total_r += rec
        total_e += eps
        print("%-6d %6d %10d %15d %18.2f" % (8200 + k, 21, rec, eps, eps / 3.0))
    print("summary: %d recycles (target 0), %.2f alert episodes per week (target <= 1) over %d leak-free days"
          % (total_r, total_e / (3.0 * seeds), 21 * seeds))


def family_run(job):
    """One seed of one family through a fresh DecisionEngine: its score (a worker's job)."""
    family, seed = job
    program = load_program()
    sys.path.insert(0, TRACES)
    import families  # noqa: E402 pylint: disable=import-outside-toplevel,import-error
    trace = families.generate(family, seed)
    engine = program.DecisionEngine(dict(program.DEFAULTS))
    starts = set(trace.starts[1:])
    decisions = []
    started = time.process_time()
    first_recycle = None
    for t, mem, ttft, pre in trace.rows:
        d = engine.feed(t, mem, ttft_p95=ttft, preemptions=pre, restarted=t in starts)
        decisions.append(d)
        if d.action == "recycle" and trace.leak_start is not None and t >= trace.leak_start:
            first_recycle = t
            break      # the leak was recycled: nothing after it is scored
    leak = trace.leak_start
    scored = [d for d in decisions if leak is None or d.t < leak]
    hours = (scored[-1].t - scored[0].t + 60.0) / HOUR if scored else 0.0
    return {"family": family, "seed": seed, "hours": hours, "episodes": alert_episodes(scored),
            "recycles": sum(1 for d in scored if d.action == "recycle"),
            "delay_h": None if first_recycle is None else (first_recycle - leak) / HOUR,
            "rate_mib_h": trace.leak_bytes_per_hour / (1024 * 1024), "shape": trace.shape,
            "cpu_s": time.process_time() - started}


def families_sweep(seeds, jobs, only=()):
    sys.path.insert(0, TRACES)
    import families  # noqa: E402 pylint: disable=import-outside-toplevel,import-error
    names = [n for n in families.FAMILIES if not only or n in only or families.FAMILIES[n].split in only]
    work = [(name, seed) for name in names for seed in range(1, seeds + 1)]
    if jobs > 1:
        import multiprocessing  # pylint: disable=import-outside-toplevel
        with multiprocessing.Pool(jobs) as pool:
            results = pool.map(family_run, work, chunksize=1)
    else:
        results = [family_run(job) for job in work]
    print()
    print("trace families (tests/traces/families.py), %d seeds each; episodes/week and recycles count "
          "the leak-free time (a leaking trace's time before its leak)" % seeds)
    header = "%-16s %-8s %-5s %6s %8s %9s %8s %11s %12s %s" % (
        "family", "split", "leak", "weeks", "ep/week", "recycles", "rec<24h", "rec_before", "cpu_s", "worst seed")
    print(header)
    print("-" * len(header))
    for name, fam in families.FAMILIES.items():
        rows = [r for r in results if r["family"] == name]
        if not rows:
            continue
        weeks = sum(r["hours"] for r in rows) / (7 * 24)
        episodes = sum(r["episodes"] for r in rows)
        recycles = sum(r["recycles"] for r in rows)
        cpu = sum(r["cpu_s"] for r in rows)
        if fam.leaking:
            within = sum(1 for r in rows if r["delay_h"] is not None and r["delay_h"] <= 24)
            worst = max(rows, key=lambda r: (r["recycles"], float("inf") if r["delay_h"] is None else r["delay_h"]))
            worst_text = "seed %d: %.0f MiB/h, %s, %d recycles before the leak; %s" % (
                worst["seed"], worst["rate_mib_h"],
                "never recycled" if worst["delay_h"] is None else "recycled after %.1f h" % worst["delay_h"],
                worst["recycles"], worst["shape"])
            print("%-16s %-8s %-5s %6.2f %8.2f %9s %7.0f%% %11d %12.1f %s" % (
                name, fam.split, "yes", weeks, episodes / weeks if weeks else 0.0, "-", 100.0 * within / len(rows),
                recycles, cpu, worst_text))
        else:
            worst = max(rows, key=lambda r: (r["recycles"], r["episodes"]))
            worst_text = "seed %d: %d episodes, %d recycles; %s" % (
                worst["seed"], worst["episodes"], worst["recycles"], worst["shape"])
            print("%-16s %-8s %-5s %6.2f %8.2f %9d %8s %11s %12.1f %s" % (
                name, fam.split, "no", weeks, episodes / weeks, recycles, "-", "-", cpu, worst_text))
    held = [n for n, f in families.FAMILIES.items() if f.split == "held_out"]
    free = [r for r in results if r["family"] in held and not families.FAMILIES[r["family"]].leaking]
    leaking = [r for r in results if r["family"] in held and families.FAMILIES[r["family"]].leaking]
    weeks = sum(r["hours"] for r in free) / (7 * 24)
    if not free or not leaking:
        return
    print("held-out summary: leak-free %.2f alert episodes per week (target <= 1), %d recycles (target 0); "
          "leaking %.0f %% recycled within 24 h (target >= 95 %%), %d recycles before the leak (target 0)" % (
              sum(r["episodes"] for r in free) / weeks, sum(r["recycles"] for r in free),
              100.0 * sum(1 for r in leaking if r["delay_h"] is not None and r["delay_h"] <= 24) / len(leaking),
              sum(r["recycles"] for r in leaking)))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if "--families" in argv:
        at = argv.index("--families")
        seeds = int(argv[at + 1]) if at + 1 < len(argv) and argv[at + 1].isdigit() else 50
        jobs = int(argv[argv.index("--jobs") + 1]) if "--jobs" in argv else 2
        only = argv[argv.index("--only") + 1].split(",") if "--only" in argv else ()
        families_sweep(seeds, jobs, only)
        if "--only-families" in argv:
            return 0
    if "--regenerate" in argv:
        sys.path.insert(0, TRACES)
        import generate_traces  # noqa: E402 pylint: disable=import-outside-toplevel
        generate_traces.write_all()
    program = load_program()
    with open(os.path.join(TRACES, "manifest.json"), encoding="utf-8") as handle:
        manifest = json.load(handle)
    header = "%-18s %-21s %5s %8s %9s %8s %6s %9s %4s %s" % (
        "trace", "expect", "days", "alert_h", "recycle_h", "recycles", "false", "memalrt_h", "ok",
        "diagnoses (alerts and recycles)")
    print(header)
    print("-" * len(header))
    results = {}
    cpu_total = 0.0
    for name, entry in manifest.items():
        cfg = dict(program.DEFAULTS)
        cfg.update(entry.get("config") or {})
        started = time.process_time()
        decisions = program.replay(os.path.join(TRACES, entry["file"]), cfg, out=io.StringIO())
        cpu_total += time.process_time() - started
        res = score(entry, decisions)
        results[name] = res

        def fmt(v):
            return "-" if v is None else "%.2f" % v
        print("%-18s %-21s %5.2f %8s %9s %8d %6d %9s %4s %s" % (
            name, entry["expect"], entry["duration"] / 86400.0, fmt(res["first_alert_h"]),
            fmt(res["first_recycle_h"]), res["recycles"], res["false_recycles"],
            fmt(res["false_mem_alert_h"]),
            "yes" if res["ok"] else "NO", ",".join(res["diagnoses"])))
    leak50 = [r for n, r in results.items() if n.startswith("leak_50mib")]
    det50 = [r["first_alert_h"] for r in leak50]
    nonleak_days = sum(manifest[n]["duration"] for n in manifest if manifest[n]["expect"] == "no_recycle") / 86400.0
    false_nonleak = sum(results[n]["false_recycles"] for n in manifest if manifest[n]["expect"] == "no_recycle")
    print()
    print("summary: 50 MiB/h leak detected after %s h (target <= 3 h); "
          "false recycles over %.0f non-leaking days: %d (target 0); traces meeting expectation: %d/%d; "
          "replay CPU %.1f s" % (
              "/".join("-" if d is None else "%.2f" % d for d in det50), nonleak_days, false_nonleak,
              sum(1 for r in results.values() if r["ok"]), len(results), cpu_total))
    if "--seeds" in argv:
        seed_sweep(program, int(argv[argv.index("--seeds") + 1]))
    if "--field-report" in argv:
        at = argv.index("--field-report")
        seeds = int(argv[at + 1]) if at + 1 < len(argv) and argv[at + 1].isdigit() else 2
        field_report_sweep(program, seeds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
