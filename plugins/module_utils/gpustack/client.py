# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A small stdlib HTTP client for GPUStack's management API.

- 2.x serves management routes under ``/v2``; 0.7.x under ``/v1`` (gpustack/routes/routes.py; docs/architecture.md).
  The generations, the route of a resource and the detection rule are module_utils/gpustack/api.py's,
  shared with the serving watchdog; this client brings the HTTP.
- Auth is an API key sent as ``Authorization: Bearer``; the key never appears in a message.
- Every failure is a GpustackApiError carrying the HTTP status (None when no answer came),
  the server's own message (GPUStack answers ``{"code","reason","message"}``; a 422 carries
  the validation errors verbatim in ``message``), the method and the path.

What the client does not trust (README "Security"): the HTTP answers. Every request has one
total deadline (connect, TLS, headers and body together), every body is size-capped, a redirect
is followed only for a GET to the same origin (scheme, host, port) - a write or another origin
fails naming the Location, so the key never leaves server_url and a write is never silently
turned into a GET - and every list page is type-checked before it is used. Options are checked
before anything is sent: the key is stripped of surrounding whitespace (a ``|`` vault scalar ends
in a newline) and refused, without being shown, when it cannot be a header value.
"""

from __future__ import annotations

import http.client
import json
import math
import os
import socket
import ssl
import urllib.parse

from ansible.module_utils.basic import env_fallback

from ansible_collections.kvpin.fleet.plugins.module_utils.gpustack.api import (
    API_VERSION_AUTO, API_VERSION_CHOICES, API_VERSIONS, ApiVersionError, detect_api_version, route,
)
from ansible_collections.kvpin.fleet.plugins.module_utils.http_deadline import Deadline

# Lists are paged (``page``, ``perPage``; answer ``{"items", "pagination"}``); 100 is the
# server's default page size.
PAGE_SIZE = 100
# Most pages one list may have (100 000 records): a server that claims more is not believed.
MAX_PAGES = 1000
# Longest server message kept in an error (a 422 lists every validation error).
MAX_MESSAGE_CHARS = 4000
# Largest answer read: a page of 100 model records is about 0.5 MiB.
MAX_BODY_BYTES = 16 * 2 ** 20
# Largest error body read (only its message is kept).
MAX_ERROR_BODY_BYTES = 64 * 2 ** 10
# Same-origin redirects followed for one GET.
MAX_REDIRECTS = 5
REDIRECT_STATUSES = (301, 302, 303, 307, 308)
# Longest timeout accepted, in seconds, and the longest API key and CA file read.
MAX_TIMEOUT = 3600
MAX_API_KEY_CHARS = 4096
MAX_CA_FILE_BYTES = 4 * 2 ** 20
# What replaces the API key wherever a server echoes it back (a message, a Location).
KEY_MASK = '********'


def gpustack_connection_argument_spec():
    """A fresh argument spec of the connection options every GPUStack module takes
    (documented by the doc fragment kvpin.fleet.gpustack); a module adds its own options to it."""
    return dict(
        server_url=dict(type='str', required=True, fallback=(env_fallback, ['GPUSTACK_SERVER_URL'])),
        api_key=dict(type='str', required=True, no_log=True, fallback=(env_fallback, ['GPUSTACK_API_KEY'])),
        validate_certs=dict(type='bool', default=True),
        ca_path=dict(type='path'),
        timeout=dict(type='int', default=30),
        api_version=dict(type='str', choices=list(API_VERSION_CHOICES), default=API_VERSION_AUTO),
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


class ClientInputError(ValueError):
    """A connection option that cannot be used; ``field`` names it. Never carries the key."""

    def __init__(self, field_name, message):
        super().__init__('%s: %s' % (field_name, message))
        self.field = field_name


def clean_api_key(value):
    """The key to send: surrounding whitespace (a trailing newline from a ``|`` vault scalar or
    ``slurp | b64decode``) stripped; refused, naming only positions, when it is empty or holds a
    character that is not visible ASCII (it could not be a header value, or would smuggle one)."""
    if not isinstance(value, str):
        raise ClientInputError('api_key', 'must be a string, got %s' % type(value).__name__)
    key = value.strip()
    if not key:
        raise ClientInputError('api_key', 'is empty%s' % (' (only whitespace)' if value else ''))
    if len(key) > MAX_API_KEY_CHARS:
        raise ClientInputError('api_key', 'is %d characters long, more than %d' % (len(key), MAX_API_KEY_CHARS))
    bad = [index for index, char in enumerate(key) if not '!' <= char <= '~']
    if bad:
        raise ClientInputError('api_key', '%d character(s) inside the key are whitespace, control or non-ASCII '
                                          '(first at position %d of %d); a key is printable ASCII without spaces '
                                          '(the key is not shown)' % (len(bad), bad[0] + 1, len(key)))
    return key


def check_timeout(value):
    """Seconds for one whole request: a finite number above 0, at most MAX_TIMEOUT."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ClientInputError('timeout', 'must be a number of seconds, got %r' % (value,))
    if not 0 < value <= MAX_TIMEOUT:
        raise ClientInputError('timeout', 'must be more than 0 and at most %d seconds, got %r' % (MAX_TIMEOUT, value))
    return value


