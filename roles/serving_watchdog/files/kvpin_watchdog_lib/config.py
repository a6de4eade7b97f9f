# -*- coding: utf-8 -*-
# Copyright (c) 2026, kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Configuration: one place for every default (the role's defaults mirror it), and its checks."""

from __future__ import annotations

import json
import math
import re
from typing import Dict, List, Optional, Sequence, Tuple

from .shared import gpustack_api


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
    # ... and long enough to have added this much at its slope (a slow rise needs longer to be
    # told from a burst or a swell), at most confirm_max_seconds.
    "confirm_rise_bytes": 256 * MiB,
    "confirm_max_seconds": 6 * 3600,
    "rising_grace_seconds": 900,       # a rise that lapses for less than this stays confirmed
    "step_fit_ratio": 0.5,             # one step fits this much better than a line: not a trend
    # Warm-up hold (issue 38): after warmup_seconds an engine's memory still climbs toward a
    # plateau (allocator pools, prefix cache, fragmentation). While it settles, a memory rise
    # neither alerts nor recycles, unless it climbs past the learned plateau by
    # plateau_margin_bytes, keeps a leak's steady pace, or reaches the limit within the horizon.
    "settle_window_seconds": 2 * 3600,     # settled: the slope over this long (or at least
                                           # 0.45 x of it) is at the threshold
    "warmup_hold_max_seconds": 8 * 3600,   # the hold ends after this at the latest (0: no hold)
    "plateau_margin_bytes": 256 * MiB,
    "plateaus_kept": 8,                # learned plateaus kept (across restarts, in state_file)
    "state_file": None,                # JSON file keeping the learned plateaus across watchdog restarts
    # Long rise: hourly floors over this long (after the hold), for leaks too slow for the window.
    "long_window_seconds": 12 * 3600,
    # ... where TTFT p95's hourly medians confirm memory floors that passed the full test: a
    # load burst's hour scatters them, so at mk_alpha a slow leak's +15..44 % often missed.
    "long_window_ttft_alpha": 0.05,
    # Alert episodes: a condition other than a confirmed memory rise pages once it has been seen
    # for alert_enter_seconds; an episode ends after alert_clear_seconds without its condition.
    "alert_enter_seconds": 2 * 3600,
    "alert_clear_seconds": 2 * 3600,
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
    # Traffic measurement (issue 36): the /metrics page the latency signal scrapes anyway is
    # also read for the prompt / generation lengths, concurrency, truncated and rejected
    # requests and preemptions, per hour over a rolling window, kept in traffic_state_file.
    "traffic_measure": True,
    "traffic_scrape_seconds": 60,      # a page is measured at most this often
    "traffic_save_seconds": 300,       # the state file and the exported figures, this often
    "traffic_window_days": 7,
    "traffic_state_file": None,        # JSON state kept across watchdog restarts (the role sets it)
    # What the plan phase reads back (site.yml's probe): the measurement in serving_plan's
    # `measurement` shape, written with the state file. measurement_context is what the plan
    # told this deployment's engine ({gpu, backend_version, args}); the KV pool read back is
    # tagged with it only for an engine that started under it (measure.TrafficRecorder).
    "measurement_file": None,
    "measurement_context": None,
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
    # Liveness: WATCHDOG=1 stops once no memory sample has reached the decision engine for this
    # long (a deployment with no running instance on this worker is not blind), so systemd
    # restarts a blind watchdog after WatchdogSec more. 0 = never (ticks alone prove liveness).
    "memory_blind_seconds": 900,
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
    "confirm_rise_bytes": (0, 2 ** 50, False),
    "confirm_max_seconds": (0, 7 * 24 * 3600, False),
    "rising_grace_seconds": (0, 24 * 3600, False),
    "step_fit_ratio": (0, 1, False),
    "settle_window_seconds": (60, 7 * 24 * 3600, False),
    "warmup_hold_max_seconds": (0, 7 * 24 * 3600, False),
    "plateau_margin_bytes": (0, 2 ** 50, False),
    "plateaus_kept": (1, 100, True),
    "long_window_seconds": (3600, 30 * 24 * 3600, False),
    "long_window_ttft_alpha": (1e-9, 0.2, False),
    "alert_enter_seconds": (0, 7 * 24 * 3600, False),
    "alert_clear_seconds": (0, 7 * 24 * 3600, False),
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
    "memory_blind_seconds": (0, 30 * 24 * 3600, False),
    "profile_switch_grace_seconds": (0, 24 * 3600, False),
    "profile_settle_seconds": (0, 3600, False),
    "traffic_scrape_seconds": (1, 3600, False),
    "traffic_save_seconds": (10, 24 * 3600, False),
    "traffic_window_days": (1, 14, True),
    "gpustack_model_id": (1, 2 ** 62, True),
    "gpustack_instance_id": (1, 2 ** 62, True),
}
STRING_KEYS = ("name", "unit", "container", "cgroup_path", "cgroup_root", "proc_root", "metrics_url",
               "probe_url", "gpustack_server", "gpustack_token_file", "drain_url", "lock_file",
               "textfile_dir", "gpustack_deployment", "gpustack_worker_name", "engine_host",
               "metrics_path", "lock_dir", "state_file", "traffic_state_file", "measurement_file")
