# -*- coding: utf-8 -*-
# Copyright (c) 2026, kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The watchdog program's profile switch against a hostile GPUStack on 127.0.0.1: a model record
whose backend_parameters are not a list, an answer for another model, an oversize or dripping
answer, an update the server accepts but does not keep, and an engine whose in-flight gauge is
NaN or huge. Each ends in a clear failure (or a bounded drain) with no PUT where nothing may
change, and the API key in no message."""
from __future__ import annotations

import http.server
import io
import json
import os
import threading
import time

import pytest
from watchdog_program import load_watchdog_program  # pylint: disable=import-error

SECRET = "gpustack_switch_s3cr3t"
DAY = ["--max-num-seqs=64"]
NIGHT = ["--max-num-seqs=4", "--max-model-len=32768"]


@pytest.fixture(scope="module")
def wd():
    return load_watchdog_program()


class Hostile:
    """GET /v1/models?search, GET/PUT /v1/models/3, GET /v1/model-instances, GET /metrics; each
    answer can be replaced by `answers[(method, path-without-query)] = (status, body bytes, drip)`."""

    def __init__(self):
        self.model = {"id": 3, "name": "llama", "backend_parameters": list(DAY)}
        self.answers = {}
        self.requests = []
        self.metrics = b"vllm:num_requests_running 0\n"
        self.instance_id = 7       # a DELETE of it: the controller's replacement is 8
        hostile = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _send(self, status, body, drip=0.0):
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not drip:
                    self.wfile.write(body)
                    return
                for byte in body:
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                    time.sleep(drip)

            def _route(self):
                path = self.path.split("?", 1)[0]
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                hostile.requests.append((self.command, path))
                try:
                    if (self.command, path) in hostile.answers:
                        return self._send(*hostile.answers[(self.command, path)])
                    if path == "/metrics":
                        return self._send(200, hostile.metrics)
                    if path == "/v1/models":
                        return self._send(200, json.dumps({"items": [hostile.model]}).encode())
                    if path == "/v1/models/3" and self.command == "GET":
                        return self._send(200, json.dumps(hostile.model).encode())
                    if path == "/v1/models/3" and self.command == "PUT":
                        hostile.model = dict(json.loads(body), id=3)
                        return self._send(200, json.dumps(hostile.model).encode())
                    if path == "/v1/model-instances/%d" % hostile.instance_id and self.command == "DELETE":
                        hostile.instance_id += 1
                        return self._send(200, b"{}")
                    if path == "/v1/model-instances":
                        port = hostile.server.server_address[1]
                        iid = hostile.instance_id
                        items = [{"id": iid, "name": "llama-%d" % iid, "model_id": 3, "worker_name": "node-a", "pid": 500,
                                  "port": port, "state": "running", "gpu_indexes": [0]}]
                        return self._send(200, json.dumps({"items": items}).encode())
                    return self._send(404, b"{}")
                except (BrokenPipeError, ConnectionResetError):
                    return None

            do_GET = do_PUT = do_DELETE = _route

            def log_message(self, *_args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hostile():
    server = Hostile()
    yield server
    server.close()


def _switch(wd, tmp_path, hostile, **over):
    key = tmp_path / "key"
    key.write_text(SECRET + "\n")
    cfg = dict(wd.DEFAULTS, name="llama", gpustack_deployment="llama", gpustack_server=hostile.url,
               gpustack_worker_name="node-a", gpustack_token_file=str(key), actuator="gpustack",
               gpustack_api_version="v1", lock_file=str(tmp_path / "l" / "recycle.lock"), lock_dir=str(tmp_path / "l"),
               http_timeout_seconds=2, drain_timeout_seconds=1, restart_wait_seconds=5, profile_settle_seconds=0,
               profiles={"day": DAY, "night": NIGHT})
    cfg.update(over)
    assert not wd.validate_config(cfg)
    out = io.StringIO()
    status = wd.switch_profile(cfg, "night", out=out)
    assert SECRET not in out.getvalue()
    return status, json.loads(out.getvalue().splitlines()[-1])["detail"]


def _puts(hostile):
    return [r for r in hostile.requests if r[0] == "PUT"]


@pytest.mark.parametrize("params", [{"--max-num-seqs": 4}, "--max-num-seqs=64", 7])
def test_backend_parameters_that_are_not_a_list_are_not_touched(wd, tmp_path, hostile, params):
    hostile.model["backend_parameters"] = params
    status, detail = _switch(wd, tmp_path, hostile)
    assert status == 1 and "backend_parameters in GPUStack are not a list" in detail
    assert not _puts(hostile)


def test_an_answer_for_another_model_is_refused(wd, tmp_path, hostile):
    hostile.answers[("GET", "/v1/models/3")] = (200, json.dumps({"id": 4, "name": "other"}).encode(), 0)
    status, detail = _switch(wd, tmp_path, hostile)
    assert status == 1 and "without the model" in detail and "nothing changed" in detail
    assert not _puts(hostile)


def test_an_oversize_model_answer_is_refused(wd, tmp_path, hostile):
    hostile.answers[("GET", "/v1/models/3")] = (200, b"[" + b"0," * 600000 + b"0]", 0)
    status, detail = _switch(wd, tmp_path, hostile, max_body_bytes=1024 * 1024)
    assert status == 1 and "exceeds the 1048576 byte cap" in detail
    assert not _puts(hostile)


def test_a_dripping_answer_cannot_hold_the_switch_past_its_deadline(wd, tmp_path, hostile):
    hostile.answers[("GET", "/v1/models/3")] = (200, json.dumps(hostile.model).encode() + b" " * 200, 0.05)
    status, detail = _switch(wd, tmp_path, hostile, http_timeout_seconds=1)
    assert status == 1 and "deadline passed" in detail and "nothing changed" in detail
    assert not _puts(hostile)


def test_an_update_accepted_but_not_kept_says_the_previous_profile_runs(wd, tmp_path, hostile):
    hostile.answers[("PUT", "/v1/models/3")] = (200, b"{}", 0)
    status, detail = _switch(wd, tmp_path, hostile)
    assert status == 1 and "GPUStack still holds profile day, which keeps running" in detail
    assert not os.path.exists(str(tmp_path / "l" / "profile-switch-llama.json"))


@pytest.mark.parametrize("metrics,drain", [
    (b"vllm:num_requests_running NaN\n", "no in-flight gauge: not drained"),     # NaN is no reading
    (b"vllm:num_requests_running 1e308\n", "timed out after 1 s"),
    (b"vllm:num_requests_running 0\n" + b"#" * (9 * 1024 * 1024), "no in-flight gauge: not drained"),
])
def test_a_lying_in_flight_gauge_only_bounds_the_drain(wd, tmp_path, hostile, metrics, drain):
    hostile.metrics = metrics
    status, detail = _switch(wd, tmp_path, hostile)
    assert status == 0, detail
    assert "drain: " + drain in detail and "instance 8 running" in detail
    assert hostile.model["backend_parameters"] == NIGHT
