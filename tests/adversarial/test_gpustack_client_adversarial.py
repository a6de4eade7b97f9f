# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""GpustackClient against hostile servers on 127.0.0.1 (issue 11, items 1, 2 and 4): keys with
whitespace, redirects same- and cross-origin, malformed 200 bodies, bad ca_path and timeout,
drips, slow headers, hangs, huge bodies, servers that echo the key back."""

import socket
import time

import pytest

from attacker_http import (close_early, drip, elapsed, hang, huge, json_body, raw, redirect,
                           slow_headers)
from gpustack_attack import API_KEY, assert_no_secret
from loopback_tcp import TcpServer, UnansweredAddress, resolving_to, tls_drip

from ansible_collections.kvpin.fleet.plugins.module_utils.gpustack.client import (
    MAX_BODY_BYTES, ClientInputError, GpustackApiError, GpustackClient, origin_of,
)

PAGE = {'items': [{'id': 1, 'name': 'm'}], 'pagination': {'page': 1, 'perPage': 100, 'total': 1, 'totalPage': 1}}


def client_for(server, key=API_KEY, **kwargs):
    kwargs.setdefault('api_version', 'v2')
    kwargs.setdefault('timeout', 5)
    return GpustackClient(server.url, key, **kwargs)


# -- 1. keys with whitespace ------------------------------------------------------------------

@pytest.mark.parametrize('given', [API_KEY + '\n', API_KEY + '\r\n', '  ' + API_KEY + '\t\n', '\n' + API_KEY])
def test_surrounding_whitespace_is_stripped_before_the_key_is_sent(attacker, given):
    server = attacker({('GET', '/v2/models'): json_body(200, PAGE)})
    assert client_for(server, given).list_all('models') == PAGE['items']
    assert server.requests[0]['headers']['authorization'] == 'Bearer ' + API_KEY


@pytest.mark.parametrize('given', [
    API_KEY[:20] + '\n' + API_KEY[20:],                 # a header smuggled after the first line
    API_KEY[:20] + '\r\nX-Injected: 1\r\n' + API_KEY[20:],
    API_KEY[:20] + ' ' + API_KEY[20:],
    API_KEY[:20] + '\x00' + API_KEY[20:],
    API_KEY[:20] + '\u00e9' + API_KEY[20:],
    API_KEY + '\n\n' + API_KEY,
])
def test_a_key_that_cannot_be_a_header_is_refused_without_showing_it(attacker, given):
    server = attacker({('GET', '/v2/models'): json_body(200, PAGE)})
    with pytest.raises(ClientInputError) as error:
        client_for(server, given)
    assert error.value.field == 'api_key'
    assert 'not shown' in str(error.value)
    assert_no_secret(str(error.value), given)
    assert server.requests == []


@pytest.mark.parametrize('given', ['', '   ', '\n'])
def test_an_empty_key_is_refused(given):
    with pytest.raises(ClientInputError, match='api_key: is empty'):
        GpustackClient('http://127.0.0.1:9', given)


# -- 2. redirects -----------------------------------------------------------------------------

@pytest.mark.parametrize('status', [301, 302, 303, 307, 308])
def test_a_cross_origin_redirect_gets_no_key_and_fails_naming_the_location(attacker, status):
    other = attacker({('GET', '/v2/models'): json_body(200, PAGE)})
    server = attacker({('GET', '/v2/models'): redirect(other.url + '/v2/models', status)})
    with pytest.raises(GpustackApiError) as error:
        client_for(server).list_all('models')
    assert other.requests == []
    assert error.value.status == status
    assert 'another origin, %s/v2/models' % other.url in str(error.value)


def test_another_host_name_or_port_of_the_same_machine_is_another_origin(attacker):
    server = attacker()
    server.route('GET', '/v2/models', redirect('http://localhost:%d/v2/models' % server.port))
    with pytest.raises(GpustackApiError, match='another origin'):
        client_for(server).list_all('models')
    assert len(server.requests) == 1
    assert origin_of('https://gpustack.example/x') == ('https', 'gpustack.example', 443)
    assert origin_of('https://gpustack.example/x') != origin_of('http://gpustack.example:443/x')  # downgrade
    assert origin_of('HTTPS://GPUStack.Example:443/') == origin_of('https://gpustack.example')


def test_a_same_origin_redirect_of_a_get_is_followed(attacker):
    server = attacker({('GET', '/v2/models'): redirect('/api/v2/models', 307),
                       ('GET', '/api/v2/models'): json_body(200, PAGE)})
    assert client_for(server).list_all('models') == PAGE['items']
    assert [r['path'] for r in server.requests] == ['/v2/models', '/api/v2/models']
    assert all(r['headers']['authorization'] == 'Bearer ' + API_KEY for r in server.requests)


@pytest.mark.parametrize('method,status', [('POST', 302), ('POST', 303), ('POST', 301), ('PUT', 307),
                                           ('PUT', 308), ('DELETE', 302)])
def test_a_redirected_write_is_a_failure_and_is_not_resent(attacker, method, status):
    """A 302/303 turns a POST into a GET in most clients, whose 200 then reads as 'created'."""
    server = attacker()
    path = '/v2/models' if method == 'POST' else '/v2/models/1'
    server.route(method, path, redirect('/v2/models/1', status))
    server.route('GET', '/v2/models/1', json_body(200, {'id': 1, 'name': 'not-what-was-sent'}))
    client = client_for(server)
    with pytest.raises(GpustackApiError) as error:
        {'POST': lambda: client.create('models', {'name': 'x'}),
         'PUT': lambda: client.replace('models', 1, {'name': 'x'}),
         'DELETE': lambda: client.delete('models', 1)}[method]()
    assert [r['method'] for r in server.requests] == [method]
    assert error.value.status == status
    assert 'redirects to %s/v2/models/1; a %s is not re-sent' % (server.url, method) in str(error.value)


def test_a_redirect_loop_and_a_redirect_without_location_fail(attacker):
    server = attacker({('GET', '/v2/models'): redirect('/v2/models'), ('GET', '/v2/workers'): raw(302, b'')})
    with pytest.raises(GpustackApiError, match='more than 5 redirects'):
        client_for(server).list_all('models')
    assert len(server.seen('GET', '/v2/models')) == 6
    with pytest.raises(GpustackApiError, match='without a Location'):
        client_for(server).list_all('workers')


def test_a_location_or_message_that_echoes_the_key_is_masked(attacker):
    server = attacker({
        ('GET', '/v2/models'): redirect('http://evil.invalid/steal?k=' + API_KEY),
        ('GET', '/v2/workers'): json_body(401, {'message': 'invalid key Bearer %s' % API_KEY}),
        ('PUT', '/v2/models/1'): raw(500, 'boom ' + API_KEY, [('Content-Type', 'text/plain')]),
    })
    client = client_for(server)
    for call in (lambda: client.list_all('models'), lambda: client.list_all('workers'),
                 lambda: client.replace('models', 1, {})):
        with pytest.raises(GpustackApiError) as error:
            call()
        assert '********' in str(error.value)
        assert_no_secret(str(error.value) + str(error.value.server_message))


@pytest.mark.parametrize('route,behaviour', [
    (('GET', '/v2/workers'), json_body(401, {'message': 'x' * 3970 + ' ' + API_KEY})),   # cut at 4000 chars
    (('GET', '/v2/models'), raw(200, b'x' * 150 + API_KEY.encode())),                   # not JSON, cut at 200
    (('GET', '/v2/models'), json_body(200, {'items': [{'id': 'x' * 30 + API_KEY, 'name': 'a'}]})),  # a sample
], ids=['error-message', 'not-json', 'malformed-sample'])
def test_a_key_echoed_where_a_message_is_cut_leaves_no_part_of_it(attacker, route, behaviour):
    """Each message is cut to a bound; the key is masked before the cut. Masked after it, the
    cut left the key's first 20-40 characters, which no longer match the mask."""
    server = attacker({route: behaviour})
    with pytest.raises(GpustackApiError) as error:
        client_for(server).list_all(route[1].rsplit('/', 1)[1])
    assert_no_secret(str(error.value) + str(error.value.server_message))


