# -*- coding: utf-8 -*-
# Copyright (c) 2026, kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The daemon measures traffic on the node (issue 36.2): the /metrics page its latency sensor
scrapes is also read by measure.TrafficRecorder. Served on loopback from the pages recorded
from a real vLLM 0.32.0 (tests/fixtures/engine_measure/): the daemon's figures equal what was
sent; an engine restart and a watchdog restart (state file) neither lose nor double traffic; a
page without length histograms, a hostile state file or an unwritable one are noted, never an
error, and the memory signal goes on; the figures are exported as metrics; `measure --state`
prints a saved window; check-config refuses bad traffic settings."""
from __future__ import annotations

import importlib
import io
import json
import os
import subprocess
import sys

import pytest

from watchdog_program import PROGRAM, ROOT, FixedClock as Clock

REAL = os.path.join(ROOT, "tests", "fixtures", "engine_measure", "vllm_cpu_0.32.0")
PAGES = [os.path.join(REAL, name) for name in (
    "metrics_1_before_traffic.txt", "metrics_2_during_traffic.txt", "metrics_3_after_traffic.txt",
    "metrics_4_after_restart.txt")]
T0 = 1796540400.0   # 2026-12-06T07:00:00Z


def read(path):
    with open(path, "rb") as handle:
        return handle.read()


def _proc(root, start):
    d = root / "100"
    d.mkdir(parents=True, exist_ok=True)
    (d / "status").write_text("RssAnon:\t4096 kB\nVmSwap:\t0 kB\n")
    (d / "stat").write_text("100 (vllm) S 0 " + "0 " * 17 + "%d 0\n" % start)


def _cfg(wd, tmp_path, url, **over):
    _proc(tmp_path / "proc", start=5)
    cfg = dict(wd.DEFAULTS, name="tiny", pid=100, proc_root=str(tmp_path / "proc"),
               cgroup_root=str(tmp_path / "none"), metrics_url=url + "/metrics", lock_file=str(tmp_path / "l"),
               textfile_dir=str(tmp_path / "textfile"), traffic_state_file=str(tmp_path / "traffic.json"))
    cfg.update(over)
    return cfg


def _tick_pages(daemon, handler, clock, pages, step=60.0):
    for path in pages:
        handler.body = read(path)
        daemon.tick()
        clock.t += step


def _events(out, event):
    return [json.loads(line) for line in out.getvalue().splitlines() if '"event":"%s"' % event in line]


def test_the_daemon_measures_what_the_real_engine_served(wd, tmp_path, engine):
    handler, url = engine
    clock = Clock(T0)
    out = io.StringIO()
    daemon = wd.Daemon(_cfg(wd, tmp_path, url), out=out, clock=clock)
    _tick_pages(daemon, handler, clock, PAGES)
    summary = daemon.state["traffic"]
    truth = json.loads(read(os.path.join(REAL, "truth.json")))
    answered = [r for r in truth["before_restart"] + truth["after_restart"] if r["status"] == 200]
    assert summary["requests"] == len(answered) == 42          # the restart neither lost nor doubled
    assert summary["restarts_seen"] == 1 and summary["rejected"] == 1
    assert summary["max_concurrency"] == 3 and summary["kv_cache_tokens"] == 524288
    assert handler.hits == 4                                   # one request per tick: the latency scrape's
    # the figures are in the textfile, as metrics
    text = (tmp_path / "textfile" / "kvpin_watchdog_tiny.prom").read_text()
    assert 'kvpin_watchdog_traffic_requests{target="tiny",window_days="7"} 42' in text
    assert 'kvpin_watchdog_traffic_tokens_p99_upper{target="tiny",window_days="7",lengths="prompt"} 2048' in text
    assert 'kvpin_watchdog_engine_kv_cache_tokens{target="tiny"} 524288' in text
    assert 'kvpin_watchdog_traffic_enough_requests{target="tiny",window_days="7"} 0' in text
    assert "kvpin_watchdog_traffic_tokens_p99_upper_95{" not in text     # 42 requests: no 95 % bound yet
    assert _events(out, "decision")                           # the memory signal went on as before


def test_pages_are_measured_at_most_every_traffic_scrape_seconds(wd, tmp_path, engine):
    handler, url = engine
    clock = Clock(T0)
    daemon = wd.Daemon(_cfg(wd, tmp_path, url, traffic_scrape_seconds=120), out=io.StringIO(), clock=clock)
    _tick_pages(daemon, handler, clock, PAGES[:3], step=60.0)   # t0, t0+60 (skipped), t0+120
    assert daemon.traffic.acc.scrapes == 2
    assert daemon.state["traffic"]["requests"] == 37            # page 3 against page 1: nothing lost


def test_a_watchdog_restart_keeps_the_window_through_the_state_file(wd, tmp_path, engine):
    handler, url = engine
    clock = Clock(T0)
    cfg = _cfg(wd, tmp_path, url)
    first = wd.Daemon(cfg, out=io.StringIO(), clock=clock)
    _tick_pages(first, handler, clock, PAGES[:2])
    first.traffic.save()                                       # what run() does when it stops
    saved = json.loads((tmp_path / "traffic.json").read_text())
    assert saved["format"] == "kvpin-traffic/1" and saved["scrapes"] == 2
    second = wd.Daemon(cfg, out=io.StringIO(), clock=clock)    # a new watchdog process
    assert second.state.get("traffic") is None and second.traffic.summary["requests"] == 16
    _tick_pages(second, handler, clock, PAGES[2:])
    assert second.state["traffic"]["requests"] == 42 and second.state["traffic"]["restarts_seen"] == 1


def test_an_engine_restart_the_memory_sensor_sees_resets_the_baseline(wd, tmp_path, engine):
    """The page alone may not show a restart (no start time, counters above the old ones): the
    daemon's own restart signal makes the new page's counts the increase since the restart."""
    ms = importlib.import_module("kvpin_watchdog_lib.measure")
    handler, url = engine
    clock = Clock(T0)
    daemon = wd.Daemon(_cfg(wd, tmp_path, url), out=io.StringIO(), clock=clock)

    def body(count):
        lines = ["# TYPE vllm:request_prompt_tokens histogram"]
        lines += ['vllm:request_prompt_tokens_bucket{le="%s"} %d' % (le, count) for le in ("16.0", "+Inf")]
        lines += ["vllm:request_prompt_tokens_count %d" % count, "vllm:request_prompt_tokens_sum %d" % count]
        return ("\n".join(lines) + "\n").encode()

    for count in (0, 10):
        handler.body = body(count)
        daemon.tick()
        clock.t += 60
    _proc(tmp_path / "proc", start=9000)                      # a new engine process, 25 requests served
    handler.body = body(25)
    daemon.tick()
    assert daemon.traffic.acc.summary()["requests"] == 10 + 25
    assert daemon.traffic.acc.last_reset_reason.startswith("the engine restarted")
    assert isinstance(daemon.traffic.acc, ms.TrafficAccumulator)


def test_a_page_without_length_histograms_is_noted_once_and_memory_goes_on(wd, tmp_path, engine):
    handler, url = engine
    clock = Clock(T0)
    out = io.StringIO()
    daemon = wd.Daemon(_cfg(wd, tmp_path, url), out=out, clock=clock)
    handler.body = b"# llama-box: metrics without length histograms\nllamacpp:prompt_tokens_total 12\n"
    for _tick in range(3):
        daemon.tick()
        clock.t += 60
    notes = _events(out, "traffic")
    assert len(notes) == 1 and "no vllm:request_prompt_tokens" in notes[0]["detail"]
    assert daemon.traffic.unusable == 3 and len(_events(out, "decision")) == 3
    text = (tmp_path / "textfile" / "kvpin_watchdog_tiny.prom").read_text()
    assert 'kvpin_watchdog_traffic_pages_unusable_total{target="tiny"} 3' in text
    assert "kvpin_watchdog_traffic_requests" not in text
    assert not (tmp_path / "traffic.json").exists()


@pytest.mark.parametrize("content, note", [
    (b"not json", "not JSON"),
    (b'{"format": "kvpin-traffic/1", "window_days": 7, "scrapes": -1}', "scrapes must be a whole number"),
    (b'{"format": "other"}', "format must be"),
    (b'{"format": "kvpin-traffic/1", "window_days": 1e300}', "window_days"),
    (b"x" * (5 << 20), "larger than"),
], ids=["not-json", "negative-count", "other-format", "huge-window", "5-MiB"])
def test_a_bad_state_file_is_a_note_and_measuring_starts_afresh(wd, tmp_path, engine, content, note):
    handler, url = engine
    (tmp_path / "traffic.json").write_bytes(content)
    clock = Clock(T0)
    out = io.StringIO()
    daemon = wd.Daemon(_cfg(wd, tmp_path, url), out=out, clock=clock)
    _tick_pages(daemon, handler, clock, PAGES[:2])
    notes = _events(out, "traffic")
    assert len(notes) == 1 and note in notes[0]["detail"] and "measuring from now" in notes[0]["detail"]
    assert daemon.state["traffic"]["requests"] == 16
    # replaced by a good one at the first measured page (then every traffic_save_seconds)
    assert json.loads((tmp_path / "traffic.json").read_text())["scrapes"] == 1


def test_traffic_measure_false_measures_nothing(wd, tmp_path, engine):
    handler, url = engine
    clock = Clock(T0)
    daemon = wd.Daemon(_cfg(wd, tmp_path, url, traffic_measure=False), out=io.StringIO(), clock=clock)
    _tick_pages(daemon, handler, clock, PAGES[:2])
    assert daemon.state["traffic"] is None and daemon.traffic.acc.scrapes == 0
    assert not (tmp_path / "traffic.json").exists()


def test_cli_measure_state_prints_the_saved_window(wd, tmp_path, engine):
    handler, url = engine
    clock = Clock(T0)
    daemon = wd.Daemon(_cfg(wd, tmp_path, url), out=io.StringIO(), clock=clock)
    _tick_pages(daemon, handler, clock, PAGES)
    daemon.traffic.save()
    proc = subprocess.run([sys.executable, PROGRAM, "measure", "--state", str(tmp_path / "traffic.json")],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["requests"] == 42 and result["state_file"] == str(tmp_path / "traffic.json")
    (tmp_path / "bad.json").write_text('{"format": "kvpin-traffic/1", "window_days": "7"}')
    proc = subprocess.run([sys.executable, PROGRAM, "measure", "--state", str(tmp_path / "bad.json")],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2 and "window_days" in proc.stderr and "Traceback" not in proc.stderr


# The real engine's two starts (process_start_time_seconds of the recorded pages).
ENGINE_1_START = 1796541382.52
ENGINE_2_START = 1796541451.05
CONTEXT = {"gpu": "NVIDIA L40S", "backend_version": "0.32.0",
           "args": ["--max-model-len", "4096", "--max-num-seqs", "8", "--gpu-memory-utilization", "0.92"]}


def _measuring(wd, tmp_path, url, context="the plan's", **over):
    context = CONTEXT if context == "the plan's" else context
    over.setdefault("measurement_file", str(tmp_path / "measurement.json"))
    return _cfg(wd, tmp_path, url, measurement_context=context, **over)


def _measurement(tmp_path):
    return json.loads((tmp_path / "measurement.json").read_text())


def test_the_measurement_file_is_what_serving_plan_reads(wd, tmp_path, engine):
    """Written with the state, in serving_plan's `measurement` shape: the planner's own check
    accepts it, and its figures are the daemon's."""
    from ansible_collections.kvpin.fleet.plugins.module_utils.plan import measured_traffic

    handler, url = engine
    clock = Clock(T0)                          # the watchdog (and its context) before the engine
    daemon = wd.Daemon(_measuring(wd, tmp_path, url), out=io.StringIO(), clock=clock)
    _tick_pages(daemon, handler, clock, PAGES)
    daemon.traffic.save()
    written = _measurement(tmp_path)
    assert sorted(written) == sorted(measured_traffic.MEASUREMENT_KEYS)
    checked = measured_traffic.check_measurement(written)
    assert checked["traffic"]["requests"] == 42 and checked["traffic"]["rejected"] == 1
    assert checked["traffic"]["max_concurrency"] == 3 and checked["hours"]
    assert checked["kv_pool"]["kv_cache_tokens"] == 524288
    assert (checked["gpu"], checked["backend_version"], checked["args"]) == (
        CONTEXT["gpu"], CONTEXT["backend_version"], CONTEXT["args"])
    assert written["measured_at"] == "2026-12-06T07:04:00Z"


