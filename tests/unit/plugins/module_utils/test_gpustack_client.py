# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""GpustackClient against a scripted HTTP server on 127.0.0.1 (the edge: answers the real GPUStack
server cannot be made to give on demand - 5xx, many pages, a 0.7-style server without /v2)."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ansible_collections.kvpin.fleet.plugins.module_utils.gpustack.client import GpustackApiError, GpustackClient

API_KEY = 'gpustack_1234567890abcdef_fedcba0987654321fedcba0987654321'


class ScriptedServer:
    """Answers each (method, path without query) from ``routes``: (status, body) or a function
    of the query string. Records the requests it saw."""

    def __init__(self, routes):
        self.routes = routes
        self.requests = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self):
                path, _unused, query = self.path.partition('?')
                length = int(self.headers.get('Content-Length') or 0)
                outer.requests.append(dict(method=self.command, path=path, query=query,
                                           auth=self.headers.get('Authorization'),
                                           body=self.rfile.read(length) if length else None))
                route = outer.routes.get((self.command, path), (404, {'code': 404, 'reason': 'NotFound',
                                                                      'message': 'Not Found'}))
                status, body = route(query) if callable(route) else route
                raw = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header('Content-Length', str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            do_GET = do_POST = do_PUT = do_DELETE = _answer

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(('127.0.0.1', 0), Handler)
        self.url = 'http://127.0.0.1:%d' % self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def scripted():
    servers = []

    def make(routes):
        servers.append(ScriptedServer(routes))
        return servers[-1]
    yield make
    for server in servers:
        server.close()


def page_of(names, page, pages):
    return {'items': [{'id': i, 'name': n} for i, n in names],
            'pagination': {'page': page, 'perPage': 100, 'total': 250, 'totalPage': pages}}


def test_list_follows_every_page_and_sends_the_key_as_bearer(scripted):
    def models(query):
        page = int(dict(p.split('=') for p in query.split('&'))['page'])
        names = [(page * 1000 + i, 'm%d-%d' % (page, i)) for i in range(100 if page < 3 else 50)]
        return 200, page_of(names, page, 3)
    server = scripted({('GET', '/v2/models'): models})
    client = GpustackClient(server.url, API_KEY, api_version='v2')
    items = client.list_all('models')
    assert len(items) == 250 and items[-1]['name'] == 'm3-49'
    assert [r['query'].split('&')[0] for r in server.requests] == ['page=1', 'page=2', 'page=3']
    assert all(r['auth'] == 'Bearer ' + API_KEY for r in server.requests)


def test_find_by_name_is_exact_although_search_is_fuzzy(scripted):
    server = scripted({('GET', '/v2/models'): (200, page_of([(1, 'qwen3-8b-old'), (2, 'qwen3-8b')], 1, 1))})
    client = GpustackClient(server.url, API_KEY, api_version='v2')
    assert client.find_by_name('models', 'qwen3-8b')['id'] == 2
    assert 'search=qwen3-8b' in server.requests[0]['query']
    assert client.find_by_name('models', 'qwen3') is None


@pytest.mark.parametrize('status,body,expected', [
    (503, {'code': 503, 'reason': 'ServiceUnavailable', 'message': 'Service unavailable'}, 'Service unavailable'),
    (500, b'upstream exploded', 'upstream exploded'),
    (404, {'code': 404, 'reason': 'NotFound', 'message': 'Model not found'}, 'Model not found'),
])
def test_http_errors_carry_status_server_message_method_and_path(scripted, status, body, expected):
    server = scripted({('PUT', '/v2/models/7'): (status, body)})
    client = GpustackClient(server.url, API_KEY, api_version='v2')
    with pytest.raises(GpustackApiError) as error:
        client.replace('models', 7, {'name': 'x'})
    assert error.value.status == status and error.value.server_message == expected
    assert str(error.value) == 'PUT /v2/models/7 answered HTTP %d: %s' % (status, expected)
    assert API_KEY not in str(error.value)


def test_auto_detects_the_v1_api_of_a_07_server(scripted):
    server = scripted({('GET', '/v1/models'): (200, page_of([], 1, 0))})
    client = GpustackClient(server.url, API_KEY)
    assert client.api_version == 'v1'
    assert [r['path'] for r in server.requests] == ['/v2/models', '/v1/models']


def test_auto_counts_401_as_the_route_existing(scripted):
    server = scripted({('GET', '/v2/models'): (401, {'code': 401, 'reason': 'Unauthorized',
                                                     'message': 'Invalid authentication credentials'})})
    assert GpustackClient(server.url, API_KEY).api_version == 'v2'


def test_server_url_must_be_http():
    with pytest.raises(ValueError):
        GpustackClient('gpustack.example', API_KEY)