@pytest.mark.parametrize('status', [200, 500])
def test_json_nested_past_the_parsers_depth_is_an_error_not_a_traceback(attacker, status):
    server = attacker({('GET', '/v2/models/1'): raw(status, b'[' * 100000 + b']' * 100000)})
    with pytest.raises(GpustackApiError) as error:
        client_for(server).get('models', 1)
    assert error.value.status == status
    assert ('nested deeper' in str(error.value)) if status == 200 else len(error.value.server_message) <= 4000


def test_a_same_origin_redirect_to_a_port_that_is_not_a_number_is_named():
    """On a server at the scheme's default port, http://host:abc/ has the same origin by
    (scheme, host, default port); the client then read the port outside its error handling."""
    client = GpustackClient('http://127.0.0.1', API_KEY, api_version='v2', timeout=5)
    for location in ('http://127.0.0.1:abc/v2/models', 'http://127.0.0.1:99999/v2/models'):
        with pytest.raises(GpustackApiError, match='whose port is not a port number'):
            client._redirect_target('GET', '/v2/models', 'http://127.0.0.1/v2/models', 302, location)


# -- 4. malformed 200 bodies ------------------------------------------------------------------

@pytest.mark.parametrize('body,named', [
    (['a', 'b'], "the list[0] must be an object, got a string ('a')"),
    ('models', 'page 1 must be an object with items and pagination, got a string'),
    (42, 'page 1 must be an object'),
    ({'items': [{'name': 'no-id'}]}, "items[0] has no whole-number 'id' (got null or nothing)"),
    ({'items': [{'id': '7', 'name': 'x'}]}, "items[0] has no whole-number 'id' (got a string ('7'))"),
    ({'items': [{'id': True, 'name': 'x'}]}, "items[0] has no whole-number 'id' (got a boolean"),
    ({'items': [{'id': '1/../../admin', 'name': 'x'}]}, "items[0] has no whole-number 'id'"),
    ({'items': [{'id': -1, 'name': 'x'}]}, "items[0] has no whole-number 'id'"),
    ({'items': [{'id': 1}]}, "items[0] has no string 'name' (got null or nothing)"),
    ({'items': {'id': 1}}, 'items must be a list, got an object'),
    ({'items': [], 'pagination': [1]}, 'pagination must be an object, got a list'),
    ({'items': [], 'pagination': {'totalPage': '3'}}, "pagination.totalPage must be a whole number from 0 to 1000, "
                                                      "got a string ('3')"),
    ({'items': [], 'pagination': {'totalPage': 10 ** 9}}, 'pagination.totalPage must be a whole number'),
    ({'items': [], 'pagination': {'totalPage': 2.5}}, 'pagination.totalPage must be a whole number'),
])
def test_a_malformed_list_page_names_the_field(attacker, body, named):
    server = attacker({('GET', '/v2/models'): json_body(200, body)})
    with pytest.raises(GpustackApiError) as error:
        client_for(server).list_all('models')
    assert named in str(error.value), str(error.value)
    assert 'malformed answer' in str(error.value)


