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
import time

import pytest
from loopback_tcp import TcpServer, UnansweredAddress, read_request, resolving_to, tls_drip  # pylint: disable=import-error
from watchdog_program import PROGRAM, load_watchdog_program  # pylint: disable=import-error

SECRET = "gpustack_tok_s3cr3t"


@pytest.fixture(scope="module")
def wd():
    return load_watchdog_program()


class RawServer(TcpServer):
    """A TCP server on 127.0.0.1 that reads each request, records it and answers with
    `script(conn, server)`."""

    def __init__(self, script):
        self.script = script
        self.requests = []
        super().__init__(self._answer)
        self.url = "http://127.0.0.1:%d" % self.port

    def _answer(self, conn, _stop):
        conn.settimeout(5)
        data = read_request(conn)
        if b"\r\n\r\n" not in data:
            return
        self.requests.append(data.decode("latin-1"))
        self.script(conn, self)


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


def test_every_address_and_the_tls_handshake_share_the_deadline(wd, monkeypatch):
    """The host resolves to an address that does not answer, then to a server dripping its TLS
    handshake: the unanswered connect spends the tick's deadline and the request ends there, the
    dripping server never reached (http.client alone gives each address, then the handshake,
    the whole timeout again)."""
    with UnansweredAddress() as dead, TcpServer(tls_drip(interval=0.2, count=150)) as dripping:
        monkeypatch.setattr(socket, "getaddrinfo", resolving_to(dead.address, ("127.0.0.1", dripping.port)))
        started = time.monotonic()
        with pytest.raises(wd.HTTPFailure, match="deadline passed"):
            wd.http_request("https://gpustack.invalid:%d/v2/models" % dripping.port,
                            deadline=time.monotonic() + 1, timeout=1)
        assert wd.probe_ttft("https://engine.invalid:%d/v1/completions" % dripping.port, None, 1.0) is None
        seconds = time.monotonic() - started
        time.sleep(0.3)     # the server's accept loop polls every 0.1 s
        accepted = dripping.accepted
    assert accepted == 0
    assert seconds < 2 + 3


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


# -- hostile answers: nesting, echoed keys, an unbounded probe, URL credentials in logs --------
from attacker_http import json_body, raw, redirect  # noqa: E402  pylint: disable=wrong-import-position,import-error
from gpustack_attack import API_KEY  # noqa: E402  pylint: disable=wrong-import-position,import-error

MODEL = {"id": 1, "name": "m", "backend_parameters": ["--a"]}


def _switch_cfg(tmp_path, server_url):
    key = tmp_path / "k.token"
    key.write_text(API_KEY + "\n")
    return dict(name="t", gpustack_deployment="m", gpustack_server=server_url, gpustack_worker_name="w",
                gpustack_api_version="v2", gpustack_token_file=str(key), profiles={"a": ["--a"], "b": ["--b"]},
                lock_file=str(tmp_path / "r.lock"), lock_dir=str(tmp_path), drain_timeout_seconds=0,
                http_timeout_seconds=2, profile_settle_seconds=0, restart_wait_seconds=0)


def _switch_profile(tmp_path, server_url):
    """`kvpin_watchdog.py switch-profile --profile b` as systemd runs it: (rc, stdout + stderr)."""
    path = tmp_path / "c.json"
    path.write_text(json.dumps(_switch_cfg(tmp_path, server_url)))
    proc = subprocess.run([sys.executable, PROGRAM, "switch-profile", "--config", str(path), "--profile", "b"],
                          capture_output=True, text=True, timeout=60, check=False)
    return proc.returncode, proc.stdout + proc.stderr


def _model_routes(srv):
    srv.route("GET", "/v2/models", json_body(200, {"items": [MODEL]}))
    srv.route("GET", "/v2/models/1", json_body(200, MODEL))
    srv.route("GET", "/v2/model-instances", json_body(200, {"items": []}))


