# -*- coding: utf-8 -*-
# Copyright (c) 2026, kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Load the watchdog program (the stdlib-only package kvpin_watchdog_lib the role ships) by its path."""
from __future__ import annotations

import http.server
import json
import os
import threading

import pytest

from watchdog_program import PROGRAM, ROOT  # noqa: F401  pylint: disable=unused-import
from watchdog_program import load_watchdog_program as _load

TRACES = os.path.join(ROOT, "tests", "traces")


@pytest.fixture(scope="session")
def wd():
    return _load()


@pytest.fixture(scope="session")
def manifest():
    with open(os.path.join(TRACES, "manifest.json"), encoding="utf-8") as handle:
        return json.load(handle)


class _Engine(http.server.BaseHTTPRequestHandler):
    """An engine's /metrics on loopback: answers every GET with the class's body, counts them."""
    body = b""
    hits = 0

    def do_GET(self):  # noqa: N802
        type(self).hits += 1
        self.send_response(200)
        self.send_header("Content-Length", str(len(type(self).body)))
        self.end_headers()
        self.wfile.write(type(self).body)

    def log_message(self, *_args):
        pass


@pytest.fixture
def engine():
    """(handler class, base URL): set handler.body to the page the next scrape gets."""
    handler = type("Engine", (_Engine,), {"body": b"", "hits": 0})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield handler, "http://127.0.0.1:%d" % server.server_address[1]
    server.shutdown()
    server.server_close()