def test_malformed_records_and_non_json_answers_name_what_is_wrong(attacker):
    server = attacker({('GET', '/v2/models/1'): json_body(200, ['x']),
                       ('POST', '/v2/models'): json_body(200, 'created'),
                       ('PUT', '/v2/models/1'): raw(200, b'<html>ok</html>'),
                       ('GET', '/v2/models/2'): json_body(200, {'name': 'x'})})
    client = client_for(server)
    with pytest.raises(GpustackApiError, match='the record must be an object, got a list'):
        client.get('models', 1)
    with pytest.raises(GpustackApiError, match='the record must be an object, got a string'):
        client.create('models', {'name': 'x'})
    with pytest.raises(GpustackApiError, match='answer is not JSON'):
        client.replace('models', 1, {})
    with pytest.raises(GpustackApiError, match="the record has no whole-number 'id'"):
        client.get('models', 2)


# -- 4. ca_path and timeout -------------------------------------------------------------------

def test_ca_path_missing_not_pem_or_refused_by_tls_names_ca_path(tmp_path):
    not_pem = tmp_path / 'ca.txt'
    not_pem.write_text('this is not a certificate\n')
    bad_pem = tmp_path / 'bad.pem'
    bad_pem.write_text('-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n')
    for path, expected in ((str(tmp_path / 'missing.pem'), 'does not exist'), (str(not_pem), 'is not a PEM'),
                           (str(bad_pem), 'refuses it as a CA file'), (str(tmp_path), 'is not a file')):
        with pytest.raises(ClientInputError) as error:
            GpustackClient('https://gpustack.example', API_KEY, ca_path=path)
        assert error.value.field == 'ca_path' and expected in str(error.value), str(error.value)


