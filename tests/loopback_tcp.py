# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Raw TCP servers on 127.0.0.1 for the HTTP deadline tests (TEST-ONLY): each accepted
connection runs ``behave(conn, stop)`` in a thread of its own.

    with TcpServer(tls_drip(interval=0.2, count=150)) as server:   # a drip of 30 s
        http_status(server.https_url + '/healthz', 1)
"""

import socket
import threading

# TLS record: content type 22 (handshake), version 3.3, length 0x4000 (16 KiB).
TLS_HANDSHAKE_RECORD_HEADER = b'\x16\x03\x03\x40\x00'


def tls_drip(interval=0.2, count=150):
    """Accept and start a TLS handshake that never ends: a handshake record header announcing
    16 KiB, then one byte every ``interval`` seconds. Each byte arrives well within any per-recv
    timeout; only a total deadline stops the client."""
    def behave(conn, stop):
        conn.sendall(TLS_HANDSHAKE_RECORD_HEADER)
        for _index in range(count):
            if stop.wait(interval):
                return
            conn.sendall(b'\x02')
    return behave


class TcpServer:
    """Accepts on 127.0.0.1 until closed; ``accepted`` counts the connections."""

    def __init__(self, behave):
        self.stop = threading.Event()
        self.accepted = 0
        self.listener = socket.socket()
        self.listener.bind(('127.0.0.1', 0))
        self.listener.listen(8)
        self.listener.settimeout(0.1)
        self.port = self.listener.getsockname()[1]
        self.https_url = 'https://127.0.0.1:%d' % self.port
        self._behave = behave
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self):
        while not self.stop.is_set():
            try:
                conn, _unused = self.listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn):
        with conn:
            try:
                self._behave(conn, self.stop)
            except OSError:
                pass

    def close(self):
        self.stop.set()
        self._thread.join(5)
        self.listener.close()

    def __enter__(self):
        return self

    def __exit__(self, *_exc):
        self.close()