def check_server_url(value):
    """``scheme://host[:port][/prefix]`` with scheme http or https, no credentials, query or fragment."""
    if not isinstance(value, str) or not value.startswith(('http://', 'https://')):
        shown = value if isinstance(value, str) and '@' not in value else '(not shown)'
        raise ClientInputError('server_url', 'must start with http:// or https://, got %r' % (shown,))
    parts = urllib.parse.urlsplit(value)
    if '@' in parts.netloc:
        raise ClientInputError('server_url', 'must not carry credentials (user:password@); '
                                             'the API key goes in api_key (the URL is not shown)')
    if parts.query or parts.fragment:
        raise ClientInputError('server_url', 'must not have a query or fragment, got %r' % (value,))
    try:
        port_ok = parts.port is None or parts.port > 0
    except ValueError:
        port_ok = False
    if not port_ok:
        raise ClientInputError('server_url', 'has an invalid port: %r' % (value,))
    if not parts.hostname:
        raise ClientInputError('server_url', 'has no host: %r' % (value,))
    if any(ord(char) < 0x21 or ord(char) > 0x7e for char in value):
        raise ClientInputError('server_url', 'holds whitespace, control or non-ASCII characters: %r' % (value,))
    return value.rstrip('/')


def origin_of(url):
    """(scheme, host, port) of a URL: two URLs with the same origin may share credentials."""
    parts = urllib.parse.urlsplit(url)
    scheme = (parts.scheme or '').lower()
    try:
        port = parts.port
    except ValueError:
        port = None
    return scheme, (parts.hostname or '').lower(), port or {'http': 80, 'https': 443}.get(scheme)


def check_ca_file(ca_path):
    """A readable PEM file with at least one CERTIFICATE block, at most MAX_CA_FILE_BYTES."""
    if not isinstance(ca_path, str) or not ca_path:
        raise ClientInputError('ca_path', 'must be a file path, got %r' % (ca_path,))
    if not os.path.isfile(ca_path):
        raise ClientInputError('ca_path', '%s does not exist or is not a file' % ca_path)
    try:
        size = os.path.getsize(ca_path)
        if size > MAX_CA_FILE_BYTES:
            raise ClientInputError('ca_path', '%s is %d bytes, more than a CA bundle (%d)' % (ca_path, size, MAX_CA_FILE_BYTES))
        with open(ca_path, 'rb') as handle:
            content = handle.read(MAX_CA_FILE_BYTES + 1)
    except OSError as error:
        raise ClientInputError('ca_path', 'cannot read %s: %s' % (ca_path, error.strerror or error))
    if b'-----BEGIN CERTIFICATE-----' not in content:
        raise ClientInputError('ca_path', '%s is not a PEM certificate file (no "-----BEGIN CERTIFICATE-----" '
                                          'block; a DER file must be converted with openssl x509 -inform der)' % ca_path)


