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
import os
import subprocess
import sys

import pytest

from conftest import PROGRAM  # pylint: disable=import-error
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


def test_tick_deadline_stays_below_half_of_watchdog_sec(wd):
    assert wd.tick_deadline(dict(wd.DEFAULTS, watchdog_sec=20)) == 9.0
    assert wd.tick_deadline(dict(wd.DEFAULTS, watchdog_sec=180)) == wd.DEFAULTS["tick_deadline_seconds"]
    assert wd.tick_deadline(dict(wd.DEFAULTS)) == wd.DEFAULTS["tick_deadline_seconds"]
