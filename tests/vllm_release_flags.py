# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""TEST-ONLY: the command-line flags of every vLLM release, read from its released wheel's
sources, for the releases no Python here can import (tests/vllm_parser.py runs the one real
parser the lab has, vLLM 0.32.0's).

Recording (on demand, needs https to pypi.org and files.pythonhosted.org)::

    .venv/bin/python tests/vllm_release_flags.py --record tests/fixtures/vllm_flags/released.json

For each release (every x86_64 wheel from 0.7.0, no .post builds) it reads, with HTTP range
requests, only the wheel's zip directory and the few source files that define the server's
parser (``vllm/engine/arg_utils.py``, ``vllm/entrypoints/**/cli_args.py``, ``vllm/config.py`` or
``vllm/config/cache.py``): about 1 MB of a 300 MB wheel. It checks each file against the CRC the
zip stores and the wheel's size against the index, and it never reads more than ``MAX_FETCH``
bytes per wheel or waits more than ``TIMEOUT`` seconds on one request.

The flags are read statically (``ast``, no vLLM import):

* every string literal starting with ``-`` passed to an ``add_argument`` call, and
* ``--<field>`` for every annotated field of the ``FrontendArgs`` dataclass and its bases (from
  about 0.10 the OpenAI server adds its flags in a loop over that dataclass),

which is what the server's parser holds apart from argparse's ``-h/--help`` and the ``--no-X``
twins ``BooleanOptionalAction`` generates. ``method_check`` compares exactly that against the
table recorded from the real 0.32.0 parser; ``--record`` refuses to write when they differ.
The KV cache dtypes are the ``CacheDType = Literal[...]`` of the release's config (or the
literal ``choices`` of ``--kv-cache-dtype`` in releases before that type existed).
"""
from __future__ import annotations

import argparse
import ast
import datetime
import io
import json
import os
import re
import sys
import urllib.parse
import urllib.request
import zipfile
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import conftest  # noqa: E402,F401  pylint: disable=unused-import,wrong-import-position

from ansible_collections.kvpin.fleet.plugins.module_utils.plan import vllm_profile  # noqa: E402

INDEX_URL = 'https://pypi.org/simple/vllm/'
FILES_HOST = 'files.pythonhosted.org'
TIMEOUT = 30.0
MAX_FETCH = 16 << 20          # bytes read from one wheel (its directory + a few sources: ~1 MB)
MAX_SOURCE = 1 << 20          # one source file, uncompressed
MAX_INDEX = 32 << 20          # the index's JSON answer (~3 MB)
FIRST = (0, 7, 0)
METHOD = ('flags: every string literal starting with "-" passed to add_argument in the sources listed, and '
          '--<field> for each annotated field of the FrontendArgs dataclass and its bases; kv_cache_dtypes: '
          'CacheDType = Literal[...] in the config, or the literal choices of --kv-cache-dtype before it. '
          'Not listed: -h/--help and the --no-X twins BooleanOptionalAction generates.')
SOURCE_PATTERNS = (re.compile(r'^vllm/engine/arg_utils\.py$'),
                   re.compile(r'^vllm/entrypoints/(?:[a-z_]+/)*cli_args\.py$'),
                   re.compile(r'^vllm/config\.py$'), re.compile(r'^vllm/config/cache\.py$'))


class SourceError(Exception):
    """A wheel, the index or a source file is not what it should be."""


def version_key(text):
    parts = text.split('.')
    if not all(p.isdigit() for p in parts):
        raise SourceError('not a plain release version: %r' % text)
    return tuple(int(p) for p in parts)


def _open(url, headers=None):
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme != 'https' or parsed.hostname not in ('pypi.org', FILES_HOST):
        raise SourceError('refusing %s: only https to pypi.org and %s' % (url, FILES_HOST))
    request = urllib.request.Request(url, headers=dict(headers or {}, **{'User-Agent': 'kvpin-tests'}))
    answer = urllib.request.urlopen(request, timeout=TIMEOUT)  # nosec: https to the two hosts above
    final = urllib.parse.urlparse(answer.geturl())
    if final.scheme != 'https' or final.hostname not in ('pypi.org', FILES_HOST):
        answer.close()
        raise SourceError('%s redirected to %s' % (url, answer.geturl()))
    return answer


class RangeFile(io.RawIOBase):
    """A read-only, seekable view of a remote file through HTTP range requests, bounded in the
    bytes it will fetch in all."""

    def __init__(self, url, size, limit=MAX_FETCH):
        super().__init__()
        self.url, self.size, self.limit = url, size, limit
        self.pos = 0
        self.fetched = 0

    def readable(self):
        return True

    def seekable(self):
        return True

    def tell(self):
        return self.pos

    def seek(self, offset, whence=io.SEEK_SET):
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def readinto(self, buffer):
        want = min(len(buffer), self.size - self.pos)
        if want <= 0:
            return 0
        if self.fetched + want > self.limit:
            raise SourceError('%s: more than %d bytes wanted from one wheel' % (self.url, self.limit))
        with _open(self.url, {'Range': 'bytes=%d-%d' % (self.pos, self.pos + want - 1)}) as answer:
            if answer.status != 206:
                raise SourceError('%s: HTTP %s to a range request' % (self.url, answer.status))
            data = answer.read(want + 1)
        if len(data) != want:
            raise SourceError('%s: asked for %d bytes at %d, got %d' % (self.url, want, self.pos, len(data)))
        buffer[:want] = data
        self.pos += want
        self.fetched += want
        return want


def wheels(first=FIRST):
    """{version: {filename, url, size, sha256}}: the x86_64 wheel of every plain release."""
    with _open(INDEX_URL, {'Accept': 'application/vnd.pypi.simple.v1+json'}) as answer:
        body = answer.read(MAX_INDEX + 1)
    if len(body) > MAX_INDEX:
        raise SourceError('the index answer is over %d bytes' % MAX_INDEX)
    found = {}
    for entry in json.loads(body).get('files', []):
        match = re.match(r'^vllm-([0-9.]+)-cp\d+-(?:abi3|cp\d+)-manylinux[0-9_]+x86_64\.whl$', entry.get('filename', ''))
        if not match or entry.get('yanked'):
            continue
        version = match.group(1)
        if version_key(version) < first:
            continue
        size = entry.get('size')
        if not isinstance(size, int) or size <= 0:
            raise SourceError('%s: no size in the index' % entry['filename'])
        found.setdefault(version, dict(filename=entry['filename'], url=entry['url'], size=size,
                                       sha256=entry.get('hashes', {}).get('sha256')))
    return dict(sorted(found.items(), key=lambda item: version_key(item[0])))


def read_sources(wheel):
    """({path: text}, bytes fetched): the parser's source files, read out of the remote wheel."""
    remote = RangeFile(wheel['url'], wheel['size'])
    archive = zipfile.ZipFile(io.BufferedReader(remote, buffer_size=1 << 16))
    sources = {}
    for info in archive.infolist():
        if not any(p.match(info.filename) for p in SOURCE_PATTERNS):
            continue
        if info.file_size > MAX_SOURCE:
            raise SourceError('%s: %s is %d bytes' % (wheel['filename'], info.filename, info.file_size))
        data = archive.read(info)            # zipfile checks the stored CRC
        if zlib.crc32(data) != info.CRC:
            raise SourceError('%s: %s fails its CRC' % (wheel['filename'], info.filename))
        sources[info.filename] = data.decode('utf-8')
    if 'vllm/engine/arg_utils.py' not in sources:
        raise SourceError('%s has no vllm/engine/arg_utils.py' % wheel['filename'])
    return sources, remote.fetched


