# -*- coding: utf-8 -*-
# Copyright (c) 2026, kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Counter resets (issue 38, item 3): an engine restart resets its counters, and the watchdog
counts the new values as the increase since the restart, as Prometheus' rate() does, for the
TTFT histogram and the preemptions counter; a restart the watchdog confirms itself (a new
process, GPUStack's restart_count) counts even when no count fell. A restart mid-window neither
loses nor doubles a count."""
from __future__ import annotations

import io
import json
import math

import pytest

INF = math.inf
# Observations per scrape interval, cumulative per le (0.5, 1.0, +Inf): 30 before the restart,
# 40 in the restarted engine's first interval, 35 in its second.
BEFORE_DELTA = {0.5: 18.0, 1.0: 21.0, INF: 30.0}
NEW_FIRST = {0.5: 20.0, 1.0: 30.0, INF: 40.0}
NEW_SECOND = {0.5: 40.0, 1.0: 60.0, INF: 75.0}
EXPECTED = {0.5: 18.0 + 40.0, 1.0: 21.0 + 60.0, INF: 30.0 + 75.0}     # 105 observations, each once


def _plus(counts, delta):
    return {le: counts[le] + delta[le] for le in counts}


@pytest.mark.parametrize("how", ["counts fall", "restart confirmed, no count fell", "confirmed a scrape late"])
def test_a_restart_mid_window_neither_loses_nor_doubles_counts(wd, how):
    # "no count fell": the old engine had served fewer requests than the new one by its first
    # scrape, so only the watchdog's own confirmation (pid, restart_count) shows the reset.
    old = {0.5: 2.0, 1.0: 3.0, INF: 4.0} if how == "restart confirmed, no count fell" else \
        {0.5: 200.0, 1.0: 300.0, INF: 400.0}
    win = wd.HistogramWindow(0.95, min_observations=100, max_window_seconds=900)
    assert win.update(0, old) is None
    assert win.update(60, _plus(old, BEFORE_DELTA)) is None
    if how == "restart confirmed, no count fell":
        win.note_restart()
    assert win.update(120, NEW_FIRST) is None
    assert "accumulating (70 observations)" in win.last_status and "restart" in win.last_status
    if how == "confirmed a scrape late":
        win.note_restart()        # the same restart, seen by the memory sensor one tick later
    p95 = win.update(180, NEW_SECOND)
    assert win.last_status.startswith("ok (105 observations)")
    assert p95 == pytest.approx(wd.bucket_quantile(0.95, EXPECTED))


def test_resets_are_per_series_and_a_new_series_only_sets_its_baseline(wd):
    win = wd.HistogramWindow(0.95, min_observations=1000)
    win.update(0, {("e0",): {1.0: 100.0, INF: 100.0}, ("e1",): {1.0: 50.0, INF: 60.0}})
    win.update(60, {("e0",): {1.0: 110.0, INF: 110.0},       # +10
                    ("e1",): {1.0: 5.0, INF: 7.0},            # reset: 7 since
                    ("e2",): {1.0: 500.0, INF: 500.0}})       # new: baseline only
    assert win.acc == {1.0: 15.0, INF: 17.0}
    # A series missing from one scrape keeps its counts: no double count when it is back.
    win.update(120, {("e0",): {1.0: 111.0, INF: 111.0}})
    win.update(180, {("e0",): {1.0: 111.0, INF: 111.0}, ("e1",): {1.0: 6.0, INF: 8.0},
                     ("e2",): {1.0: 502.0, INF: 502.0}})
    assert win.acc == {1.0: 15.0 + 1 + 1 + 2, INF: 17.0 + 1 + 1 + 2}


def _page(counts, preemptions=None):
    lines = ['vllm:time_to_first_token_seconds_bucket{le="%s"} %s' % ("+Inf" if le == INF else le, c)
             for le, c in sorted(counts.items())]
    if preemptions is not None:
        lines.append("vllm:num_preemptions_total %s" % preemptions)
    return "\n".join(lines) + "\n"


def test_the_preemptions_counter_is_a_running_total_across_restarts(wd):
    sensor = wd.LatencySensor(dict(wd.DEFAULTS, ttft_min_observations=1000))
    got = []
    for raw, confirmed in ((7, False), (9, False), (3, False), (5, False), (8, True), (2, False)):
        if confirmed:
            sensor.note_restart()       # a restart whose new counter (8) is above the old one (5)
        got.append(sensor.from_text(0.0, _page(NEW_FIRST, raw))["preemptions"])
    assert got == [7.0, 9.0, 12.0, 14.0, 22.0, 24.0]


def _proc(root, start):
    d = root / "100"
    d.mkdir(parents=True, exist_ok=True)
    (d / "status").write_text("RssAnon:\t4096 kB\nVmSwap:\t0 kB\n")
    (d / "stat").write_text("100 (vllm) S 0 " + "0 " * 17 + "%d 0\n" % start)


def _statuses(out):
    return [json.loads(line).get("latency_status") for line in out.getvalue().splitlines()
            if '"event":"decision"' in line]


def test_a_restart_the_memory_sensor_sees_counts_the_new_engine_from_zero(wd, tmp_path, engine):
    handler, url = engine
    _proc(tmp_path / "proc", start=5)
    cfg = dict(wd.DEFAULTS, name="t", pid=100, proc_root=str(tmp_path / "proc"), cgroup_root=str(tmp_path / "none"),
               metrics_url=url + "/metrics", lock_file=str(tmp_path / "l"), ttft_min_observations=1000)
    out = io.StringIO()
    daemon = wd.Daemon(cfg, out=out)
    old = {0.5: 2.0, 1.0: 3.0, INF: 4.0}
    for counts in (old, _plus(old, BEFORE_DELTA)):
        handler.body = _page(counts).encode()
        daemon.tick()
    _proc(tmp_path / "proc", start=9000)       # the engine process was replaced
    handler.body = _page(NEW_FIRST).encode()
    daemon.tick()
    handler.body = _page(NEW_SECOND).encode()
    daemon.tick()
    statuses = _statuses(out)
    assert "engine restarted" in statuses[2] and "accumulating (70 observations)" in statuses[2]
    assert "accumulating (105 observations)" in statuses[3]


class _Deployment:
    """A GPUStack deployment sensor whose instance keeps its pid and port while GPUStack's
    restart_count moves (a container restarted in place)."""

    def __init__(self, wd, url):
        self.wd, self.url, self.restart_count = wd, url, 0

    def sample(self, _deadline):
        inst = self.wd.Instance(id=1, name="m-1", state="running", pid=100, port=1, gpu_indexes=[0],
                                worker_ip="127.0.0.1", restart_count=self.restart_count)
        return {"memory_bytes": 4 << 20, "source": "test", "restarted": False, "per_process": {}, "cgroup": None,
                "instance": inst, "limit": None, "limit_source": "none", "status": "ok"}

    def metrics_url(self):
        return self.url + "/metrics"


def test_gpustack_restart_count_confirms_a_restart(wd, tmp_path, engine):
    handler, url = engine
    cfg = dict(wd.DEFAULTS, name="t", pid=100, lock_file=str(tmp_path / "l"), ttft_min_observations=1000)
    out = io.StringIO()
    daemon = wd.Daemon(cfg, out=out)
    daemon.deployment = _Deployment(wd, url)
    old = {0.5: 2.0, 1.0: 3.0, INF: 4.0}
    for counts in (old, _plus(old, BEFORE_DELTA)):
        handler.body = _page(counts).encode()
        daemon.tick()
    daemon.deployment.restart_count = 1
    handler.body = _page(NEW_FIRST).encode()
    daemon.tick()
    assert "engine restarted" in _statuses(out)[-1] and "accumulating (70 observations)" in _statuses(out)[-1]
