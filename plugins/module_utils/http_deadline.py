# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One total deadline for one HTTP exchange (http.client): connect, TLS handshake, request,
status line, headers and body together.

A socket timeout bounds each recv, not the answer: a server that drips one byte per timeout
(its TLS handshake, its headers, its body) holds a check forever. Here every blocking step gets
what is left of one deadline as its timeout, and ``expired`` tells the caller afterwards that the
deadline is what ended the exchange (for "timed out after Ns"). No thread: the TCP connect
(every address a name resolves to in turn) and each send or recv get the time left; the TLS
handshake gets it too (CPython's do_handshake honours its socket timeout as the total for the
whole handshake). Name resolution is not bounded (getaddrinfo takes no timeout).

Stdlib only and Python >= 3.8: node_state ships it to every node inside the probe.
"""

from __future__ import annotations

import io
import socket
import time


class Deadline:
    """``seconds`` from now, shared by every exchange that uses it (redirects included)::

        deadline = Deadline(timeout)
        connection = http.client.HTTPConnection(host, port, timeout=timeout)
        deadline.connect(connection)        # instead of connection.connect()
        connection.request(...); connection.getresponse().read()

    A step with no time left raises socket.timeout; ``expired`` says afterwards whether the
    deadline is what ended the exchange."""

    def __init__(self, seconds):
        self.end = time.monotonic() + seconds
        self._ended_a_step = False

    def remaining(self):
        return self.end - time.monotonic()

    @property
    def expired(self):
        """True once the deadline has passed or has ended a step (its socket.timeout): then the
        deadline, not the server, is what ended the exchange."""
        return self._ended_a_step or self.remaining() <= 0

    def left(self):
        """Seconds left (> 0), or socket.timeout."""
        left = self.remaining()
        if left <= 0:
            self._ended_a_step = True
            raise socket.timeout('deadline passed')
        return left

    def within(self, sock, call, *args):
        """``call(*args)``, a blocking call on ``sock``, with the socket's timeout set to what is left."""
        sock.settimeout(self.left())
        try:
            return call(*args)
        except socket.timeout:
            self._ended_a_step = True
            raise

    def _create_connection(self, address, _timeout=None, source_address=None):
        # http.client's hook for the TCP connect: HTTP(S)Connection.connect calls it. Not
        # socket.create_connection, which gives every address the name resolves to the whole
        # timeout (a name with N unanswering addresses would hold the exchange N timeouts):
        # each address here gets what is left, and the last socket keeps what is left for the
        # TLS handshake HTTPSConnection.connect does next on it.
        host, port = address
        last_error = None
        for family, kind, proto, _canonical, sockaddr in socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM):
            sock = socket.socket(family, kind, proto)
            try:
                if source_address:
                    sock.bind(source_address)
                sock.settimeout(self.left())
                sock.connect(sockaddr)
                sock.settimeout(self.left())
                return sock
            except socket.timeout:
                sock.close()
                raise
            except OSError as error:
                sock.close()
                last_error = error
        raise last_error or OSError('%s resolves to no address' % host)

    def connect(self, connection):
        """``connection.connect()`` (an http.client HTTP(S)Connection) within the deadline, then
        every later send and recv of the connection within it too."""
        connection._create_connection = self._create_connection  # pylint: disable=protected-access
        try:
            connection.connect()
        except socket.timeout:
            # (a connect the deadline cut: its settimeout(left) was all there was)
            self._ended_a_step = True
            raise
        connection.sock = _DeadlineSocket(connection.sock, self)


class _DeadlineSocket:
    """A connected (plain or TLS) socket whose every send and recv runs within the deadline;
    http.client reads the answer through makefile('rb'), so its reads come back here. Closed
    like a socket: not while an answer still reads from it ("Connection: close" answers)."""

    def __init__(self, sock, deadline):
        self._sock = sock
        self._deadline = deadline
        self._io_refs = 0
        self._closed = False

    def sendall(self, data, *args):
        return self._deadline.within(self._sock, self._sock.sendall, data, *args)

    def recv_into(self, buf, *args):
        return self._deadline.within(self._sock, self._sock.recv_into, buf, *args)

    def fileno(self):
        return self._sock.fileno()

    def makefile(self, *_args, **_kwargs):
        self._io_refs += 1
        return io.BufferedReader(socket.SocketIO(self, 'rb'))

    def _decref_socketios(self):
        self._io_refs -= 1
        if self._closed and self._io_refs <= 0:
            self._sock.close()

    def close(self):
        self._closed = True
        if self._io_refs <= 0:
            self._sock.close()
