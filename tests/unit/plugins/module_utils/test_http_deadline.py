# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""http_deadline: one total deadline for one http.client exchange (TCP connect, TLS handshake,
request, status line, headers, body), against small servers on 127.0.0.1. Bounds asserted are
the deadline's (generous), not speeds."""

import http.client
import socket
import ssl
import time

import pytest

from loopback_tcp import TcpServer, UnansweredAddress, read_request, resolving_to, tls_drip

from ansible_collections.kvpin.fleet.plugins.module_utils import http_deadline
from ansible_collections.kvpin.fleet.plugins.module_utils.http_deadline import Deadline


@pytest.fixture
def serve():
    servers = []

    def make(behave):
        servers.append(TcpServer(behave))
        return servers[-1]
    yield make
    for server in servers:
        server.close()


def answer(body, interval=None):
    """Read one request, answer 200 with ``body`` and "Connection: close"; with ``interval``, the
    body one byte every ``interval`` seconds."""
    def behave(conn, stop):
        read_request(conn)
        conn.sendall(b'HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n' % len(body))
        if interval is None:
            conn.sendall(body)
            return
        for index in range(len(body)):
            if stop.wait(interval):
                return
            conn.sendall(body[index:index + 1])
    return behave


def test_time_left_and_expired():
    deadline = Deadline(30)
    assert 0 < deadline.remaining() <= 30 and deadline.left() <= 30
    assert deadline.expired is False


@pytest.mark.parametrize('seconds', [0, -1])
def test_no_time_left_is_a_socket_timeout_and_expired(seconds):
    deadline = Deadline(seconds)
    with pytest.raises(socket.timeout, match='deadline passed'):
        deadline.left()
    assert deadline.expired is True


def test_an_answer_within_the_deadline_is_read_whole_and_not_expired(serve):
    """"Connection: close": http.client closes the connection while the answer still reads from
    its socket; the socket is closed only once the answer is."""
    body = b'{"ok": true}' + b' ' * 100000
    server = serve(answer(body))
    deadline = Deadline(10)
    connection = http.client.HTTPConnection('127.0.0.1', server.port, timeout=10)
    deadline.connect(connection)
    wrapped = connection.sock
    connection.request('GET', '/')
    response = connection.getresponse()
    assert connection.sock is None       # handed to the response ("Connection: close")
    assert response.read() == body
    response.close()
    connection.close()
    assert wrapped.fileno() == -1        # closed, not leaked
    assert deadline.expired is False


def test_a_dripping_body_is_ended_by_the_deadline(serve):
    """Each byte comes 0.1 s after the last, within any per-recv timeout; the drip would take
    30 s. Only the total deadline ends it."""
    server = serve(answer(b'x' * 300, interval=0.1))
    deadline = Deadline(1)
    connection = http.client.HTTPConnection('127.0.0.1', server.port, timeout=1)
    start = time.monotonic()
    with pytest.raises(socket.timeout):
        deadline.connect(connection)
        connection.request('GET', '/')
        connection.getresponse().read()
    connection.close()
    assert time.monotonic() - start < 1 + 3
    assert deadline.expired is True


def test_a_dripping_tls_handshake_is_ended_by_the_deadline(serve):
    """The drip would take 30 s; a handshake with no total bound would wait it out."""
    server = serve(tls_drip())
    deadline = Deadline(1)
    connection = http.client.HTTPSConnection('127.0.0.1', server.port, timeout=1,
                                             context=ssl.create_default_context())
    start = time.monotonic()
    with pytest.raises(socket.timeout):
        deadline.connect(connection)
    connection.close()
    assert time.monotonic() - start < 1 + 3
    assert deadline.expired is True


class _RecordingContext:
    """A stand-in SSL context: records the timeout the handshake would get, then fails it."""

    verify_mode = ssl.CERT_REQUIRED
    check_hostname = True

    def __init__(self):
        self.handshake_timeout = None

    def wrap_socket(self, sock, server_hostname=None):
        self.handshake_timeout = sock.gettimeout()
        raise ssl.SSLError('stand-in handshake')


def slow_getaddrinfo(seconds):
    """getaddrinfo that takes ``seconds`` first: time the deadline spends before any connect."""
    real_getaddrinfo = socket.getaddrinfo

    def resolve(*args, **kwargs):
        time.sleep(seconds)
        return real_getaddrinfo(*args, **kwargs)
    return resolve


def test_the_tls_handshake_gets_what_the_tcp_connect_left(serve, monkeypatch):
    """TCP connect and handshake share one deadline: a connect that took 0.5 s of 2 s leaves the
    handshake at most 1.5 s (a per-step timeout would give it the full 2 s again)."""
    server = serve(tls_drip())
    monkeypatch.setattr(http_deadline.socket, 'getaddrinfo', slow_getaddrinfo(0.5))
    context = _RecordingContext()
    deadline = Deadline(2)
    connection = http.client.HTTPSConnection('127.0.0.1', server.port, timeout=2, context=context)
    with pytest.raises(ssl.SSLError, match='stand-in'):
        deadline.connect(connection)
    connection.close()
    assert 0 < context.handshake_timeout <= 2 - 0.5
    assert deadline.expired is False


def test_every_address_of_a_name_shares_the_deadline(serve, monkeypatch):
    """A name that resolves to two unanswering addresses, then one that answers: with 1 s in all
    the connect ends unconnected (socket.create_connection would give each address the whole
    second and connect to the third)."""
    good = serve(answer(b'{}'))
    with UnansweredAddress() as dead1, UnansweredAddress() as dead2:
        monkeypatch.setattr(http_deadline.socket, 'getaddrinfo',
                            resolving_to(dead1.address, dead2.address, ('127.0.0.1', good.port)))
        deadline = Deadline(1)
        connection = http.client.HTTPConnection('several.invalid', good.port, timeout=1)
        with pytest.raises(socket.timeout):
            deadline.connect(connection)
        connection.close()
    assert deadline.expired is True
    time.sleep(0.3)     # the server's accept loop polls every 0.1 s
    assert good.accepted == 0


def test_a_deadline_passed_before_connect_connects_nowhere(serve):
    server = serve(answer(b'{}'))
    deadline = Deadline(0)
    connection = http.client.HTTPConnection('127.0.0.1', server.port, timeout=1)
    with pytest.raises(socket.timeout, match='deadline passed'):
        deadline.connect(connection)
    connection.close()
    time.sleep(0.3)
    assert server.accepted == 0
    assert deadline.expired is True


def test_one_deadline_across_two_exchanges(serve):
    """Redirects share the request's deadline: the second exchange gets only what the first left."""
    server = serve(answer(b'x' * 300, interval=0.1))
    deadline = Deadline(2)
    first = http.client.HTTPConnection('127.0.0.1', server.port, timeout=2)
    deadline.connect(first)
    first.request('GET', '/')
    response = first.getresponse()
    assert response.read(3) == b'xxx'   # 0.3 s of the drip at least
    response.close()
    first.close()
    assert deadline.expired is False
    second = http.client.HTTPConnection('127.0.0.1', server.port, timeout=2)
    deadline.connect(second)
    # what the first exchange left, not the connection's own timeout of 2 s
    assert second.sock._sock.gettimeout() <= 2 - 0.3
    with pytest.raises(socket.timeout):
        second.request('GET', '/')
        second.getresponse().read()
    second.close()
    assert deadline.expired is True