def test_deeply_nested_json_is_a_malformed_answer_not_a_traceback(wd, attacker, tmp_path):
    srv = attacker()
    _model_routes(srv)
    srv.route("GET", "/v2/models", raw(200, b"[" * 100000 + b"]" * 100000))
    api = wd.GPUStackAPI(dict(wd.DEFAULTS, **_switch_cfg(tmp_path, srv.url)))
    assert api.call("GET", "/v2/models", time.monotonic() + 5) == (200, None)
    with pytest.raises(wd.HTTPFailure, match="no items list in the answer"):
        api.find_model_id(time.monotonic() + 5)
    rc, out = _switch_profile(tmp_path, srv.url)
    assert rc == 1 and "Traceback" not in out and "RecursionError" not in out
    assert "no items list in the answer" in out


@pytest.mark.parametrize("scenario", ["put_401_message", "put_307_location", "get_302_location", "message_cut"])
def test_a_key_the_server_echoes_back_is_masked(attacker, tmp_path, scenario):
    srv = attacker()
    _model_routes(srv)
    if scenario == "put_401_message":
        srv.route("PUT", "/v2/models/1", json_body(401, {"message": "invalid api key " + API_KEY}))
    elif scenario == "put_307_location":
        srv.route("PUT", "/v2/models/1", redirect("http://127.0.0.1:1/steal?k=" + API_KEY, 307))
    elif scenario == "get_302_location":
        srv.route("GET", "/v2/models", redirect("/x?token=" + API_KEY, 302))
    else:   # the key straddles the 300-character cut of the message: no prefix of it may survive
        srv.route("PUT", "/v2/models/1", json_body(401, {"message": "x" * 284 + API_KEY}))
    rc, out = _switch_profile(tmp_path, srv.url)
    assert rc == 1 and "Traceback" not in out
    assert API_KEY[:16] not in out, out
    assert "***" in out


def test_a_key_echoed_in_a_legacy_redirect_or_a_bad_status_line_is_masked(wd, attacker, serve, tmp_path):
    srv = attacker()
    srv.route("POST", "/v2/models/3/restart", redirect("http://127.0.0.1:1/steal?k=" + API_KEY + "#" + API_KEY, 307))
    cfg = dict(wd.DEFAULTS, **_switch_cfg(tmp_path, srv.url))
    cfg.update(gpustack_deployment=None, actuator="gpustack", gpustack_model_id=3)
    result = wd.Actuator(cfg, lambda *a, **k: None).recycle()
    assert not result["ok"] and "not followed" in result["detail"] and API_KEY[:16] not in json.dumps(result)

    def bad_status(conn, _server):
        conn.sendall(b"XTTP/1.1 200 " + API_KEY.encode() + b"\r\n\r\n")
    server = serve(bad_status)
    with pytest.raises(wd.HTTPFailure) as err:
        wd.http_request(server.url + "/v2/models", headers={"Authorization": "Bearer " + API_KEY}, timeout=5)
    assert "BadStatusLine" in str(err.value) and API_KEY[:16] not in str(err.value)


def test_a_key_echoed_in_an_instance_state_is_masked(wd, attacker, tmp_path):
    srv = attacker()
    srv.route("GET", "/v2/models", json_body(200, {"items": [MODEL]}))
    srv.route("GET", "/v2/model-instances", json_body(200, {"items": [
        {"id": 5, "name": "m-5", "state": "error: bad key " + API_KEY, "worker_name": "w", "model_id": 1}]}))
    cfg = dict(wd.DEFAULTS, **_switch_cfg(tmp_path, srv.url))
    out = wd.DeploymentSensor(cfg, wd.GPUStackAPI(cfg)).sample(time.monotonic() + 5)
    assert out["status"].startswith("instance 5 is error: bad key ") and API_KEY[:16] not in out["status"]


def _sse_head(conn):
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n")