def _dataclass_flags(classes, name, seen=None):
    seen = set() if seen is None else seen
    if name in seen or name not in classes:
        return {}
    seen.add(name)
    path, node = classes[name]
    found = {}
    for base in node.bases:
        if isinstance(base, ast.Name):
            found.update(_dataclass_flags(classes, base.id, seen))
    for statement in node.body:
        if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name) \
                and not statement.target.id.startswith('_'):
            found['--' + statement.target.id.replace('_', '-')] = '%s:%d' % (path, statement.lineno)
    return found


def _literal_strings(node):
    if isinstance(node, (ast.List, ast.Tuple)):
        values = [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        return values if len(values) == len(node.elts) else None
    return None


def flags_of(sources):
    """({flag: 'path:line'}, {'values': [...], 'at': 'path:line'} or None) read from the sources."""
    flags, classes, kv_dtypes = {}, {}, None
    frontend = False
    for path in sorted(sources):
        tree = ast.parse(sources[path], filename=path)
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                classes.setdefault(node.name, (path, node))
                frontend = frontend or node.name == 'FrontendArgs'
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr == 'add_argument':
                names = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
                         and a.value.startswith('-')]
                for name in names:
                    flags.setdefault(name, '%s:%d' % (path, node.lineno))
                if '--kv-cache-dtype' in names and kv_dtypes is None:
                    for keyword in node.keywords:
                        values = _literal_strings(keyword.value) if keyword.arg == 'choices' else None
                        if values:
                            kv_dtypes = dict(values=values, at='%s:%d' % (path, node.lineno))
            elif isinstance(node, ast.Assign) and len(node.targets) == 1 \
                    and isinstance(node.targets[0], ast.Name) and node.targets[0].id == 'CacheDType' \
                    and isinstance(node.value, ast.Subscript):
                values = _literal_strings(node.value.slice) if not isinstance(node.value.slice, ast.Constant) \
                    else [node.value.slice.value]
                if values:
                    kv_dtypes = dict(values=values, at='%s:%d' % (path, node.lineno))
    if frontend:
        for name, where in _dataclass_flags(classes, 'FrontendArgs').items():
            flags.setdefault(name, where)
    return dict(sorted(flags.items())), kv_dtypes


