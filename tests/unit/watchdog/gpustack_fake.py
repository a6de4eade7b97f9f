# -*- coding: utf-8 -*-
# Copyright (c) 2026, kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A loopback stand-in of the few GPUStack routes the watchdog uses (test edge only): model
list with ?search=, model-instances with ?model_id=, DELETE of an instance (the controller's
answer: a new instance with a new id, pid and port), GET and PUT of one model (the profile
switch; PUT replaces the record, as GPUStack's ModelUpdate does), and an engine /metrics per
port."""
from __future__ import annotations

import http.server
import json
import threading
import urllib.parse


class FakeGPUStack:
    def __init__(self, version="v1", token="tok-123"):
        self.version = version
        self.token = token
        self.models = [{"id": 3, "name": "llama"}, {"id": 4, "name": "llama-big"}]
        self.instances = []
        self.requests = []
        self.metrics = "vllm:num_requests_running 0\n"
        self.next_id = 100
        self.on_delete = None      # callable(instance) -> replacement instance dict or None
        self.on_put = None         # callable(model) -> None: what the server does on an update
        self.put_status = None     # answer every PUT with this status (and change nothing)
        self.bodies = []           # (method, path, decoded JSON body) of every PUT
        self.logs = {}             # instance id -> its engine log (bytes), GET .../logs
        self.logs_redirect = None  # answer GET .../logs with a 302 to this URL instead
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _reply(self, status, data, ctype="application/json"):
                body = data if isinstance(data, bytes) else json.dumps(data).encode()
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _route(self):
                parts = urllib.parse.urlsplit(self.path)
                query = dict(urllib.parse.parse_qsl(parts.query))
                fake.requests.append((self.command, self.path, self.headers.get("Authorization")))
                if parts.path == "/metrics":
                    return self._reply(200, fake.metrics.encode(), "text/plain")
                if self.headers.get("Authorization") != "Bearer " + fake.token:
                    return self._reply(401, {"message": "unauthorized"})
                prefix = "/" + fake.version
                if not parts.path.startswith(prefix + "/"):
                    return self._reply(404, {"message": "not found"})
                route = parts.path[len(prefix):]
                if route == "/models" and self.command == "GET":
                    term = query.get("search", "")
                    return self._reply(200, {"items": [m for m in fake.models if term in m["name"]],
                                             "pagination": {"page": 1}})
                if route == "/model-instances" and self.command == "GET":
                    items = [i for i in fake.instances if str(i["model_id"]) == query.get("model_id")]
                    return self._reply(200, {"items": items, "pagination": {"page": 1}})
                if route.startswith("/models/") and self.command in ("GET", "PUT"):
                    mid = int(route.rsplit("/", 1)[1])
                    found = [m for m in fake.models if m["id"] == mid]
                    if not found:
                        return self._reply(404, {"message": "model not found"})
                    if self.command == "GET":
                        return self._reply(200, dict(found[0], state="running", updated_at="now"))
                    length = int(self.headers.get("Content-Length") or 0)
                    body = json.loads(self.rfile.read(length) or b"{}")
                    fake.bodies.append((self.command, self.path, body))
                    if fake.put_status is not None:
                        return self._reply(fake.put_status, {"message": "refused by the stand-in"})
                    found[0].clear()
                    found[0].update(body, id=mid)
                    if fake.on_put:
                        fake.on_put(found[0])
                    return self._reply(200, found[0])
                if route.startswith("/model-instances/") and route.endswith("/logs") and self.command == "GET":
                    iid = int(route.split("/")[2])
                    if fake.logs_redirect:
                        self.send_response(302)
                        self.send_header("Location", fake.logs_redirect)
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return None
                    if iid not in fake.logs:
                        return self._reply(404, {"message": "no log"})
                    body = fake.logs[iid]
                    if int(query.get("tail", "-1")) >= 0:     # GPUStack: the last n lines
                        lines = body.splitlines(True)
                        body = b"".join(lines[-int(query["tail"]):]) if int(query["tail"]) else b""
                    return self._reply(200, body, "text/plain")
                if route.startswith("/model-instances/") and self.command == "DELETE":
                    iid = int(route.rsplit("/", 1)[1])
                    gone = [i for i in fake.instances if i["id"] == iid]
                    fake.instances = [i for i in fake.instances if i["id"] != iid]
                    if gone and fake.on_delete:
                        new = fake.on_delete(gone[0])
                        if new:
                            fake.instances.append(new)
                    return self._reply(200 if gone else 404, {})
                return self._reply(404, {"message": "no route"})

            do_GET = do_DELETE = do_POST = do_PUT = _route

            def log_message(self, *_args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = "http://127.0.0.1:%d" % self.port
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def instance(self, iid, pid, worker="node-a", model_id=3, gpus=(0,), state="running", port=None):
        return {"id": iid, "name": "llama-%d" % iid, "model_id": model_id, "model_name": "llama",
                "worker_id": 1, "worker_name": worker, "worker_ip": "127.0.0.1", "pid": pid,
                "port": port or self.port, "ports": [port or self.port], "state": state,
                "gpu_indexes": list(gpus), "restart_count": 0}

    def close(self):
        self.server.shutdown()
        self.server.server_close()