def _ssl_context(validate_certs, ca_path):
    if ca_path is not None:
        check_ca_file(ca_path)
    if not validate_certs:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    try:
        return ssl.create_default_context(cafile=ca_path)
    except (ssl.SSLError, OSError, ValueError) as error:
        raise ClientInputError('ca_path', '%s: the TLS library refuses it as a CA file (%s)' % (
            ca_path, getattr(error, 'reason', None) or error.__class__.__name__))


def _unmasked(text):
    return text


def shown_sample(text, limit, mask=_unmasked):
    """``text`` for a message: ``mask`` applied first (it masks a secret the server may have
    echoed), then cut to ``limit`` characters ('...' marks a cut). The other order would let a
    cut leave a prefix of the secret that no longer matches its mask."""
    text = mask(str(text))
    return text if len(text) <= limit else text[:max(limit - 3, 0)] + '...'


def error_message_from_body(raw, mask=_unmasked):
    """The server's message from an error body (GPUStack, FastAPI or plain text), ``mask``
    applied before it is cut to MAX_MESSAGE_CHARS."""
    text = raw.decode('utf-8', errors='replace') if isinstance(raw, bytes) else str(raw or '')
    try:
        body = json.loads(text)
    except (ValueError, RecursionError):     # RecursionError: arrays nested past Python's limit
        return shown_sample(text.strip(), MAX_MESSAGE_CHARS, mask) or '(empty body)'
    if isinstance(body, dict):
        if isinstance(body.get('error'), dict):      # OpenAI-style error body
            body = body['error']
        for key in ('message', 'detail'):
            if key in body:
                value = body[key]
                value = value if isinstance(value, str) else json.dumps(value)
                return shown_sample(value.strip(), MAX_MESSAGE_CHARS, mask)
    return shown_sample(text.strip(), MAX_MESSAGE_CHARS, mask)


def _kind(value, mask=_unmasked):
    """A JSON value's type as the message names it, with a short sample (``mask`` applied
    before the sample is cut)."""
    if value is None:
        return 'null or nothing'
    names = {dict: 'an object', list: 'a list', str: 'a string', bool: 'a boolean', int: 'a number',
             float: 'a number'}
    return '%s (%s)' % (names.get(type(value), type(value).__name__), shown_sample(repr(value), 60, mask))


def _whole_number(value):
    return isinstance(value, int) and not isinstance(value, bool)


