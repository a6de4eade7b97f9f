# -*- coding: utf-8 -*-
# Copyright (c) 2026, kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Hostile /metrics pages (issue 39) cannot blind the memory watchdog: each family is parsed and
judged on its own (a bad one is dropped, counted and logged once), the tick's memory sample
always reaches the decision engine, the pages that stay under the 8 MiB body cap but used to
drive the daemon past its unit's MemoryMax are bounded (the daemon runs under that limit here),
and a watchdog whose memory sample keeps failing stops feeding WATCHDOG=1 so systemd restarts it.
Every server listens on 127.0.0.1."""
from __future__ import annotations

import io
import json
import math
import os
import re
import resource
import socket
import subprocess
import sys
import time

import pytest
from attacker_http import raw  # pylint: disable=import-error
import hostile_metrics as hm  # pylint: disable=import-error
from watchdog_program import PROGRAM, ROOT, load_watchdog_program  # pylint: disable=import-error

UNIT_TEMPLATE = os.path.join(ROOT, "roles", "serving_watchdog", "templates", "kvpin-watchdog.service.j2")
KiB = 1024


@pytest.fixture(scope="module")
def wd():
    return load_watchdog_program()


def _proc(root, pid=1, anon_kib=2048):
    d = root / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    (d / "status").write_text("RssAnon:\t%d kB\nVmSwap:\t0 kB\n" % anon_kib)
    (d / "stat").write_text("%d (x) S 0 " % pid + "0 " * 17 + "5 0\n")


def _cfg(wd, tmp_path, url, **over):
    _proc(tmp_path / "proc")
    cfg = dict(wd.DEFAULTS, name="t", pid=1, proc_root=str(tmp_path / "proc"), cgroup_root=str(tmp_path / "none"),
               metrics_url=url + "/metrics", lock_file=str(tmp_path / "l"), textfile_dir=str(tmp_path / "tf"),
               interval_seconds=1)
    cfg.update(over)
    return cfg


def _events(out, event=None):
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    return [r for r in records if event is None or r["event"] == event]


# -- the parser: one family at a time ------------------------------------------------------------
@pytest.mark.parametrize("case", sorted(hm.BAD_FAMILIES))
def test_a_bad_family_is_dropped_alone_with_its_reason(wd, case):
    body, reason = hm.BAD_FAMILIES[case]
    page = wd.exposition.parse_page(body, wd.LATENCY_SAMPLE_NAMES)
    assert [(family, why) for family, why, _detail in page.dropped] == [(hm.TTFT, reason)]
    assert hm.TTFT + "_bucket" not in page.samples
    assert page.samples["vllm:kv_cache_usage_perc"] == [({"model_name": "m"}, 0.5)]   # the sound family stays
    assert reason in wd.exposition.DROP_REASONS


@pytest.mark.parametrize("line, reason", [
    ('vllm:kv_cache_usage_perc{model_name="m"} NaN', "non_finite"),
    ('vllm:kv_cache_usage_perc{model_name="m"} -Inf', "non_finite"),
    ('vllm:num_preemptions_total{model_name="m"} -1', "negative"),
    ('vllm:kv_cache_usage_perc{model_name="m",model_name="n"} 0.5', "malformed"),
    ('vllm:kv_cache_usage_perc{model_name="m"} 1_000', "malformed"),
    ('vllm:kv_cache_usage_perc{model_name="m} 0.5', "malformed"),
    ('vllm:kv_cache_usage_perc', "malformed"),
    ('vllm:kv_cache_usage_perc{model_name="m"} 0.5\nvllm:kv_cache_usage_perc{model_name="m"} 0.6', "duplicate_series"),
])
def test_non_finite_negative_and_garbage_samples_are_rejected(wd, line, reason):
    body = hm.good_page(100).decode().replace('vllm:kv_cache_usage_perc{model_name="m"} 0.5', line)
    page = wd.exposition.parse_page(body, wd.LATENCY_SAMPLE_NAMES)
    family = line.split("{")[0].split(" ")[0]
    assert [(f, why) for f, why, _detail in page.dropped] == [(family, reason)]
    assert family not in page.samples
    assert len(page.samples[hm.TTFT + "_bucket"]) == 5


def test_label_escapes_and_a_brace_inside_a_value_are_read_exactly(wd):
    page = wd.exposition.parse_page(b'x{a="p\\\\q\\"r\\ns",b="}, {"} 1 1700000000000\n  y 2\n# z 3\n')
    assert page.samples == {"x": [({"a": 'p\\q"r\ns', "b": "}, {"}, 1.0)], "y": [({}, 2.0)]}
    assert not page.dropped


def test_the_page_and_what_the_parser_keeps_are_bounded(wd):
    exp = wd.exposition
    refused = exp.parse_page(hm.tiny_samples(exp.MAX_PAGE_LINES + 1), wd.LATENCY_SAMPLE_NAMES)
    assert refused.refused == "too_many_lines" and str(exp.MAX_PAGE_LINES + 1) in refused.detail
    assert not refused.samples
    flood = exp.parse_page(hm.ttft_series_flood(), wd.LATENCY_SAMPLE_NAMES)
    assert [(f, why) for f, why, _detail in flood.dropped] == [(hm.TTFT, "too_many_series")]
    # Two sound families of the most series a name may keep: the page's sample bound holds.
    extra = "".join('vllm:num_preemptions_total{s="%d"} 1\n' % i for i in range(10)).encode()
    both = exp.parse_page(hm.kept_bound_page(exp.MAX_FAMILY_SAMPLES, 10) + extra, wd.LATENCY_SAMPLE_NAMES)
    assert sum(len(v) for v in both.samples.values()) <= exp.MAX_KEPT_SAMPLES
    assert [(f, why) for f, why, _detail in both.dropped] == [("vllm:num_preemptions_total", "too_many_series")]
    # Long label values: the kept bytes bound holds.
    pad = "v" * 3000
    wide = exp.parse_page("".join('vllm:kv_cache_usage_perc{s="%s%d"} 0.5\n' % (pad, i) for i in range(1000)),
                          wd.LATENCY_SAMPLE_NAMES)
    assert [why for _f, why, _detail in wide.dropped] == ["too_many_series"]
    too_long = exp.parse_page('vllm:kv_cache_usage_perc{s="%s"} 0.5\n' % ("v" * exp.MAX_LINE_BYTES),
                              wd.LATENCY_SAMPLE_NAMES)
    assert [why for _f, why, _detail in too_long.dropped] == ["malformed"]


# -- a tick: memory reaches the engine whatever the page holds -----------------------------------
@pytest.mark.parametrize("case", sorted(hm.BAD_FAMILIES))
def test_a_bad_family_never_stops_the_memory_sample_and_is_counted_and_logged_once(wd, attacker, tmp_path, case):
    body, reason = hm.BAD_FAMILIES[case]
    server = attacker({("GET", "/metrics"): raw(200, body)})
    out = io.StringIO()
    daemon = wd.Daemon(_cfg(wd, tmp_path, server.url), out=out)
    for _unused in range(3):
        decision = daemon.tick()
        assert decision.memory_bytes == 2048 * KiB and decision.phase != "collecting"
    assert not _events(out, "error")
    decisions = _events(out, "decision")
    assert all(d["memory_bytes"] == 2048 * KiB for d in decisions) and len(decisions) == 3
    assert decisions[-1]["corroboration"] == {"kv_cache_usage": 0.5}     # the sound family still read
    assert "%s dropped (%s)" % (hm.TTFT, reason) in decisions[-1]["latency_status"]
    logged = _events(out, "metric_family_dropped")
    assert [(e["family"], e["reason"]) for e in logged] == [(hm.TTFT, reason)]     # once, not every tick
    prom = (tmp_path / "tf" / "kvpin_watchdog_t.prom").read_text()
    assert 'kvpin_watchdog_metric_families_dropped_total{target="t",family="%s",reason="%s"} 3' % (
        hm.TTFT, reason) in prom
    assert prom.count("# TYPE kvpin_watchdog_metric_families_dropped_total counter") == 1
    assert "kvpin_watchdog_last_memory_sample_timestamp_seconds" in prom


def test_a_latency_sensor_that_raises_still_lets_memory_through(wd, attacker, tmp_path, monkeypatch):
    server = attacker({("GET", "/metrics"): raw(200, hm.good_page(100))})
    out = io.StringIO()
    daemon = wd.Daemon(_cfg(wd, tmp_path, server.url), out=out)

    def broken(*_args, **_kwargs):
        raise OverflowError("cannot convert float infinity to integer")
    monkeypatch.setattr(daemon.latency, "sample", broken)
    decision = daemon.tick()
    assert decision.memory_bytes == 2048 * KiB
    assert "latency sensor failed: OverflowError" in _events(out, "decision")[-1]["latency_status"]


# -- the daemon under its own unit's memory limit --------------------------------------------------
def unit_memory_max():
    """MemoryMax= of the watchdog's unit template, in bytes."""
    with open(UNIT_TEMPLATE, encoding="utf-8") as handle:
        found = re.search(r"^MemoryMax=(\d+)([KMGT]?)\s*$", handle.read(), re.M)
    assert found, "no MemoryMax= in %s" % UNIT_TEMPLATE
    return int(found.group(1)) * 1024 ** " KMGT".index(found.group(2) or " ")


