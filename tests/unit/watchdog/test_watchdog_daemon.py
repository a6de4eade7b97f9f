# -*- coding: utf-8 -*-
# Copyright (c) 2026, kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Daemon edges: cgroup/proc sensors, actuators (fake systemctl/podman on PATH, GPUStack API
on 127.0.0.1), the recycle lock, sd_notify, textfile metrics, the daemon loop under SIGTERM."""
from __future__ import annotations

import fcntl
import http.server
import io
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time

import pytest

from watchdog_program import PROGRAM  # pylint: disable=import-error

MiB = 1024 * 1024
GiB = 1024 * MiB

FAKE_TOOL = """#!/bin/sh
# Test double for systemctl/podman/docker: records argv, answers `show -p ControlGroup`.
echo "$(basename "$0") $*" >> "{log}"
if [ "$1" = "show" ]; then echo "{cgroup}"; fi
if [ "$1" = "inspect" ]; then echo "{pid}"; fi
exit 0
"""


@pytest.fixture
def fake_path(tmp_path, monkeypatch):
    """A bin dir first on PATH holding recording fakes of systemctl, podman and docker."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "argv.log"
    for tool in ("systemctl", "podman", "docker"):
        script = bindir / tool
        script.write_text(FAKE_TOOL.format(log=log, cgroup="/system.slice/vllm.service", pid=4242))
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", "%s:%s" % (bindir, os.environ.get("PATH", "")))
    return log


def _argv(log):
    return log.read_text().splitlines() if log.exists() else []


class _Recorder(http.server.BaseHTTPRequestHandler):
    requests = []
    status = 200
    body = b"{}"

    def _handle(self):
        length = int(self.headers.get("Content-Length") or 0)
        data = self.rfile.read(length) if length else b""
        type(self).requests.append((self.command, self.path, dict(self.headers), data))
        self.send_response(type(self).status)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        self.wfile.write(type(self).body)

    do_GET = do_POST = do_DELETE = _handle

    def log_message(self, *_args):
        pass


@pytest.fixture
def http_server():
    """An HTTP server on 127.0.0.1 (never another address) that records requests."""
    handler = type("Handler", (_Recorder,), {"requests": [], "status": 200, "body": b"{}"})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield handler, "http://127.0.0.1:%d" % server.server_address[1]
    server.shutdown()
    server.server_close()


def _cfg(wd, tmp_path, **over):
    cfg = dict(wd.DEFAULTS, name="vllm-a", lock_file=str(tmp_path / "lock" / "recycle.lock"))
    cfg.update(over)
    return cfg


# -- actuators ---------------------------------------------------------------
def test_recycle_command_construction(wd):
    assert wd.recycle_command({"actuator": "systemd", "unit": "gpustack.service"}) == [
        "systemctl", "restart", "gpustack.service"]
    assert wd.recycle_command({"actuator": "docker", "container": "vllm-7"}) == [
        "docker", "restart", "vllm-7"]
    assert wd.recycle_command({"actuator": "gpustack"}) is None


def test_systemd_actuator_drains_then_restarts(wd, tmp_path, fake_path, http_server):
    handler, base = http_server
    hook = tmp_path / "bin" / "drain-hook"
    hook.write_text('#!/bin/sh\necho "drain-hook $*" >> "%s"\n' % fake_path)
    hook.chmod(0o755)
    logs = []
    cfg = _cfg(wd, tmp_path, actuator="systemd", unit="gpustack.service",
               pre_recycle_command=[str(hook), "--node", "a"], drain_url=base + "/drain")
    result = wd.Actuator(cfg, lambda event, **kw: logs.append((event, kw))).recycle()
    assert result["ok"], result
    assert _argv(fake_path) == ["drain-hook --node a", "systemctl restart gpustack.service"]
    assert [(r[0], r[1]) for r in handler.requests] == [("POST", "/drain")]
    assert [e for e, _unused in logs] == ["drain", "drain"]


def test_container_actuator(wd, tmp_path, fake_path):
    cfg = _cfg(wd, tmp_path, actuator="podman", container="vllm-llama")
    assert wd.Actuator(cfg, lambda *a, **k: None).recycle()["ok"]
    assert _argv(fake_path) == ["podman restart vllm-llama"]


def test_dry_run_runs_nothing(wd, tmp_path, fake_path):
    cfg = _cfg(wd, tmp_path, actuator="systemd", unit="x.service", dry_run=True)
    result = wd.Actuator(cfg, lambda *a, **k: None).recycle()
    assert result["dry_run"] and "systemctl restart x.service" in result["detail"]
    assert _argv(fake_path) == []


