# -*- coding: utf-8 -*-
# Copyright (c) 2026, kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""kvpin serving watchdog: recycle an LLM serving worker on a memory *slope*.

Stdlib only (Python 3.9+). Two subcommands share one decision engine:

  daemon --config FILE          watch one target under systemd (Type=notify)
  replay --trace FILE.csv       feed a recorded trace through the same engine,
                                print one JSON decision per sample
  switch-profile --config FILE (--profile NAME | --due)
                                switch the deployment to one of its traffic-class
                                profiles (backend_parameters) through GPUStack's API

Why anon+swap and not RSS: mapped weights and /dev/shm inflate RSS without any
leak, and a leak that moved to swap hides in RSS (ollama #18106).
Why a slope and not a level: a slow leak (vLLM #44175, ~47 MiB/h) takes days
to reach any level that is also safe for a healthy worker.
"""

from __future__ import annotations

import argparse
import bisect
import csv
import errno
import fcntl
import json
import math
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

MiB = 1024 * 1024
GiB = 1024 * MiB
HOUR = 3600.0

# ---------------------------------------------------------------------------
# Configuration: one place for every default. The role's defaults mirror this.
# ---------------------------------------------------------------------------
DEFAULTS: Dict[str, object] = {
    "name": "serving",
    # What to watch (exactly one of unit / container / cgroup_path / pid).
    "unit": None,                      # systemd unit holding the engine (GPUStack 0.x)
    "container": None,                 # container name (GPUStack 2.x engine container)
    "container_runtime": "podman",     # podman | docker
    "cgroup_path": None,               # explicit cgroup dir (overrides resolution)
    "pid": None,                       # single process (fallback / tests)
    "cgroup_root": "/sys/fs/cgroup",
    "proc_root": "/proc",
    "memory_limit_bytes": None,        # memory the target may use before it is OOM-killed
    # Sampling and statistics.
    "interval_seconds": 60,
    "window_seconds": 3 * 3600,        # trend window (multi-hour: slow leaks need it)
    "min_window_seconds": 3600,        # no verdict before this much clean history
    "min_points": 30,
    "max_points": 120,                 # downsample window to this many points (O(n^2) stats)
    "evaluate_every_seconds": 300,     # statistics are recomputed at most this often
    "warmup_seconds": 3600,            # ignored after every (re)start: load, graphs, caches settle
    "restart_drop_fraction": 0.3,      # memory falling by this fraction = a restart
    "confidence": 0.95,                # Sen's slope CI two-sided confidence
    "mk_alpha": 0.01,                  # Mann-Kendall significance level
    "slope_threshold_bytes_per_hour": 16 * MiB,
    "new_high_subwindows": 3,          # capped-cache guard: newest sub-window floor sets a new high
    "confirm_seconds": 3600,           # the rise must hold this long before a recycle
    "recycle_horizon_seconds": 12 * 3600,  # recycle when the limit is projected within this
    "ttft_slope_threshold_seconds_per_hour": 0.02,
    "ttft_min_relative_rise": 0.15,    # TTFT p95 rise over the window, relative to its start
    "ttft_min_points": 20,
    # Slow decay under daily seasonality (field report: -18 % throughput over 36 h, RSS up a
    # few % per 3 h with p95 TTFT tracking it, under a daily traffic swell). Hourly aggregates
    # are compared with the same hour one season earlier: a swell repeats (difference ~0), a
    # decay does not. Needs season_seconds + season_min_differences hours of clean history.
    "season_seconds": 24 * 3600,
    "season_bucket_seconds": 3600,
    "season_min_differences": 6,       # the last N hourly differences must all be positive
    "season_ttft_min_rise": 0.05,      # TTFT p95 up >= 5 % on the same hour a season earlier
    # Policy.
    "cooldown_seconds": 3600,
    "storm_max_recycles": 3,
    "storm_window_seconds": 24 * 3600,
    # Latency signal.
    "metrics_url": None,               # Prometheus text endpoint (vLLM /metrics)
    "probe_url": None,                 # OpenAI /v1/completions for engines without a histogram
    "probe_model": None,
    "probe_timeout_seconds": 30,
    "ttft_quantile": 0.95,
    "ttft_min_observations": 20,       # a p95 from fewer requests is noise
    "ttft_max_window_seconds": 900,    # give up accumulating observations after this
    "http_timeout_seconds": 5,
    # Actuator.
    "actuator": "none",                # none | systemd | podman | docker | gpustack
    "dry_run": False,
    "gpustack_server": None,
    "gpustack_model_id": None,
    "gpustack_token_file": None,
    "gpustack_mode": "restart",        # restart (POST /v2/models/{id}/restart) | delete_instance
    "gpustack_instance_id": None,
    "pre_recycle_command": None,       # argv list run before the restart (drain)
    "drain_url": None,                 # POSTed before the restart (drain)
    "drain_grace_seconds": 0,
    "lock_file": "/run/kvpin-watchdog/recycle.lock",
    "actuator_timeout_seconds": 300,
    # Outputs.
    "textfile_dir": None,              # node_exporter textfile collector dir
    # GPUStack deployment target (the role derives one per deployment in kvpin_deployments):
    # every tick the deployment's instance on this worker is looked up through the API, so a
    # restarted or rescheduled instance (new pid, port, container) is followed, not lost.
    "gpustack_deployment": None,       # model name in GPUStack
    "gpustack_api_version": "auto",    # auto | v1 (GPUStack 0.7.x) | v2 (2.x)
    "gpustack_worker_name": None,      # this node's worker name in GPUStack
    "engine_runtime": "native",        # native: engine is a child of the worker unit (0.7.x);
                                       # container: the instance's own container (2.x)
    "engine_host": "127.0.0.1",        # where this node's engines answer (/metrics): GPUStack
                                       # 0.7.1 starts vLLM and llama-box with --host 0.0.0.0
                                       # --port <instance port> (worker/backends/vllm.py,
                                       # llama_box.py built-in arguments)
    "gpu_indexes": [],                 # GPUs of the deployment on this node (recycle locks)
    "metrics_path": "/metrics",
    "lock_dir": None,                  # per-GPU recycle locks (gpu-<index>.lock) live here
    "drain_timeout_seconds": 60,       # wait at most this long for in-flight requests to finish
    "restart_wait_seconds": 600,       # hold the GPU locks until the new instance runs, at most
    # Bounds on every tick's I/O.
    "tick_deadline_seconds": 30,       # all network reads of one tick together
    "max_body_bytes": 8 * MiB,         # an HTTP body larger than this is refused
    "watchdog_sec": None,              # the unit's WatchdogSec (check-config checks against it)
    # Scheduled traffic-class profiles (serving_plan strategy 'scheduled'): profile name ->
    # the deployment's backend_parameters in that profile. switch-profile puts one in place.
    "profiles": None,
    # The window edges, [{at: "HH:MM", profile: NAME}] (serving_plan's plan.schedule), local time:
    # `switch-profile --due` puts the profile of the latest edge at or before now in place, so a
    # timer caught up at boot (Persistent=true) after several missed edges lands on the right one.
    "profile_schedule": None,
    "profile_switch_grace_seconds": 1800,   # after a switch the daemon neither recycles nor alerts
    "profile_settle_seconds": 30,      # after the update, wait this long for GPUStack to restart
                                       # the instance itself before deleting it (recreated then)
}


def load_config(path: Optional[str]) -> Dict[str, object]:
    """Read a JSON config file over DEFAULTS; unknown keys are an error (typos).

    Lines starting with '#' are dropped first, so the role's templates can carry the
    ansible_managed header.
    """
    cfg = dict(DEFAULTS)
    if path:
        with open(path, "r", encoding="utf-8") as handle:
            text = "".join(line for line in handle if not line.lstrip().startswith("#"))
        user = json.loads(text)
        if not isinstance(user, dict):
            raise ValueError("config %s: top level must be an object" % path)
        unknown = sorted(set(user) - set(DEFAULTS))
        if unknown:
            raise ValueError("config %s: unknown keys %s" % (path, ", ".join(unknown)))
        cfg.update({k: v for k, v in user.items() if v is not None})
    return cfg


ACTUATORS = ("none", "systemd", "podman", "docker", "gpustack")

# Every numeric setting: (minimum, maximum, integer?). None = no bound. A value the daemon
# cannot run with (a string, a bool, NaN, inf, out of range) is rejected by check-config.
NUMERIC_RANGES: Dict[str, Tuple[Optional[float], Optional[float], bool]] = {
    "interval_seconds": (1, 24 * 3600, False),
    "window_seconds": (1, 30 * 24 * 3600, False),
    "min_window_seconds": (1, 30 * 24 * 3600, False),
    "min_points": (3, 100000, True),
    "max_points": (3, 2000, True),
    "evaluate_every_seconds": (0.1, 24 * 3600, False),
    "season_seconds": (2, 30 * 24 * 3600, False),
    "season_bucket_seconds": (1, 24 * 3600, False),
    "season_min_differences": (1, 1000, True),
    "season_ttft_min_rise": (0, 100, False),
    "warmup_seconds": (0, 7 * 24 * 3600, False),
    "restart_drop_fraction": (0.01, 0.99, False),
    "confidence": (0.5, 0.9999, False),
    "mk_alpha": (1e-9, 0.2, False),
    "slope_threshold_bytes_per_hour": (1, None, False),
    "new_high_subwindows": (2, 20, True),
    "confirm_seconds": (0, 7 * 24 * 3600, False),
    "recycle_horizon_seconds": (0, 30 * 24 * 3600, False),
    "ttft_slope_threshold_seconds_per_hour": (0, 3600, False),
    "ttft_min_relative_rise": (0, 100, False),
    "ttft_min_points": (3, 100000, True),
    "cooldown_seconds": (0, 30 * 24 * 3600, False),
    "storm_max_recycles": (1, 1000, True),
    "storm_window_seconds": (1, 30 * 24 * 3600, False),
    "probe_timeout_seconds": (0.1, 600, False),
    "ttft_quantile": (0.5, 0.999, False),
    "ttft_min_observations": (1, 10 ** 9, True),
    "ttft_max_window_seconds": (1, 24 * 3600, False),
    "http_timeout_seconds": (0.1, 600, False),
    "drain_grace_seconds": (0, 3600, False),
    "actuator_timeout_seconds": (1, 3600, False),
    "memory_limit_bytes": (MiB, 2 ** 62, True),
    "pid": (1, 2 ** 31, True),
    "drain_timeout_seconds": (0, 3600, False),
    "restart_wait_seconds": (0, 3600, False),
    "tick_deadline_seconds": (0.5, 600, False),
    "max_body_bytes": (1024, 1024 * MiB, True),
    "watchdog_sec": (1, 24 * 3600, False),
    "profile_switch_grace_seconds": (0, 24 * 3600, False),
    "profile_settle_seconds": (0, 3600, False),
    "gpustack_model_id": (1, 2 ** 62, True),
    "gpustack_instance_id": (1, 2 ** 62, True),
}
STRING_KEYS = ("name", "unit", "container", "cgroup_path", "cgroup_root", "proc_root", "metrics_url",
               "probe_url", "gpustack_server", "gpustack_token_file", "drain_url", "lock_file",
               "textfile_dir", "gpustack_deployment", "gpustack_worker_name", "engine_host",
               "metrics_path", "lock_dir")
CHOICES = {
    "actuator": ACTUATORS,
    "container_runtime": ("podman", "docker"),
    "gpustack_mode": ("restart", "delete_instance"),
    "gpustack_api_version": ("auto", "v1", "v2"),
    "engine_runtime": ("native", "container"),
}
URL_KEYS = ("metrics_url", "probe_url", "gpustack_server", "drain_url")
NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")


def tick_deadline(cfg: Dict[str, object]) -> float:
    """Seconds one tick's network reads may take: tick_deadline_seconds, capped below half of
    WatchdogSec so a tick that overruns is noticed by systemd within about one period."""
    value = float(cfg["tick_deadline_seconds"])
    if cfg.get("watchdog_sec"):
        value = min(value, max(1.0, float(cfg["watchdog_sec"]) / 2.0 - 1.0))
    return value


def _number_problem(key: str, value: object) -> Optional[str]:
    low, high, integer = NUMERIC_RANGES[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "%s must be a number, got %s" % (key, type(value).__name__)
    if math.isnan(value) or math.isinf(value):
        return "%s must be finite, got %r" % (key, value)
    if integer and value != int(value):
        return "%s must be a whole number, got %r" % (key, value)
    if low is not None and value < low:
        return "%s must be >= %g, got %g" % (key, low, value)
    if high is not None and value > high:
        return "%s must be <= %g, got %g" % (key, high, value)
    return None


MAX_PROFILES = 64
MAX_PROFILE_ARGS = 256
MAX_PROFILE_ARG_CHARS = 4096


def profiles_problems(profiles: object) -> List[str]:
    """What is wrong with a `profiles` setting ({name: [backend parameter, ...]}), each naming
    the profile; None (no profiles) is fine."""
    if profiles is None:
        return []
    if not isinstance(profiles, dict) or not profiles or len(profiles) > MAX_PROFILES:
        return ["profiles must be a mapping of 1..%d profile names to backend_parameters lists" % MAX_PROFILES]
    errors = []
    for name, args in profiles.items():
        if not isinstance(name, str) or not NAME_RE.match(name):
            errors.append("profiles: name %r must match [A-Za-z0-9_.-]{1,128}" % (str(name)[:40],))
        elif not isinstance(args, list) or len(args) > MAX_PROFILE_ARGS:
            errors.append("profiles.%s must be a list of at most %d backend parameters" % (name, MAX_PROFILE_ARGS))
        elif not all(isinstance(a, str) and 0 < len(a) <= MAX_PROFILE_ARG_CHARS and not any(ord(c) < 32 for c in a)
                     for a in args):
            errors.append("profiles.%s: every backend parameter must be a non-empty single-line string of at most "
                          "%d characters" % (name, MAX_PROFILE_ARG_CHARS))
    return errors


MAX_SCHEDULE_EDGES = 48
_AT_RE = re.compile(r"^([01][0-9]|2[0-3]):([0-5][0-9])$")


def schedule_problems(schedule: object, profiles: object) -> List[str]:
    """What is wrong with a `profile_schedule`, each naming the edge; None is fine."""
    if schedule is None:
        return []
    if not isinstance(schedule, list) or not 0 < len(schedule) <= MAX_SCHEDULE_EDGES:
        return ["profile_schedule must be a list of 1..%d edges {at: HH:MM, profile: NAME}" % MAX_SCHEDULE_EDGES]
    errors, seen = [], set()
    names = set(profiles) if isinstance(profiles, dict) else set()
    for index, edge in enumerate(schedule):
        where = "profile_schedule[%d]" % index
        if not isinstance(edge, dict) or set(edge) != {"at", "profile"}:
            errors.append("%s must be {at: HH:MM, profile: NAME}" % where)
            continue
        if not isinstance(edge["at"], str) or not _AT_RE.match(edge["at"]):
            errors.append("%s.at must be HH:MM (00:00..23:59), got %r" % (where, str(edge["at"])[:20]))
        elif edge["at"] in seen:
            errors.append("%s.at %s is given twice" % (where, edge["at"]))
        else:
            seen.add(edge["at"])
        if not isinstance(edge["profile"], str) or edge["profile"] not in names:
            errors.append("%s.profile %r is not one of profiles (%s)" % (
                where, str(edge["profile"])[:40], ", ".join(sorted(names)) or "none"))
    return errors


def due_profile(schedule: Sequence[Dict[str, str]], minute_of_day: int) -> str:
    """The profile of the latest edge at or before minute_of_day (0..1439); before the day's
    first edge, the previous day's last one."""
    edges = sorted((int(e["at"][:2]) * 60 + int(e["at"][3:]), e["profile"]) for e in schedule)
    due = edges[-1][1]
    for minute, profile in edges:
        if minute <= minute_of_day:
            due = profile
    return due


def validate_config(cfg: Dict[str, object]) -> List[str]:
    """Every value the daemon could not run with, each naming its key (empty = fine)."""
    errors = []
    for key in NUMERIC_RANGES:
        if cfg.get(key) is not None:
            problem = _number_problem(key, cfg[key])
            if problem:
                errors.append(problem)
    for key in STRING_KEYS:
        value = cfg.get(key)
        if value is not None and (not isinstance(value, str) or not value.strip()
                                  or any(ord(ch) < 32 for ch in value)):
            errors.append("%s must be a non-empty single-line string" % key)
    for key, allowed in CHOICES.items():
        if cfg.get(key) not in allowed:
            errors.append("%s must be one of %s, got %r" % (key, ", ".join(allowed), cfg.get(key)))
    for key in URL_KEYS:
        value = cfg.get(key)
        if isinstance(value, str) and not re.match(r"^https?://[^/\s]+", value):
            errors.append("%s must be an http:// or https:// URL" % key)
    for key in ("dry_run",):
        if not isinstance(cfg.get(key), bool):
            errors.append("%s must be true or false" % key)
    if isinstance(cfg.get("name"), str) and not NAME_RE.match(cfg["name"]):
        errors.append("name must match [A-Za-z0-9_.-]{1,128}")
    gpus = cfg.get("gpu_indexes")
    if not isinstance(gpus, list) or any(isinstance(g, bool) or not isinstance(g, int) or not 0 <= g < 1024
                                         for g in gpus):
        errors.append("gpu_indexes must be a list of GPU indexes (whole numbers 0..1023)")
    if isinstance(cfg.get("metrics_path"), str) and not cfg["metrics_path"].startswith("/"):
        errors.append("metrics_path must start with /")
    deployment = cfg.get("gpustack_deployment")
    sources = [k for k in ("unit", "container", "cgroup_path", "pid", "gpustack_deployment") if cfg.get(k)]
    if len(sources) != 1:
        errors.append("set exactly one of unit, container, cgroup_path, pid, gpustack_deployment (got %s)" % (
            ", ".join(sources) or "none"))
    actuator = cfg.get("actuator")
    if actuator == "systemd" and not cfg.get("unit"):
        errors.append("actuator systemd needs unit")
    if actuator in ("podman", "docker") and not cfg.get("container"):
        errors.append("actuator %s needs container" % actuator)
    if deployment:
        if not cfg.get("gpustack_server"):
            errors.append("gpustack_deployment needs gpustack_server")
        if not cfg.get("gpustack_worker_name"):
            errors.append("gpustack_deployment needs gpustack_worker_name")
        if actuator not in ("gpustack", "none"):
            errors.append("gpustack_deployment is recycled through the API: actuator gpustack or none")
    elif actuator == "gpustack":
        if not cfg.get("gpustack_server"):
            errors.append("actuator gpustack needs gpustack_server")
        if cfg.get("gpustack_mode") == "delete_instance":
            if cfg.get("gpustack_instance_id") is None:
                errors.append("gpustack_mode delete_instance needs gpustack_instance_id")
        elif cfg.get("gpustack_model_id") is None:
            errors.append("actuator gpustack needs gpustack_model_id")
    if not errors:
        if float(cfg["min_window_seconds"]) > float(cfg["window_seconds"]):
            errors.append("min_window_seconds (%g) must not exceed window_seconds (%g)" % (
                float(cfg["min_window_seconds"]), float(cfg["window_seconds"])))
        wsec = cfg.get("watchdog_sec")
        if wsec is not None:
            # A tick must end well within one WatchdogSec period: liveness is proven by ticks
            # completing (the main loop stops feeding WATCHDOG=1 when a tick overruns), and the
            # last-tick metric must not look stale between two healthy ticks.
            if float(cfg["interval_seconds"]) * 2 > float(wsec):
                errors.append("interval_seconds (%g s) too long for WatchdogSec=%g: must be at most half of it" % (
                    float(cfg["interval_seconds"]), float(wsec)))
            if float(wsec) < 4:
                errors.append("watchdog_sec must be >= 4 (the main loop notifies once a second)")
    errors.extend(profiles_problems(cfg.get("profiles")))
    errors.extend(schedule_problems(cfg.get("profile_schedule"), cfg.get("profiles")))
    if cfg.get("pre_recycle_command") is not None and (
            not isinstance(cfg["pre_recycle_command"], list)
            or not all(isinstance(a, str) for a in cfg["pre_recycle_command"])):
        errors.append("pre_recycle_command must be an argv list of strings")
    return errors


# ---------------------------------------------------------------------------
# Statistics: Theil-Sen slope, Sen's CI, Mann-Kendall with Hamed-Rao correction.
# ---------------------------------------------------------------------------
@dataclass
class Trend:
    n: int
    slope: float          # per second
    lower: float          # per second, lower CI bound
    upper: float
    intercept: float      # value at x = 0 (x as given)
    s: int                # Mann-Kendall S
    var_s: float          # corrected Var(S)
    z: float
    p: float              # two-sided p-value
    variance_factor: float  # Hamed-Rao n/n* (>= 1)


def _tie_term(values: Sequence[float]) -> float:
    counts: Dict[float, int] = {}
    for v in values:
        counts[v] = counts.get(v, 0) + 1
    return float(sum(c * (c - 1) * (2 * c + 5) for c in counts.values() if c > 1))


def _ranks(values: Sequence[float]) -> List[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        mean_rank = (i + j) / 2.0 + 1.0
        for k in range(i, j + 1):
            ranks[order[k]] = mean_rank
        i = j + 1
    return ranks


def high_pass(values: Sequence[float], half_width: int) -> List[float]:
    """values minus a centred running median: keeps short-scale noise, drops the slow shape."""
    n = len(values)
    out = []
    for i in range(n):
        lo, hi = max(0, i - half_width), min(n, i + half_width + 1)
        out.append(values[i] - statistics.median(values[lo:hi]))
    return out


def hamed_rao_factor(residuals: Sequence[float], z_crit: float = 1.96,
                     max_lag: Optional[int] = None) -> float:
    """Variance inflation n/n* of Hamed & Rao (1998) from the ranks of a detrended series.

    Only autocorrelations outside the +/- z/sqrt(n) band count. The factor is
    clamped to >= 1: negative correlations (a sawtooth's half period) must not
    make the test *more* confident than the independent case.
    """
    n = len(residuals)
    if n < 4:
        return 1.0
    ranks = _ranks(residuals)
    mean = sum(ranks) / n
    dev = [r - mean for r in ranks]
    denom = sum(d * d for d in dev)
    if denom <= 0:
        return 1.0
    band = z_crit / math.sqrt(n)
    acc = 0.0
    last_lag = n - 3 if max_lag is None else min(n - 3, max_lag)
    for lag in range(1, last_lag + 1):
        rho = sum(dev[i] * dev[i + lag] for i in range(n - lag)) / denom
        if abs(rho) > band:
            acc += (n - lag) * (n - lag - 1) * (n - lag - 2) * rho
    factor = 1.0 + 2.0 / (n * (n - 1) * (n - 2)) * acc
    return max(1.0, factor)


def trend(xs: Sequence[float], ys: Sequence[float], confidence: float = 0.95,
          autocorrelation: bool = True, noise_half_width: int = 15,
          max_lag: int = 8) -> Optional[Trend]:
    """Theil-Sen slope with Sen's (1968) CI, and the Mann-Kendall test on the same pairs.

    Autocorrelation (GC sawtooth, bursts) makes plain MK over-confident, so Var(S) gets
    the Hamed-Rao factor. Its autocorrelations come from high-passed values (minus a
    running median of 2*noise_half_width+1 points), not from residuals of one straight
    line: a leak that starts mid-window leaves a bent residual that would read as
    strong autocorrelation and hide the very trend being tested. Only lags up to
    max_lag count (the median's window cuts longer ones anyway). So the correction
    covers noise correlated over minutes (sawtooth, AR phi >= ~0.7 at 60 s samples);
    slower wander is left to the floor-ramp guard and confirm_seconds. The same corrected variance sets
    the width of Sen's CI, so the lower slope bound is honest too.
    xs must be strictly increasing. Returns None for fewer than 3 points.
    """
    n = len(xs)
    if n < 3 or n != len(ys):
        return None
    slopes: List[float] = []
    for i in range(n - 1):
        xi, yi = xs[i], ys[i]
        slopes.extend([(ys[j] - yi) / (xs[j] - xi) for j in range(i + 1, n)])
    slopes.sort()
    # MK's S from the same sorted pair slopes (dx > 0, so sign(dy) = sign(slope)).
    s = (len(slopes) - bisect.bisect_right(slopes, 0.0)) - bisect.bisect_left(slopes, 0.0)
    m = len(slopes)
    slope = statistics.median(slopes)
    intercept = statistics.median([ys[i] - slope * xs[i] for i in range(n)])
    var_s = (n * (n - 1) * (2 * n + 5) - _tie_term(ys)) / 18.0
    factor = 1.0
    if autocorrelation:
        factor = hamed_rao_factor(high_pass(ys, noise_half_width), max_lag=max_lag)
        var_s *= factor
    if var_s <= 0:
        return Trend(n, slope, slope, slope, intercept, s, 0.0, 0.0, 1.0, factor)
    # Continuity-corrected Z.
    if s > 0:
        z = (s - 1) / math.sqrt(var_s)
    elif s < 0:
        z = (s + 1) / math.sqrt(var_s)
    else:
        z = 0.0
    norm = statistics.NormalDist()
    p = 2.0 * (1.0 - norm.cdf(abs(z)))
    c = norm.inv_cdf(0.5 + confidence / 2.0) * math.sqrt(var_s)
    lo_rank = int(math.floor((m - c) / 2.0))
    hi_rank = int(math.ceil((m + c) / 2.0))
    lower = slopes[min(max(lo_rank, 0), m - 1)]
    upper = slopes[min(max(hi_rank, 0), m - 1)]
    return Trend(n, slope, lower, upper, intercept, s, var_s, z, p, factor)


def downsample(points: Sequence[Tuple[float, float]], max_points: int) -> List[Tuple[float, float]]:
    """Average consecutive samples into at most max_points buckets (keeps O(n^2) cheap)."""
    n = len(points)
    if n <= max_points:
        return list(points)
    out = []
    for b in range(max_points):
        lo = b * n // max_points
        hi = (b + 1) * n // max_points
        chunk = points[lo:hi]
        out.append((sum(p[0] for p in chunk) / len(chunk), sum(p[1] for p in chunk) / len(chunk)))
    return out


# ---------------------------------------------------------------------------
# Prometheus text exposition: parse, histogram windowing, quantile.
# ---------------------------------------------------------------------------
# Metric families by role; the first name present wins. Old names keep old engines working.
METRIC_NAMES = {
    "ttft_histogram": (
        "vllm:time_to_first_token_seconds",
        "gpustack:time_to_first_token_seconds",
        "sglang:time_to_first_token_seconds",
    ),
    "preemptions": ("vllm:num_preemptions_total", "vllm:num_preemptions", "gpustack:request_preemptions"),
    "kv_cache_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc",
                       "gpustack:kv_cache_usage_ratio", "llamabox:kv_cache_usage_ratio"),
    "requests_waiting": ("vllm:num_requests_waiting", "gpustack:num_requests_waiting",
                         "llamacpp:requests_deferred"),
    # In-flight requests (drain waits for 0): vLLM's gauge; llama.cpp server --metrics
    # exports llamacpp:requests_processing (tools/server/server.cpp).
    "requests_running": ("vllm:num_requests_running", "llamacpp:requests_processing"),
}
# Every sample name LatencySensor.from_text looks up (the only lines it parses): the TTFT
# histograms' _bucket series and the preemption, KV-cache and waiting-request families.
LATENCY_SAMPLE_NAMES = frozenset(
    [base + "_bucket" for base in METRIC_NAMES["ttft_histogram"]]
    + [name for role in ("preemptions", "kv_cache_usage", "requests_waiting") for name in METRIC_NAMES[role]])

_SAMPLE_RE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\S+)?\s*$')
_LABEL_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?\s*')


def _parse_value(text: str) -> float:
    low = text.lower()
    if low in ("+inf", "inf"):
        return math.inf
    if low == "-inf":
        return -math.inf
    if low == "nan":
        return math.nan
    return float(text)


def parse_exposition(text: str, names: Optional[Iterable[str]] = None) -> Dict[str, List[Tuple[Dict[str, str], float]]]:
    """Prometheus text format 0.0.4 -> {sample name: [(labels, value), ...]}.

    names: keep only these sample names; every other line is skipped by a prefix test before
    the regex and label parsing (a vLLM page is ~200 lines, the latency signal needs ~25)."""
    out: Dict[str, List[Tuple[Dict[str, str], float]]] = {}
    wanted = frozenset(names) if names is not None else None
    prefixes = tuple(sorted(wanted)) if wanted is not None else None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if prefixes is not None and not line.startswith(prefixes):
            continue
        match = _SAMPLE_RE.match(line)
        if not match:
            continue
        name, _unused, label_text, value_text = match.group(1), match.group(2), match.group(3), match.group(4)
        if wanted is not None and name not in wanted:
            continue
        labels: Dict[str, str] = {}
        if label_text:
            for lm in _LABEL_RE.finditer(label_text):
                labels[lm.group(1)] = (lm.group(2).replace('\\"', '"')
                                       .replace("\\n", "\n").replace("\\\\", "\\"))
        try:
            value = _parse_value(value_text)
        except ValueError:
            continue
        out.setdefault(name, []).append((labels, value))
    return out


def first_family(samples: Dict[str, list], role: str, suffix: str = "") -> Optional[str]:
    for base in METRIC_NAMES[role]:
        if base + suffix in samples:
            return base
    return None


def histogram_buckets(samples: Dict[str, list], base: str) -> Dict[float, float]:
    """Cumulative counts per `le`, summed over all other label sets (sum by (le))."""
    buckets: Dict[float, float] = {}
    for labels, value in samples.get(base + "_bucket", []):
        if "le" not in labels:
            continue
        le = _parse_value(labels["le"])
        buckets[le] = buckets.get(le, 0.0) + value
    return buckets


def sum_family(samples: Dict[str, list], name: str) -> Optional[float]:
    values = [v for _unused, v in samples.get(name, []) if not math.isnan(v)]
    return sum(values) if values else None


def bucket_quantile(q: float, buckets: Dict[float, float]) -> Optional[float]:
    """PromQL histogram_quantile for classic buckets (promql/quantile.go bucketQuantile)."""
    if not buckets or math.inf not in buckets or len(buckets) < 2:
        return None
    bounds = sorted(buckets)
    counts = [buckets[b] for b in bounds]
    for i in range(1, len(counts)):  # ensureMonotonic
        if counts[i] < counts[i - 1]:
            counts[i] = counts[i - 1]
    total = counts[-1]
    if total <= 0 or math.isnan(total):
        return None
    rank = q * total
    idx = next(i for i, c in enumerate(counts) if c >= rank)
    if idx == len(bounds) - 1:
        return bounds[-2]  # rank in +Inf bucket: upper bound of the 2nd highest
    if idx == 0 and bounds[0] <= 0:
        return bounds[0]
    bucket_start = 0.0 if idx == 0 else bounds[idx - 1]
    count_before = 0.0 if idx == 0 else counts[idx - 1]
    in_bucket = counts[idx] - count_before
    if in_bucket <= 0:
        return bounds[idx]
    return bucket_start + (bounds[idx] - bucket_start) * (rank - count_before) / in_bucket


class HistogramWindow:
    """p95 over the interval since a baseline scrape, from per-`le` deltas.

    A counter reset (any bucket falling) drops the interval and re-baselines.
    Too few observations: keep the baseline and wait, up to max_window seconds.
    """

    def __init__(self, quantile: float = 0.95, min_observations: int = 20,
                 max_window_seconds: float = 900.0):
        self.quantile = quantile
        self.min_observations = min_observations
        self.max_window_seconds = max_window_seconds
        self.base: Optional[Dict[float, float]] = None
        self.base_t: Optional[float] = None
        self.last_status = "no data"

    def update(self, t: float, buckets: Dict[float, float]) -> Optional[float]:
        if not buckets:
            self.last_status = "no histogram"
            return None
        if self.base is None:
            self.base, self.base_t = dict(buckets), t
            self.last_status = "baseline"
            return None
        delta = {}
        for le, count in buckets.items():
            prev = self.base.get(le)
            if prev is None:
                continue
            delta[le] = count - prev
        if any(d < 0 for d in delta.values()) or set(self.base) - set(buckets):
            self.base, self.base_t = dict(buckets), t
            self.last_status = "counter reset: interval dropped"
            return None
        observations = delta.get(math.inf, 0.0)
        if observations < self.min_observations:
            if self.base_t is not None and t - self.base_t > self.max_window_seconds:
                self.base, self.base_t = dict(buckets), t
                self.last_status = "too few observations (%d) in window" % observations
            else:
                self.last_status = "accumulating (%d observations)" % observations
            return None
        value = bucket_quantile(self.quantile, delta)
        self.base, self.base_t = dict(buckets), t
        self.last_status = "ok (%d observations)" % observations
        return value


# ---------------------------------------------------------------------------
# Decision engine (shared by replay and daemon).
# ---------------------------------------------------------------------------
@dataclass
class Decision:
    t: float
    action: str                      # none | alert | recycle
    reason: str
    phase: str                       # warmup | collecting | evaluating | cooldown
    diagnosis: Optional[str] = None  # leak_with_latency | leak_projected | memory_rising | latency_only | ...
    memory_bytes: Optional[int] = None
    slope_bytes_per_hour: Optional[float] = None
    slope_lower_bytes_per_hour: Optional[float] = None
    slope_upper_bytes_per_hour: Optional[float] = None
    mk_p: Optional[float] = None
    mk_z: Optional[float] = None
    autocorrelation_factor: Optional[float] = None
    new_high: Optional[bool] = None
    window_points: int = 0
    window_seconds: float = 0.0
    ttft_p95: Optional[float] = None
    ttft_slope: Optional[float] = None          # seconds per hour
    ttft_slope_lower: Optional[float] = None
    ttft_mk_p: Optional[float] = None
    ttft_relative_rise: Optional[float] = None
    preemptions_in_window: Optional[float] = None
    projected_seconds_to_limit: Optional[float] = None
    memory_limit_bytes: Optional[int] = None
    rising_for_seconds: Optional[float] = None
    recycles_in_storm_window: int = 0
    suppressed_by: Optional[str] = None         # cooldown | storm_guard
    corroboration: Dict[str, float] = field(default_factory=dict)

    def to_json(self) -> str:
        data = asdict(self)
        for key, value in list(data.items()):
            if isinstance(value, float):
                data[key] = None if math.isnan(value) or math.isinf(value) else round(value, 6)
        return json.dumps(data, sort_keys=False, separators=(",", ":"))


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _fmt_bytes(n: float) -> str:
    if abs(n) >= GiB:
        return "%.2f GiB" % (n / GiB)
    return "%.1f MiB" % (n / MiB)


class DecisionEngine:
    """Fed samples one by one; returns a Decision per sample.

    Rules (the field report's slow decay, docs/architecture.md):
      memory rising + TTFT p95 rising          -> recycle (bookkeeping growth / fragmentation)
      memory rising, limit within horizon      -> recycle (before the projected crossing)
      memory rising, limit far                 -> alert
      TTFT p95 rising, memory flat             -> alert only (placement / preemption)
    "Memory rising" = Mann-Kendall significant AND Sen's lower slope bound above the
    threshold AND the newest sub-window set a new high (a capped cache that levelled
    off stops setting highs, so it is never recycled once flat).
    """

    def __init__(self, config: Optional[Dict[str, object]] = None, auto_commit: bool = True):
        # auto_commit: a recycle decision counts as done (replay). The daemon passes False and
        # calls commit_recycle() only when the actuator succeeded: a failed recycle (lock held,
        # API error) is not counted and does not reset the trend, so it is retried.
        self.auto_commit = auto_commit
        cfg = dict(DEFAULTS)
        if config:
            cfg.update({k: v for k, v in config.items() if v is not None})
        self.cfg = cfg
        self.mem: deque = deque()           # (t, bytes) since the last (re)start
        self.ttft: deque = deque()          # (t, p95)
        self.preempt: deque = deque()       # (t, counter)
        self.start_t: Optional[float] = None
        self.last_t: Optional[float] = None
        self.last_mem: Optional[float] = None
        self.last_eval_t: Optional[float] = None
        self.last_eval: Optional[Decision] = None
        self.floors: deque = deque()        # (t, floor of the newest sub-window) per evaluation
        self.floor_before_window: Optional[float] = None
        self.rising_since: Optional[float] = None
        self.recycle_times: deque = deque()
        self.last_recycle_t: Optional[float] = None
        self.season: deque = deque()        # (bucket end t, memory floor, TTFT p95 median) per hour
        self.bucket: List[Tuple[float, float, Optional[float]]] = []

    # -- state -------------------------------------------------------------
    def restart(self, t: float) -> None:
        """Forget the trend: a new process starts a new warm-up and window."""
        self.mem.clear()
        self.ttft.clear()
        self.preempt.clear()
        self.start_t = t
        self.last_eval_t = None
        self.last_eval = None
        self.floors.clear()
        self.floor_before_window = None
        self.rising_since = None
        self.season.clear()
        self.bucket = []

    def _trim(self, t: float) -> None:
        horizon = t - float(self.cfg["window_seconds"])
        for series in (self.mem, self.ttft, self.preempt):
            while series and series[0][0] < horizon:
                series.popleft()
        storm_start = t - float(self.cfg["storm_window_seconds"])
        while self.recycle_times and self.recycle_times[0] < storm_start:
            self.recycle_times.popleft()

    # -- main entry --------------------------------------------------------
    def feed(self, t: float, mem_bytes: float, ttft_p95: Optional[float] = None,
             preemptions: Optional[float] = None, restarted: bool = False,
             corroboration: Optional[Dict[str, float]] = None) -> Decision:
        cfg = self.cfg
        drop = (self.last_mem is not None and self.last_mem > 0
                and mem_bytes < self.last_mem * (1.0 - float(cfg["restart_drop_fraction"])))
        if self.start_t is None or restarted or drop:
            self.restart(t)
        self.last_t, self.last_mem = t, mem_bytes
        base = dict(t=t, memory_bytes=int(mem_bytes), ttft_p95=ttft_p95,
                    memory_limit_bytes=cfg.get("memory_limit_bytes"),
                    corroboration=dict(corroboration or {}))
        age = t - self.start_t
        if age < float(cfg["warmup_seconds"]):
            reason = "warm-up after (re)start: %.0f of %.0f s" % (age, float(cfg["warmup_seconds"]))
            if drop or restarted:
                reason = "restart detected; " + reason
            return Decision(action="none", reason=reason, phase="warmup",
                            recycles_in_storm_window=len(self.recycle_times), **base)
        self.mem.append((t, float(mem_bytes)))
        self._season_add(t, float(mem_bytes), ttft_p95)
        if ttft_p95 is not None and not math.isnan(ttft_p95):
            self.ttft.append((t, float(ttft_p95)))
        if preemptions is not None:
            self.preempt.append((t, float(preemptions)))
        self._trim(t)
        span = self.mem[-1][0] - self.mem[0][0]
        if span < float(cfg["min_window_seconds"]) or len(self.mem) < int(cfg["min_points"]):
            return Decision(action="none", phase="collecting", window_points=len(self.mem),
                            window_seconds=span,
                            reason="collecting: %.0f of %.0f s clean history" % (
                                span, float(cfg["min_window_seconds"])),
                            recycles_in_storm_window=len(self.recycle_times), **base)
        if (self.last_eval is not None and self.last_eval_t is not None
                and t - self.last_eval_t < float(cfg["evaluate_every_seconds"])):
            return self._repeat(base)
        decision = self._evaluate(base)
        self.last_eval_t, self.last_eval = t, decision
        if decision.action == "recycle" and self.auto_commit:
            self.commit_recycle(t)
            decision.recycles_in_storm_window = len(self.recycle_times)
        return decision

    def commit_recycle(self, t: float) -> None:
        """A recycle happened: count it (cooldown, storm guard); a new trend starts here."""
        self.recycle_times.append(t)
        self.last_recycle_t = t
        self.restart(t)

    def storm_guard_tripped(self) -> bool:
        return len(self.recycle_times) >= int(self.cfg["storm_max_recycles"])

    def _repeat(self, base: dict) -> Decision:
        """Between evaluations, carry the last statistics; never repeat an action."""
        prev = self.last_eval
        data = asdict(prev)
        data.update(base)
        data.update(action="none", suppressed_by=None, window_points=len(self.mem),
                    reason="between evaluations (every %ss); last: %s" % (
                        self.cfg["evaluate_every_seconds"], prev.action),
                    recycles_in_storm_window=len(self.recycle_times))
        if prev.action == "alert":  # an alert condition persists until re-evaluated
            data["action"] = "alert"
            data["reason"] = prev.reason
        return Decision(**data)

    def _evaluate(self, base: dict) -> Decision:
        cfg = self.cfg
        t = base["t"]
        t0 = self.mem[0][0]
        pts = downsample([(x - t0, y) for x, y in self.mem], int(cfg["max_points"]))
        xs = [p[0] for p in pts]
        ys = [p[1] for p in pts]
        mt = trend(xs, ys, float(cfg["confidence"]))
        d = Decision(action="none", phase="evaluating", reason="", window_points=len(self.mem),
                     window_seconds=self.mem[-1][0] - t0, **base)
        d.recycles_in_storm_window = len(self.recycle_times)
        if mt is None:
            d.reason = "not enough points"
            return d
        d.slope_bytes_per_hour = mt.slope * HOUR
        d.slope_lower_bytes_per_hour = mt.lower * HOUR
        d.slope_upper_bytes_per_hour = mt.upper * HOUR
        d.mk_p, d.mk_z, d.autocorrelation_factor = mt.p, mt.z, mt.variance_factor

        # Capped-cache / burst guard on sub-window *floors* (25th percentiles): a leak is a ramp,
        # so every sub-window's floor sits above the one before, and the newest floor is above
        # every earlier floor since the (re)start by a margin. A cache that levelled off, a
        # burst (a step that lifts peaks and one floor) or a daily swing that repeats fails it.
        k = max(2, int(cfg["new_high_subwindows"]))
        size = max(1, len(ys) // k)
        floors = [_quantile(ys[len(ys) - (k - i) * size:len(ys) - (k - i - 1) * size], 0.25)
                  for i in range(k)]
        recent_floor = floors[-1]
        earlier_best = max(floors[:-1] + ([self.floor_before_window] if self.floor_before_window else []))
        margin = float(cfg["slope_threshold_bytes_per_hour"]) * (xs[-1] - xs[0]) / k / HOUR
        ramp = all(floors[i + 1] > floors[i] for i in range(k - 1))
        d.new_high = ramp and recent_floor > earlier_best + margin
        self.floors.append((t, recent_floor))
        while self.floors and self.floors[0][0] < t0:
            self.floor_before_window = max(self.floor_before_window or 0.0, self.floors.popleft()[1])
        recent_high = max(ys[-size:])

        threshold = float(cfg["slope_threshold_bytes_per_hour"]) / HOUR
        mem_trend = mt.p < float(cfg["mk_alpha"]) and mt.s > 0 and mt.lower > threshold
        mem_rising = mem_trend and d.new_high

        limit = cfg.get("memory_limit_bytes")
        if limit and mt.slope > 0:
            d.projected_seconds_to_limit = max(0.0, (float(limit) - recent_high) / mt.slope)

        # TTFT trend over the same window.
        ttft_rising = False
        ttft_note = "no TTFT signal"
        if len(self.ttft) >= int(cfg["ttft_min_points"]):
            tpts = downsample([(x - t0, y) for x, y in self.ttft], int(cfg["max_points"]))
            tt = trend([p[0] for p in tpts], [p[1] for p in tpts], float(cfg["confidence"]))
            if tt is not None:
                d.ttft_slope = tt.slope * HOUR
                d.ttft_slope_lower = tt.lower * HOUR
                d.ttft_mk_p = tt.p
                start_level = tt.intercept + tt.slope * tpts[0][0]
                end_level = tt.intercept + tt.slope * tpts[-1][0]
                if start_level > 0:
                    d.ttft_relative_rise = (end_level - start_level) / start_level
                ttft_rising = (tt.p < float(cfg["mk_alpha"]) and tt.s > 0
                               and tt.lower * HOUR > float(cfg["ttft_slope_threshold_seconds_per_hour"])
                               and (d.ttft_relative_rise or 0.0) >= float(cfg["ttft_min_relative_rise"]))
                ttft_note = "TTFT p95 slope %+.3f s/h (lower %+.3f, MK p=%.2g, rise %+.0f%%)" % (
                    d.ttft_slope, d.ttft_slope_lower, tt.p, 100.0 * (d.ttft_relative_rise or 0.0))
        if len(self.preempt) >= 2:
            d.preemptions_in_window = max(0.0, self.preempt[-1][1] - self.preempt[0][1])

        mem_note = "memory %s, slope %s/h (lower %s/h, MK p=%.2g, n/n*=%.2f, new high: %s)" % (
            _fmt_bytes(base["memory_bytes"]), _fmt_bytes(d.slope_bytes_per_hour),
            _fmt_bytes(d.slope_lower_bytes_per_hour), mt.p, mt.variance_factor,
            "yes" if d.new_high else "no")
        extra = []
        if d.projected_seconds_to_limit is not None:
            hours = d.projected_seconds_to_limit / HOUR
            extra.append("limit %s projected in %.1f h" % (_fmt_bytes(float(limit)), hours))
        if d.preemptions_in_window:
            extra.append("%d preemptions in window" % d.preemptions_in_window)
        for key, value in sorted(d.corroboration.items()):
            extra.append("%s=%g" % (key, value))
        tail = ("; " + "; ".join(extra)) if extra else ""

        horizon = float(cfg["recycle_horizon_seconds"])
        within = d.projected_seconds_to_limit is not None and d.projected_seconds_to_limit <= horizon
        # A recycle needs the rise to hold at every evaluation for confirm_seconds (Prometheus
        # `for:`): a burst or a short swing passes the test once, a leak keeps passing it.
        # Hysteresis: entering needs the full test; staying needs a significant-ish slope above
        # the threshold and a floor still setting highs, so a slow leak whose CI grazes the
        # threshold is not reset each time, while a burst that passed stops counting.
        still_rising = (mt.p < 10 * float(cfg["mk_alpha"]) and mt.slope > threshold
                        and d.new_high)
        if mem_rising and self.rising_since is None:
            self.rising_since = t
        elif not still_rising:
            self.rising_since = None
        confirmed = mem_rising and t - self.rising_since >= float(cfg["confirm_seconds"])
        d.rising_for_seconds = 0.0 if self.rising_since is None else t - self.rising_since
        if mem_rising and not confirmed and (ttft_rising or within):
            d.action, d.diagnosis = "alert", "leak_unconfirmed"
            d.reason = "memory rising for %.0f of %.0f s needed before a recycle: %s; %s%s" % (
                d.rising_for_seconds, float(cfg["confirm_seconds"]), mem_note, ttft_note, tail)
        elif mem_rising and ttft_rising:
            d.action, d.diagnosis = "recycle", "leak_with_latency"
            d.reason = ("memory and TTFT p95 rising together (host bookkeeping growth / "
                        "fragmentation): %s; %s%s" % (mem_note, ttft_note, tail))
        elif mem_rising and within:
            d.action, d.diagnosis = "recycle", "leak_projected"
            d.reason = "memory rising, limit crossed within the %.1f h horizon: %s; %s%s" % (
                horizon / HOUR, mem_note, ttft_note, tail)
        elif mem_rising:
            d.action, d.diagnosis = "alert", "memory_rising"
            d.reason = "memory rising without latency impact, limit not within %.1f h: %s; %s%s" % (
                horizon / HOUR, mem_note, ttft_note, tail)
        elif ttft_rising and mem_trend:
            d.action, d.diagnosis = "alert", "latency_with_memory_bump"
            d.reason = ("TTFT p95 and memory up, but the memory floor is not ramping (a burst or "
                        "a plateau, not a leak): no recycle: %s; %s%s" % (ttft_note, mem_note, tail))
        elif ttft_rising:
            d.action, d.diagnosis = "alert", "latency_only"
            d.reason = ("TTFT p95 rising with flat memory: placement or preemption, "
                        "a recycle would not help: %s; %s%s" % (ttft_note, mem_note, tail))
        else:
            d.diagnosis = "steady"
            d.reason = "no sustained trend: %s; %s%s" % (mem_note, ttft_note, tail)

        if d.action != "recycle":
            self._seasonal(d, mem_note, tail)
        if d.action == "recycle":
            self._apply_policy(d, t)
        return d

    # -- slow decay: same hour, one season apart ---------------------------
    def _season_add(self, t: float, mem: float, ttft: Optional[float]) -> None:
        self.bucket.append((t, mem, ttft if ttft is not None and not math.isnan(ttft) else None))
        if t - self.bucket[0][0] < float(self.cfg["season_bucket_seconds"]) - 1e-9:
            return
        mems = [b[1] for b in self.bucket]
        ttfts = [b[2] for b in self.bucket if b[2] is not None]
        self.season.append((t, _quantile(mems, 0.25),
                            statistics.median(ttfts) if len(ttfts) >= max(3, len(self.bucket) // 3) else None))
        self.bucket = []
        keep = int(float(self.cfg["season_seconds"]) / float(self.cfg["season_bucket_seconds"])) \
            + int(self.cfg["season_min_differences"]) + 2
        while len(self.season) > keep:
            self.season.popleft()

    def seasonal_differences(self) -> Tuple[List[float], List[float]]:
        """Memory-floor differences (bytes) and relative TTFT p95 differences between each of
        the newest hourly buckets and the bucket one season before it."""
        lag = int(round(float(self.cfg["season_seconds"]) / float(self.cfg["season_bucket_seconds"])))
        rows = list(self.season)
        mem_d, ttft_d = [], []
        for i in range(lag, len(rows)):
            old, new = rows[i - lag], rows[i]
            if abs((new[0] - old[0]) - float(self.cfg["season_seconds"])) > float(self.cfg["season_bucket_seconds"]):
                continue   # a gap in the history: not the same hour of the previous season
            mem_d.append(new[1] - old[1])
            if old[2] and new[2] is not None:
                ttft_d.append(new[2] / old[2] - 1.0)
        return mem_d, ttft_d

    def _seasonal(self, d: Decision, mem_note: str, tail: str) -> None:
        cfg = self.cfg
        m = int(cfg["season_min_differences"])
        mem_d, ttft_d = self.seasonal_differences()
        if len(mem_d) < m:
            return
        per_season = float(cfg["slope_threshold_bytes_per_hour"]) * float(cfg["season_seconds"]) / HOUR
        recent = mem_d[-m:]
        # Higher than a season ago is not enough: a cache that filled up and levelled off is
        # too, for a whole season. The newest hourly floor must still top the floors of 3 to 12
        # hours before it by the threshold's 3 h worth (a swell's hour-to-hour wiggle is smaller).
        rows = list(self.season)
        bucket_h = float(cfg["season_bucket_seconds"]) / HOUR
        near, far = max(1, int(round(3 / bucket_h))), max(2, int(round(12 / bucket_h)))
        still = (len(rows) > far and rows[-1][1] > max(r[1] for r in rows[-far - 1:-near])
                 + float(cfg["slope_threshold_bytes_per_hour"]) * 3)
        mem_up = still and all(x > 0 for x in recent) and statistics.median(recent) > per_season
        ttft_up = False
        ttft_text = "TTFT p95 vs a season ago: too few readings"
        if len(ttft_d) >= m:
            recent_t = ttft_d[-m:]
            ttft_up = all(x > 0 for x in recent_t) and statistics.median(recent_t) >= float(cfg["season_ttft_min_rise"])
            ttft_text = "TTFT p95 %+.0f%% vs the same hours a season ago" % (100 * statistics.median(recent_t))
        mem_text = "memory floor %s vs the same hours a season ago (needs > %s)" % (
            _fmt_bytes(statistics.median(recent)), _fmt_bytes(per_season))
        season_h = float(cfg["season_seconds"]) / HOUR
        if mem_up and ttft_up:
            d.action, d.diagnosis = "recycle", "slow_decay"
            d.reason = ("slow decay: memory and TTFT p95 both above the same hours %.0f h ago for the "
                        "last %d hours (a daily swell repeats, this does not): %s; %s; %s%s" % (
                            season_h, m, mem_text, ttft_text, mem_note, tail))
        elif d.action == "none" and mem_up:
            d.action, d.diagnosis = "alert", "memory_rising"
            d.reason = ("memory above the same hours %.0f h ago for the last %d hours, TTFT p95 not: "
                        "no recycle without a limit in reach: %s; %s; %s%s" % (
                            season_h, m, mem_text, ttft_text, mem_note, tail))
        elif d.action == "none" and ttft_up:
            d.action, d.diagnosis = "alert", "latency_only"
            d.reason = ("TTFT p95 above the same hours %.0f h ago for the last %d hours with flat memory: "
                        "placement or preemption, a recycle would not help: %s; %s%s" % (
                            season_h, m, ttft_text, mem_text, tail))

    def _apply_policy(self, d: Decision, t: float) -> None:
        cfg = self.cfg
        if (self.last_recycle_t is not None
                and t - self.last_recycle_t < float(cfg["cooldown_seconds"])):
            d.action, d.suppressed_by = "alert", "cooldown"
            d.reason = "recycle suppressed (cooldown %.0f s since last recycle): %s" % (
                float(cfg["cooldown_seconds"]), d.reason)
        elif len(self.recycle_times) >= int(cfg["storm_max_recycles"]):
            d.action, d.suppressed_by = "alert", "storm_guard"
            d.reason = "recycle suppressed (storm guard: %d recycles in %.1f h, alerting only): %s" % (
                len(self.recycle_times), float(cfg["storm_window_seconds"]) / HOUR, d.reason)


# ---------------------------------------------------------------------------
# Replay.
# ---------------------------------------------------------------------------
def _short_number(value: float) -> str:
    """A number as %g writes it (3600, not 3600.0) for messages."""
    return "%g" % value


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
                    trace_path, line, _short_number(t), "repeats" if t == last_t else "goes back from",
                    _short_number(last_t)))
            last_t = t
            d = engine.feed(t, mem, ttft_p95=ttft, preemptions=preempt)
            decisions.append(d)
            if not actions_only or d.action != "none":
                out.write(d.to_json() + "\n")
    return decisions


# ---------------------------------------------------------------------------
# Daemon: sensors.
# ---------------------------------------------------------------------------
def _read(path: str) -> Optional[str]:
    try:
        with open(path, "r", encoding="utf-8") as handle:
            return handle.read()
    except OSError:
        return None


def _read_small(path: str, limit: int = 65536) -> Optional[str]:
    """A small kernel file (/proc/PID/stat, status) read without the text-layer objects open()
    builds: the process-tree walk reads one per process of the node every tick. At most `limit`
    bytes; bytes that are not UTF-8 (a process name is any bytes) are replaced, not an error."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        chunks, size = [], 0
        while size < limit:
            chunk = os.read(fd, min(8192, limit - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError:
        return None
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8", "replace")


def _kv(text: str) -> Dict[str, int]:
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            try:
                out[parts[0]] = int(parts[1])
            except ValueError:
                pass
    return out


def cgroup_memory(cgroup_dir: str) -> Optional[Tuple[int, str]]:
    """anon + swap of a cgroup (v2, else v1). Returns (bytes, source) or None."""
    stat = _read(os.path.join(cgroup_dir, "memory.stat"))
    if stat is None:
        return None
    values = _kv(stat)
    if "anon" in values:  # cgroup v2
        swap_text = _read(os.path.join(cgroup_dir, "memory.swap.current"))
        swap = int(swap_text.strip()) if swap_text and swap_text.strip().isdigit() else 0
        return values["anon"] + swap, "cgroup2 anon+swap"
    rss = values.get("total_rss", values.get("rss"))
    if rss is None:
        return None
    swap = values.get("total_swap", values.get("swap", 0))
    return rss + swap, "cgroup1 rss+swap"


def proc_anon_swap(proc_root: str, pid: int) -> Optional[int]:
    """RssAnon + VmSwap of one process, bytes."""
    text = _read_small(os.path.join(proc_root, str(pid), "status"))
    if text is None:
        return None
    total = 0
    found = False
    for line in text.splitlines():
        if line.startswith("RssAnon:") or line.startswith("VmSwap:"):
            parts = line.split()
            total += int(parts[1]) * 1024
            found = True
    return total if found else None


def proc_start_time(proc_root: str, pid: int) -> Optional[int]:
    text = _read_small(os.path.join(proc_root, str(pid), "stat"))
    if not text:
        return None
    try:
        return int(text[text.rindex(")") + 2:].split()[19])  # field 22: starttime
    except (ValueError, IndexError):
        return None


def cgroup_pids(cgroup_dir: str) -> List[int]:
    text = _read(os.path.join(cgroup_dir, "cgroup.procs")) or ""
    return [int(x) for x in text.split() if x.strip().isdigit()]


def _run(argv: List[str], timeout: float) -> Tuple[int, str]:
    try:
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 127, str(exc)
    return proc.returncode, proc.stdout.decode("utf-8", "replace").strip()


def cgroup_candidates(root: str, rel: str) -> List[str]:
    """Where a cgroup path lives: unified (v2), hybrid's unified mount, the v1 memory controller,
    or v1's name=systemd tree (process list only: then /proc RssAnon+VmSwap is the reading)."""
    rel = rel.lstrip("/")
    return [os.path.join(root, sub, rel) if sub else os.path.join(root, rel)
            for sub in ("", "unified", "memory", "systemd")]


def pick_cgroup_dir(candidates: Sequence[str]) -> Optional[str]:
    """The first candidate with memory accounting, else the first that exists (pids only)."""
    existing = [c for c in candidates if os.path.isdir(c)]
    for cand in existing:
        if os.path.exists(os.path.join(cand, "memory.stat")):
            return cand
    return existing[0] if existing else None


def resolve_cgroup(cfg: Dict[str, object]) -> Optional[str]:
    root = str(cfg["cgroup_root"])
    if cfg.get("cgroup_path"):
        path = str(cfg["cgroup_path"])
        return path if os.path.isabs(path) else pick_cgroup_dir(cgroup_candidates(root, path))
    if cfg.get("unit"):
        rc, out = _run(["systemctl", "show", "-p", "ControlGroup", "--value", str(cfg["unit"])], 10)
        if rc == 0 and out:
            return pick_cgroup_dir(cgroup_candidates(root, out))
        return None
    if cfg.get("container"):
        rc, out = _run([str(cfg["container_runtime"]), "inspect", "--format",
                        "{{.State.Pid}}", str(cfg["container"])], 10)
        if rc == 0 and out.isdigit() and int(out) > 0:
            text = _read(os.path.join(str(cfg["proc_root"]), out, "cgroup")) or ""
            candidates = []
            for line in text.splitlines():
                parts = line.split(":", 2)
                if len(parts) != 3:
                    continue
                if "memory" in parts[1].split(","):      # cgroup v1 memory controller
                    candidates.insert(0, os.path.join(root, "memory", parts[2].lstrip("/")))
                elif parts[0] == "0":                    # v2 / hybrid unified
                    candidates.extend(cgroup_candidates(root, parts[2])[:2])
            return pick_cgroup_dir(candidates)
    return None


class MemorySensor:
    """Samples anon+swap of the target; remembers the process identity to spot restarts."""

    def __init__(self, cfg: Dict[str, object]):
        self.cfg = cfg
        self.cgroup_dir: Optional[str] = None
        self.identity: Optional[Tuple[int, int]] = None

    def sample(self) -> Dict[str, object]:
        proc_root = str(self.cfg["proc_root"])
        if self.cgroup_dir is None or not os.path.isdir(self.cgroup_dir):
            self.cgroup_dir = resolve_cgroup(self.cfg)
        pids: List[int] = []
        total: Optional[int] = None
        source = "none"
        if self.cgroup_dir:
            got = cgroup_memory(self.cgroup_dir)
            pids = cgroup_pids(self.cgroup_dir)
            if got is not None:
                total, source = got
        if self.cfg.get("pid"):
            pids = pids or [int(self.cfg["pid"])]
        per_process = {}
        for pid in pids[:64]:
            value = proc_anon_swap(proc_root, pid)
            if value is not None:
                per_process[pid] = value
        if total is None and per_process:
            total, source = sum(per_process.values()), "proc RssAnon+VmSwap"
        # Identity = the oldest process: a restart replaces it.
        identity = None
        starts = [(proc_start_time(proc_root, pid), pid) for pid in pids[:64]]
        starts = [s for s in starts if s[0] is not None]
        if starts:
            start, pid = min(starts)
            identity = (pid, start)
        restarted = self.identity is not None and identity is not None and identity != self.identity
        if identity is not None:
            self.identity = identity
        return {"memory_bytes": total, "source": source, "restarted": restarted,
                "per_process": per_process, "cgroup": self.cgroup_dir}


class LatencySensor:
    """TTFT p95 from the engine's histogram, or from an active streaming probe."""

    def __init__(self, cfg: Dict[str, object]):
        self.cfg = cfg
        self.window = HistogramWindow(float(cfg["ttft_quantile"]), int(cfg["ttft_min_observations"]),
                                      float(cfg["ttft_max_window_seconds"]))

    def reset(self) -> None:
        """A new engine process: its counters start again, the old baseline is meaningless."""
        self.window = HistogramWindow(float(self.cfg["ttft_quantile"]), int(self.cfg["ttft_min_observations"]),
                                      float(self.cfg["ttft_max_window_seconds"]))

    def sample(self, t: float, metrics_url: Optional[str] = None,
               deadline: Optional[float] = None) -> Dict[str, object]:
        out: Dict[str, object] = {"ttft_p95": None, "preemptions": None, "corroboration": {},
                                  "status": "no latency source"}
        url = metrics_url or self.cfg.get("metrics_url")
        if url:
            try:
                status, body, _headers = http_request(str(url), deadline=deadline,
                                                      timeout=float(self.cfg["http_timeout_seconds"]),
                                                      max_bytes=int(self.cfg["max_body_bytes"]))
            except HTTPFailure as exc:
                out["status"] = "metrics scrape failed: %s" % exc
                return out
            if status != 200:
                out["status"] = "metrics scrape failed: status %d" % status
                return out
            out.update(self.from_text(t, body.decode("utf-8", "replace")))
            if out["ttft_p95"] is not None or not self.cfg.get("probe_url"):
                return out
        if self.cfg.get("probe_url"):
            timeout = float(self.cfg["probe_timeout_seconds"])
            if deadline is not None:
                timeout = min(timeout, max(0.0, deadline - time.monotonic()))
            value = probe_ttft(str(self.cfg["probe_url"]), self.cfg.get("probe_model"), timeout) if timeout > 0 else None
            out["ttft_p95"] = value
            out["status"] = "probe ok" if value is not None else "probe failed"
        return out

    def from_text(self, t: float, text: str) -> Dict[str, object]:
        samples = parse_exposition(text, LATENCY_SAMPLE_NAMES)
        result: Dict[str, object] = {"ttft_p95": None, "preemptions": None, "corroboration": {}}
        base = first_family(samples, "ttft_histogram", "_bucket")
        if base:
            result["ttft_p95"] = self.window.update(t, histogram_buckets(samples, base))
            result["status"] = "%s: %s" % (base, self.window.last_status)
        else:
            result["status"] = "no TTFT histogram in metrics"
        for name in METRIC_NAMES["preemptions"]:
            value = sum_family(samples, name)
            if value is not None:
                result["preemptions"] = value
                break
        for role, key in (("kv_cache_usage", "kv_cache_usage"), ("requests_waiting", "requests_waiting")):
            for name in METRIC_NAMES[role]:
                value = sum_family(samples, name)
                if value is not None:
                    result["corroboration"][key] = value
                    break
        return result


PROBE_MAX_LINE = 4096           # bytes of one streamed line that are looked at
PROBE_MAX_BYTES = 64 * 1024     # bytes read before the first data: line, at most


def probe_ttft(url: str, model: Optional[object], timeout: float) -> Optional[float]:
    """Seconds until the first streamed data chunk of a tiny /v1/completions request.

    One probe is one observation, not a p95: the trend of many probes stands in for it.
    Bounded like http_request: one deadline (start + timeout) on every socket operation, at most
    PROBE_MAX_BYTES read, no redirect followed (a 3xx, like any non-2xx, is None), no proxy.
    """
    import http.client  # pylint: disable=import-outside-toplevel
    import urllib.parse  # pylint: disable=import-outside-toplevel
    body = {"prompt": "Hello", "max_tokens": 1, "stream": True}
    if model:
        body["model"] = model
    start = time.monotonic()
    deadline = start + timeout
    conn = resp = None
    try:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname or timeout <= 0:
            return None
        conn_cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        conn = conn_cls(parts.hostname, parts.port, timeout=timeout)
        _connect_within(conn, deadline)
        conn.request("POST", (parts.path or "/") + ("?" + parts.query if parts.query else ""),
                     body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if not 200 <= resp.status < 300:
            return None
        seen, line_start = 0, True
        while seen < PROBE_MAX_BYTES:
            line = resp.readline(PROBE_MAX_LINE)
            if not line:
                return None
            seen += len(line)
            if line_start and line.strip().startswith(b"data:"):
                return time.monotonic() - start
            line_start = line.endswith(b"\n")   # the rest of an over-long line is no new line
    except (OSError, http.client.HTTPException, ValueError):
        return None
    finally:
        if resp is not None:
            resp.close()
        if conn is not None:
            conn.close()
    return None


# ---------------------------------------------------------------------------
# Bounded HTTP: a deadline per request enforced on the socket, a body size cap, no redirects.
# ---------------------------------------------------------------------------
class HTTPFailure(Exception):
    """A request that did not produce a usable answer; the message never holds a credential."""


def _time_left(deadline: float) -> float:
    """Seconds left before ``deadline`` (time.monotonic), or socket.timeout once it has passed."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise socket.timeout("deadline passed")
    return left


class _DeadlineSocket:
    """Wraps a connected socket: every recv/send first sets the socket timeout to what is left
    of one deadline, so a server that drips a byte a second cannot hold a read past it
    (urlopen's timeout applies per recv call, not to the whole answer)."""

    def __init__(self, sock, deadline: float):
        self._sock = sock
        self._deadline = deadline
        self._io_refs = 0        # like socket.socket: close() waits for the response's reader
        self._closed = False

    def _arm(self) -> None:
        self._sock.settimeout(_time_left(self._deadline))

    def recv_into(self, buf, nbytes=0, flags=0):
        self._arm()
        return self._sock.recv_into(buf, nbytes, flags)

    def recv(self, n, flags=0):
        self._arm()
        return self._sock.recv(n, flags)

    def sendall(self, data, flags=0):
        self._arm()
        return self._sock.sendall(data, flags)

    def makefile(self, mode="rb", buffering=None, **_kw):
        import io  # pylint: disable=import-outside-toplevel
        self._io_refs += 1
        return io.BufferedReader(socket.SocketIO(self, "rb"))

    def _decref_socketios(self):
        self._io_refs = max(0, self._io_refs - 1)
        if self._closed and self._io_refs == 0:
            self._sock.close()

    def settimeout(self, value):
        self._sock.settimeout(value)

    def close(self):
        self._closed = True
        if self._io_refs == 0:
            self._sock.close()


def _connect_within(conn, deadline: float) -> None:
    """conn.connect() within the deadline, then every later send and recv too (_DeadlineSocket).
    Each address the host resolves to gets what is left, and so does the TLS handshake after it:
    http.client would give each address, then the handshake, the connection's whole timeout.
    The program's own copy of the collection's module_utils/http_deadline.py: it runs on the
    node without the collection."""
    def create_connection(address, _timeout=None, source_address=None):
        host, port = address
        last_error = None
        for family, kind, proto, _canonical, sockaddr in socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM):
            sock = socket.socket(family, kind, proto)
            try:
                if source_address:
                    sock.bind(source_address)
                sock.settimeout(_time_left(deadline))
                sock.connect(sockaddr)
                sock.settimeout(_time_left(deadline))      # what the TLS handshake gets
                return sock
            except socket.timeout:
                sock.close()
                raise
            except OSError as error:
                sock.close()
                last_error = error
        raise last_error or OSError("%s resolves to no address" % host)

    conn._create_connection = create_connection  # pylint: disable=protected-access
    conn.connect()
    conn.sock = _DeadlineSocket(conn.sock, deadline)


def http_request(url: str, method: str = "GET", body: Optional[bytes] = None,
                 headers: Optional[Dict[str, str]] = None, deadline: Optional[float] = None,
                 timeout: float = 5.0, max_bytes: int = 8 * MiB) -> Tuple[int, bytes, Dict[str, str]]:
    """One HTTP(S) request bounded in time (deadline on time.monotonic, enforced on every
    socket operation) and size. Never follows a redirect: a 3xx is returned as is, so a
    credential never reaches the Location. Raises HTTPFailure (message without headers)."""
    import http.client  # pylint: disable=import-outside-toplevel
    import urllib.parse  # pylint: disable=import-outside-toplevel
    auth = str(dict((k.lower(), v) for k, v in (headers or {}).items()).get("authorization") or "")
    secret = auth.split(" ", 1)[1] if auth.startswith("Bearer ") else None
    now = time.monotonic()
    deadline = min(deadline if deadline is not None else now + timeout, now + timeout)
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise HTTPFailure("not an http(s) URL: %s" % _redact_url(url))
    left = deadline - now
    if left <= 0:
        raise HTTPFailure("%s %s: no time left in this tick" % (method, _redact_url(url)))
    conn_cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = conn_cls(parts.hostname, parts.port, timeout=left)
    path = (parts.path or "/") + ("?" + parts.query if parts.query else "")
    resp = None
    try:
        _connect_within(conn, deadline)
        conn.request(method, path, body=body, headers=dict(headers or {}))
        resp = conn.getresponse()
        length = resp.getheader("Content-Length")
        if length and length.isdigit() and int(length) > max_bytes:
            raise HTTPFailure("%s %s: body of %s bytes exceeds the %d byte cap" % (
                method, _redact_url(url), length, max_bytes))
        chunks, total = [], 0
        while True:
            chunk = resp.read(min(65536, max_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > max_bytes:
                raise HTTPFailure("%s %s: body exceeds the %d byte cap" % (method, _redact_url(url), max_bytes))
        return resp.status, b"".join(chunks), {k.lower(): v for k, v in resp.getheaders()}
    except HTTPFailure:
        raise
    except (OSError, http.client.HTTPException, ValueError) as exc:
        if time.monotonic() >= deadline or isinstance(exc, socket.timeout):
            raise HTTPFailure("%s %s: deadline passed" % (method, _redact_url(url))) from None
        raise HTTPFailure("%s %s: %s" % (method, _redact_url(url), type(exc).__name__ + ": "
                                         + _mask_secret(str(exc), secret)[:200])) from None
    finally:
        if resp is not None:
            resp.close()
        conn.close()


def _redact_url(url: object) -> str:
    """A URL fit for a log: no userinfo (user:password@), every query value masked
    (?token=*** keeps the names) and no fragment. Plain text, never parsed: also fit for a
    malformed Location."""
    text = re.sub(r"//[^/@]*@", "//", str(url))
    text, hashed, _fragment = text.partition("#")
    base, asked, query = text.partition("?")
    if asked:
        base += "?" + "&".join(part.split("=", 1)[0] + "=***" if "=" in part else ("***" if part else "")
                               for part in query.split("&"))
    return base + ("#***" if hashed else "")


def redacted_config(cfg: Dict[str, object]) -> Dict[str, object]:
    """The config as logged: no key file path, every URL-valued key through _redact_url."""
    return {k: (_redact_url(v) if k in URL_KEYS + ("metrics_path",) and isinstance(v, str) else v)
            for k, v in cfg.items() if k != "gpustack_token_file"}


def _mask_secret(text: object, secret: Optional[str]) -> str:
    """text with the API key (as sent, percent-encoded or JSON-escaped) replaced by ***: a
    server's answer or Location may echo it. Mask before any cut, so no prefix survives."""
    import urllib.parse  # pylint: disable=import-outside-toplevel
    text = str(text)
    if secret:
        for form in sorted({secret, urllib.parse.quote(secret, safe=""), json.dumps(secret)[1:-1]},
                           key=len, reverse=True):
            text = text.replace(form, "***")
    return text


def read_api_key(path: Optional[object]) -> Optional[str]:
    """The key file's one line, stripped; a key with inner whitespace or control characters is
    refused (it would break or smuggle a header). The message never includes the key."""
    if not path:
        return None
    text = _read(str(path))
    if text is None:
        raise HTTPFailure("API key file %s cannot be read" % path)
    key = text.strip()
    if not key:
        raise HTTPFailure("API key file %s is empty" % path)
    if any(ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in key):
        raise HTTPFailure("API key in %s holds whitespace or control characters: refused" % path)
    return key


# ---------------------------------------------------------------------------
# GPUStack: the deployment's instance on this worker, found every tick.
# Routes and fields checked in GPUStack's source:
#   0.7.1: management routes under /v1, admin only (gpustack/routes/routes.py v1_admin_router:
#          /v1/models, /v1/model-instances); GET /v1/models?search=<name> is a fuzzy name match
#          (routes/models.py get_models), GET /v1/model-instances?model_id=&worker_id= filters
#          (routes/model_instances.py get_model_instances); answers are PaginatedList
#          {items, pagination} (schemas/common.py). ModelInstance fields (schemas/models.py
#          ModelInstanceBase): id, name, worker_id, worker_name, worker_ip, pid, port, ports,
#          state (running, ...), gpu_indexes, model_id, model_name, restart_count.
#   2.x:   the same routes under /v2 (routes/routes.py versioned_prefix = "/v2"), same fields.
#   Restart of ONE instance: DELETE /{v}/model-instances/{id} in both. The model controller
#          then recreates the missing replica (0.7.1 server/controllers.py ModelInstanceController
#          ._reconcile: on EventType.DELETED -> sync_replicas, which creates
#          model.replicas - len(instances) new instances). POST /v2/models/{id}/restart (2.3)
#          restarts every replica of the model on every worker, so it is not used here.
#   2.x engine containers are named after the instance (worker/serve_manager.py:
#          get_workload(model_instance.name)).
# ---------------------------------------------------------------------------
INSTANCE_STATES_RUNNING = ("running",)
# Server-owned status on a model read back from the API, left out of a full-record PUT (GPUStack
# 2.3.0 schemas/models.py: not part of ModelUpdate). The same tuple as
# plugins/module_utils/gpustack/records.py SERVER_OWNED_MODEL_FIELDS (this program ships alone;
# tests/unit/watchdog/test_watchdog_profile_switch.py checks that the two agree).
SERVER_OWNED_MODEL_FIELDS = (
    "id", "created_at", "updated_at", "deleted_at", "state", "state_message", "role_status",
    "stale", "degradations", "restarting_since", "has_stale_lora_instances", "ready_replicas",
)


@dataclass
class Instance:
    id: int
    name: str
    state: str
    pid: Optional[int]
    port: Optional[int]
    gpu_indexes: List[int]
    worker_ip: Optional[str]
    restart_count: int = 0

    def identity(self) -> Tuple[object, ...]:
        return (self.id, self.pid, self.port, self.name)


def _int_field(item: Dict[str, object], key: str, low: int = 0, high: int = 2 ** 62) -> Optional[int]:
    value = item.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        return None
    return value


def parse_instance(item: object) -> Optional[Instance]:
    """One ModelInstance from the API, type- and range-checked; None if unusable."""
    if not isinstance(item, dict):
        return None
    iid = _int_field(item, "id", 1)
    name = item.get("name")
    if iid is None or not isinstance(name, str) or not name:
        return None
    port = _int_field(item, "port", 1, 65535)
    if port is None and isinstance(item.get("ports"), list) and item["ports"]:
        first = item["ports"][0]
        port = first if isinstance(first, int) and not isinstance(first, bool) and 0 < first < 65536 else None
    gpus = item.get("gpu_indexes") or []
    gpus = sorted({g for g in gpus if isinstance(g, int) and not isinstance(g, bool) and 0 <= g < 1024}) \
        if isinstance(gpus, list) else []
    ip = item.get("worker_ip")
    return Instance(id=iid, name=name, state=str(item.get("state") or ""), pid=_int_field(item, "pid", 1, 2 ** 31),
                    port=port, gpu_indexes=gpus, worker_ip=ip if isinstance(ip, str) and ip else None,
                    restart_count=_int_field(item, "restart_count") or 0)


class GPUStackAPI:
    """The few GPUStack routes the watchdog needs, every call bounded by the tick deadline."""

    def __init__(self, cfg: Dict[str, object]):
        self.cfg = cfg
        self.server = str(cfg["gpustack_server"]).rstrip("/")
        self.version = None if cfg.get("gpustack_api_version") in (None, "auto") else str(cfg["gpustack_api_version"])
        self.model_id: Optional[int] = None
        self.key: Optional[str] = None   # the last key read: masked in any text from the server

    def _headers(self) -> Dict[str, str]:
        headers = {"Accept": "application/json", "Content-Type": "application/json"}
        key = read_api_key(self.cfg.get("gpustack_token_file"))
        if key:
            self.key = key
            headers["Authorization"] = "Bearer " + key
        return headers

    def mask(self, text: object) -> str:
        """Server text (a message, a Location, a read-back value) with the API key masked."""
        return _mask_secret(text, self.key)

    def call(self, method: str, path: str, deadline: float, payload: Optional[bytes] = None) -> Tuple[int, object]:
        url = self.server + path
        if payload is None and method in ("POST", "PUT"):
            payload = b"{}"
        status, body, headers = http_request(url, method, payload,
                                             self._headers(), deadline,
                                             float(self.cfg["http_timeout_seconds"]),
                                             int(self.cfg["max_body_bytes"]))
        if 300 <= status < 400:
            raise HTTPFailure("%s %s answered %d redirect to %s: not followed (the API key stays here)" % (
                method, _redact_url(url), status, _redact_url(self.mask(headers.get("location", "?")))[:200]))
        data = None
        if body:
            try:
                data = json.loads(body.decode("utf-8", "replace"))
            except (ValueError, RecursionError):   # not JSON, or nested deeper than the parser's stack
                data = None
        return status, data

    def prefix(self, deadline: float) -> str:
        if self.version is None:
            status, _unused = self.call("GET", "/v2/models?perPage=1", deadline)
            if status == 404:
                self.version = "v1"
            elif 200 <= status < 300:
                self.version = "v2"
            else:
                raise HTTPFailure("GET /v2/models answered %d: cannot tell the API version" % status)
        return "/" + self.version

    def _items(self, path: str, deadline: float) -> List[object]:
        status, data = self.call("GET", path, deadline)
        if status != 200:
            raise HTTPFailure("GET %s answered %d" % (path, status))
        items = data.get("items") if isinstance(data, dict) else data
        if not isinstance(items, list):
            raise HTTPFailure("GET %s: no items list in the answer" % path)
        return items

    def find_model_id(self, deadline: float) -> int:
        import urllib.parse  # pylint: disable=import-outside-toplevel
        name = str(self.cfg["gpustack_deployment"])
        path = "%s/models?search=%s&perPage=100" % (self.prefix(deadline), urllib.parse.quote(name))
        for item in self._items(path, deadline):
            if isinstance(item, dict) and item.get("name") == name and _int_field(item, "id", 1):
                return int(item["id"])
        raise HTTPFailure("deployment %r not found in GPUStack" % name)

    def instances(self, deadline: float) -> List[Instance]:
        """This worker's instances of the deployment (model id re-resolved once if it vanished)."""
        for attempt in range(2):
            if self.model_id is None:
                self.model_id = self.find_model_id(deadline)
            path = "%s/model-instances?model_id=%d&perPage=100" % (self.prefix(deadline), self.model_id)
            status, data = self.call("GET", path, deadline)
            items = data.get("items") if isinstance(data, dict) else None
            if status == 200 and isinstance(items, list):
                worker = self.cfg["gpustack_worker_name"]
                found = []
                for raw in items:
                    inst = parse_instance(raw)
                    if inst is not None and isinstance(raw, dict) and raw.get("worker_name") == worker \
                            and raw.get("model_id") in (None, self.model_id):
                        found.append(inst)
                return sorted(found, key=lambda i: i.id)
            if attempt == 0 and status in (404, 200):
                self.model_id = None   # deployment recreated under a new id: look it up again
                continue
            raise HTTPFailure("GET %s answered %d" % (path, status))
        return []

    def get_model(self, model_id: int, deadline: float) -> Dict[str, object]:
        path = "%s/models/%d" % (self.prefix(deadline), model_id)
        status, data = self.call("GET", path, deadline)
        if status != 200 or not isinstance(data, dict) or data.get("id") != model_id:
            raise HTTPFailure("GET %s answered %d%s" % (path, status, "" if status != 200 else " without the model"))
        return data

    def put_model(self, model_id: int, record: Dict[str, object], deadline: float) -> Tuple[bool, str]:
        """PUT replaces the whole record (GPUStack's ModelUpdate), so the body is the record read
        back, less the server-owned status fields, with the changed fields."""
        path = "%s/models/%d" % (self.prefix(deadline), model_id)
        body = {k: v for k, v in record.items() if k not in SERVER_OWNED_MODEL_FIELDS}
        status, data = self.call("PUT", path, deadline, json.dumps(body).encode("utf-8"))
        detail = "PUT %s -> %d" % (path, status)
        if not 200 <= status < 300 and isinstance(data, dict) and isinstance(data.get("message"), str):
            detail += ": " + self.mask(data["message"])[:300]
        return 200 <= status < 300, detail

    def delete_instance(self, instance_id: int, deadline: float) -> Tuple[bool, str]:
        path = "%s/model-instances/%d" % (self.prefix(deadline), instance_id)
        status, _unused = self.call("DELETE", path, deadline)
        return 200 <= status < 300, "DELETE %s -> %d" % (path, status)


def pick_instance(instances: Sequence[Instance], gpu_indexes: Sequence[int]) -> Optional[Instance]:
    """The instance to watch: running first, then the one on the configured GPUs, lowest id."""
    if not instances:
        return None
    wanted = sorted(gpu_indexes or [])

    def rank(inst: Instance) -> Tuple[int, int, int]:
        return (0 if inst.state in INSTANCE_STATES_RUNNING else 1,
                0 if not wanted or inst.gpu_indexes == wanted else 1, inst.id)
    return sorted(instances, key=rank)[0]


def process_tree(proc_root: str, root_pid: int) -> List[int]:
    """root_pid and all its descendants, from /proc/*/stat parent links."""
    children: Dict[int, List[int]] = {}
    try:
        names = os.listdir(proc_root)
    except OSError:
        return []
    for name in names:
        if not name.isdigit():
            continue
        text = _read_small(os.path.join(proc_root, name, "stat"))
        if not text or ")" not in text:
            continue
        try:
            ppid = int(text[text.rindex(")") + 2:].split()[1])
        except (ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(name))
    if not os.path.isdir(os.path.join(proc_root, str(root_pid))):
        return []
    out, todo = [], [root_pid]
    while todo and len(out) < 4096:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return sorted(out)


def meminfo(proc_root: str) -> Dict[str, int]:
    """/proc/meminfo in bytes."""
    text = _read(os.path.join(proc_root, "meminfo")) or ""
    out = {}
    for line in text.splitlines():
        parts = line.replace(":", " ").split()
        if len(parts) >= 2 and parts[1].isdigit():
            out[parts[0]] = int(parts[1]) * (1024 if len(parts) > 2 and parts[2] == "kB" else 1)
    return out


def cgroup_memory_max(cgroup_dir: Optional[str]) -> Optional[int]:
    """memory.max (v2) or memory.limit_in_bytes (v1); None when unlimited or unreadable."""
    if not cgroup_dir:
        return None
    for name in ("memory.max", "memory.limit_in_bytes"):
        text = (_read(os.path.join(cgroup_dir, name)) or "").strip()
        if text.isdigit():
            value = int(text)
            return value if value < 2 ** 60 else None  # v1 "unlimited" is ~2^63
    return None


def pid_cgroup_dir(cgroup_root: str, proc_root: str, pid: int) -> Optional[str]:
    """The cgroup directory of a process with memory accounting (v2, hybrid or v1)."""
    text = _read(os.path.join(proc_root, str(pid), "cgroup")) or ""
    candidates = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if "memory" in parts[1].split(","):
            candidates.insert(0, os.path.join(cgroup_root, "memory", parts[2].lstrip("/")))
        elif parts[0] == "0":
            candidates.extend(cgroup_candidates(cgroup_root, parts[2])[:2])
    return pick_cgroup_dir(candidates)


def default_limit(engine_bytes: int, engine_cgroup: Optional[str], cgroup_exclusive: bool,
                  cgroup_used: Optional[int], node: Dict[str, int]) -> Tuple[Optional[int], str]:
    """What the engine may grow to before it is killed, in bytes, and where that came from.

    container (cgroup_exclusive): the engine cgroup's memory.max.
    native, the worker unit's cgroup has memory.max: that limit minus what the rest of the
      cgroup (the worker itself) holds: max - (cgroup_used - engine_bytes).
    otherwise the node: MemTotal minus what the rest of the node holds, where the rest is
      (MemTotal - MemAvailable) - engine_bytes; so engine_bytes + MemAvailable. Swap is not
      counted: growing into swap already costs latency, and the earlier limit errs on the
      side of recycling before the OOM killer acts.
    """
    cg_max = cgroup_memory_max(engine_cgroup)
    if cg_max is not None:
        if cgroup_exclusive:
            return cg_max, "cgroup memory.max"
        if cgroup_used is not None:
            rest = max(0, cgroup_used - engine_bytes)
            return max(0, cg_max - rest), "worker cgroup memory.max minus the rest of the cgroup"
    total, available = node.get("MemTotal"), node.get("MemAvailable")
    if total and available is not None:
        rest = max(0, (total - available) - engine_bytes)
        return max(0, total - rest), "node MemTotal minus the rest of the node"
    return None, "none"


# ---------------------------------------------------------------------------
# Daemon: actuators.
# ---------------------------------------------------------------------------
class RecycleLock:
    """fcntl lock so two recycles never overlap on a node (all watchdogs share the file)."""

    def __init__(self, path: str):
        self.path = path
        self.handle = None

    def acquire(self) -> bool:
        directory = os.path.dirname(self.path)
        if directory:
            os.makedirs(directory, exist_ok=True)
        self.handle = open(self.path, "a+", encoding="utf-8")
        try:
            fcntl.flock(self.handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            self.handle.close()
            self.handle = None
            if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                return False
            raise
        return True

    def release(self) -> None:
        if self.handle is not None:
            fcntl.flock(self.handle.fileno(), fcntl.LOCK_UN)
            self.handle.close()
            self.handle = None


def recycle_command(cfg: Dict[str, object]) -> Optional[List[str]]:
    """argv that restarts the target, for the command-line actuators."""
    kind = cfg.get("actuator")
    if kind == "systemd":
        return ["systemctl", "restart", str(cfg["unit"])]
    if kind in ("podman", "docker"):
        return [str(kind), "restart", str(cfg["container"])]
    return None


def gpustack_request(cfg: Dict[str, object]) -> Tuple[str, str]:
    """(method, url) of the legacy single-instance / whole-model GPUStack actuator."""
    server = str(cfg["gpustack_server"]).rstrip("/")
    if cfg.get("gpustack_mode") == "delete_instance":
        return "DELETE", "%s/v2/model-instances/%s" % (server, cfg["gpustack_instance_id"])
    return "POST", "%s/v2/models/%s/restart" % (server, cfg["gpustack_model_id"])


class GPULocks:
    """One lock file per GPU index under lock_dir, all of an instance's GPUs, taken in sorted
    order (no deadlock between two watchdogs sharing GPUs), non-blocking: a held lock means
    another engine on that GPU is (re)starting now, so this recycle waits for a later tick."""

    def __init__(self, lock_dir: str, gpu_indexes: Sequence[int], fallback: str):
        names = ["gpu-%d.lock" % g for g in sorted(set(gpu_indexes))]
        self.paths = [os.path.join(lock_dir, n) for n in names] if names else [fallback]
        self.held: List[RecycleLock] = []

    def acquire(self) -> Optional[str]:
        """None when all are held, else the path that was busy (nothing is kept then)."""
        for path in self.paths:
            lock = RecycleLock(path)
            if not lock.acquire():
                self.release()
                return path
            self.held.append(lock)
        return None

    def release(self) -> None:
        for lock in reversed(self.held):
            lock.release()
        self.held = []


class Actuator:
    def __init__(self, cfg: Dict[str, object], log):
        self.cfg = cfg
        self.log = log

    def recycle(self) -> Dict[str, object]:
        cfg = self.cfg
        kind = cfg.get("actuator")
        if kind in (None, "none"):
            return {"ok": False, "detail": "no actuator configured (alert only)"}
        if cfg.get("dry_run"):
            return {"ok": True, "dry_run": True, "detail": "dry run: %s" % self.describe()}
        lock = RecycleLock(str(cfg["lock_file"]))
        if not lock.acquire():
            return {"ok": False, "detail": "another recycle holds %s" % cfg["lock_file"]}
        try:
            self._drain()
            if kind == "gpustack":
                return self._gpustack()
            argv = recycle_command(cfg)
            if argv is None:
                return {"ok": False, "detail": "unknown actuator %r" % kind}
            rc, out = _run(argv, float(cfg["actuator_timeout_seconds"]))
            return {"ok": rc == 0, "detail": "%s -> rc %d %s" % (" ".join(argv), rc, out[-200:])}
        finally:
            lock.release()

    def describe(self) -> str:
        if self.cfg.get("actuator") == "gpustack":
            method, url = gpustack_request(self.cfg)
            return "%s %s" % (method, _redact_url(url))
        return " ".join(recycle_command(self.cfg) or ["?"])

    def _drain(self) -> None:
        cfg = self.cfg
        if cfg.get("pre_recycle_command"):
            argv = [str(a) for a in cfg["pre_recycle_command"]]
            rc, out = _run(argv, float(cfg["actuator_timeout_seconds"]))
            self.log("drain", command=argv, rc=rc, output=out[-200:])
        if cfg.get("drain_url"):
            try:
                status, _body, _headers = http_request(str(cfg["drain_url"]), "POST", b"{}",
                                                       {"Content-Type": "application/json"},
                                                       timeout=float(cfg["http_timeout_seconds"]),
                                                       max_bytes=int(cfg["max_body_bytes"]))
                self.log("drain", url=_redact_url(str(cfg["drain_url"])), status=status)
            except HTTPFailure as exc:
                self.log("drain", url=_redact_url(str(cfg["drain_url"])), error=str(exc))
        grace = float(cfg.get("drain_grace_seconds") or 0)
        if grace > 0:
            time.sleep(grace)

    def _gpustack(self) -> Dict[str, object]:
        method, url = gpustack_request(self.cfg)
        key = None
        try:
            key = read_api_key(self.cfg.get("gpustack_token_file"))
            headers = {"Content-Type": "application/json"}
            if key:
                headers["Authorization"] = "Bearer " + key
            status, _body, resp_headers = http_request(
                url, method, b"{}" if method == "POST" else None, headers,
                timeout=float(self.cfg["http_timeout_seconds"]), max_bytes=int(self.cfg["max_body_bytes"]))
        except HTTPFailure as exc:
            return {"ok": False, "detail": str(exc)}
        if 300 <= status < 400:
            return {"ok": False, "detail": "%s %s -> %d redirect to %s: not followed" % (
                method, _redact_url(url), status, _redact_url(_mask_secret(resp_headers.get("location", "?"), key))[:200])}
        return {"ok": 200 <= status < 300, "detail": "%s %s -> %d" % (method, _redact_url(url), status)}


class DeploymentActuator:
    """Recycle ONE GPUStack instance: per-GPU locks, bounded drain, DELETE the instance, and
    hold the locks until the controller's replacement runs (bounded), so two engines never
    (re)start on one GPU at once. The worker unit and other deployments keep running."""

    def __init__(self, cfg: Dict[str, object], api: "GPUStackAPI", log, scrape_running):
        self.cfg = cfg
        self.api = api
        self.log = log
        self.scrape_running = scrape_running   # () -> in-flight requests of the engine, or None

    def budget_seconds(self) -> float:
        cfg = self.cfg
        return (float(cfg["drain_timeout_seconds"]) + float(cfg["restart_wait_seconds"])
                + 4 * float(cfg["http_timeout_seconds"]))

    def recycle(self, instance: "Instance") -> Dict[str, object]:
        cfg = self.cfg
        if cfg.get("actuator") in (None, "none"):
            return {"ok": False, "detail": "no actuator configured (alert only)"}
        if cfg.get("dry_run"):
            return {"ok": True, "dry_run": True,
                    "detail": "dry run: DELETE model-instances/%d (%s)" % (instance.id, self.api.mask(instance.name))}
        gpus = sorted(set(instance.gpu_indexes) | set(cfg.get("gpu_indexes") or []))
        lock_dir = str(cfg.get("lock_dir") or os.path.dirname(str(cfg["lock_file"])))
        locks = GPULocks(lock_dir, gpus, str(cfg["lock_file"]))
        busy = locks.acquire()
        if busy:
            return {"ok": False, "lock_held": True,
                    "detail": "another engine (re)start holds %s: retry later" % busy}
        try:
            drained = self._drain()
            deadline = time.monotonic() + 2 * float(cfg["http_timeout_seconds"])
            try:
                ok, detail = self.api.delete_instance(instance.id, deadline)
            except HTTPFailure as exc:
                return {"ok": False, "detail": str(exc), "drain": drained}
            if not ok:
                return {"ok": False, "detail": detail, "drain": drained}
            waited = self._wait_for_replacement(instance)
            return {"ok": True, "detail": detail, "drain": drained, "replacement": waited,
                    "gpus_locked": gpus}
        finally:
            locks.release()

    def _drain(self) -> str:
        """Wait (bounded) until the engine reports no request in flight. GPUStack 0.7.1 has no
        per-instance drain route, so this is the engine's own gauge; the time bound wins."""
        limit = float(self.cfg["drain_timeout_seconds"])
        end = time.monotonic() + limit
        while True:
            running = self.scrape_running()
            if running is None:
                return "no in-flight gauge: not drained"
            if running <= 0:
                return "idle"
            if time.monotonic() >= end:
                return "timed out after %.0f s with %g requests in flight" % (limit, running)
            time.sleep(min(1.0, max(0.0, end - time.monotonic())))

    def _wait_for_replacement(self, old: "Instance") -> str:
        end = time.monotonic() + float(self.cfg["restart_wait_seconds"])
        while time.monotonic() < end:
            time.sleep(min(2.0, max(0.0, end - time.monotonic())))
            try:
                found = self.api.instances(time.monotonic() + float(self.cfg["http_timeout_seconds"]))
            except HTTPFailure:
                continue
            fresh = [i for i in found if i.identity() != old.identity() and i.state in INSTANCE_STATES_RUNNING]
            if fresh:
                return "instance %d running" % fresh[0].id
        return "no running replacement within %.0f s" % float(self.cfg["restart_wait_seconds"])


# ---------------------------------------------------------------------------
# Profile switch (serving_plan strategy 'scheduled'): at every window edge a systemd timer runs
# `switch-profile --profile NAME`, which puts that profile's backend_parameters on the deployment
# through GPUStack's API. Order: read the model (no change: exit 0), take the GPU locks, drain
# the engine (bounded), re-read, write the marker, PUT the record, read it back, and make sure
# the instance restarts (GPUStack restarts it, or it is deleted and the controller recreates it
# with the new parameters, the route the recycle uses). Any failure before the PUT is answered
# leaves the deployment as it was, and says so.
# ---------------------------------------------------------------------------
PROFILE_MARKER_MAX_BYTES = 4096


def profile_marker_path(cfg: Dict[str, object]) -> str:
    """The one place the marker's path is made: the switch writes it, the daemon of the same
    target reads it (the lock directory: the watchdog user may write there; a tmpfs, so a reboot
    forgets it, and the switch caught up at boot writes a new one)."""
    directory = str(cfg.get("lock_dir") or os.path.dirname(str(cfg["lock_file"])))
    return os.path.join(directory, "profile-switch-%s.json" % cfg["name"])


def write_file_atomically(path: str, text: str, prefix: str) -> str:
    """Write ``text`` to ``path`` (mode 0644) through a temporary file in its directory, so a
    reader sees the old file or the new one, never half of one; returns ``path``."""
    fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=os.path.dirname(path))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def write_profile_marker(cfg: Dict[str, object], record: Dict[str, object]) -> str:
    path = profile_marker_path(cfg)
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    return write_file_atomically(path, json.dumps(record, sort_keys=True), ".profile-switch-")


def remove_profile_marker(cfg: Dict[str, object]) -> None:
    try:
        os.unlink(profile_marker_path(cfg))
    except FileNotFoundError:
        pass


def read_profile_marker(cfg: Dict[str, object], now: float) -> Optional[Dict[str, object]]:
    """The marker of a switch less than profile_switch_grace_seconds ago (wall clock), else None.
    A marker that is not small JSON with a finite time and a profile name, or that is dated more
    than a minute ahead, is ignored: a bad file cannot keep the watchdog quiet for ever."""
    text = _read_small(profile_marker_path(cfg), PROFILE_MARKER_MAX_BYTES + 1)
    if text is None or len(text) > PROFILE_MARKER_MAX_BYTES:
        return None
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    when, profile = data.get("time"), data.get("profile")
    if isinstance(when, bool) or not isinstance(when, (int, float)) or not math.isfinite(when):
        return None
    if not isinstance(profile, str) or not NAME_RE.match(profile):
        return None
    age = now - float(when)
    if age < -60 or age >= float(cfg["profile_switch_grace_seconds"]):
        return None
    return {"time": float(when), "profile": profile, "age_seconds": max(0.0, age)}


def scrape_running_requests(cfg: Dict[str, object], url: Optional[str]) -> Optional[float]:
    """Requests in flight on the engine (vLLM vllm:num_requests_running, llama-box's gauge), or
    None when the engine cannot tell."""
    if not url:
        return None
    try:
        _status, body, _h = http_request(url, timeout=float(cfg["http_timeout_seconds"]),
                                         max_bytes=int(cfg["max_body_bytes"]))
    except HTTPFailure:
        return None
    samples = parse_exposition(body.decode("utf-8", "replace"))
    for name in METRIC_NAMES["requests_running"]:
        value = sum_family(samples, name)
        if value is not None:
            return value
    return None


class ProfileSwitch:
    """One switch of a deployment to one profile; run() -> (exit status, message). The message
    never holds the API key (no header or key file content is ever put in one)."""

    def __init__(self, cfg: Dict[str, object], log, clock=time.time):
        self.cfg = cfg
        self.log = log
        self.clock = clock
        self.api = GPUStackAPI(cfg)

    def _deadline(self) -> float:
        return time.monotonic() + 2 * float(self.cfg["http_timeout_seconds"])

    def profile_of(self, params: object) -> str:
        for name, args in sorted((self.cfg.get("profiles") or {}).items()):
            if params == args:
                return name
        return "(parameters of no profile)"

    def _lock(self, locks: GPULocks) -> Optional[str]:
        """All GPU locks, waiting (bounded by drain_timeout_seconds) for a recycle or another
        switch on the same GPUs to finish."""
        end = time.monotonic() + float(self.cfg["drain_timeout_seconds"])
        while True:
            busy = locks.acquire()
            if busy is None or time.monotonic() >= end:
                return busy
            time.sleep(min(1.0, max(0.0, end - time.monotonic())))

    def run(self, profile: str) -> Tuple[int, str]:
        cfg = self.cfg
        profiles = cfg.get("profiles") or {}
        name = str(cfg.get("gpustack_deployment"))
        if profile not in profiles:
            return 2, "profile %r is not one of the profiles of %s (%s)" % (
                profile[:80], name, ", ".join(sorted(profiles)) or "none configured")
        wanted = list(profiles[profile])
        keeps = "; the deployment keeps its current backend parameters"
        try:
            model_id = self.api.find_model_id(self._deadline())
            record = self.api.get_model(model_id, self._deadline())
        except HTTPFailure as exc:
            return 1, "switch of %s to profile %s failed, nothing changed: %s%s" % (name, profile, exc, keeps)
        current = record.get("backend_parameters") or []
        if current == wanted:
            return 0, "%s already runs profile %s: nothing to do" % (name, profile)
        if not isinstance(current, list):
            return 1, "switch of %s to profile %s refused: its backend_parameters in GPUStack are not a list%s" % (
                name, profile, keeps)
        previous = self.profile_of(current)
        try:
            found = self.api.instances(self._deadline())
        except HTTPFailure as exc:
            return 1, "switch of %s to profile %s failed, nothing changed: %s; it keeps profile %s" % (
                name, profile, exc, previous)
        inst = pick_instance(found, cfg.get("gpu_indexes") or [])
        gpus = sorted(set(inst.gpu_indexes if inst else []) | set(cfg.get("gpu_indexes") or []))
        lock_dir = str(cfg.get("lock_dir") or os.path.dirname(str(cfg["lock_file"])))
        locks = GPULocks(lock_dir, gpus, str(cfg["lock_file"]))
        busy = self._lock(locks)
        if busy:
            return 1, "switch of %s to profile %s not done: another engine (re)start held %s for %g s; it keeps " \
                      "profile %s" % (name, profile, busy, float(cfg["drain_timeout_seconds"]), previous)
        try:
            return self._switch(model_id, profile, wanted, previous, inst)
        finally:
            locks.release()

    def _switch(self, model_id: int, profile: str, wanted: List[str], previous: str,
                inst: Optional[Instance]) -> Tuple[int, str]:
        cfg = self.cfg
        name = str(cfg.get("gpustack_deployment"))
        actuator = DeploymentActuator(cfg, self.api, self.log, lambda: scrape_running_requests(cfg, self._url(inst)))
        drained = actuator._drain() if inst is not None else "no instance on this worker: nothing to drain"  # pylint: disable=protected-access
        self.log("drain", detail=drained)
        try:
            record = self.api.get_model(model_id, self._deadline())
        except HTTPFailure as exc:
            return 1, "switch of %s to profile %s failed after the drain, nothing changed: %s; it keeps profile %s" % (
                name, profile, exc, previous)
        if (record.get("backend_parameters") or []) == wanted:
            return 0, "%s was switched to profile %s meanwhile (another node's timer): nothing to do" % (name, profile)
        write_profile_marker(cfg, {"time": self.clock(), "profile": profile, "previous": previous,
                                   "deployment": name})
        try:
            ok, detail = self.api.put_model(model_id, dict(record, backend_parameters=wanted), self._deadline())
        except HTTPFailure as exc:
            ok, detail = False, str(exc)
        try:
            back = self.api.get_model(model_id, self._deadline())
        except HTTPFailure as exc:
            if ok:
                return 1, "switch of %s to profile %s: %s accepted, but the read-back failed (%s): state unknown, " \
                          "check the deployment" % (name, profile, detail, exc)
            return 1, "switch of %s to profile %s failed (%s) and the read-back failed (%s): the update was most " \
                      "likely not applied; the next trigger retries (a no-op if it was)" % (name, profile, detail, exc)
        got = back.get("backend_parameters") or []
        if got != wanted:
            if got == (record.get("backend_parameters") or []):
                remove_profile_marker(cfg)
                return 1, "switch of %s to profile %s failed: %s; GPUStack still holds profile %s, which keeps " \
                          "running" % (name, profile, detail, previous)
            return 1, "switch of %s to profile %s: %s, but GPUStack reads back %s, neither profile: check the " \
                      "deployment" % (name, profile, detail, self.api.mask(json.dumps(got))[:300])
        restarted, restart = self._restart(actuator, inst) if inst is not None else (True, "no instance on this worker")
        if not restarted:
            return 1, "%s switched from profile %s to %s in GPUStack (%s; drain: %s), but its instance on this worker " \
                      "is not running the new profile: %s" % (name, previous, profile, detail, drained, restart)
        return 0, "%s switched from profile %s to %s (%s; drain: %s; restart: %s)" % (
            name, previous, profile, detail, drained, restart)

    def _url(self, inst: Optional[Instance]) -> Optional[str]:
        sensor = DeploymentSensor(self.cfg, self.api)
        sensor.instance = inst
        return sensor.metrics_url()

    def _restart(self, actuator: DeploymentActuator, old: Instance) -> Tuple[bool, str]:
        """GPUStack restarts the instance on an update, or (a version that does not) the
        instance is deleted so the controller recreates it from the updated record."""
        end = time.monotonic() + float(self.cfg["profile_settle_seconds"])
        while True:
            try:
                now = {i.id: i for i in self.api.instances(self._deadline())}
            except HTTPFailure:
                now = None
            if now is not None:
                same = now.get(old.id)
                if same is None or same.identity() != old.identity() or same.state not in INSTANCE_STATES_RUNNING:
                    break
            if time.monotonic() >= end:
                try:
                    ok, detail = self.api.delete_instance(old.id, self._deadline())
                except HTTPFailure as exc:
                    return False, "GPUStack did not restart instance %d and its delete failed (%s): it runs the " \
                                  "old parameters until it restarts" % (old.id, exc)
                if not ok:
                    return False, "GPUStack did not restart instance %d and %s: it runs the old parameters until " \
                                  "it restarts" % (old.id, detail)
                break
            time.sleep(min(1.0, max(0.0, end - time.monotonic())))
        waited = actuator._wait_for_replacement(old)  # pylint: disable=protected-access
        return waited.endswith(" running"), waited


# ---------------------------------------------------------------------------
# Daemon: outputs.
# ---------------------------------------------------------------------------
def sd_notify(message: str, env: Optional[Dict[str, str]] = None) -> bool:
    """Send a datagram to $NOTIFY_SOCKET ('@' = abstract namespace). False without systemd."""
    address = (env if env is not None else os.environ).get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        sock.connect(address)
        sock.sendall(message.encode("utf-8"))
        return True
    except OSError:
        return False
    finally:
        sock.close()


ACTION_CODE = {"none": 0, "alert": 1, "recycle": 2}
# Every diagnosis the engine gives (the alerting rules match on these names).
DIAGNOSES = ("leak_unconfirmed", "leak_with_latency", "leak_projected", "slow_decay", "memory_rising",
             "latency_with_memory_bump", "latency_only", "steady")


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render_metrics(target: str, decision: Decision, recycles_total: int,
                   state: Optional[Dict[str, object]] = None) -> str:
    """Prometheus text for one watched deployment. state (daemon bookkeeping): limit_source,
    storm_guard_tripped, last_recycle_timestamp, last_recycle_ok, recycle_failures_total,
    last_tick_timestamp."""
    state = state or {}
    label = '{target="%s"}' % _escape_label(target)
    rows = [
        ("kvpin_watchdog_memory_bytes", "gauge", "anon+swap of the watched engine", label, decision.memory_bytes),
        ("kvpin_watchdog_memory_limit_bytes", "gauge", "memory the engine may use before it is killed",
         '{target="%s",source="%s"}' % (_escape_label(target),
                                        _escape_label(str(state.get("limit_source") or "none"))),
         decision.memory_limit_bytes),
        ("kvpin_watchdog_slope_bytes_per_hour", "gauge", "Theil-Sen slope of memory", label,
         decision.slope_bytes_per_hour),
        ("kvpin_watchdog_slope_lower_bytes_per_hour", "gauge", "lower confidence bound of the slope", label,
         decision.slope_lower_bytes_per_hour),
        ("kvpin_watchdog_slope_upper_bytes_per_hour", "gauge", "upper confidence bound of the slope", label,
         decision.slope_upper_bytes_per_hour),
        ("kvpin_watchdog_projected_seconds_to_limit", "gauge", "time until the memory limit at the slope", label,
         decision.projected_seconds_to_limit),
        ("kvpin_watchdog_ttft_p95_seconds", "gauge", "TTFT p95 of the last window", label, decision.ttft_p95),
        ("kvpin_watchdog_ttft_slope_seconds_per_hour", "gauge", "Theil-Sen slope of TTFT p95", label,
         decision.ttft_slope),
        ("kvpin_watchdog_diagnosis", "gauge", "last diagnosis (label), always 1",
         '{target="%s",diagnosis="%s"}' % (_escape_label(target),
                                           _escape_label(decision.diagnosis or decision.phase)), 1),
        ("kvpin_watchdog_decision", "gauge", "last decision: 0 none, 1 alert, 2 recycle", label,
         ACTION_CODE[decision.action]),
        ("kvpin_watchdog_storm_guard_tripped", "gauge", "1 when the storm guard stopped recycling (alert only)",
         label, 1 if state.get("storm_guard_tripped") else 0),
        ("kvpin_watchdog_last_recycle_timestamp_seconds", "gauge", "wall-clock time of the last recycle attempt",
         label, state.get("last_recycle_timestamp")),
        ("kvpin_watchdog_last_recycle_success", "gauge", "1 if the last recycle attempt succeeded, 0 if it failed",
         label, None if state.get("last_recycle_ok") is None else (1 if state.get("last_recycle_ok") else 0)),
        ("kvpin_watchdog_recycles_total", "counter", "recycles performed by this watchdog", label, recycles_total),
        ("kvpin_watchdog_recycle_failures_total", "counter", "recycle attempts that failed", label,
         int(state.get("recycle_failures_total") or 0)),
        ("kvpin_watchdog_last_tick_timestamp_seconds", "gauge", "wall-clock time of the last completed tick",
         label, state.get("last_tick_timestamp")),
    ]
    lines = []
    for name, kind, help_text, labels, value in rows:
        if value is None or (isinstance(value, float) and (math.isnan(value) or math.isinf(value))):
            continue
        lines.append("# HELP %s %s" % (name, help_text))
        lines.append("# TYPE %s %s" % (name, kind))
        lines.append("%s%s %s" % (name, labels, repr(float(value)) if isinstance(value, float) else value))
    return "\n".join(lines) + "\n"


def write_textfile(directory: str, target: str, text: str) -> str:
    """Atomic: the collector never reads a half-written file."""
    os.makedirs(directory, exist_ok=True)
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", target)
    final = os.path.join(directory, "kvpin_watchdog_%s.prom" % safe)
    return write_file_atomically(final, text, ".kvpin_watchdog_")


class DeploymentSensor:
    """A GPUStack deployment's instance on this worker, found through the API every tick, and
    the engine measured: native -> the instance's process tree (pid from the API and all its
    descendants) anon+swap from /proc; container -> the instance container's cgroup."""

    def __init__(self, cfg: Dict[str, object], api: GPUStackAPI):
        self.cfg = cfg
        self.api = api
        self.instance: Optional[Instance] = None
        # container runtime: the instance container's resolved cgroup, ONE entry
        # (container_key(instance), cgroup dir), so `<runtime> inspect` (a process start, tens
        # of ms of CPU) runs once per container, not once per tick.
        self.container_cache: Optional[Tuple[Tuple[object, ...], str]] = None

    def container_cgroup(self, inst: Instance) -> Optional[str]:
        sub = dict(self.cfg, container=inst.name, unit=None, cgroup_path=None)
        found = resolve_cgroup(sub)
        if found is None and inst.pid:
            found = pid_cgroup_dir(str(self.cfg["cgroup_root"]), str(self.cfg["proc_root"]), inst.pid)
        return found

    @staticmethod
    def container_key(inst: Instance) -> Tuple[object, ...]:
        """The container as the API reports it: the instance (id), its container (name), its
        process and start (pid, restart_count) and its state. Any change: look it up again."""
        return (inst.id, inst.name, inst.pid, inst.restart_count, inst.state)

    def container_memory(self, inst: Instance) -> Tuple[Optional[str], Optional[Tuple[int, str]]]:
        """(cgroup dir, cgroup_memory of it) of the instance's container. The cached dir is used
        while the instance's container_key is unchanged and its memory.stat can be read; a
        changed instance, or a cached dir that vanished or cannot be read (a recreated
        container), is looked up again in the same tick. Only a readable dir is cached."""
        key = self.container_key(inst)
        if self.container_cache is not None and self.container_cache[0] == key:
            got = cgroup_memory(self.container_cache[1])
            if got is not None:
                return self.container_cache[1], got
        self.container_cache = None
        cg = self.container_cgroup(inst)
        got = cgroup_memory(cg) if cg else None
        if cg and got is not None:
            self.container_cache = (key, cg)
        return cg, got

    def sample(self, deadline: float) -> Dict[str, object]:
        cfg = self.cfg
        out: Dict[str, object] = {"memory_bytes": None, "source": "none", "restarted": False,
                                  "per_process": {}, "cgroup": None, "instance": None,
                                  "limit": None, "limit_source": "none"}
        try:
            found = self.api.instances(deadline)
        except HTTPFailure as exc:
            out["status"] = "GPUStack API: %s" % exc
            return out
        inst = pick_instance(found, cfg.get("gpu_indexes") or [])
        if inst is None:
            out["status"] = "no instance of %s on worker %s" % (cfg["gpustack_deployment"], cfg["gpustack_worker_name"])
            return out
        out["instance"] = inst
        if self.instance is not None and inst.identity() != self.instance.identity():
            out["restarted"] = True   # restarted or rescheduled: a new process, a new trend
        self.instance = inst
        if inst.state not in INSTANCE_STATES_RUNNING:
            self.container_cache = None     # stopped or restarting: its container may be replaced
            out["status"] = "instance %d is %s" % (inst.id, self.api.mask(inst.state)[:200])
            return out
        proc_root, cg_root = str(cfg["proc_root"]), str(cfg["cgroup_root"])
        if cfg.get("engine_runtime") == "container":
            cg, got = self.container_memory(inst)
            out["cgroup"] = cg
            if got is not None:
                out["memory_bytes"], out["source"] = got
            exclusive, cg_used = True, out["memory_bytes"]
        else:
            pids = process_tree(proc_root, inst.pid) if inst.pid else []
            per = {}
            for pid in pids[:256]:
                value = proc_anon_swap(proc_root, pid)
                if value is not None:
                    per[pid] = value
            if per:
                out["memory_bytes"] = sum(per.values())
                out["source"] = "proc RssAnon+VmSwap of instance %d process tree (%d processes)" % (inst.id, len(per))
            out["per_process"] = per
            cg = pid_cgroup_dir(cg_root, proc_root, inst.pid) if inst.pid else None
            out["cgroup"] = cg
            got = cgroup_memory(cg) if cg else None
            exclusive, cg_used = False, (got[0] if got else None)
        if out["memory_bytes"] is None:
            out["status"] = "instance %d: engine memory not readable" % inst.id
            return out
        if cfg.get("memory_limit_bytes"):
            out["limit"], out["limit_source"] = int(cfg["memory_limit_bytes"]), "config memory_limit_bytes"
        else:
            out["limit"], out["limit_source"] = default_limit(int(out["memory_bytes"]), out["cgroup"], exclusive,
                                                              cg_used, meminfo(proc_root))
        out["status"] = "ok"
        return out

    def metrics_url(self) -> Optional[str]:
        inst = self.instance
        if inst is None or not inst.port:
            return None
        host = str(self.cfg.get("engine_host") or "127.0.0.1")
        if ":" in host and not host.startswith("["):
            host = "[%s]" % host
        return "http://%s:%d%s" % (host, inst.port, self.cfg.get("metrics_path") or "/metrics")


class Daemon:
    def __init__(self, cfg: Dict[str, object], out=None, clock=time.time, monotonic=time.monotonic):
        self.cfg = cfg
        self.out = out or sys.stdout
        self.clock = clock            # wall clock: log and metric timestamps only
        self.monotonic = monotonic    # every duration and the engine's time axis
        self.engine = DecisionEngine(cfg, auto_commit=False)
        self.memory = MemorySensor(cfg)
        self.latency = LatencySensor(cfg)
        self.actuator = Actuator(cfg, self.log)
        self.api = GPUStackAPI(cfg) if cfg.get("gpustack_deployment") else None
        self.deployment = DeploymentSensor(cfg, self.api) if self.api else None
        self.deployment_actuator = (DeploymentActuator(cfg, self.api, self.log, self._running_requests)
                                    if self.api else None)
        self.recycles_total = 0
        self.state: Dict[str, object] = {"recycle_failures_total": 0}
        self.stopping = False
        self.tick_deadline: Optional[float] = None   # monotonic; None = no tick in progress
        self.limit_source: Optional[str] = None
        self.after_switch = False     # a profile switch's grace period ended: the trend restarts

    def log(self, event: str, **fields: object) -> None:
        record = {"ts": round(self.clock(), 3), "target": self.cfg["name"], "event": event}
        record.update(fields)
        self.out.write(json.dumps(record, default=str, separators=(",", ":")) + "\n")
        self.out.flush()

    def _running_requests(self) -> Optional[float]:
        return scrape_running_requests(self.cfg, self.deployment.metrics_url() if self.deployment else None)

    def _sample_deployment(self, now: float, deadline: float) -> Tuple[Dict[str, object], Dict[str, object]]:
        mem = self.deployment.sample(deadline)
        if mem["restarted"]:
            self.latency.reset()
        url = self.deployment.metrics_url() if mem.get("instance") is not None else None
        lat = self.latency.sample(now, metrics_url=url, deadline=deadline)
        if mem.get("limit_source") and mem["limit_source"] != self.limit_source and mem["limit"]:
            self.log("limit", limit_bytes=mem["limit"], source=mem["limit_source"])
            self.limit_source = mem["limit_source"]
        return mem, lat

    def tick(self) -> Decision:
        # Network and liveness deadlines on the real monotonic clock; the engine's time axis on
        # self.monotonic (the same clock in production, a simulated one in benchmarks).
        deadline = time.monotonic() + tick_deadline(self.cfg)
        self.tick_deadline = deadline + 5.0
        now = self.monotonic()
        if self.deployment is not None:
            mem, lat = self._sample_deployment(now, deadline)
        else:
            mem = self.memory.sample()
            lat = self.latency.sample(now, deadline=deadline)
        if mem.get("limit"):
            self.engine.cfg["memory_limit_bytes"] = int(mem["limit"])
        switch = read_profile_marker(self.cfg, self.clock())
        if switch is not None:
            # A profile switch restarts the engine on purpose: its memory and latency are not a
            # trend, so no recycle and no alert until the grace period ends; the engine's trend
            # then starts anew (as after any restart).
            self.after_switch = True
            decision = Decision(t=now, action="none", phase="profile_switch", memory_bytes=mem["memory_bytes"],
                                reason="profile switch to %s %.0f s ago: no recycle or alert for %g s after it" % (
                                    switch["profile"], switch["age_seconds"],
                                    float(self.cfg["profile_switch_grace_seconds"])))
            self.log("decision", **json.loads(decision.to_json()))
            self._finish(decision)
            return decision
        restarted = bool(mem["restarted"]) or self.after_switch
        if self.after_switch:
            self.latency.reset()
            self.after_switch = False
        if mem["memory_bytes"] is None:
            decision = Decision(t=now, action="none", phase="collecting",
                                reason=str(mem.get("status") or "no memory reading (cgroup %s)" % mem["cgroup"]))
            self.log("decision", **json.loads(decision.to_json()))
            self._finish(decision)
            return decision
        decision = self.engine.feed(now, mem["memory_bytes"], ttft_p95=lat["ttft_p95"],
                                    preemptions=lat["preemptions"], restarted=restarted,
                                    corroboration=lat["corroboration"])
        record = json.loads(decision.to_json())
        record["memory_source"] = mem["source"]
        record["per_process_bytes"] = mem["per_process"]
        record["latency_status"] = lat.get("status")
        if mem.get("instance") is not None:
            inst = mem["instance"]
            record["instance"] = {"id": inst.id, "pid": inst.pid, "port": inst.port, "gpus": inst.gpu_indexes}
        if mem.get("limit_source"):
            record["limit_source"] = mem["limit_source"]
        self.log("decision", **record)
        if decision.action == "recycle":
            self._recycle(decision, mem)
        self.state["limit_source"] = mem.get("limit_source") or (
            "config memory_limit_bytes" if self.cfg.get("memory_limit_bytes") else None)
        self._finish(decision)
        return decision

    def _recycle(self, decision: Decision, mem: Dict[str, object]) -> None:
        if self.deployment_actuator is not None:
            self.tick_deadline = time.monotonic() + self.deployment_actuator.budget_seconds() + 10.0
            result = self.deployment_actuator.recycle(mem["instance"])
        else:
            self.tick_deadline = time.monotonic() + float(self.cfg["actuator_timeout_seconds"]) * 2 + 10.0
            result = self.actuator.recycle()
        self.state["last_recycle_timestamp"] = self.clock()
        self.state["last_recycle_ok"] = bool(result.get("ok"))
        if result.get("ok"):
            if not result.get("dry_run"):
                self.recycles_total += 1
            self.engine.commit_recycle(decision.t)
        else:
            # Not counted, trend kept: the next evaluation decides again (a retry).
            self.state["recycle_failures_total"] = int(self.state["recycle_failures_total"]) + 1
        self.log("recycle", **result)

    def _finish(self, decision: Decision) -> None:
        self.state["storm_guard_tripped"] = self.engine.storm_guard_tripped()
        self.state["last_tick_timestamp"] = self.clock()
        if decision.suppressed_by == "storm_guard" and not self.state.get("storm_logged"):
            self.log("storm_guard", detail="recycling stopped after %d recycles in %.1f h: alert only" % (
                len(self.engine.recycle_times), float(self.cfg["storm_window_seconds"]) / HOUR))
            self.state["storm_logged"] = True
        if self.cfg.get("textfile_dir"):
            write_textfile(str(self.cfg["textfile_dir"]), str(self.cfg["name"]),
                           render_metrics(str(self.cfg["name"]), decision, self.recycles_total, self.state))
        self.status_line = "%s: %s" % (decision.action, decision.reason[:200])
        self.tick_deadline = None

    def _tick_safely(self) -> None:
        try:
            self.tick()
        except Exception as exc:  # noqa: BLE001 - one bad tick must not kill the watchdog
            self.log("error", error="%s: %s" % (type(exc).__name__, exc))
        finally:
            self.tick_deadline = None

    def healthy(self) -> bool:
        """Feed systemd only while no tick runs, or the running one is within its deadline:
        a tick hung past it starves WATCHDOG=1 on purpose, so systemd restarts the daemon."""
        deadline = self.tick_deadline
        return deadline is None or time.monotonic() < deadline

    def run(self) -> int:
        import threading  # pylint: disable=import-outside-toplevel
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)
        self.log("start", config=redacted_config(self.cfg))
        sd_notify("READY=1\nSTATUS=watching %s" % self.cfg["name"])
        self.status_line = "starting"
        interval = float(self.cfg["interval_seconds"])
        worker: Optional[threading.Thread] = None
        next_tick = time.monotonic()
        while not self.stopping:
            if (worker is None or not worker.is_alive()) and time.monotonic() >= next_tick:
                next_tick = time.monotonic() + interval
                self.tick_deadline = time.monotonic() + tick_deadline(self.cfg) + 5.0
                worker = threading.Thread(target=self._tick_safely, name="tick", daemon=True)
                worker.start()
            # The scrape runs in the tick thread; this loop keeps WATCHDOG=1 fed meanwhile.
            if self.healthy():
                sd_notify("WATCHDOG=1\nSTATUS=%s" % self.status_line)
            time.sleep(min(1.0, interval))
        sd_notify("STOPPING=1")
        self.log("stop")
        return 0

    def _stop(self, *_args) -> None:
        self.stopping = True


def switch_profile(cfg: Dict[str, object], profile: str, out=None) -> int:
    """The switch-profile subcommand: JSON lines on stdout, the outcome on stderr too when it
    failed (the unit's journal shows it); exit 0 switched or nothing to do, 1 failed (the
    deployment keeps its profile unless the message says otherwise), 2 bad config or profile."""
    out = out or sys.stdout

    def log(event: str, **fields: object) -> None:
        record = {"ts": round(time.time(), 3), "target": cfg["name"], "event": event}
        record.update(fields)
        out.write(json.dumps(record, default=str, separators=(",", ":")) + "\n")
        out.flush()

    if not cfg.get("gpustack_deployment") or not cfg.get("profiles"):
        sys.stderr.write("kvpin_watchdog: switch-profile needs gpustack_deployment and profiles in the config\n")
        return 2
    status, message = ProfileSwitch(cfg, log).run(profile)
    log("profile_switch", ok=status == 0, profile=profile, detail=message)
    if status:
        sys.stderr.write("kvpin_watchdog: %s\n" % message)
    return status


# ---------------------------------------------------------------------------
# CLI.
# ---------------------------------------------------------------------------
def main(argv: Optional[Iterable[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="kvpin_watchdog", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("daemon", help="watch one target")
    d.add_argument("--config", required=True)
    d.add_argument("--once", action="store_true", help="run one tick and exit")
    r = sub.add_parser("replay", help="replay a CSV trace through the decision engine")
    r.add_argument("--trace", required=True)
    r.add_argument("--config")
    r.add_argument("--actions-only", action="store_true", help="print only alert/recycle lines")
    c = sub.add_parser("check-config", help="validate a daemon config file and exit")
    c.add_argument("--config", required=True)
    p = sub.add_parser("switch-profile", help="switch the deployment to one of its profiles through GPUStack")
    p.add_argument("--config", required=True)
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--profile", help="this profile")
    which.add_argument("--due", action="store_true", help="the profile profile_schedule gives for now (local time)")
    args = parser.parse_args(list(argv) if argv is not None else None)
    try:
        cfg = load_config(args.config)
    except (OSError, ValueError) as exc:
        sys.stderr.write("kvpin_watchdog: %s\n" % exc)
        return 2
    if args.command == "replay":
        try:
            replay(args.trace, cfg, actions_only=args.actions_only)
        except (OSError, ValueError, KeyError) as exc:
            sys.stderr.write("kvpin_watchdog: %s\n" % exc)
            return 2
        return 0
    errors = validate_config(cfg)
    if args.command == "check-config" or errors:
        for error in errors:
            sys.stderr.write("kvpin_watchdog: %s: %s\n" % (args.config, error))
        return 2 if errors else 0
    if args.command == "switch-profile":
        if args.due:
            if not cfg.get("profile_schedule"):
                sys.stderr.write("kvpin_watchdog: %s: --due needs profile_schedule\n" % args.config)
                return 2
            now = time.localtime()
            return switch_profile(cfg, due_profile(cfg["profile_schedule"], now.tm_hour * 60 + now.tm_min))
        return switch_profile(cfg, args.profile)
    daemon = Daemon(cfg)
    if args.once:
        daemon.tick()
        return 0
    return daemon.run()


if __name__ == "__main__":
    sys.exit(main())
