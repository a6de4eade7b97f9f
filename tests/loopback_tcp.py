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
import time

# TLS record: content type 22 (handshake), version 3.3, length 0x4000 (16 KiB).
TLS_HANDSHAKE_RECORD_HEADER = b'\x16\x03\x03\x40\x00'


def tls_drip(interval=0.2, count=150):
    """Accept and start a TLS handshake that never ends: a handshake record header announcing
    16 KiB, then one byte every ``interval`` seconds. Each byte arrives well within any per-recv
    timeout; a client whose handshake has no total bound waits out the whole drip."""
    def behave(conn, stop):
        conn.sendall(TLS_HANDSHAKE_RECORD_HEADER)
        for _index in range(count):
            if stop.wait(interval):
                return
            conn.sendall(b'\x02')
    return behave


def read_request(conn):
    """The request line and headers of one HTTP request read from ``conn`` (less at EOF)."""
    data = b''
    while b'\r\n\r\n' not in data:
        chunk = conn.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


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


class UnansweredAddress:
    """An address on 127.0.0.1 that does not answer: a listener whose accept queue is full, so
    the kernel drops further SYNs and a connect to it waits until its timeout."""

    def __init__(self):
        self.listener = socket.socket()
        self.listener.bind(('127.0.0.1', 0))
        self.listener.listen(0)
        self.address = self.listener.getsockname()
        self._queued = []
        for _index in range(3):
            sock = socket.socket()
            sock.setblocking(False)
            try:
                sock.connect(self.address)
            except BlockingIOError:
                pass
            self._queued.append(sock)
        time.sleep(0.2)

    def close(self):
        for sock in self._queued:
            sock.close()
        self.listener.close()

    def __enter__(self):
        return self

    def __exit__(self, *_exc):
        self.close()


def resolving_to(*addresses):
    """A getaddrinfo stand-in: every name resolves to ``addresses`` ((host, port) on IPv4), in order."""
    def getaddrinfo(*_args, **_kwargs):
        return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, '', address) for address in addresses]
    return getaddrinfo
