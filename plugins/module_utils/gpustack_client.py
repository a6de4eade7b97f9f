# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A small stdlib HTTP client for GPUStack's management API.

- 2.x serves management routes under ``/v2``; 0.7.x under ``/v1`` (gpustack/routes/routes.py; docs/architecture.md).
- Auth is an API key sent as ``Authorization: Bearer``; the key never appears in a message.
- Every failure is a GpustackApiError carrying the HTTP status (None when no answer came),
  the server's own message (GPUStack answers ``{"code","reason","message"}``; a 422 carries
  the validation errors verbatim in ``message``), the method and the path.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import urllib.error
import urllib.parse
import urllib.request

from ansible.module_utils.basic import env_fallback

API_VERSIONS = ('v1', 'v2')
# Lists are paged (``page``, ``perPage``; answer ``{"items", "pagination"}``); 100 is the
# server's default page size.
PAGE_SIZE = 100
# Longest server message kept in an error (a 422 lists every validation error).
MAX_MESSAGE_CHARS = 4000


def gpustack_connection_argument_spec():
    """A fresh argument spec of the connection options every GPUStack module takes
    (documented by the doc fragment kvpin.fleet.gpustack); a module adds its own options to it."""
    return dict(
        server_url=dict(type='str', required=True, fallback=(env_fallback, ['GPUSTACK_SERVER_URL'])),
        api_key=dict(type='str', required=True, no_log=True, fallback=(env_fallback, ['GPUSTACK_API_KEY'])),
        validate_certs=dict(type='bool', default=True),
        ca_path=dict(type='path'),
        timeout=dict(type='int', default=30),
        api_version=dict(type='str', choices=['auto'] + list(API_VERSIONS), default='auto'),
    )


class GpustackApiError(Exception):
    """A request that did not succeed. ``status`` is None for network, TLS and timeout errors."""

    def __init__(self, method, path, status, message):
        self.method = method
        self.path = path
        self.status = status
        self.server_message = message
        if status is None:
            text = '%s %s failed: %s' % (method, path, message)
        else:
            text = '%s %s answered HTTP %s: %s' % (method, path, status, message)
        super().__init__(text)


def error_message_from_body(raw):
    """The server's message from an error body (GPUStack, FastAPI or plain text)."""
    text = raw.decode('utf-8', errors='replace') if isinstance(raw, bytes) else str(raw or '')
    try:
        body = json.loads(text)
    except ValueError:
        return text.strip()[:MAX_MESSAGE_CHARS] or '(empty body)'
    if isinstance(body, dict):
        if isinstance(body.get('error'), dict):      # OpenAI-style error body
            body = body['error']
        for key in ('message', 'detail'):
            if key in body:
                value = body[key]
                value = value if isinstance(value, str) else json.dumps(value)
                return value.strip()[:MAX_MESSAGE_CHARS]
    return text.strip()[:MAX_MESSAGE_CHARS]