def test_a_pool_from_an_engine_older_than_the_context_is_not_attributed(wd, tmp_path, engine):
    """The watchdog got this plan's context after the engine started (a replan: the role rewrites
    the watchdog before GPUStack restarts the engine): that engine may run other args, so its
    pool goes home without card, version and args (the planner then never resizes on it); the
    engine started after the context (the restart, page 4) is attributed."""
    handler, url = engine
    clock = Clock(ENGINE_1_START + 10)
    daemon = wd.Daemon(_measuring(wd, tmp_path, url), out=io.StringIO(), clock=clock)
    _tick_pages(daemon, handler, clock, PAGES[:3])             # the first engine, started before
    written = _measurement(tmp_path)
    assert written["kv_pool"]["kv_cache_tokens"] == 524288
    assert (written["gpu"], written["backend_version"], written["args"]) == (None, None, None)
    _tick_pages(daemon, handler, clock, PAGES[3:])             # the engine restarted under the context
    daemon.traffic.save()
    written = _measurement(tmp_path)
    assert written["args"] == CONTEXT["args"] and written["gpu"] == CONTEXT["gpu"]


def test_a_watchdog_restart_keeps_the_attribution_and_a_new_context_does_not_take_it(wd, tmp_path, engine):
    handler, url = engine
    clock = Clock(T0)
    first = wd.Daemon(_measuring(wd, tmp_path, url), out=io.StringIO(), clock=clock)
    _tick_pages(first, handler, clock, PAGES[:2])
    first.traffic.save()
    # The same plan, the watchdog restarted long after the engine: the engine keeps its context.
    clock.t = ENGINE_1_START + 600
    same = wd.Daemon(_measuring(wd, tmp_path, url), out=io.StringIO(), clock=clock)
    _tick_pages(same, handler, clock, PAGES[2:3])
    same.traffic.save()
    assert _measurement(tmp_path)["args"] == CONTEXT["args"]
    # A replan (other args) while the same engine still runs: the pool stays the old args'.
    replanned = dict(CONTEXT, args=["--max-model-len", "2048", "--max-num-seqs", "16"])
    clock.t += 60
    new = wd.Daemon(_measuring(wd, tmp_path, url, context=replanned), out=io.StringIO(), clock=clock)
    handler.body = read(PAGES[2])
    new.tick()
    new.traffic.save()
    assert _measurement(tmp_path)["args"] == CONTEXT["args"]
    assert new.traffic.acc.context["args"] == replanned["args"]