def test_lock_prevents_overlapping_recycles(wd, tmp_path, fake_path):
    cfg = _cfg(wd, tmp_path, actuator="systemd", unit="x.service")
    os.makedirs(os.path.dirname(cfg["lock_file"]))
    with open(cfg["lock_file"], "w", encoding="utf-8") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)        # another watchdog is recycling
        result = wd.Actuator(cfg, lambda *a, **k: None).recycle()
        assert not result["ok"] and "another recycle holds" in result["detail"]
        assert _argv(fake_path) == []
    assert wd.Actuator(cfg, lambda *a, **k: None).recycle()["ok"]   # released: proceeds
    assert _argv(fake_path) == ["systemctl restart x.service"]


def test_lock_is_exclusive_between_processes(wd, tmp_path):
    path = str(tmp_path / "l.lock")
    lock = wd.RecycleLock(path)
    assert lock.acquire()
    probe = subprocess.run([sys.executable, "-c", (
        "import fcntl,sys\nf=open(sys.argv[1],'a')\n"
        "try:\n fcntl.flock(f, fcntl.LOCK_EX|fcntl.LOCK_NB); print('got')\n"
        "except OSError: print('busy')\n"), path], capture_output=True, text=True, check=True)
    assert probe.stdout.strip() == "busy"
    lock.release()


@pytest.mark.parametrize("mode,method,path", [("restart", "POST", "/v2/models/42/restart"),
                                              ("delete_instance", "DELETE", "/v2/model-instances/7")])
def test_gpustack_actuator_calls_the_api_with_the_token(wd, tmp_path, http_server, mode, method, path):
    handler, base = http_server
    token = tmp_path / "token"
    token.write_text("gpustack_abc_secret\n")
    token.chmod(0o600)
    out = io.StringIO()
    cfg = _cfg(wd, tmp_path, actuator="gpustack", gpustack_server=base + "/", gpustack_model_id=42,
               gpustack_instance_id=7, gpustack_mode=mode, gpustack_token_file=str(token))
    daemon = wd.Daemon(cfg, out=out)
    result = daemon.actuator.recycle()
    assert result["ok"], result
    (req_method, req_path, headers, _unused), = handler.requests
    assert (req_method, req_path) == (method, path)
    assert headers["Authorization"] == "Bearer gpustack_abc_secret"
    daemon.log("recycle", **result)
    daemon.log("start", config={k: v for k, v in cfg.items() if k != "gpustack_token_file"})
    assert "secret" not in out.getvalue()


def test_gpustack_actuator_reports_http_errors(wd, tmp_path, http_server):
    handler, base = http_server
    handler.status = 404
    cfg = _cfg(wd, tmp_path, actuator="gpustack", gpustack_server=base, gpustack_model_id=9)
    result = wd.Actuator(cfg, lambda *a, **k: None).recycle()
    assert not result["ok"] and "-> 404" in result["detail"]


# -- sensors -----------------------------------------------------------------
def _proc(root, pid, anon_kib, swap_kib, start):
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "status").write_text("Name:\tvllm\nVmRSS:\t9999999 kB\nRssAnon:\t%d kB\nRssFile:\t5000000 kB\n"
                              "VmSwap:\t%d kB\n" % (anon_kib, swap_kib))
    fields = ["S"] + ["0"] * 18 + [str(start)] + ["0"] * 10
    (d / "stat").write_text("%d (vllm serve) %s\n" % (pid, " ".join(fields)))


def _cgroup(root, rel, anon, swap, pids, v2=True):
    d = root / rel.lstrip("/")
    d.mkdir(parents=True, exist_ok=True)
    if v2:
        (d / "memory.stat").write_text("anon %d\nfile %d\nshmem 0\n" % (anon, 40 * GiB))
        (d / "memory.swap.current").write_text("%d\n" % swap)
    else:
        (d / "memory.stat").write_text("cache 1\nrss 5\ntotal_rss %d\ntotal_swap %d\n" % (anon, swap))
    (d / "cgroup.procs").write_text("".join("%d\n" % p for p in pids))
    return d


def test_memory_sensor_cgroup_v2_anon_plus_swap_via_systemctl(wd, tmp_path, fake_path):
    cg_root, proc_root = tmp_path / "cgroup", tmp_path / "proc"
    _cgroup(cg_root, "/system.slice/vllm.service", 6 * GiB, 512 * MiB, [100, 101])
    _proc(proc_root, 100, 1024, 0, start=500)
    _proc(proc_root, 101, 2048, 1024, start=700)
    sensor = wd.MemorySensor(_cfg(wd, tmp_path, unit="vllm.service", cgroup_root=str(cg_root),
                                  proc_root=str(proc_root)))
    got = sensor.sample()
    assert got["memory_bytes"] == 6 * GiB + 512 * MiB       # not file/mmap, not VmRSS
    assert got["source"] == "cgroup2 anon+swap"
    assert got["per_process"] == {100: 1024 * 1024, 101: 3072 * 1024}
    assert "systemctl show -p ControlGroup --value vllm.service" in _argv(fake_path)
    assert got["restarted"] is False
    # The oldest process is replaced: a restart.
    (proc_root / "100" / "stat").write_text("100 (vllm) " + " ".join(["S"] + ["0"] * 18 + ["900"]))
    assert sensor.sample()["restarted"] is True