class GpustackClient:
    """JSON over HTTP(S) to one GPUStack server.

    ``api_version`` is ``v1``, ``v2`` or ``auto`` (resolved on first use by detect_api_version).
    """

    def __init__(self, server_url, api_key, api_version='auto', validate_certs=True, ca_path=None,
                 timeout=30, opener=None):
        if not server_url or not server_url.startswith(('http://', 'https://')):
            raise ValueError('server_url must start with http:// or https://, got %r' % (server_url,))
        self.server_url = server_url.rstrip('/')
        self._api_key = api_key
        self.timeout = timeout
        self._api_version = api_version if api_version in API_VERSIONS else None
        self._opener = opener or urllib.request.build_opener(
            urllib.request.HTTPSHandler(context=self._ssl_context(validate_certs, ca_path)))

    @classmethod
    def from_params(cls, params):
        """The client for a module's parameters (the options of gpustack_connection_argument_spec)."""
        return cls(params['server_url'], params['api_key'], api_version=params['api_version'],
                   validate_certs=params['validate_certs'], ca_path=params['ca_path'],
                   timeout=params['timeout'])

    @staticmethod
    def _ssl_context(validate_certs, ca_path):
        if not validate_certs:
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
            return context
        return ssl.create_default_context(cafile=ca_path)

    # -- raw requests -------------------------------------------------------------------

    def request(self, method, path, body=None, query=None):
        """Send one request; return the parsed JSON answer (None for an empty body)."""
        url = self.server_url + path
        if query:
            url += '?' + urllib.parse.urlencode(query)
        headers = {'Accept': 'application/json', 'Authorization': 'Bearer %s' % self._api_key}
        data = None
        if body is not None:
            data = json.dumps(body).encode('utf-8')
            headers['Content-Type'] = 'application/json'
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with self._opener.open(request, timeout=self.timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as error:
            raise GpustackApiError(method, path, error.code, error_message_from_body(error.read()))
        except urllib.error.URLError as error:
            raise GpustackApiError(method, path, None, self._describe_network_error(error.reason))
        except (socket.timeout, TimeoutError):
            raise GpustackApiError(method, path, None, 'no answer within %ss (timeout)' % self.timeout)
        except ssl.SSLError as error:
            raise GpustackApiError(method, path, None, 'TLS error: %s' % error)
        except OSError as error:
            raise GpustackApiError(method, path, None, self._describe_network_error(error))
        except http.client.HTTPException as error:
            raise GpustackApiError(method, path, None, 'connection broken: %s' % (error.__class__.__name__,))
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            raise GpustackApiError(method, path, None, 'answer is not JSON: %r' % raw[:200])

    def _describe_network_error(self, reason):
        if isinstance(reason, ssl.SSLCertVerificationError):
            return 'TLS certificate verification failed (%s); set ca_path, or validate_certs=false' % (
                reason.verify_message or reason)
        if isinstance(reason, ssl.SSLError):
            return 'TLS error: %s' % reason
        if isinstance(reason, (socket.timeout, TimeoutError)):
            return 'no answer within %ss (timeout)' % self.timeout
        return 'cannot reach %s: %s' % (self.server_url, reason)

    # -- API version and paths ----------------------------------------------------------

    @property
    def api_version(self):
        if self._api_version is None:
            self._api_version = self.detect_api_version()
        return self._api_version

    def detect_api_version(self):
        """``v2`` when /v2/models exists (any answer but 404), else ``v1`` when /v1/models does."""
        for version in ('v2', 'v1'):
            try:
                self.request('GET', '/%s/models' % version, query={'page': 1, 'perPage': 1})
                return version
            except GpustackApiError as error:
                if error.status is None:
                    raise
                if error.status != 404:
                    # 401/403 still prove the route exists; the real call reports the auth error.
                    return version
        raise GpustackApiError('GET', '/v2/models', 404,
                               'neither /v2/models nor /v1/models exists: is this a GPUStack server?')

    def path(self, resource, resource_id=None):
        base = '/%s/%s' % (self.api_version, resource)
        return base if resource_id is None else '%s/%s' % (base, resource_id)

    # -- resources ----------------------------------------------------------------------

    def list_all(self, resource, query=None):
        """Every item of a paged list (follows ``pagination.totalPage``)."""
        items = []
        page = 1
        while True:
            params = dict(query or {})
            params.update(page=page, perPage=PAGE_SIZE)
            answer = self.request('GET', self.path(resource), query=params) or {}
            if isinstance(answer, list):      # unpaged answer
                return answer
            items.extend(answer.get('items') or [])
            total_pages = (answer.get('pagination') or {}).get('totalPage') or 1
            if page >= total_pages:
                return items
            page += 1

    def find_by_name(self, resource, name):
        """The one item named ``name`` (exact match), or None.

        ``search`` narrows the list on the server (a fuzzy match); the exact comparison is here.
        """
        matches = [item for item in self.list_all(resource, {'search': name}) if item.get('name') == name]
        if len(matches) > 1:
            raise GpustackApiError('GET', self.path(resource), None,
                                   '%d %s are named %r; refusing to guess' % (len(matches), resource, name))
        return matches[0] if matches else None

    def get(self, resource, resource_id):
        return self.request('GET', self.path(resource, resource_id))

    def create(self, resource, body):
        return self.request('POST', self.path(resource), body)

    def replace(self, resource, resource_id, body):
        return self.request('PUT', self.path(resource, resource_id), body)

    def delete(self, resource, resource_id):
        return self.request('DELETE', self.path(resource, resource_id))