def test_without_a_context_the_pool_goes_home_unattributed(wd, tmp_path, engine):
    handler, url = engine
    clock = Clock(T0)
    daemon = wd.Daemon(_measuring(wd, tmp_path, url, context=None), out=io.StringIO(), clock=clock)
    _tick_pages(daemon, handler, clock, PAGES)
    daemon.traffic.save()
    written = _measurement(tmp_path)
    assert written["kv_pool"]["kv_cache_tokens"] == 524288 and written["args"] is None


@pytest.mark.parametrize("which, note", [
    ("traffic_state_file", "traffic state file"), ("measurement_file", "measurement file")])
def test_an_unwritable_state_or_measurement_file_is_a_note(wd, tmp_path, engine, which, note):
    handler, url = engine
    clock = Clock(T0)
    out = io.StringIO()
    daemon = wd.Daemon(_measuring(wd, tmp_path, url, **{which: str(tmp_path / "missing" / "t.json")}),
                       out=out, clock=clock)
    _tick_pages(daemon, handler, clock, PAGES[:2])
    notes = _events(out, "traffic")
    assert len(notes) == 1 and note in notes[0]["detail"] and "not written" in notes[0]["detail"]
    assert daemon.state["traffic"]["requests"] == 16


@pytest.mark.parametrize("content, note", [
    (b'{"format": "kvpin-traffic/1", "window_days": 7, "scrapes": 0, "restarts_seen": 0, '
     b'"requests_before_first_scrape": 0, "slots": [], "kv_pool_context": {"args": "--max-num-seqs 8"}}',
     "kv_pool_context"),
    (b'{"format": "kvpin-traffic/1", "window_days": 7, "scrapes": 0, "restarts_seen": 0, '
     b'"requests_before_first_scrape": 0, "slots": [], "kv_pool_start_time": -5}', "kv_pool_start_time"),
    (b'{"format": "kvpin-traffic/1", "window_days": 7, "scrapes": 0, "restarts_seen": 0, '
     b'"requests_before_first_scrape": 0, "slots": [], "context": {"gpu": "x"}}', "context"),
], ids=["args-not-a-list", "negative-start", "context-without-since"])
def test_a_bad_attribution_in_the_state_file_is_a_note(wd, tmp_path, engine, content, note):
    handler, url = engine
    (tmp_path / "traffic.json").write_bytes(content)
    out = io.StringIO()
    daemon = wd.Daemon(_measuring(wd, tmp_path, url), out=out, clock=Clock(T0))
    handler.body = read(PAGES[0])
    daemon.tick()
    notes = _events(out, "traffic")
    assert len(notes) == 1 and note in notes[0]["detail"] and "measuring from now" in notes[0]["detail"]
    assert daemon.traffic.acc.scrapes == 1 and _measurement(tmp_path)["kv_pool"]["kv_cache_tokens"] == 524288


