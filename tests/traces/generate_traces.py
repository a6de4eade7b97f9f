# -*- coding: utf-8 -*-
# Copyright (c) 2026, kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Deterministic (seeded) synthetic memory/TTFT traces for the serving watchdog.

Run: python tests/traces/generate_traces.py   (rewrites tests/traces/data/*.csv + manifest.json)

Shapes are modelled on real reports (docs/data-sources.md, "Watchdog traces"), not measured here:
- leak rates: 50 MiB/h (vLLM #44175 measured ~47 MiB/h), 200 MiB/h (GPUStack #5342 ~150 MB/h),
  2 GiB/h (vllm-ascend #15193);
- sawtooth GC/allocator noise of +/-100..300 MiB with a period of 4..12 minutes;
- warm-up ramp after every start (weights, CUDA graphs, caches);
- a llama.cpp-style capped prompt cache (--cache-ram 8192 MiB) that rises then levels off;
- traffic bursts: bumps of 0.3..1 GiB lasting 10..40 minutes that return;
- a mild diurnal load swing in memory and TTFT.
Each trace's expected outcome and its watchdog config overrides are in manifest.json.
"""

from __future__ import annotations

import csv
import json
import math
import os
import random
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

MiB = 1024 * 1024
GiB = 1024 * MiB
HOUR = 3600
DAY = 24 * HOUR
INTERVAL = 60

HERE = os.path.dirname(os.path.abspath(__file__))
DATA_DIR = os.path.join(HERE, "data")


@dataclass
class TraceSpec:
    name: str
    seed: int
    duration: int
    expect: str                        # recycle | alert_only | no_recycle
    description: str
    base_bytes: int = 6 * GiB          # settled anon+swap of a vLLM worker host side
    sawtooth_bytes: int = 200 * MiB    # half amplitude
    leak_start: Optional[int] = None
    leak_bytes_per_hour: float = 0.0
    ttft_base: float = 0.35
    ttft_rise_per_hour: float = 0.0    # starts with the leak (or at ttft_rise_start)
    ttft_rise_start: Optional[int] = None
    preemptions_per_hour_rising: float = 0.0
    restarts: List[int] = field(default_factory=list)
    cap_bytes: Optional[int] = None    # capped cache: growth stops at this many bytes
    bursts_per_day: float = 6.0
    diurnal_bytes: int = 40 * MiB     # host anon barely follows load: the KV cache is on the GPU
    config: Dict[str, object] = field(default_factory=dict)


def _warmup(age: float) -> float:
    """Fraction of the settled level reached `age` seconds after start (load + graphs + caches)."""
    return 0.55 + 0.45 * (1.0 - math.exp(-age / 600.0))


def generate(spec: TraceSpec) -> List[Tuple[int, int, Optional[float], int]]:
    rng = random.Random(spec.seed)
    rows = []
    # Pre-draw bursts: (start, duration, height).
    bursts = []
    t = 0.0
    while spec.bursts_per_day > 0:
        t += rng.expovariate(spec.bursts_per_day / DAY)
        if t >= spec.duration:
            break
        bursts.append((t, rng.uniform(600, 2400), rng.uniform(300 * MiB, 1 * GiB)))
    start = 0
    restarts = sorted(spec.restarts)
    saw_phase, saw_period = 0.0, rng.uniform(240, 720)
    saw_amp = spec.sawtooth_bytes * rng.uniform(0.5, 1.5)
    preempt = 0.0
    diurnal_phase = rng.uniform(0, 2 * math.pi)
    for t_int in range(0, spec.duration, INTERVAL):
        if restarts and t_int >= restarts[0]:
            start = restarts.pop(0)
        age = t_int - start
        level = spec.base_bytes * _warmup(age)
        # Leak: accumulates since the leak start or the last restart, whichever is later.
        if spec.leak_start is not None and t_int >= spec.leak_start:
            leak_from = max(spec.leak_start, start)
            leaked = spec.leak_bytes_per_hour * (t_int - leak_from) / HOUR
            if spec.cap_bytes is not None:
                leaked = min(leaked, spec.cap_bytes)
            level += leaked
        # Sawtooth: linear rise then drop (GC / malloc_trim), period re-drawn each cycle.
        saw_phase += INTERVAL / saw_period
        if saw_phase >= 1.0:
            saw_phase -= 1.0
            saw_period = rng.uniform(240, 720)
            saw_amp = spec.sawtooth_bytes * rng.uniform(0.5, 1.5)
        level += saw_amp * (2.0 * saw_phase - 1.0)
        level += rng.gauss(0, 15 * MiB)
        load = math.sin(2 * math.pi * t_int / DAY + diurnal_phase)
        level += spec.diurnal_bytes * load
        burst_load = 0.0
        for b_start, b_len, b_height in bursts:
            if b_start <= t_int < b_start + b_len + 1800:
                # Rises over the burst, decays back over ~10 min after it.
                if t_int < b_start + b_len:
                    frac = min(1.0, (t_int - b_start) / 300.0)
                else:
                    frac = math.exp(-(t_int - b_start - b_len) / 600.0)
                level += b_height * frac
                burst_load = max(burst_load, frac * b_height / GiB)
        # TTFT p95 of the last minute: lognormal noise, load-dependent, optional trend.
        ttft = spec.ttft_base * (1.0 + 0.1 * load + 0.8 * burst_load) * math.exp(rng.gauss(0, 0.08))
        rise_from = spec.ttft_rise_start if spec.ttft_rise_start is not None else spec.leak_start
        if spec.ttft_rise_per_hour and rise_from is not None and t_int >= rise_from:
            ttft += spec.ttft_rise_per_hour * (t_int - max(rise_from, start)) / HOUR
            if spec.preemptions_per_hour_rising:
                preempt += spec.preemptions_per_hour_rising * INTERVAL / HOUR * rng.uniform(0.5, 1.5)
        ttft_value: Optional[float] = round(ttft, 4)
        if age < 300:  # no traffic served while loading
            ttft_value = None
        rows.append((t_int, int(max(level, 0)), ttft_value, int(preempt)))
    return rows


def specs() -> List[TraceSpec]:
    h = HOUR
    return [
        TraceSpec("leak_50mib_ttft", 101, 16 * h, "recycle",
                  "50 MiB/h leak (vLLM #44175 rate) from hour 4, TTFT p95 tracking it",
                  leak_start=4 * h, leak_bytes_per_hour=50 * MiB, ttft_rise_per_hour=0.03),
        TraceSpec("leak_50mib_quiet", 102, 16 * h, "alert_only",
                  "50 MiB/h leak from hour 4, no latency impact, limit far: alert, no recycle",
                  leak_start=4 * h, leak_bytes_per_hour=50 * MiB,
                  config={"memory_limit_bytes": 64 * GiB}),
        TraceSpec("leak_200mib_ttft", 201, 16 * h, "recycle",
                  "200 MiB/h leak from hour 3 with TTFT rising",
                  leak_start=3 * h, leak_bytes_per_hour=200 * MiB, ttft_rise_per_hour=0.05),
        TraceSpec("leak_200mib_limit", 202, 24 * h, "recycle",
                  "200 MiB/h leak from hour 3, no latency impact, 9 GiB limit: recycle before the crossing",
                  leak_start=3 * h, leak_bytes_per_hour=200 * MiB,
                  config={"memory_limit_bytes": 9 * GiB}),
        TraceSpec("leak_2gib", 203, 12 * h, "recycle",
                  "2 GiB/h leak from hour 2 (vllm-ascend #15193 rate), 32 GiB limit",
                  leak_start=2 * h, leak_bytes_per_hour=2 * GiB,
                  config={"memory_limit_bytes": 32 * GiB}),
        TraceSpec("leak_restarts", 204, 24 * h, "recycle",
                  "200 MiB/h leak with TTFT rising and two unrelated restarts inside the trace",
                  leak_start=2 * h, leak_bytes_per_hour=200 * MiB, ttft_rise_per_hour=0.05,
                  restarts=[3 * h, 9 * h]),
        TraceSpec("capped_cache", 301, 48 * h, "no_recycle_after_cap",
                  "llama.cpp prompt cache: +1 GiB/h from hour 1, capped at 8 GiB, then flat",
                  leak_start=1 * h, leak_bytes_per_hour=1 * GiB, cap_bytes=8 * GiB,
                  config={"memory_limit_bytes": 64 * GiB}),
        TraceSpec("ttft_flat_memory", 401, 24 * h, "alert_only",
                  "TTFT p95 rising (preemptions) while memory is flat: alert, never recycle",
                  ttft_rise_per_hour=0.05, ttft_rise_start=4 * h, preemptions_per_hour_rising=40),
        TraceSpec("bursts_7d", 501, 7 * 24 * h, "no_recycle",
                  "7 days, no leak, frequent traffic bursts (+0.3..1 GiB for 10..40 min)",
                  bursts_per_day=24.0),
        TraceSpec("steady_7d_a", 502, 7 * 24 * h, "no_recycle",
                  "7 days, no leak, +/-200 MiB sawtooth, diurnal swing",
                  config={"memory_limit_bytes": 9 * GiB}),
        TraceSpec("steady_7d_b", 503, 7 * 24 * h, "no_recycle",
                  "7 days, no leak, +/-300 MiB sawtooth, restarts on days 2 and 5",
                  sawtooth_bytes=300 * MiB, restarts=[2 * DAY, 5 * DAY]),
    ]


# The field report's slow decay ("Catching the slow decay"): throughput -18 % over 36 h with
# GPU utilisation flat, worker RSS growing monotonically (a few % per 3 h: 60 MiB/h on a 6 GiB
# floor is 3 % per 3 h) and p95 TTFT tracking it, all under a daily traffic swell. Classes:
#   decay  RSS ramp + TTFT tracking it (+22 % over 36 h = 1/0.82)  -> recycle (slow_decay)
#   ramp   the same RSS ramp, TTFT only swells, no limit            -> alert, never recycle
#   ttft   slow p95 rise (+22 % / 36 h), RSS only swells            -> alert latency_only
#   swell  the daily swell alone (TTFT +20 % and RSS +60 MiB at peak) -> nothing
FIELD_REPORT_CLASSES = ("decay", "ramp", "ttft", "swell")
FIELD_REPORT_EXPECT = {"decay": "recycle", "ramp": "alert_only", "ttft": "alert_only", "swell": "nothing"}


def field_report(kind: str, seed: int, hours: int = 60, leak_start: int = HOUR,
                 base_bytes: int = 6 * GiB, rate_bytes_per_hour: float = 60 * MiB,
                 swell_bytes: int = 60 * MiB, swell_ttft: float = 0.20,
                 decay_ttft_36h: float = 0.22,
                 restarts: Tuple[int, ...] = ()) -> List[Tuple[int, int, Optional[float], int]]:
    """One field-report trace of class `kind` (FIELD_REPORT_CLASSES), seeded. A restart (times
    in `restarts`) starts a new warm-up and a new decay from zero."""
    if kind not in FIELD_REPORT_CLASSES:
        raise ValueError("kind must be one of %s" % ", ".join(FIELD_REPORT_CLASSES))
    rng = random.Random(seed)
    phase = rng.uniform(0, 24)
    saw_phase, saw_period = 0.0, rng.uniform(240, 720)
    saw_amp = 200 * MiB * rng.uniform(0.5, 1.5)
    rows = []
    pending = sorted(restarts)
    started = 0
    for t in range(0, hours * HOUR, INTERVAL):
        if pending and t >= pending[0]:
            started = pending.pop(0)
        level = base_bytes * _warmup(t - started)
        # The swell: traffic peaks once a day (Gaussian, sigma 3 h, peak at 14:00 local).
        hour_of_day = (t / HOUR + phase) % 24
        swell = math.exp(-((hour_of_day - 14.0) / 3.0) ** 2)
        level += swell_bytes * swell
        saw_phase += INTERVAL / saw_period
        if saw_phase >= 1.0:
            saw_phase -= 1.0
            saw_period = rng.uniform(240, 720)
            saw_amp = 200 * MiB * rng.uniform(0.5, 1.5)
        level += saw_amp * (2.0 * saw_phase - 1.0) + rng.gauss(0, 15 * MiB)
        decayed = max(0, t - max(leak_start, started))
        if kind in ("decay", "ramp"):
            level += rate_bytes_per_hour * decayed / HOUR
        ttft = 0.35 * (1.0 + swell_ttft * swell) * math.exp(rng.gauss(0, 0.08))
        if kind in ("decay", "ttft"):
            ttft *= 1.0 + decay_ttft_36h * decayed / (36 * HOUR)
        rows.append((t, int(level), round(ttft, 4) if t - started >= 300 else None, 0))
    return rows


def write_all(directory: str = DATA_DIR) -> Dict[str, dict]:
    os.makedirs(directory, exist_ok=True)
    manifest = {}
    for spec in specs():
        path = os.path.join(directory, spec.name + ".csv")
        with open(path, "w", encoding="utf-8", newline="") as handle:
            writer = csv.writer(handle, lineterminator="\n")
            writer.writerow(["t_seconds", "rss_bytes", "ttft_p95_seconds", "preemptions_total"])
            for t, mem, ttft, pre in generate(spec):
                writer.writerow([t, mem, "" if ttft is None else ttft, pre])
        manifest[spec.name] = {
            "file": "data/%s.csv" % spec.name, "seed": spec.seed, "expect": spec.expect,
            "description": spec.description, "leak_start": spec.leak_start,
            "leak_bytes_per_hour": spec.leak_bytes_per_hour,
            "cap_reached_at": (spec.leak_start + int(spec.cap_bytes / spec.leak_bytes_per_hour * HOUR)
                               if spec.cap_bytes else None),
            "restarts": spec.restarts, "duration": spec.duration, "config": spec.config,
        }
    for kind in FIELD_REPORT_CLASSES:
        name = "field_report_%s" % kind
        path = os.path.join(directory, name + ".csv")
        with open(path, "w", encoding="utf-8", newline="") as handle:
            writer = csv.writer(handle, lineterminator="\n")
            writer.writerow(["t_seconds", "rss_bytes", "ttft_p95_seconds", "preemptions_total"])
            for t, mem, ttft, pre in field_report(kind, 7001):
                writer.writerow([t, mem, "" if ttft is None else ttft, pre])
        manifest[name] = {
            "file": "data/%s.csv" % name, "seed": 7001, "expect": FIELD_REPORT_EXPECT[kind],
            "description": "field report slow decay, class %s (generate_traces.field_report)" % kind,
            "leak_start": HOUR if kind != "swell" else None,
            "leak_bytes_per_hour": 60 * MiB if kind in ("decay", "ramp") else 0.0,
            "cap_reached_at": None, "restarts": [], "duration": 60 * HOUR, "config": {},
        }
    with open(os.path.join(os.path.dirname(directory), "manifest.json"), "w", encoding="utf-8") as handle:
        json.dump(manifest, handle, indent=2, sort_keys=True)
        handle.write("\n")
    return manifest


if __name__ == "__main__":
    for name, entry in write_all().items():
        print("%-20s %-22s %s" % (name, entry["expect"], entry["description"]))
