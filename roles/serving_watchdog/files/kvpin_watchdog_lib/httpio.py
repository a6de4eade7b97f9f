# -*- coding: utf-8 -*-
# Copyright (c) 2026, kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Bounded HTTP: a deadline per request enforced on the socket, a body size cap, no redirects."""

from __future__ import annotations

import json
import re
import socket
import time
from typing import Dict, Optional, Tuple

from .config import MiB, URL_KEYS
from .fsio import _read
from .shared import http_deadline


# ---------------------------------------------------------------------------
# Bounded HTTP: a deadline per request enforced on the socket, a body size cap, no redirects.
# ---------------------------------------------------------------------------
class HTTPFailure(Exception):
    """A request that did not produce a usable answer; the message never holds a credential."""


def _connect_within(conn, deadline: float) -> None:
    """conn.connect() within the deadline (on time.monotonic), then every later send and recv
    too: each address of the host and the TLS handshake get only what is left of it. The
    collection's http_deadline.Deadline does it (one copy: the role ships that file into this
    package)."""
    http_deadline.Deadline(deadline - time.monotonic()).connect(conn)


def http_request(url: str, method: str = "GET", body: Optional[bytes] = None,
                 headers: Optional[Dict[str, str]] = None, deadline: Optional[float] = None,
                 timeout: float = 5.0, max_bytes: int = 8 * MiB) -> Tuple[int, bytes, Dict[str, str]]:
    """One HTTP(S) request bounded in time (deadline on time.monotonic, enforced on every
    socket operation) and size. Never follows a redirect: a 3xx is returned as is, so a
    credential never reaches the Location. Raises HTTPFailure (message without headers)."""
    import http.client  # pylint: disable=import-outside-toplevel
    import urllib.parse  # pylint: disable=import-outside-toplevel
    auth = str(dict((k.lower(), v) for k, v in (headers or {}).items()).get("authorization") or "")
    secret = auth.split(" ", 1)[1] if auth.startswith("Bearer ") else None
    now = time.monotonic()
    deadline = min(deadline if deadline is not None else now + timeout, now + timeout)
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise HTTPFailure("not an http(s) URL: %s" % _redact_url(url))
    left = deadline - now
    if left <= 0:
        raise HTTPFailure("%s %s: no time left in this tick" % (method, _redact_url(url)))
    conn_cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = conn_cls(parts.hostname, parts.port, timeout=left)
    path = (parts.path or "/") + ("?" + parts.query if parts.query else "")
    resp = None
    try:
        _connect_within(conn, deadline)
        conn.request(method, path, body=body, headers=dict(headers or {}))
        resp = conn.getresponse()
        length = resp.getheader("Content-Length")
        if length and length.isdigit() and int(length) > max_bytes:
            raise HTTPFailure("%s %s: body of %s bytes exceeds the %d byte cap" % (
                method, _redact_url(url), length, max_bytes))
        chunks, total = [], 0
        while True:
            chunk = resp.read(min(65536, max_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > max_bytes:
                raise HTTPFailure("%s %s: body exceeds the %d byte cap" % (method, _redact_url(url), max_bytes))
        return resp.status, b"".join(chunks), {k.lower(): v for k, v in resp.getheaders()}
    except HTTPFailure:
        raise
    except (OSError, http.client.HTTPException, ValueError) as exc:
        if time.monotonic() >= deadline or isinstance(exc, socket.timeout):
            raise HTTPFailure("%s %s: deadline passed" % (method, _redact_url(url))) from None
        raise HTTPFailure("%s %s: %s" % (method, _redact_url(url), type(exc).__name__ + ": "
                                         + _mask_secret(str(exc), secret)[:200])) from None
    finally:
        if resp is not None:
            resp.close()
        conn.close()


def _redact_url(url: object) -> str:
    """A URL fit for a log: no userinfo (user:password@), every query value masked
    (?token=*** keeps the names) and no fragment. Plain text, never parsed: also fit for a
    malformed Location."""
    text = re.sub(r"//[^/@]*@", "//", str(url))
    text, hashed, _fragment = text.partition("#")
    base, asked, query = text.partition("?")
    if asked:
        base += "?" + "&".join(part.split("=", 1)[0] + "=***" if "=" in part else ("***" if part else "")
                               for part in query.split("&"))
    return base + ("#***" if hashed else "")


def redacted_config(cfg: Dict[str, object]) -> Dict[str, object]:
    """The config as logged: no key file path, every URL-valued key through _redact_url."""
    return {k: (_redact_url(v) if k in URL_KEYS + ("metrics_path",) and isinstance(v, str) else v)
            for k, v in cfg.items() if k != "gpustack_token_file"}


def _mask_secret(text: object, secret: Optional[str]) -> str:
    """text with the API key (as sent, percent-encoded or JSON-escaped) replaced by ***: a
    server's answer or Location may echo it. Mask before any cut, so no prefix survives."""
    import urllib.parse  # pylint: disable=import-outside-toplevel
    text = str(text)
    if secret:
        for form in sorted({secret, urllib.parse.quote(secret, safe=""), json.dumps(secret)[1:-1]},
                           key=len, reverse=True):
            text = text.replace(form, "***")
    return text


def read_api_key(path: Optional[object]) -> Optional[str]:
    """The key file's one line, stripped; a key with inner whitespace or control characters is
    refused (it would break or smuggle a header). The message never includes the key."""
    if not path:
        return None
    text = _read(str(path))
    if text is None:
        raise HTTPFailure("API key file %s cannot be read" % path)
    key = text.strip()
    if not key:
        raise HTTPFailure("API key file %s is empty" % path)
    if any(ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in key):
        raise HTTPFailure("API key in %s holds whitespace or control characters: refused" % path)
    return key
