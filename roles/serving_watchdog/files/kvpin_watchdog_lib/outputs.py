# -*- coding: utf-8 -*-
# Copyright (c) 2026, kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Daemon outputs: sd_notify, the metrics text and its textfile."""

from __future__ import annotations

import math
import os
import re
import socket
from typing import Dict, Optional

from .fsio import write_file_atomically
from .decision import Decision


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


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render_metrics(target: str, decision: Decision, recycles_total: int,
                   state: Optional[Dict[str, object]] = None) -> str:
    """Prometheus text for one watched deployment. state (daemon bookkeeping): limit_source,
    storm_guard_tripped, last_recycle_timestamp, last_recycle_ok, recycle_failures_total,
    last_tick_timestamp, last_memory_sample_timestamp, alert_episode_since_timestamp (the open
    episode's start, wall clock), families_dropped ({(family, reason): count}), pages_refused
    ({reason: count})."""
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
        # The open alert episode (what the alerting rules read: one per condition, with
        # hysteresis); no series while none is open.
        ("kvpin_watchdog_alert_episode", "gauge", "1 while an alert episode is open (its diagnosis as label)",
         '{target="%s",diagnosis="%s"}' % (_escape_label(target), _escape_label(decision.alert_episode or "")),
         1 if decision.alert_episode else None),
        ("kvpin_watchdog_alert_episode_since_timestamp_seconds", "gauge", "when the open alert episode began",
         label, state.get("alert_episode_since_timestamp") if decision.alert_episode else None),
        ("kvpin_watchdog_alert_episodes_total", "counter", "alert episodes opened since the watchdog started",
         label, decision.alert_episodes_total),
        ("kvpin_watchdog_warmup_hold", "gauge", "1 while the engine settles after a (re)start (memory rises excused)",
         label, 1 if decision.warmup_hold else 0),
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
        ("kvpin_watchdog_last_memory_sample_timestamp_seconds", "gauge",
         "wall-clock time of the last memory sample that reached the decision engine", label,
         state.get("last_memory_sample_timestamp")),
    ]
    rows += _traffic_rows(target, label, state)
    # Counters with a series per (family, reason) / reason: fixed vocabularies, so bounded.
    for (family, reason), count in sorted(dict(state.get("families_dropped") or {}).items()):
        rows.append(("kvpin_watchdog_metric_families_dropped_total", "counter",
                     "scraped metric families dropped as unsound (NaN/Inf, bad le, falling buckets, "
                     "garbage, too many series), per family and reason",
                     '{target="%s",family="%s",reason="%s"}' % (
                         _escape_label(target), _escape_label(family), _escape_label(reason)), int(count)))
    for reason, count in sorted(dict(state.get("pages_refused") or {}).items()):
        rows.append(("kvpin_watchdog_metrics_pages_refused_total", "counter",
                     "scraped metrics pages refused whole (over the parser's bounds), per reason",
                     '{target="%s",reason="%s"}' % (_escape_label(target), _escape_label(reason)), int(count)))
    lines = []
    described = set()
    for name, kind, help_text, labels, value in rows:
        if value is None or (isinstance(value, float) and (math.isnan(value) or math.isinf(value))):
            continue
        if name not in described:     # one HELP/TYPE per family, however many series
            described.add(name)
            lines.append("# HELP %s %s" % (name, help_text))
            lines.append("# TYPE %s %s" % (name, kind))
        lines.append("%s%s %s" % (name, labels, repr(float(value)) if isinstance(value, float) else value))
    return "\n".join(lines) + "\n"


def _traffic_rows(target: str, label: str, state: Dict[str, object]) -> list:
    """The measured traffic (measure.TrafficRecorder's summary of its rolling window)."""
    summary = state.get("traffic")
    rows = [("kvpin_watchdog_traffic_pages_unusable_total", "counter",
             "scraped pages the traffic measurement could not use (no length histogram, unsound)",
             label, int(state.get("traffic_pages_unusable") or 0))]
    if not isinstance(summary, dict):
        return rows
    window = '{target="%s",window_days="%s"}' % (_escape_label(target), summary.get("window_days"))
    rows += [
        ("kvpin_watchdog_traffic_requests", "gauge", "requests measured in the rolling window", window,
         summary.get("requests")),
        ("kvpin_watchdog_traffic_enough_requests", "gauge",
         "1 when the window holds enough requests (>= 299) for its p99 bounds to be planned from", window,
         1 if summary.get("enough_requests") else 0),
        ("kvpin_watchdog_traffic_max_concurrency", "gauge", "peak of running + waiting requests in the window",
         window, summary.get("max_concurrency")),
        ("kvpin_watchdog_traffic_length_truncated", "gauge", "requests stopped at their length limit in the window",
         window, summary.get("length_truncated")),
        ("kvpin_watchdog_traffic_rejected", "gauge", "requests refused with a 4xx in the window", window,
         summary.get("rejected")),
        ("kvpin_watchdog_traffic_preemptions", "gauge", "preemptions in the window", window,
         summary.get("preemptions")),
        ("kvpin_watchdog_traffic_engine_restarts_seen_total", "counter",
         "engine restarts the traffic measurement saw (counters reset, start time or layout changed)", label,
         summary.get("restarts_seen")),
        ("kvpin_watchdog_engine_kv_cache_tokens", "gauge", "the KV pool the engine reports (cache_config_info)",
         label, summary.get("kv_cache_tokens")),
    ]
    for kind in ("prompt", "generation"):
        labels = '{target="%s",window_days="%s",lengths="%s"}' % (
            _escape_label(target), summary.get("window_days"), kind)
        rows.append(("kvpin_watchdog_traffic_tokens_p99_upper", "gauge",
                     "upper edge of the histogram bucket holding the p99 length (absent when censored)",
                     labels, summary.get("%s_tokens_p99_upper" % kind)))
        rows.append(("kvpin_watchdog_traffic_tokens_p99_upper_95", "gauge",
                     "upper edge of the bucket holding the 95 %-confidence bound of the p99 length, what a "
                     "plan sizes on (absent below 299 requests or when censored)",
                     labels, summary.get("%s_tokens_p99_upper_95" % kind)))
        rows.append(("kvpin_watchdog_traffic_tokens_p99_censored", "gauge",
                     "1 when the p99 length falls in the +Inf bucket (no upper bound)", labels,
                     1 if summary.get("%s_tokens_p99_censored" % kind) else 0))
    return rows


def write_textfile(directory: str, target: str, text: str) -> str:
    """Atomic: the collector never reads a half-written file."""
    os.makedirs(directory, exist_ok=True)
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", target)
    final = os.path.join(directory, "kvpin_watchdog_%s.prom" % safe)
    return write_file_atomically(final, text, ".kvpin_watchdog_")