def test_memory_sensor_cgroup_v1_and_proc_fallback(wd, tmp_path):
    cg_root, proc_root = tmp_path / "cgroup", tmp_path / "proc"
    _cgroup(cg_root, "/docker/abc", 3 * GiB, 1 * GiB, [55], v2=False)
    _proc(proc_root, 55, 10, 0, start=1)
    sensor = wd.MemorySensor(_cfg(wd, tmp_path, cgroup_path="docker/abc", cgroup_root=str(cg_root),
                                  proc_root=str(proc_root)))
    got = sensor.sample()
    assert (got["memory_bytes"], got["source"]) == (4 * GiB, "cgroup1 rss+swap")
    _proc(proc_root, 77, 4096, 1024, start=3)
    sensor = wd.MemorySensor(_cfg(wd, tmp_path, pid=77, cgroup_root=str(tmp_path / "none"),
                                  proc_root=str(proc_root)))
    got = sensor.sample()
    assert (got["memory_bytes"], got["source"]) == (5120 * 1024, "proc RssAnon+VmSwap")


def test_container_cgroup_resolution(wd, tmp_path, fake_path):
    proc_root, cg_root = tmp_path / "proc", tmp_path / "cg"
    (proc_root / "4242").mkdir(parents=True)
    (proc_root / "4242" / "cgroup").write_text("0::/machine.slice/libpod-abc.scope/container\n")
    _cgroup(cg_root, "/machine.slice/libpod-abc.scope/container", GiB, 0, [4242])
    cfg = _cfg(wd, tmp_path, container="vllm-x", proc_root=str(proc_root), cgroup_root=str(cg_root))
    assert wd.resolve_cgroup(cfg) == str(cg_root / "machine.slice/libpod-abc.scope/container")
    assert "podman inspect --format {{.State.Pid}} vllm-x" in _argv(fake_path)


def test_hybrid_cgroup_v1_memory_controller_is_found(wd, tmp_path, fake_path):
    """systemd on a hybrid host: ControlGroup is relative to each hierarchy; memory is under memory/."""
    cg_root = tmp_path / "cgroup"
    (cg_root / "unified" / "system.slice" / "vllm.service").mkdir(parents=True)   # no memory.stat
    _cgroup(cg_root / "memory", "/system.slice/vllm.service", 2 * GiB, GiB, [1], v2=False)
    cfg = _cfg(wd, tmp_path, unit="vllm.service", cgroup_root=str(cg_root), proc_root=str(tmp_path))
    got = wd.MemorySensor(cfg).sample()
    assert got["cgroup"] == str(cg_root / "memory" / "system.slice" / "vllm.service")
    assert (got["memory_bytes"], got["source"]) == (3 * GiB, "cgroup1 rss+swap")