@pytest.mark.parametrize("key, value, message", [
    ("measurement_file", "", "measurement_file"),
    ("measurement_context", ["gpu"], "measurement_context must be a mapping"),
    ("measurement_context", {"gpu": "x", "host": "y"}, "measurement_context must be a mapping"),
    ("measurement_context", {"gpu": "a\nb"}, "measurement_context.gpu"),
    ("measurement_context", {"backend_version": 32}, "measurement_context.backend_version"),
    ("measurement_context", {"args": "--max-num-seqs 8"}, "measurement_context.args"),
    ("measurement_context", {"args": ["x" * 5000]}, "measurement_context.args"),
    ("traffic_window_days", 0, "traffic_window_days"),
    ("traffic_window_days", 30, "traffic_window_days"),
    ("traffic_window_days", 1.5, "traffic_window_days"),
    ("traffic_scrape_seconds", 0, "traffic_scrape_seconds"),
    ("traffic_save_seconds", "5m", "traffic_save_seconds"),
    ("traffic_measure", "yes", "traffic_measure must be true or false"),
    ("traffic_state_file", "", "traffic_state_file"),
])
def test_check_config_refuses_bad_traffic_settings(wd, key, value, message):
    cfg = dict(wd.DEFAULTS, name="t", pid=1)
    cfg[key] = value
    errors = wd.validate_config(cfg)
    assert any(message in e for e in errors), errors
