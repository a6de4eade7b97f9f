# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A hostile HTTP server on 127.0.0.1 for adversarial tests of HTTP clients (TEST-ONLY).

Each route answers with one *behaviour*, built by the functions below: a JSON or raw body, a
redirect (same or other origin), a body dripped one byte at a time, headers dripped one byte at
a time, a huge body (with or without Content-Length), a connection that never answers or is
closed without an answer. Every request is recorded (method, path, query, headers, body), so a
test can assert what a client sent where - for example that a second server, the target of a
cross-origin redirect, never saw an ``Authorization`` header.

Standard library only, so other test suites can copy this file as it is::

    with AttackerServer({('GET', '/v2/models'): drip(200, b'{"items": []}', interval=0.5)}) as srv:
        client = Client(srv.url, ...)

Routes are keyed by (method, path without query); ``('*', path)`` matches any method; an
unknown route answers 404 with a GPUStack-style JSON error. A route may also be a function of
the recorded request returning a behaviour.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

__all__ = ['AttackerServer', 'json_body', 'raw', 'redirect', 'drip', 'slow_headers', 'huge', 'hang',
           'close_early', 'not_found', 'elapsed']

_REASONS = {200: 'OK', 201: 'Created', 204: 'No Content', 301: 'Moved Permanently', 302: 'Found',
            303: 'See Other', 307: 'Temporary Redirect', 308: 'Permanent Redirect', 400: 'Bad Request',
            401: 'Unauthorized', 403: 'Forbidden', 404: 'Not Found', 422: 'Unprocessable Entity',
            500: 'Internal Server Error', 502: 'Bad Gateway', 503: 'Service Unavailable'}


def _head(status, headers):
    lines = ['HTTP/1.1 %d %s' % (status, _REASONS.get(status, 'Status'))]
    lines += ['%s: %s' % (name, value) for name, value in headers]
    return ('\r\n'.join(lines) + '\r\n\r\n').encode('latin-1')


# -- behaviours: functions (handler, stop_event) -> None that write the whole answer -----------

def raw(status, body=b'', headers=None, content_length=True):
    """``body`` (bytes or str) as it is, with ``headers`` (list of (name, value))."""
    data = body.encode('utf-8') if isinstance(body, str) else body
    extra = list(headers or [])

    def behave(wfile, _stop):
        head = [('Content-Type', 'application/json')] + extra
        if content_length:
            head.append(('Content-Length', str(len(data))))
        head.append(('Connection', 'close'))
        wfile.write(_head(status, head) + data)
    return behave


def json_body(status, body, headers=None):
    """``body`` serialised as JSON (any JSON value: a list of strings, a bare string, ...)."""
    return raw(status, json.dumps(body), headers)


def not_found():
    return json_body(404, {'code': 404, 'reason': 'NotFound', 'message': 'Not Found'})


def redirect(location, status=302, body=b''):
    """A redirect to ``location`` (absolute URL: another origin; or a path: the same one)."""
    return raw(status, body, [('Location', location)])


def drip(status, body, interval=0.2, content_length=True):
    """Headers at once, then ``body`` one byte every ``interval`` seconds (each byte arrives well
    within any per-read socket timeout; only a total deadline stops the client)."""
    data = body.encode('utf-8') if isinstance(body, str) else body

    def behave(wfile, stop):
        head = [('Content-Type', 'application/json'), ('Connection', 'close')]
        if content_length:
            head.append(('Content-Length', str(len(data))))
        wfile.write(_head(status, head))
        wfile.flush()
        for index in range(len(data)):
            if stop.wait(interval):
                return
            wfile.write(data[index:index + 1])
            wfile.flush()
    return behave


def slow_headers(interval=0.2, count=10000):
    """A status line, then header bytes one every ``interval`` seconds, never ending the headers."""
    def behave(wfile, stop):
        wfile.write(b'HTTP/1.1 200 OK\r\n')
        wfile.flush()
        for index in range(count):
            if stop.wait(interval):
                return
            wfile.write(b'X-Slow-%d: x\r\n' % index if index % 16 == 15 else b'X')
            wfile.flush()
    return behave


def huge(status=200, size=64 * 2 ** 20, content_length=True, chunk=2 ** 16):
    """``size`` bytes of a JSON string, fast; without Content-Length the length is unannounced."""
    def behave(wfile, stop):
        head = [('Content-Type', 'application/json'), ('Connection', 'close')]
        if content_length:
            head.append(('Content-Length', str(size)))
        wfile.write(_head(status, head))
        sent = 0
        block = b'"' + b'A' * (chunk - 1)
        while sent < size and not stop.is_set():
            part = block[:min(chunk, size - sent)]
            wfile.write(part)
            sent += len(part)
            block = b'A' * chunk
    return behave


def hang():
    """Read the request and never answer."""
    def behave(_wfile, stop):
        stop.wait(3600)
    return behave


def close_early():
    """Close the connection without a byte of answer."""
    def behave(_wfile, _stop):
        return
    return behave


class AttackerServer:
    """A threaded HTTP server on 127.0.0.1 (an ephemeral port) answering from ``routes``.

    ``requests``: every request seen, as dicts (method, path, query, headers (lower-case names),
    body bytes). ``url``: ``http://127.0.0.1:<port>``. Use as a context manager, or call close().
    """

    def __init__(self, routes=None, host='127.0.0.1'):
        self.routes = dict(routes or {})
        self.requests = []
        self._stop = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = 'HTTP/1.1'

            def _serve(self):
                path, _unused, query = self.path.partition('?')
                length = int(self.headers.get('Content-Length') or 0)
                body = self.rfile.read(min(length, 2 ** 20)) if length > 0 else b''
                request = dict(method=self.command, path=path, query=query, body=body,
                               headers=dict((k.lower(), v) for k, v in self.headers.items()))
                outer.requests.append(request)
                route = outer.routes.get((self.command, path)) or outer.routes.get(('*', path)) or not_found()
                behave = route
                if getattr(route, '__name__', '') != 'behave':
                    behave = route(request)
                try:
                    behave(self.wfile, outer._stop)
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError, socket.timeout, OSError):
                    pass
                self.close_connection = True

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _serve

            def log_message(self, *_args):
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            allow_reuse_address = True

        self.httpd = Server((host, 0), Handler)
        self.port = self.httpd.server_address[1]
        self.url = 'http://%s:%d' % (host, self.port)
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={'poll_interval': 0.05},
                                        daemon=True)
        self._thread.start()

    def route(self, method, path, behaviour):
        self.routes[(method, path)] = behaviour

    def seen(self, method=None, path=None):
        return [r for r in self.requests
                if (method is None or r['method'] == method) and (path is None or r['path'] == path)]

    def close(self):
        self._stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self):
        return self

    def __exit__(self, *_exc):
        self.close()


def elapsed(function, *args, **kwargs):
    """(seconds, result or exception) of one call: for reporting, not for asserting speed."""
    start = time.monotonic()
    try:
        result = function(*args, **kwargs)
    except Exception as error:  # pylint: disable=broad-except
        result = error
    return time.monotonic() - start, result
