# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""node_state's HTTP check (the worker's /healthz) against servers on 127.0.0.1 that answer
slowly: its timeout is the total for the connect, the TLS handshake, the answer's status line
and headers, not a per-read timeout a server can reset with one byte at a time."""

import socket
import time

import pytest

from attacker_http import elapsed, hang, json_body, raw, redirect, slow_headers
from loopback_tcp import TcpServer, UnansweredAddress, resolving_to, tls_drip

from ansible_collections.kvpin.fleet.plugins.module_utils.facts.node_state import http_status


@pytest.mark.parametrize('behaviour', [slow_headers(interval=0.1, count=150), hang()], ids=['slow-headers', 'hang'])
def test_a_server_dripping_its_headers_gets_no_more_than_the_timeout(attacker, behaviour):
    """Each header byte comes 0.1 s after the last (within any per-read timeout); the drip
    would last 15 s. The bound asserted is the deadline's, not a speed."""
    server = attacker({('GET', '/healthz'): behaviour})
    seconds, answer = elapsed(http_status, server.url + '/healthz', 1.0)
    assert answer == (None, 'timed out after 1s')
    assert seconds < 10


def test_a_server_dripping_its_tls_handshake_gets_no_more_than_the_timeout():
    """An https URL whose server accepts and drips its handshake one byte every 0.2 s (30 s in
    all): a handshake with no total bound would wait it out. The bound asserted is the deadline's."""
    with TcpServer(tls_drip(interval=0.2, count=150)) as server:
        seconds, answer = elapsed(http_status, server.https_url + '/healthz', 1.0)
    assert answer == (None, 'timed out after 1s')
    assert server.accepted == 1
    assert seconds < 1.0 + 3


def test_the_connect_and_the_handshake_share_the_timeout(monkeypatch):
    """The name resolves to an address that does not answer, then to a server dripping its TLS
    handshake. The unanswered connect spends the whole second: the check ends there, and the
    dripping server is never reached (a connect and a handshake each given the full timeout
    would reach it and hold the check for twice the timeout)."""
    with UnansweredAddress() as dead, TcpServer(tls_drip(interval=0.2, count=150)) as dripping:
        monkeypatch.setattr(socket, 'getaddrinfo', resolving_to(dead.address, ('127.0.0.1', dripping.port)))
        seconds, answer = elapsed(http_status, 'https://gpu-node.invalid:%d/healthz' % dripping.port, 1.0)
        time.sleep(0.3)     # the server's accept loop polls every 0.1 s
        accepted = dripping.accepted
    assert answer == (None, 'timed out after 1s')
    assert accepted == 0
    assert seconds < 1.0 + 3


@pytest.mark.parametrize('behaviour,status', [
    (json_body(200, {'ok': True}), 200),
    (raw(503, b'down'), 503),
    (redirect('http://evil.invalid/'), 302),     # an answer to compare, not a place to go
])
def test_any_answer_is_its_status(attacker, behaviour, status):
    server = attacker({('GET', '/healthz'): behaviour})
    assert http_status(server.url + '/healthz', 5) == (status, None)
    assert len(server.requests) == 1


@pytest.mark.parametrize('url', ['http://127.0.0.1:abc/healthz', 'ftp://127.0.0.1/healthz', 'http:///healthz'])
def test_an_unusable_url_is_no_answer_with_a_reason(url):
    status, reason = http_status(url, 1)
    assert status is None and reason