CHOICES = {
    "actuator": ACTUATORS,
    "container_runtime": ("podman", "docker"),
    "gpustack_mode": ("restart", "delete_instance"),
    "gpustack_api_version": gpustack_api.API_VERSION_CHOICES,   # auto, v1, v2
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


MAX_CONTEXT_TEXT = 256


def measurement_context_problems(context: object) -> List[str]:
    """What is wrong with a `measurement_context` ({gpu, backend_version, args}: what the plan
    told the engine), each naming the key; None (not known) is fine."""
    if context is None:
        return []
    if not isinstance(context, dict) or not set(context) <= {"gpu", "backend_version", "args"}:
        return ["measurement_context must be a mapping of gpu, backend_version and args"]
    errors = []
    for key in ("gpu", "backend_version"):
        value = context.get(key)
        if value is not None and (not isinstance(value, str) or not 0 < len(value) <= MAX_CONTEXT_TEXT
                                  or any(ord(c) < 32 for c in value)):
            errors.append("measurement_context.%s must be a single-line string of 1..%d characters"
                          % (key, MAX_CONTEXT_TEXT))
    args = context.get("args")
    if args is not None and (not isinstance(args, list) or len(args) > MAX_PROFILE_ARGS or not all(
            isinstance(a, str) and 0 < len(a) <= MAX_PROFILE_ARG_CHARS and not any(ord(c) < 32 for c in a)
            for a in args)):
        errors.append("measurement_context.args must be a list of at most %d single-line strings of at most "
                      "%d characters" % (MAX_PROFILE_ARGS, MAX_PROFILE_ARG_CHARS))
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
    for key in ("dry_run", "traffic_measure"):
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
        blind = float(cfg.get("memory_blind_seconds") or 0)
        if blind and blind < 2 * float(cfg["interval_seconds"]):
            errors.append("memory_blind_seconds (%g s) must be 0 (never) or at least two intervals "
                          "(2 x interval_seconds = %g s): one failed sample is no blindness" % (
                              blind, 2 * float(cfg["interval_seconds"])))
    errors.extend(measurement_context_problems(cfg.get("measurement_context")))
    errors.extend(profiles_problems(cfg.get("profiles")))
    errors.extend(schedule_problems(cfg.get("profile_schedule"), cfg.get("profiles")))
    if cfg.get("pre_recycle_command") is not None and (
            not isinstance(cfg["pre_recycle_command"], list)
            or not all(isinstance(a, str) for a in cfg["pre_recycle_command"])):
        errors.append("pre_recycle_command must be an argv list of strings")
    return errors
