# -*- coding: utf-8 -*-
# Copyright (c) 2026, kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The watchdog's HTTP against hostile servers, all on 127.0.0.1: a server that drips its
answer a byte at a time cannot hold a tick past its deadline (and systemd's watchdog stays fed
meanwhile), oversize bodies are refused, a redirect is never followed with the API key (a
redirected DELETE is a failure naming the Location), and a malformed key is refused unprinted."""
from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest
from watchdog_program import PROGRAM, load_watchdog_program  # pylint: disable=import-error

SECRET = "gpustack_tok_s3cr3t"


@pytest.fixture(scope="module")
def wd():
    return load_watchdog_program()


class RawServer:
    """A TCP server on 127.0.0.1 that answers every connection with `script(conn)`."""

    def __init__(self, script):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.url = "http://127.0.0.1:%d" % self.port
        self.script = script
        self.requests = []
        self.stop = threading.Event()
        self.sock.settimeout(0.2)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while not self.stop.is_set():
            try:
                conn, _addr = self.sock.accept()
            except OSError:
                continue
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn):
        try:
            conn.settimeout(5)
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                data += chunk
            self.requests.append(data.decode("latin-1"))
            self.script(conn, self)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self):
        self.stop.set()
        self.thread.join(timeout=5)
        self.sock.close()


def drip_headers(conn, server):
    for byte in b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nX-Slow: " + b"a" * 10000:
        if server.stop.is_set():
            return
        conn.sendall(bytes([byte]))
        time.sleep(0.1)


def drip_body(conn, server):
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
    for _unused in range(100000):
        if server.stop.is_set():
            return
        conn.sendall(b"#")
        time.sleep(0.1)


@pytest.fixture
def serve():
    servers = []

    def make(script):
        server = RawServer(script)
        servers.append(server)
        return server
    yield make
    for server in servers:
        server.close()


@pytest.mark.parametrize("script", [drip_headers, drip_body])
def test_a_dripping_server_cannot_hold_a_request_past_its_deadline(wd, serve, script):
    server = serve(script)
    started = time.monotonic()
    with pytest.raises(wd.HTTPFailure, match="deadline passed"):
        wd.http_request(server.url + "/metrics", deadline=time.monotonic() + 1.5, timeout=30)
    # Each byte arrives well within any per-recv timeout; only the overall deadline stops it.
    assert time.monotonic() - started < 3.0


def test_an_oversize_body_is_refused(wd, serve):
    def declared(conn, _server):
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 999999999\r\n\r\n" + b"x" * 1000)

    def undeclared(conn, _server):
        conn.sendall(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + b"x" * 300000)
    for script in (declared, undeclared):
        server = serve(script)
        with pytest.raises(wd.HTTPFailure, match="byte cap"):
            wd.http_request(server.url + "/metrics", timeout=5, max_bytes=100000)


def _redirect_to(target):
    def script(conn, _server):
        conn.sendall(("HTTP/1.1 307 Temporary Redirect\r\nLocation: %s/steal\r\nContent-Length: 0\r\n\r\n"
                      % target).encode())
    return script


def _ok(conn, _server):
    conn.sendall(b'HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}')


def _cfg(wd, tmp_path, server_url, key=SECRET + "\n"):
    path = tmp_path / "key"
    path.write_text(key)
    return dict(wd.DEFAULTS, name="llama", gpustack_deployment="llama", gpustack_server=server_url,
                gpustack_worker_name="node-a", gpustack_token_file=str(path), actuator="gpustack",
                gpustack_api_version="v1", lock_file=str(tmp_path / "l" / "recycle.lock"),
                lock_dir=str(tmp_path / "l"), http_timeout_seconds=3, drain_timeout_seconds=0,
                restart_wait_seconds=0)


def test_a_redirected_delete_fails_naming_the_location_and_never_follows(wd, serve, tmp_path):
    elsewhere = serve(_ok)
    api_server = serve(_redirect_to(elsewhere.url))
    cfg = _cfg(wd, tmp_path, api_server.url)
    inst = wd.Instance(id=7, name="llama-7", state="running", pid=1, port=1, gpu_indexes=[0], worker_ip=None)
    logs = io.StringIO()
    result = wd.DeploymentActuator(cfg, wd.GPUStackAPI(cfg), lambda e, **k: logs.write(json.dumps(k)),
                                   lambda: None).recycle(inst)
    assert not result["ok"]
    assert "307 redirect to %s/steal" % elsewhere.url in result["detail"]
    assert "not followed" in result["detail"]
    assert SECRET not in json.dumps(result) and SECRET not in logs.getvalue()
    time.sleep(0.3)
    assert elsewhere.requests == []                     # the key never left for the Location
    assert api_server.requests[0].startswith("DELETE /v1/model-instances/7 ")
    assert "Authorization: Bearer %s" % SECRET in api_server.requests[0]


def test_a_redirected_lookup_is_a_failure_not_followed(wd, serve, tmp_path):
    elsewhere = serve(_ok)
    api_server = serve(_redirect_to(elsewhere.url))
    cfg = _cfg(wd, tmp_path, api_server.url)
    with pytest.raises(wd.HTTPFailure, match="redirect to .*not followed") as err:
        wd.GPUStackAPI(cfg).instances(time.monotonic() + 5)
    assert SECRET not in str(err.value)
    time.sleep(0.3)
    assert elsewhere.requests == []


def test_the_legacy_actuator_does_not_follow_a_redirect_either(wd, serve, tmp_path):
    elsewhere = serve(_ok)
    api_server = serve(_redirect_to(elsewhere.url))
    cfg = dict(_cfg(wd, tmp_path, api_server.url), gpustack_deployment=None, gpustack_model_id=3)
    result = wd.Actuator(cfg, lambda *a, **k: None).recycle()
    assert not result["ok"] and "redirect to %s/steal" % elsewhere.url in result["detail"]
    time.sleep(0.3)
    assert elsewhere.requests == []


@pytest.mark.parametrize("key", ["tok en", "tok\nen", "tok\ten", "tok\x00en", "\n\n"])
def test_a_malformed_api_key_is_refused_and_never_printed(wd, serve, tmp_path, key):
    api_server = serve(_ok)
    cfg = _cfg(wd, tmp_path, api_server.url, key=key)
    with pytest.raises(wd.HTTPFailure) as err:
        wd.GPUStackAPI(cfg).instances(time.monotonic() + 5)
    assert "whitespace or control" in str(err.value) or "empty" in str(err.value)
    assert key.strip() not in str(err.value) or not key.strip()
    assert api_server.requests == []


def test_surrounding_whitespace_of_a_key_is_stripped(wd, tmp_path):
    path = tmp_path / "k"
    path.write_text("  %s \n\n" % SECRET)
    assert wd.read_api_key(str(path)) == SECRET


def test_systemd_stays_fed_while_a_scrape_drips_and_a_hung_tick_starves_it(wd, serve, tmp_path):
    server = serve(drip_body)
    proc_root = tmp_path / "proc" / "1"
    proc_root.mkdir(parents=True)
    (proc_root / "status").write_text("RssAnon:\t2048 kB\nVmSwap:\t0 kB\n")
    (proc_root / "stat").write_text("1 (x) S 0 " + "0 " * 17 + "5 0\n")
    cfg_path = tmp_path / "c.json"
    cfg_path.write_text(json.dumps({"name": "t", "pid": 1, "proc_root": str(tmp_path / "proc"),
                                    "cgroup_root": str(tmp_path / "none"), "interval_seconds": 1,
                                    "tick_deadline_seconds": 3, "http_timeout_seconds": 30,
                                    "metrics_url": server.url + "/metrics", "watchdog_sec": 10,
                                    "lock_file": str(tmp_path / "l")}))
    notify = str(tmp_path / "n.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(notify)
    sock.settimeout(1.5)
    proc = subprocess.Popen([sys.executable, PROGRAM, "daemon", "--config", str(cfg_path)],
                            env=dict(os.environ, NOTIFY_SOCKET=notify), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    fed = 0
    try:
        end = time.monotonic() + 4.5
        while time.monotonic() < end:
            try:
                if sock.recv(4096).startswith(b"WATCHDOG=1"):
                    fed += 1
            except socket.timeout:
                pass
        proc.terminate()
        stdout, _stderr = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
        sock.close()
    # Fed about once a second although the first scrape drips for its whole 3 s deadline.
    assert fed >= 3
    statuses = [json.loads(line).get("latency_status") for line in stdout.splitlines()
                if '"event":"decision"' in line]
    assert any(s and "deadline passed" in s for s in statuses), statuses
    # A tick past its deadline starves the feed on purpose (systemd then restarts the daemon).
    daemon = wd.Daemon(dict(wd.DEFAULTS, name="t", pid=1), out=io.StringIO())
    daemon.tick_deadline = time.monotonic() - 1
    assert not daemon.healthy()
    daemon.tick_deadline = None
    assert daemon.healthy()