def test_probe_measures_time_to_first_streamed_chunk(wd):
    class Slow(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            time.sleep(0.3)
            self.wfile.write(b'data: {"choices":[{"text":"Hi"}]}\n\n')
            self.wfile.write(b"data: [DONE]\n\n")

        def log_message(self, *_a):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        ttft = wd.probe_ttft("http://127.0.0.1:%d/v1/completions" % server.server_address[1], "m", 5)
    finally:
        server.shutdown()
        server.server_close()
    assert 0.25 <= ttft < 3
    assert wd.probe_ttft("http://127.0.0.1:9/v1/completions", None, 1) is None


# -- outputs -----------------------------------------------------------------
def test_sd_notify_path_and_abstract_socket(wd, tmp_path):
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    try:
        assert wd.sd_notify("READY=1\nSTATUS=ok", {"NOTIFY_SOCKET": path})
        assert sock.recv(4096) == b"READY=1\nSTATUS=ok"
    finally:
        sock.close()
    name = "kvpin-test-%d" % os.getpid()
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    abstract.bind("\0" + name)
    try:
        assert wd.sd_notify("WATCHDOG=1", {"NOTIFY_SOCKET": "@" + name})
        assert abstract.recv(4096) == b"WATCHDOG=1"
    finally:
        abstract.close()
    assert wd.sd_notify("READY=1", {}) is False


def test_textfile_metrics_format_and_atomic_write(wd, tmp_path):
    d = wd.Decision(t=1.0, action="recycle", reason="r", phase="evaluating", memory_bytes=6 * GiB,
                    slope_bytes_per_hour=50.0 * MiB, ttft_p95=0.42)
    text = wd.render_metrics('a"b', d, 3)
    samples = wd.parse_exposition(text)
    assert samples["kvpin_watchdog_decision"] == [({"target": 'a"b'}, 2.0)]
    assert samples["kvpin_watchdog_recycles_total"][0][1] == 3.0
    assert samples["kvpin_watchdog_memory_bytes"][0][1] == 6 * GiB
    assert samples["kvpin_watchdog_slope_bytes_per_hour"][0][1] == 50.0 * MiB
    assert samples["kvpin_watchdog_ttft_p95_seconds"][0][1] == 0.42
    assert "kvpin_watchdog_projected_seconds_to_limit" not in samples   # unknown: left out
    assert "# TYPE kvpin_watchdog_recycles_total counter" in text
    path = wd.write_textfile(str(tmp_path / "tf"), "vllm/a", text)
    assert os.path.basename(path) == "kvpin_watchdog_vllm_a.prom"
    assert open(path, encoding="utf-8").read() == text
    assert os.listdir(str(tmp_path / "tf")) == ["kvpin_watchdog_vllm_a.prom"]   # no temp left


def test_daemon_tick_end_to_end(wd, tmp_path, fake_path, http_server):
    handler, base = http_server
    handler.body = (b'vllm:time_to_first_token_seconds_bucket{le="0.5"} 10\n'
                    b'vllm:time_to_first_token_seconds_bucket{le="+Inf"} 10\n'
                    b"vllm:num_preemptions_total 2\nvllm:kv_cache_usage_perc 0.8\n")
    cg_root, proc_root = tmp_path / "cgroup", tmp_path / "proc"
    _cgroup(cg_root, "/system.slice/vllm.service", 6 * GiB, 0, [100])
    _proc(proc_root, 100, 1024, 0, start=5)
    out = io.StringIO()
    cfg = _cfg(wd, tmp_path, unit="vllm.service", cgroup_root=str(cg_root), proc_root=str(proc_root),
               metrics_url=base + "/metrics", textfile_dir=str(tmp_path / "tf"))
    clock = iter(float(t) for t in range(0, 10 ** 6, 60))
    daemon = wd.Daemon(cfg, out=out, clock=lambda: next(clock))
    decision = daemon.tick()
    assert decision.phase == "warmup" and decision.memory_bytes == 6 * GiB
    record = json.loads(out.getvalue().splitlines()[-1])
    assert record["event"] == "decision" and record["memory_source"] == "cgroup2 anon+swap"
    assert record["corroboration"] == {"kv_cache_usage": 0.8}
    prom = (tmp_path / "tf" / "kvpin_watchdog_vllm-a.prom").read_text()
    assert 'kvpin_watchdog_memory_bytes{target="vllm-a"} %d' % (6 * GiB) in prom
    assert handler.requests and handler.requests[0][1] == "/metrics"


def test_daemon_process_notifies_systemd_and_stops_on_sigterm(tmp_path):
    notify = str(tmp_path / "n.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(notify)
    sock.settimeout(20)
    proc_root = tmp_path / "proc"
    _proc(proc_root, 1, 2048, 0, start=1)
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"name": "t", "pid": 1, "proc_root": str(proc_root),
                               "cgroup_root": str(tmp_path / "none"), "interval_seconds": 1,
                               "lock_file": str(tmp_path / "l")}))
    env = dict(os.environ, NOTIFY_SOCKET=notify)
    proc = subprocess.Popen([sys.executable, PROGRAM, "daemon", "--config", str(cfg)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        got = [sock.recv(4096).decode() for _unused in range(3)]
        assert got[0].startswith("READY=1")
        assert got[1].startswith("WATCHDOG=1") and got[2].startswith("WATCHDOG=1")
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
        sock.close()
    assert proc.returncode == 0, stderr
    events = [json.loads(line)["event"] for line in stdout.splitlines()]
    assert events[0] == "start" and events[-1] == "stop" and "decision" in events


def test_check_config_rejects_ambiguous_targets(tmp_path):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"unit": "a.service", "container": "b", "actuator": "systemd"}))
    bad = subprocess.run([sys.executable, PROGRAM, "check-config", "--config", str(cfg)],
                         capture_output=True, text=True, check=False)
    assert bad.returncode == 2 and "exactly one of unit, container" in bad.stderr
    cfg.write_text(json.dumps({"container": "b", "actuator": "systemd"}))
    bad = subprocess.run([sys.executable, PROGRAM, "daemon", "--config", str(cfg)],
                         capture_output=True, text=True, check=False, timeout=30)
    assert bad.returncode == 2 and "actuator systemd needs unit" in bad.stderr
    cfg.write_text(json.dumps({"unit": "a.service", "actuator": "systemd"}))
    ok = subprocess.run([sys.executable, PROGRAM, "check-config", "--config", str(cfg)],
                        capture_output=True, text=True, check=False)
    assert ok.returncode == 0, ok.stderr