@pytest.mark.parametrize('timeout', [0, -1, 0.0, float('nan'), float('inf'), True, '30', None, 3601])
def test_a_timeout_that_is_not_a_positive_number_names_timeout(timeout):
    with pytest.raises(ClientInputError) as error:
        GpustackClient('http://127.0.0.1:9', API_KEY, timeout=timeout)
    assert error.value.field == 'timeout'


@pytest.mark.parametrize('url,expected', [
    ('https://admin:%s@gpustack.example' % API_KEY, 'must not carry credentials'),
    ('gpustack.example', 'must start with http:// or https://'),
    ('https://gpustack.example/?x=1', 'no query or fragment'.replace('no', 'not have a')),
    ('https://:443', 'has no host'),
    ('https://gpustack.example:99999', 'invalid port'),
    ('https://gpustack.example/a b', 'whitespace'),
])
def test_a_bad_server_url_is_refused_and_credentials_in_it_are_not_shown(url, expected):
    with pytest.raises(ClientInputError) as error:
        GpustackClient(url, API_KEY)
    assert error.value.field == 'server_url' and expected in str(error.value), str(error.value)
    assert_no_secret(str(error.value))


# -- 4. total deadline and size caps ----------------------------------------------------------

@pytest.mark.parametrize('behaviour', [
    drip(200, b'{"items": [], "pagination": {"totalPage": 1}}' + b' ' * 200, interval=0.1),
    slow_headers(interval=0.1),
    hang(),
], ids=['body-drip', 'slow-headers', 'hang'])
def test_a_slow_server_does_not_hold_a_request_past_its_timeout(attacker, behaviour):
    """Each byte arrives within a per-read timeout (0.1 s < 1 s); only the total deadline ends it.
    The drip would take about 25 s; the bound asserted is the deadline's, not a speed."""
    server = attacker({('GET', '/v2/models'): behaviour})
    seconds, outcome = elapsed(client_for(server, timeout=1).list_all, 'models')
    assert isinstance(outcome, GpustackApiError), outcome
    assert outcome.status is None and 'no complete answer within 1s' in str(outcome)
    assert seconds < 10


def test_a_dripping_tls_handshake_does_not_hold_a_request_past_its_timeout():
    """An https server_url whose server drips its handshake one byte every 0.2 s (30 s in all)."""
    with TcpServer(tls_drip(interval=0.2, count=150)) as server:
        client = GpustackClient(server.https_url, API_KEY, api_version='v2', timeout=1)
        seconds, outcome = elapsed(client.list_all, 'models')
    assert isinstance(outcome, GpustackApiError), outcome
    assert outcome.status is None and 'no complete answer within 1s' in str(outcome)
    assert seconds < 1 + 3


