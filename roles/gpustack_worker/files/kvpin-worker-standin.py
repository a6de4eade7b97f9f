#!/usr/bin/python3
# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""TEST-ONLY stand-in for a GPUStack worker (labs without GPUs). NOT GPUStack.

Installed by the gpustack_worker role only when gpustack_worker_native_standin is true. It is
run by the role's real unit exactly as GPUStack is (``<exe> start --config-file FILE``), reads
the same config.yaml, checks the keys a worker needs the way GPUStack does, and then serves
``GET /healthz`` (200) on worker_port, bound to worker_ip when set, else 0.0.0.0. It logs the
config it loaded with the token masked, and exits 2 on an invalid config (so a bad change
fails the role's health check). Standard library only; the config parser reads the block
YAML subset that to_nice_yaml writes (mappings, scalars, simple lists, comments).
"""

from __future__ import annotations

import argparse
import http.server
import json
import re
import sys

EXIT_BAD_CONFIG = 2
SECRET_KEYS = ('token', 'huggingface_token')
_INT_RE = re.compile(r'^[-+]?[0-9]+$')
_FLOAT_RE = re.compile(r'^[-+]?([0-9]+\.[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?$')


class ConfigError(ValueError):
    """The config file cannot be used; the message says why."""


def _scalar(text):
    text = text.strip()
    if text == '' or text in ('~', 'null', 'Null', 'NULL'):
        return None
    if text[0] in '"\'':
        quote = text[0]
        if len(text) < 2 or text[-1] != quote:
            raise ConfigError('unterminated quoted string: %s' % text)
        if quote == '"':
            return json.loads(text)
        return text[1:-1].replace("''", "'")
    if text in ('{}', '[]'):
        return {} if text == '{}' else []
    if text in ('true', 'True', 'TRUE', 'yes', 'Yes', 'on'):
        return True
    if text in ('false', 'False', 'FALSE', 'no', 'No', 'off'):
        return False
    if _INT_RE.match(text):
        return int(text)
    if _FLOAT_RE.match(text):
        return float(text)
    return text


def _lines(text):
    out = []
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not stripped or stripped.startswith('#') or stripped == '---':
            continue
        if '\t' in raw[:len(raw) - len(raw.lstrip())]:
            raise ConfigError('line %d: tab in indentation' % number)
        out.append((len(raw) - len(raw.lstrip(' ')), stripped, number))
    return out


def _split_key(stripped, number):
    if ':' not in stripped:
        raise ConfigError('line %d: expected "key: value", got %r' % (number, stripped))
    if stripped[0] in '"\'':
        end = stripped.index(stripped[0], 1)
        key = stripped[1:end]
        rest = stripped[end + 1:].lstrip()
        if not rest.startswith(':'):
            raise ConfigError('line %d: expected ":" after key' % number)
        return key, rest[1:]
    key, dummy, rest = stripped.partition(':')
    return key.strip(), rest


def _block(lines, pos, indent):
    """Parse the block starting at lines[pos] (its indentation is ``indent``)."""
    if lines[pos][1].startswith('- ') or lines[pos][1] == '-':
        items = []
        while pos < len(lines) and lines[pos][0] == indent and lines[pos][1].startswith('-'):
            value = lines[pos][1][1:].strip()
            if not value:
                raise ConfigError('line %d: nested list items are not supported' % lines[pos][2])
            items.append(_scalar(value))
            pos += 1
        return items, pos
    mapping = {}
    while pos < len(lines) and lines[pos][0] == indent:
        dummy, stripped, number = lines[pos]
        key, rest = _split_key(stripped, number)
        pos += 1
        if rest.strip():
            mapping[key] = _scalar(rest)
        elif pos < len(lines) and (lines[pos][0] > indent or
                                   (lines[pos][0] == indent and lines[pos][1].startswith('-'))):
            mapping[key], pos = _block(lines, pos, lines[pos][0])
        else:
            mapping[key] = None
    if pos < len(lines) and lines[pos][0] > indent:
        raise ConfigError('line %d: unexpected indentation' % lines[pos][2])
    return mapping, pos


def parse_config(text):
    """The mapping in ``text`` (block YAML subset)."""
    lines = _lines(text)
    if not lines:
        raise ConfigError('config is empty')
    value, pos = _block(lines, 0, lines[0][0])
    if pos != len(lines):
        raise ConfigError('line %d: unexpected content' % lines[pos][2])
    if not isinstance(value, dict):
        raise ConfigError('config must be a mapping')
    return value


def _non_negative_int(value, what):
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError('%s must be a non-negative integer, got %r' % (what, value))
    return value


def validate(config):
    """The settings the stand-in uses; raises ConfigError like a GPUStack worker would."""
    server_url = config.get('server_url')
    if not isinstance(server_url, str) or not re.match(r'^https?://[^/\s]+', server_url):
        raise ConfigError('server_url must be an http(s) URL, got %r' % (server_url,))
    if not config.get('token'):
        raise ConfigError('Token is required when running as worker')
    port = config.get('worker_port', 10150)
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise ConfigError('worker_port must be an integer in 1..65535, got %r' % (port,))
    reserved = config.get('system_reserved') or {}
    if not isinstance(reserved, dict):
        raise ConfigError('system_reserved must be a mapping, got %r' % (reserved,))
    for key in ('ram', 'vram'):
        _non_negative_int(reserved.get(key, 0), 'system_reserved.%s' % key)
    worker_ip = config.get('worker_ip') or '0.0.0.0'
    return {'bind': str(worker_ip), 'port': port}


def redacted(config):
    """``config`` with secrets masked, for the log."""
    return {key: ('********' if key in SECRET_KEYS and value else value) for key, value in config.items()}


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's naming)
        if self.path.split('?', 1)[0] == '/healthz':
            body = b'{"status": "ok", "standin": true}\n'
            self.send_response(200)
        else:
            body = b'{"detail": "Not Found"}\n'
            self.send_response(404)
        self.send_header('Content-Type', 'application/json')
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, fmt, *args):
        pass


def main(argv=None):
    parser = argparse.ArgumentParser(prog='kvpin-worker-standin',
                                     description='TEST-ONLY GPUStack worker stand-in')
    sub = parser.add_subparsers(dest='command', required=True)
    start = sub.add_parser('start')
    start.add_argument('--config-file', required=True)
    args = parser.parse_args(argv)
    log = sys.stderr
    try:
        with open(args.config_file, encoding='utf-8') as handle:
            config = parse_config(handle.read())
        settings = validate(config)
    except (OSError, ConfigError) as exc:
        print('kvpin-worker-standin: invalid config %s: %s' % (args.config_file, exc), file=log, flush=True)
        return EXIT_BAD_CONFIG
    print('kvpin-worker-standin (TEST-ONLY, not GPUStack): loaded %s: %s'
          % (args.config_file, json.dumps(redacted(config), sort_keys=True)), file=log, flush=True)
    try:
        server = http.server.ThreadingHTTPServer((settings['bind'], settings['port']), _Handler)
    except OSError as exc:
        print('kvpin-worker-standin: cannot listen on %s:%d: %s' % (settings['bind'], settings['port'], exc),
              file=log, flush=True)
        return EXIT_BAD_CONFIG
    print('kvpin-worker-standin: serving /healthz on %s:%d' % (settings['bind'], settings['port']),
          file=log, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == '__main__':
    sys.exit(main())