class GpustackClient:
    """JSON over HTTP(S) to one GPUStack server.

    ``api_version`` is ``v1``, ``v2`` or ``auto`` (resolved on first use by detect_api_version).
    ``timeout`` is the total time for one request, redirects included.
    """

    def __init__(self, server_url, api_key, api_version=API_VERSION_AUTO, validate_certs=True, ca_path=None,
                 timeout=30):
        self.server_url = check_server_url(server_url)
        self._api_key = clean_api_key(api_key)
        self.timeout = check_timeout(timeout)
        self._api_version = api_version if api_version in API_VERSIONS else None
        self._origin = origin_of(self.server_url)
        self._context = _ssl_context(validate_certs, ca_path) if self._origin[0] == 'https' else None
        if self._origin[0] == 'http' and ca_path is not None:
            check_ca_file(ca_path)

    @classmethod
    def from_params(cls, params):
        """The client for a module's parameters (the options of gpustack_connection_argument_spec)."""
        return cls(params['server_url'], params['api_key'], api_version=params['api_version'],
                   validate_certs=params['validate_certs'], ca_path=params['ca_path'],
                   timeout=params['timeout'])

    @classmethod
    def from_module(cls, module):
        """from_params for an AnsibleModule; the key as sent (stripped) is masked in all its output
        too, not only the key as given."""
        client = cls.from_params(module.params)
        module.no_log_values.update(client.secret_values())
        return client

    def secret_values(self):
        """What to mask in every output: the key as sent (stripped; the key as given is a no_log
        option already)."""
        return {self._api_key}

    def scrub(self, text):
        """``text`` with the API key masked (servers may echo what they were sent), also as
        repr() escapes it (how a sample of an answer shows it)."""
        text = str(text)
        for form in (self._api_key, repr(self._api_key)[1:-1]):
            if form in text:
                text = text.replace(form, KEY_MASK)
        return text

    # -- raw requests -------------------------------------------------------------------

    def request(self, method, path, body=None, query=None):
        """Send one request; return the parsed JSON answer (None for an empty body).

        Redirects: a GET follows up to MAX_REDIRECTS to the same origin; any other redirect is
        an error naming its Location (nothing is re-sent)."""
        url = self.server_url + path
        if query:
            url += '?' + urllib.parse.urlencode(query)
        data = None if body is None else json.dumps(body).encode('utf-8')
        deadline = Deadline(self.timeout)
        for _hop in range(MAX_REDIRECTS + 1):
            status, location, raw = self._exchange(method, path, url, data, deadline)
            if status not in REDIRECT_STATUSES:
                break
            url = self._redirect_target(method, path, url, status, location)
        else:
            raise GpustackApiError(method, path, status, 'more than %d redirects (the last to %s)' % (
                MAX_REDIRECTS, self.scrub(location)))
        if not 200 <= status < 300:
            raise GpustackApiError(method, path, status, error_message_from_body(raw, self.scrub))
        if not raw:
            return None
        try:
            return json.loads(raw)
        except RecursionError:
            raise GpustackApiError(method, path, status, 'answer is not usable JSON: arrays or objects nested '
                                   'deeper than this client parses') from None
        except ValueError:
            # Enough of the body that a key starting in the shown part is whole when masked.
            head = raw[:200 + 2 * len(self._api_key)]
            raise GpustackApiError(method, path, status, 'answer is not JSON: %s' % shown_sample(repr(head), 200, self.scrub))

    def _redirect_target(self, method, path, url, status, location):
        if not location:
            raise GpustackApiError(method, path, status, 'a redirect without a Location header')
        target = urllib.parse.urljoin(url, location)
        shown = self.scrub(target)
        try:
            urllib.parse.urlsplit(target).port
        except ValueError:
            raise GpustackApiError(method, path, status, 'redirects to %s, whose port is not a port number' % shown) from None
        if method != 'GET':
            raise GpustackApiError(method, path, status, 'redirects to %s; a %s is not re-sent to another address '
                                   '(it could turn into a GET and report a write that never happened): '
                                   'set server_url to the address the API answers on' % (shown, method))
        if origin_of(target) != self._origin:
            raise GpustackApiError(method, path, status, 'redirects to another origin, %s; the API key is only '
                                   'sent to server_url (%s): set server_url to the address the API answers on'
                                   % (shown, self.server_url))
        return target

    def _exchange(self, method, path, url, data, deadline):
        """One HTTP exchange: (status, Location header, body bytes), within ``deadline``."""
        remaining = deadline.remaining()
        if remaining <= 0:
            raise GpustackApiError(method, path, None, self._timeout_message())
        parts = urllib.parse.urlsplit(url)
        target = (parts.path or '/') + ('?' + parts.query if parts.query else '')
        if parts.scheme == 'https':
            connection = http.client.HTTPSConnection(parts.hostname, parts.port, timeout=remaining,
                                                     context=self._context or _ssl_context(True, None))
        else:
            connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=remaining)
        headers = {'Accept': 'application/json', 'Accept-Encoding': 'identity', 'User-Agent': 'kvpin.fleet',
                   'Authorization': 'Bearer %s' % self._api_key}
        if data is not None:
            headers['Content-Type'] = 'application/json'
        try:
            deadline.connect(connection)
            connection.request(method, target, body=data, headers=headers)
            response = connection.getresponse()
            status = response.status
            location = response.getheader('Location')
            ok = 200 <= status < 300
            raw = self._read_capped(method, path, response, MAX_BODY_BYTES if ok else MAX_ERROR_BODY_BYTES, fail=ok)
            if deadline.expired:
                # Whatever was read, an exchange the deadline ended a step of is no answer.
                raise GpustackApiError(method, path, None, self._timeout_message())
            return status, location, raw
        except GpustackApiError:
            raise
        except Exception as error:  # pylint: disable=broad-except
            # Every other failure is described by its class only (never str(error): a header or
            # URL could be in it); ssl and OS errors by their own reason.
            raise GpustackApiError(method, path, None, self._describe(error, deadline))
        finally:
            connection.close()

    def _read_capped(self, method, path, response, limit, fail):
        declared = response.getheader('Content-Length')
        if fail and declared and declared.strip().isdigit() and int(declared) > limit:
            raise GpustackApiError(method, path, response.status, 'answer of %s bytes is larger than %d bytes; '
                                   'not read' % (declared.strip(), limit))
        chunks, total = [], 0
        while total <= limit:
            chunk = response.read(min(2 ** 16, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > limit:
            if fail:
                raise GpustackApiError(method, path, response.status,
                                       'answer is larger than %d bytes; not read further' % limit)
            return b''.join(chunks)[:limit]
        return b''.join(chunks)

    def _timeout_message(self):
        return 'no complete answer within %ss (timeout: the total for one request, redirects included)' % self.timeout

    def _describe(self, error, deadline):
        if deadline.expired or isinstance(error, (socket.timeout, TimeoutError)):
            return self._timeout_message()
        if isinstance(error, ssl.SSLCertVerificationError):
            return 'TLS certificate verification failed (%s); set ca_path, or validate_certs=false' % (
                error.verify_message or error.reason)
        if isinstance(error, ssl.SSLError):
            return 'TLS error: %s' % (error.reason or error.__class__.__name__)
        if isinstance(error, http.client.HTTPException):
            return 'connection broken: %s' % error.__class__.__name__
        if isinstance(error, OSError):
            return 'cannot reach %s: %s' % (self.server_url, error.strerror or error.__class__.__name__)
        return 'could not send the request (%s; details are not shown, they may hold a header)' % (
            error.__class__.__name__)

    # -- API version and paths ----------------------------------------------------------

    @property
    def api_version(self):
        if self._api_version is None:
            self._api_version = self.detect_api_version()
        return self._api_version

    def detect_api_version(self):
        """``v2`` when /v2/models exists (any answer but 404), else ``v1`` when /v1/models does
        (api.py detect_api_version). No answer at all is raised as it is; neither route there is
        a GpustackApiError for the first path probed, with its 404."""
        try:
            return detect_api_version(self._probe_status)
        except ApiVersionError as error:
            path, status = error.probes[0]
            raise GpustackApiError('GET', path, status, str(error)) from None

    def _probe_status(self, path):
        """The HTTP status of a one-item GET of ``path`` (200 for any success); a request that got
        no answer (status None) raises."""
        try:
            self.request('GET', path, query={'page': 1, 'perPage': 1})
        except GpustackApiError as error:
            if error.status is None:
                raise
            # 401/403 still prove the route exists; the real call reports the auth error.
            return error.status
        return 200

    def path(self, resource, resource_id=None):
        return route(self.api_version, resource, resource_id)

    # -- resources ----------------------------------------------------------------------

    def _malformed(self, method, path, what):
        return GpustackApiError(method, path, 200, 'malformed answer: %s' % self.scrub(what))

    def kind(self, value):
        """_kind with the API key masked before the sample is cut."""
        return _kind(value, self.scrub)

    def check_record(self, method, path, record, where):
        """``record`` if it is an object whose ``id`` is a whole number >= 0, else a
        GpustackApiError naming ``where`` (the id goes into the next request's path)."""
        if not isinstance(record, dict):
            raise self._malformed(method, path, '%s must be an object, got %s' % (where, self.kind(record)))
        if not _whole_number(record.get('id')) or record['id'] < 0:
            raise self._malformed(method, path, "%s has no whole-number 'id' (got %s)" % (where, self.kind(record.get('id'))))
        return record

    def list_all(self, resource, query=None):
        """Every item of a paged list (follows ``pagination.totalPage``, at most MAX_PAGES).

        Each item is an object with a whole-number ``id`` and a string ``name``; anything else
        in the answer is a GpustackApiError naming the field."""
        items = []
        page = 1
        path = self.path(resource)
        while True:
            params = dict(query or {})
            params.update(page=page, perPage=PAGE_SIZE)
            answer = self.request('GET', path, query=params)
            if answer is None:
                answer = {}
            if isinstance(answer, list):      # unpaged answer
                return self._check_items(path, answer, 'the list')
            if not isinstance(answer, dict):
                raise self._malformed('GET', path, 'page %d must be an object with items and pagination, got %s'
                                      % (page, self.kind(answer)))
            page_items = answer.get('items')
            if page_items is None:
                page_items = []
            if not isinstance(page_items, list):
                raise self._malformed('GET', path, 'items must be a list, got %s' % self.kind(page_items))
            items.extend(self._check_items(path, page_items, 'items', len(items)))
            pagination = answer.get('pagination')
            if pagination is None:
                pagination = {}
            if not isinstance(pagination, dict):
                raise self._malformed('GET', path, 'pagination must be an object, got %s' % self.kind(pagination))
            total_pages = pagination.get('totalPage')
            if total_pages is None:
                total_pages = 1
            if not _whole_number(total_pages) or not 0 <= total_pages <= MAX_PAGES:
                raise self._malformed('GET', path, 'pagination.totalPage must be a whole number from 0 to %d, got %s'
                                      % (MAX_PAGES, self.kind(total_pages)))
            if page >= total_pages:
                return items
            page += 1

    def _check_items(self, path, items, where, offset=0):
        for index, item in enumerate(items):
            self.check_record('GET', path, item, '%s[%d]' % (where, offset + index))
            if not isinstance(item.get('name'), str):
                raise self._malformed('GET', path, "%s[%d] has no string 'name' (got %s)"
                                      % (where, offset + index, self.kind(item.get('name'))))
        return items

    def find_by_name(self, resource, name):
        """The one item named ``name`` (exact match), or None.

        ``search`` narrows the list on the server (a fuzzy match); the exact comparison is here.
        """
        matches = [item for item in self.list_all(resource, {'search': name}) if item.get('name') == name]
        if len(matches) > 1:
            raise GpustackApiError('GET', self.path(resource), None,
                                   '%d %s are named %r; refusing to guess' % (len(matches), resource, name))
        return matches[0] if matches else None

    def _record_answer(self, method, path, answer):
        """A created, replaced or read record: an object (an empty body counts as {})."""
        if answer is None:
            return {}
        if not isinstance(answer, dict):
            raise self._malformed(method, path, 'the record must be an object, got %s' % self.kind(answer))
        return answer

    def get(self, resource, resource_id):
        path = self.path(resource, resource_id)
        return self.check_record('GET', path, self.request('GET', path), 'the record')

    def create(self, resource, body):
        path = self.path(resource)
        return self._record_answer('POST', path, self.request('POST', path, body))

    def replace(self, resource, resource_id, body):
        path = self.path(resource, resource_id)
        return self._record_answer('PUT', path, self.request('PUT', path, body))

    def delete(self, resource, resource_id):
        return self.request('DELETE', self.path(resource, resource_id))
