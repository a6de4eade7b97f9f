# -*- coding: utf-8 -*-
# Copyright (c) 2026, kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""kvpin serving watchdog: recycle an LLM serving worker on a memory *slope*.

Stdlib only (Python 3.9+). Its subcommands (daemon and replay share one decision engine):

  daemon --config FILE          watch one target under systemd (Type=notify)
  replay --trace FILE.csv       feed a recorded trace through the same engine,
                                print one JSON decision per sample
  switch-profile --config FILE (--profile NAME | --due)
                                switch the deployment to one of its traffic-class
                                profiles (backend_parameters) through GPUStack's API
  measure (--metrics PAGE... | --engine-log FILE)
                                the deployment's measured traffic from successive
                                /metrics pages, or the KV pool its engine reported at
                                startup; one JSON object, the planner's `measurement`

Why anon+swap and not RSS: mapped weights and /dev/shm inflate RSS without any
leak, and a leak that moved to swap hides in RSS (ollama #18106).
Why a slope and not a level: a slow leak (vLLM #44175, ~47 MiB/h) takes days
to reach any level that is also safe for a healthy worker.
"""

# The package (one module per part, in import order: each imports only those above it):
#   config, stats, exposition, fsio -> decision -> trace_replay; exposition -> measure;
#   httpio -> sensors -> gpustack
#   -> actuators -> profile_switch -> outputs -> daemon -> cli. Run by ../kvpin_watchdog.py (the
#   installed command) or `python3 -m kvpin_watchdog_lib`. Stdlib only, plus the two files the
#   role ships into this directory from the collection (http_deadline.py, gpustack_api.py).
# Every public name of the single-file program is re-exported here (and the two private ones
# the tests call), so `kvpin_watchdog_lib.X` is the old `kvpin_watchdog.X`.

from __future__ import annotations

import time  # noqa: F401  (kvpin_watchdog_lib.time: the tests read the clock the program reads)

from .config import (  # noqa: F401
    MiB, GiB, HOUR, DEFAULTS, load_config, ACTUATORS, NUMERIC_RANGES, STRING_KEYS, CHOICES,
    URL_KEYS, NAME_RE, tick_deadline, MAX_PROFILES, MAX_PROFILE_ARGS, MAX_PROFILE_ARG_CHARS,
    profiles_problems, MAX_SCHEDULE_EDGES, schedule_problems, due_profile, validate_config
)
from .stats import Trend, _tie_term, high_pass, hamed_rao_factor, trend, downsample  # noqa: F401
from .exposition import (  # noqa: F401
    METRIC_NAMES, LATENCY_SAMPLE_NAMES, parse_exposition, first_family, histogram_buckets,
    sum_family, bucket_quantile, HistogramWindow
)
from .fsio import write_file_atomically  # noqa: F401
from .decision import Decision, DecisionEngine, DETECTORS, DIAGNOSES  # noqa: F401
from .trace_replay import replay  # noqa: F401
from .httpio import HTTPFailure, http_request, _redact_url, redacted_config, read_api_key  # noqa: F401
from .sensors import (  # noqa: F401
    cgroup_memory, proc_anon_swap, proc_start_time, cgroup_pids, cgroup_candidates, pick_cgroup_dir,
    resolve_cgroup, MemorySensor, LatencySensor, PROBE_MAX_LINE, PROBE_MAX_BYTES, probe_ttft
)
from .gpustack import (  # noqa: F401
    INSTANCE_STATES_RUNNING, SERVER_OWNED_MODEL_FIELDS, Instance, parse_instance, GPUStackAPI,
    pick_instance, process_tree, meminfo, cgroup_memory_max, pid_cgroup_dir, default_limit,
    DeploymentSensor
)
from .actuators import (  # noqa: F401
    RecycleLock, recycle_command, gpustack_request, GPULocks, Actuator, DeploymentActuator
)
from .profile_switch import (  # noqa: F401
    PROFILE_MARKER_MAX_BYTES, profile_marker_path, write_profile_marker, remove_profile_marker,
    read_profile_marker, scrape_running_requests, ProfileSwitch
)
from .outputs import sd_notify, ACTION_CODE, render_metrics, write_textfile  # noqa: F401
from .daemon import Daemon, switch_profile  # noqa: F401
from .cli import main  # noqa: F401