def _rotating(pages, each=2):
    """A route serving each page `each` times in turn, then the last one forever."""
    served = []

    def route(_request):
        index = min(len(served) // each, len(pages) - 1)
        served.append(index)
        return raw(200, pages[index])
    return route, served


def _vm(pid, field):
    with open("/proc/%d/status" % pid, encoding="ascii") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * KiB
    return None


def test_the_daemon_survives_the_big_pages_under_its_units_memory_limit(attacker, tmp_path):
    """The daemon (a real process) under its unit's MemoryMax, applied as RLIMIT_AS: the host
    here has no cgroup v2 memory controller to give a child memory.max (cgroup v1 memory, and a
    v2 hierarchy without controllers). RLIMIT_AS is the stricter bound (address space >= what
    a cgroup charges); MALLOC_ARENA_MAX=1 keeps glibc from reserving 64 MiB of address space
    for the tick thread's own malloc arena, which a cgroup never charges."""
    limit = unit_memory_max()
    pages = [fn() for fn in hm.BIG_PAGES.values()] + [hm.kept_bound_page(), hm.good_page(100)]
    route, served = _rotating(pages)
    server = attacker({("GET", "/metrics"): route})
    _proc(tmp_path / "proc")
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"name": "t", "pid": 1, "proc_root": str(tmp_path / "proc"),
                               "cgroup_root": str(tmp_path / "none"), "interval_seconds": 1,
                               "metrics_url": server.url + "/metrics", "lock_file": str(tmp_path / "l")}))
    env = dict(os.environ, MALLOC_ARENA_MAX="1")
    env.pop("NOTIFY_SOCKET", None)
    proc = subprocess.Popen([sys.executable, PROGRAM, "daemon", "--config", str(cfg)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)))
    try:
        end = time.monotonic() + 90
        while len(served) < 2 * (len(pages) - 1) + 1 and time.monotonic() < end and proc.poll() is None:
            time.sleep(0.2)
        time.sleep(1.5)      # the last tick's decision is written
        peak = _vm(proc.pid, "VmHWM") if proc.poll() is None else None
        proc.terminate()
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr[-2000:]
    assert len(served) >= 2 * (len(pages) - 1) + 1, "the daemon stopped scraping: %s" % stderr[-2000:]
    events = [json.loads(line) for line in stdout.splitlines()]
    assert not [e for e in events if e["event"] == "error"], stdout[-2000:]
    decisions = [e for e in events if e["event"] == "decision"]
    assert len(decisions) >= len(served) - 1
    assert all(d["memory_bytes"] == 2048 * KiB for d in decisions)
    said = [(e["event"], e["reason"]) for e in events if e["event"] in ("metric_family_dropped", "metrics_page_refused")]
    assert said == [("metrics_page_refused", "too_many_lines"), ("metric_family_dropped", "too_many_series")]
    assert peak is not None and peak < limit