def test_the_connect_and_the_handshake_share_the_timeout(monkeypatch):
    """server_url's name resolves to an address that does not answer, then to a server dripping
    its TLS handshake: the unanswered connect spends the whole second and the request ends there,
    the dripping server never reached (a per-step timeout would reach it: twice the timeout)."""
    with UnansweredAddress() as dead, TcpServer(tls_drip(interval=0.2, count=150)) as dripping:
        monkeypatch.setattr(socket, 'getaddrinfo', resolving_to(dead.address, ('127.0.0.1', dripping.port)))
        client = GpustackClient('https://gpustack.invalid:%d' % dripping.port, API_KEY, api_version='v2', timeout=1)
        seconds, outcome = elapsed(client.list_all, 'models')
        time.sleep(0.3)     # the server's accept loop polls every 0.1 s
        accepted = dripping.accepted
    assert isinstance(outcome, GpustackApiError), outcome
    assert outcome.status is None and 'no complete answer within 1s' in str(outcome)
    assert accepted == 0
    assert seconds < 1 + 3


def test_a_drip_across_same_origin_redirects_shares_one_deadline(attacker):
    server = attacker({('GET', '/v2/models'): redirect('/a'),
                       ('GET', '/a'): drip(307, b'x' * 10, interval=0.15),
                       ('GET', '/b'): drip(200, b'{}' + b' ' * 20, interval=0.15)})
    server.routes[('GET', '/a')] = raw(307, b'', [('Location', '/b')])
    seconds, outcome = elapsed(client_for(server, timeout=1).list_all, 'models')
    assert isinstance(outcome, GpustackApiError) and 'within 1s' in str(outcome), outcome
    assert seconds < 10


@pytest.mark.parametrize('content_length', [True, False])
def test_a_huge_answer_is_not_read_past_the_cap(attacker, content_length):
    server = attacker({('GET', '/v2/models'): huge(200, size=4 * MAX_BODY_BYTES, content_length=content_length)})
    with pytest.raises(GpustackApiError) as error:
        client_for(server, timeout=30).list_all('models')
    assert 'larger than %d bytes' % MAX_BODY_BYTES in str(error.value)


def test_a_huge_error_body_keeps_the_status_and_a_bounded_message(attacker):
    server = attacker({('GET', '/v2/models'): huge(500, size=2 * MAX_BODY_BYTES)})
    with pytest.raises(GpustackApiError) as error:
        client_for(server, timeout=30).list_all('models')
    assert error.value.status == 500 and len(error.value.server_message) <= 4000


@pytest.mark.parametrize('status', [400, 401, 403, 404, 422, 500, 502, 503])
def test_error_codes_carry_status_and_message(attacker, status):
    server = attacker({('PUT', '/v2/models/1'): json_body(status, {'message': 'nope %d' % status})})
    with pytest.raises(GpustackApiError) as error:
        client_for(server).replace('models', 1, {})
    assert (error.value.status, error.value.server_message) == (status, 'nope %d' % status)


def test_a_connection_closed_without_an_answer_or_refused_is_named(attacker):
    server = attacker({('GET', '/v2/models'): close_early()})
    with pytest.raises(GpustackApiError, match='connection broken: RemoteDisconnected'):
        client_for(server).list_all('models')
    port = server.port
    server.close()
    with pytest.raises(GpustackApiError, match='cannot reach http://127.0.0.1:%d' % port):
        GpustackClient('http://127.0.0.1:%d' % port, API_KEY, api_version='v2', timeout=2).list_all('models')


def test_no_error_path_prints_a_header(attacker):
    """Every failure above, once more, with a key that had a trailing newline: the message of
    each holds neither the key nor the Authorization header."""
    server = attacker({('GET', '/v2/models'): redirect('http://127.0.0.2:1/'),
                       ('POST', '/v2/models'): redirect('/v2/models'),
                       ('GET', '/v2/workers'): drip(200, b'{}' * 50, interval=0.2)})
    client = client_for(server, API_KEY + '\n', timeout=1)
    messages = []
    for call in (lambda: client.list_all('models'), lambda: client.create('models', {}),
                 lambda: client.list_all('workers'), lambda: client.get('models', 9)):
        with pytest.raises(GpustackApiError) as error:
            call()
        messages.append(str(error.value))
    text = '\n'.join(messages)
    assert 'Authorization' not in text and 'Bearer' not in text
    assert_no_secret(text, API_KEY + '\n')
    time.sleep(0)