def parser_flags(table):
    """The option strings of a recorded real parser (tests/fixtures/vllm_flags/vllm_X.json) that
    the sources spell out: without help and BooleanOptionalAction's generated --no-X twins."""
    found = set()
    for action in table['actions']:
        if action['action'] == '_HelpAction':
            continue
        generated = action['action'] == 'BooleanOptionalAction'
        for option in action['option_strings']:
            if not (generated and option.startswith('--no-')):
                found.add(option)
    return found


def method_check(static, table):
    """(only in the sources, only in the parser): empty both when the static reading of a
    release (a set of flags) equals its real parser."""
    static = set(static)
    real = parser_flags(table)
    return sorted(static - real), sorted(real - static)


def record(path, real_table_path, versions=None, watched=()):
    with open(real_table_path, encoding='utf-8') as handle:
        real_table = json.load(handle)
    available = wheels()
    chosen = versions or list(available)
    releases, fetched = {}, 0
    for version in chosen:
        if version not in available:
            raise SourceError('no x86_64 wheel of vLLM %s on the index' % version)
        wheel = available[version]
        sources, used = read_sources(wheel)
        fetched += used
        flags, kv_dtypes = flags_of(sources)
        releases[version] = dict(wheel=wheel['filename'], wheel_sha256=wheel['sha256'],
                                 sources=sorted(sources), flags=flags, kv_cache_dtypes=kv_dtypes)
        print('%-10s %4d flags  kv dtypes %-3s  %7d bytes read of %d' % (
            version, len(flags), len(kv_dtypes['values']) if kv_dtypes else '-', used, wheel['size']))
    real_version = real_table['vllm_version']
    if real_version in releases:
        only_static, only_real = method_check(releases[real_version]['flags'], real_table)
        if only_static or only_real:
            raise SourceError('the static reading of %s differs from its real parser: only in the sources %s, '
                              'only in the parser %s' % (real_version, only_static, only_real))
    document = dict(
        recorded='tests/vllm_release_flags.py --record on %s UTC from %s (x86_64 wheels, range reads, %d bytes '
                 'in all); checked against the real parser of %s (%s)' % (
                     datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d'), INDEX_URL, fetched,
                     real_version, real_table_path),
        method=METHOD,
        releases=_as_changes(releases, watched))
    with open(path, 'w', encoding='utf-8') as handle:
        json.dump(document, handle, indent=1, sort_keys=True)
        handle.write('\n')
    return document


def _as_changes(releases, watched):
    """Each release as the flags it adds and removes against the one before (the first: all),
    with file:line kept for the watched flags only: the fixture stays small and reads as a
    changelog ('0.18.0 removes --swap-space')."""
    out, before = {}, {}
    for version, release in releases.items():
        flags = release.pop('flags')
        release['added'] = sorted(set(flags) - set(before))
        release['removed'] = sorted(set(before) - set(flags))
        release['where'] = {flag: flags[flag] for flag in sorted(watched) if flag in flags}
        out[version] = release
        before = flags
    return out


def flags_at(document, version):
    """The set of flags of one recorded release, rebuilt from the changes."""
    if version not in document['releases']:
        raise KeyError('vLLM %s is not recorded' % version)
    flags = set()
    for name, release in sorted(document['releases'].items(), key=lambda item: version_key(item[0])):
        flags = (flags | set(release['added'])) - set(release['removed'])
        if name == version:
            return flags
    raise KeyError(version)


def watched_flags():
    return sorted({rule.flag for rule in vllm_profile.FLAGS.values()})


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n', maxsplit=1)[0])
    parser.add_argument('--record', required=True, metavar='PATH')
    parser.add_argument('--real-table', default='tests/fixtures/vllm_flags/vllm_0.32.0.json')
    parser.add_argument('--versions', nargs='*')
    parser.add_argument('--watch', nargs='*', metavar='FLAG', default=watched_flags(),
                        help='flags whose file:line is kept per release (default: the collection\'s own)')
    args = parser.parse_args(argv)
    try:
        record(args.record, args.real_table, args.versions, args.watch)
    except (SourceError, OSError, zipfile.BadZipFile, ValueError, SyntaxError) as error:
        print('vllm_release_flags: %s' % error, file=sys.stderr)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