# -- liveness: a blind watchdog stops feeding systemd ---------------------------------------------
def test_no_memory_sample_for_memory_blind_seconds_starves_watchdog_and_sight_restores_it(tmp_path):
    (tmp_path / "proc").mkdir()        # pid 1 has no readable status: no memory sample
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"name": "t", "pid": 1, "proc_root": str(tmp_path / "proc"),
                               "cgroup_root": str(tmp_path / "none"), "interval_seconds": 1,
                               "memory_blind_seconds": 3, "watchdog_sec": 10, "lock_file": str(tmp_path / "l")}))
    notify = str(tmp_path / "n.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(notify)
    sock.settimeout(0.2)
    feeds = []
    proc = subprocess.Popen([sys.executable, PROGRAM, "daemon", "--config", str(cfg)],
                            env=dict(os.environ, NOTIFY_SOCKET=notify), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)

    def listen(seconds):
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            try:
                if sock.recv(4096).startswith(b"WATCHDOG=1"):
                    feeds.append(time.monotonic())
            except socket.timeout:
                pass
    try:
        start = time.monotonic()
        listen(8.0)
        restored_at = time.monotonic()
        _proc(tmp_path / "proc")       # the memory can be read again
        listen(4.0)
        proc.terminate()
        stdout, stderr = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
        sock.close()
    assert proc.returncode == 0, stderr
    blind_phase = [t for t in feeds if t < restored_at]
    assert blind_phase and blind_phase[0] - start < 3.0        # fed at first
    assert restored_at - blind_phase[-1] >= 3.0                # then starved, blind
    assert [t for t in feeds if t > restored_at + 0.5]          # fed again once memory is read
    events = [json.loads(line) for line in stdout.splitlines()]
    blind = [e for e in events if e["event"] == "blind"]
    assert len(blind) == 1 and blind[0]["limit_seconds"] == 3 and "systemd restarts" in blind[0]["detail"]
    assert [e for e in events if e["event"] == "sight_restored"]


class _NoInstanceHere:
    """A deployment sensor whose API answers: no instance of the deployment on this worker."""

    def sample(self, _deadline):
        return {"memory_bytes": None, "source": "none", "restarted": False, "per_process": {}, "cgroup": None,
                "instance": None, "limit": None, "limit_source": "none", "status": "no instance of m on worker w"}

    def metrics_url(self):
        return None


def test_blind_only_when_memory_fails_not_when_there_is_nothing_to_watch(wd, tmp_path):
    cfg = dict(wd.DEFAULTS, name="t", pid=1, proc_root=str(tmp_path / "empty"), cgroup_root=str(tmp_path / "none"),
               memory_blind_seconds=120, lock_file=str(tmp_path / "l"))
    out = io.StringIO()
    daemon = wd.Daemon(cfg, out=out)
    daemon.tick()
    assert daemon.healthy()
    daemon.memory_seen_at -= 121           # two minutes without a sample
    assert not daemon.healthy()
    daemon.tick()
    assert [e["event"] for e in _events(out)].count("blind") == 1 and not daemon.healthy()
    _proc(tmp_path / "empty")
    daemon.tick()
    assert daemon.healthy() and _events(out)[-1]["event"] == "decision"
    never = wd.Daemon(dict(cfg, memory_blind_seconds=0), out=io.StringIO())
    never.memory_seen_at -= 10 ** 6
    assert never.healthy()
    # A deployment with no instance on this worker: nothing to watch, so not blind.
    absent = wd.Daemon(cfg, out=io.StringIO())
    absent.deployment = _NoInstanceHere()
    absent.memory_seen_at -= 121
    absent.tick()
    assert absent.healthy()


def test_check_config_bounds_memory_blind_seconds(wd):
    base = dict(wd.DEFAULTS, pid=1)
    assert not wd.validate_config(base)
    assert not wd.validate_config(dict(base, memory_blind_seconds=0))
    errors = wd.validate_config(dict(base, interval_seconds=60, memory_blind_seconds=90))
    assert errors == ["memory_blind_seconds (90 s) must be 0 (never) or at least two intervals "
                      "(2 x interval_seconds = 120 s): one failed sample is no blindness"]
    assert wd.validate_config(dict(base, memory_blind_seconds=math.nan)) == [
        "memory_blind_seconds must be finite, got nan"]
    assert wd.validate_config(dict(base, memory_blind_seconds="15m")) == [
        "memory_blind_seconds must be a number, got str"]
