# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A TCP server on 127.0.0.1 that accepts and starts a TLS handshake it never finishes (TEST-ONLY):
a handshake record header announcing 16 KiB, then one byte every ``interval`` seconds. Each byte
arrives well within any per-recv timeout; only a total deadline stops the client.

    with TlsDripServer(interval=0.2, count=150) as server:   # a drip of 30 s
        http_status('https://127.0.0.1:%d/healthz' % server.port, 1)
"""

import socket
import threading

# TLS record: content type 22 (handshake), version 3.3, length 0x4000.
RECORD_HEADER = b'\x16\x03\x03\x40\x00'


class TlsDripServer:

    def __init__(self, interval=0.2, count=150):
        self.interval = interval
        self.count = count
        self.accepted = 0
        self._stop = threading.Event()
        self._listener = socket.socket()
        self._listener.bind(('127.0.0.1', 0))
        self._listener.listen(8)
        self._listener.settimeout(0.1)
        self.port = self._listener.getsockname()[1]
        self.url = 'https://127.0.0.1:%d' % self.port
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self):
        while not self._stop.is_set():
            try:
                conn, _unused = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._drip, args=(conn,), daemon=True).start()

    def _drip(self, conn):
        with conn:
            try:
                conn.sendall(RECORD_HEADER)
                for _index in range(self.count):
                    if self._stop.wait(self.interval):
                        return
                    conn.sendall(b'\x02')
            except OSError:
                pass

    def close(self):
        self._stop.set()
        self._thread.join(5)
        self._listener.close()

    def __enter__(self):
        return self

    def __exit__(self, *_exc):
        self.close()