def test_probe_ttft_holds_one_total_deadline_against_keepalives(wd, serve):
    def keepalive(conn, server):
        _sse_head(conn)
        for _unused in range(40):            # 8 s of ': keepalive', each well within a read timeout
            if server.stop.is_set():
                return
            conn.sendall(b": keepalive\n")
            time.sleep(0.2)
    server = serve(keepalive)
    started = time.monotonic()
    assert wd.probe_ttft(server.url + "/v1/completions", None, 1.0) is None
    assert time.monotonic() - started < 2.0


def test_probe_ttft_reads_a_bounded_number_of_bytes(wd, serve):
    def flood(conn, _server):                # 16 MiB without a newline, then silence
        _sse_head(conn)
        for _unused in range(16):
            conn.sendall(b"x" * 2 ** 20)
        time.sleep(4)

    def late_data(conn, _server):            # 100 KiB of comment lines before the first data: line
        _sse_head(conn)
        conn.sendall(b": pad\n" * (100 * 1024 // 6) + b"data: {}\n\n")
    server = serve(flood)
    started = time.monotonic()
    assert wd.probe_ttft(server.url + "/v1/completions", None, 3.0) is None
    assert time.monotonic() - started < 1.5
    assert wd.probe_ttft(serve(late_data).url + "/v1/completions", None, 3.0) is None


def test_probe_ttft_follows_no_redirect_and_no_proxy(wd, serve, monkeypatch):
    def data(conn, _server):
        _sse_head(conn)
        conn.sendall(b"data: {}\n\n")
    target = serve(data)

    def moved(conn, _server):
        conn.sendall(("HTTP/1.1 302 Found\r\nLocation: %s/v1/completions\r\nContent-Length: 0\r\n\r\n"
                      % target.url).encode())
    assert wd.probe_ttft(serve(moved).url + "/v1/completions", None, 3.0) is None
    time.sleep(0.3)
    assert target.requests == []
    proxy = serve(data)
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("http_proxy", proxy.url)
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    assert wd.probe_ttft(target.url + "/v1/completions", "m", 3.0) is not None
    assert proxy.requests == [] and len(target.requests) == 1


def test_url_credentials_never_reach_the_start_line_or_the_actuator_detail(wd, serve, tmp_path, monkeypatch):
    assert wd._redact_url("http://u:pw@h:1/p?token=abc&flag&x=1#frag") == "http://h:1/p?token=***&***&x=***#***"
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    cfg = dict(wd.DEFAULTS, name="t", pid=1, drain_url="http://admin:s3cretpw@127.0.0.1:9/drain",
               metrics_url="http://127.0.0.1:9/metrics?token=tok_s3cret",
               probe_url="http://p:s3cretpw@127.0.0.1:9/v1/completions?key=tok_s3cret",
               metrics_path="/metrics?token=tok_s3cret", gpustack_token_file=str(tmp_path / "k"))
    out = io.StringIO()
    daemon = wd.Daemon(cfg, out=out)
    daemon.stopping = True                   # log the start line, skip the loop
    assert daemon.run() == 0
    start = json.loads(out.getvalue().splitlines()[0])
    assert start["event"] == "start"
    assert "s3cretpw" not in out.getvalue() and "tok_s3cret" not in out.getvalue()
    assert start["config"]["drain_url"] == "http://127.0.0.1:9/drain"
    assert start["config"]["metrics_url"] == "http://127.0.0.1:9/metrics?token=***"
    assert "gpustack_token_file" not in start["config"]
    server = serve(_ok)
    legacy = dict(cfg, actuator="gpustack", gpustack_server=server.url.replace("//", "//admin:s3cretpw@"),
                  gpustack_model_id=3, gpustack_token_file=None, drain_url=None, lock_file=str(tmp_path / "l"))
    assert "s3cretpw" not in wd.Actuator(legacy, lambda *a, **k: None).describe()
    result = wd.Actuator(legacy, lambda *a, **k: None).recycle()
    assert result["ok"] and "s3cretpw" not in json.dumps(result), result
