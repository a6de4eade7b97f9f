# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The watchdogs' measurements, read on the node in site.yml's one probe round trip.

Each deployment's watchdog writes ``measurement_file`` (kvpin_watchdog_lib/measure.py,
``TrafficRecorder.measurement``): its traffic window and the KV pool its engine got, in
serving_plan's ``measurement`` shape. ``read_measurements`` reads each file bounded in size
(MAX_MEASUREMENT_BYTES), never through a symbolic link or from anything but a regular file, and
checks it with the planner's own ``check_measurement``. Per deployment it answers ``state``:

* ``read``: ``measurement`` is the file's content, valid for the planner;
* ``missing``: no file yet (no watchdog, or it has not measured a page yet);
* ``unusable``: ``reason`` says why (too large, not JSON, a value out of range: the field named),
  and ``note`` is the line the plan report prints for it.

A file the probe cannot use never fails the probe: the plan falls back to the declared traffic
and says why.
"""

from __future__ import annotations

import errno
import json
import os
import stat

from ansible_collections.kvpin.fleet.plugins.module_utils.plan.measured_traffic import check_measurement
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.plan_types import PlanInputError

MAX_MEASUREMENT_BYTES = 256 * 1024   # a 7-day summary with 24 hours is about 15 KB
MAX_FILES = 256
MAX_NAME = 128


class MeasurementFilesInputError(ValueError):
    """The module's ``measurements`` option is malformed."""


def parse_measurement_files(raw):
    """{deployment name: absolute path}, checked (MeasurementFilesInputError names the entry)."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise MeasurementFilesInputError('must be a dict of deployment name to file path, got %s'
                                         % type(raw).__name__)
    if len(raw) > MAX_FILES:
        raise MeasurementFilesInputError('at most %d files, got %d' % (MAX_FILES, len(raw)))
    out = {}
    for name, path in raw.items():
        if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME:
            raise MeasurementFilesInputError('names are deployment names of 1..%d characters, got %r'
                                             % (MAX_NAME, str(name)[:40]))
        if not isinstance(path, str) or not os.path.isabs(path) or '\x00' in path or len(path) > 4096:
            raise MeasurementFilesInputError('%s: path must be an absolute path, got %r' % (name, str(path)[:80]))
        out[name] = path
    return out


def read_bounded_regular(path, limit):
    """At most ``limit`` bytes of the regular file at ``path`` (not through a symbolic link):
    (bytes, None), or (None, 'missing'), or (None, reason)."""
    flags = os.O_RDONLY | getattr(os, 'O_NOFOLLOW', 0) | getattr(os, 'O_NONBLOCK', 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return None, 'missing'
        if exc.errno == errno.ELOOP:
            return None, 'is a symbolic link'
        return None, 'not readable (%s)' % (exc.strerror or exc)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None, 'not a regular file'
        if st.st_size > limit:
            return None, '%d bytes, over the %d-byte bound' % (st.st_size, limit)
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(65536, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            return None, 'over the %d-byte bound (grew while read)' % limit
        return b''.join(chunks), None
    except OSError as exc:
        return None, 'not readable (%s)' % (exc.strerror or exc)
    finally:
        os.close(fd)


def read_measurement(name, path):
    """One deployment's answer: {path, state, measurement, reason, note}."""
    answer = _read(path)
    answer['note'] = ('%s: measurement file %s not used (%s): planned without it'
                      % (name, path, answer['reason']) if answer['state'] == 'unusable' else None)
    return answer


def _read(path):
    answer = {'path': path, 'state': 'unusable', 'measurement': None, 'reason': None}
    data, why = read_bounded_regular(path, MAX_MEASUREMENT_BYTES)
    if why == 'missing':
        answer.update(state='missing', reason='no measurement file yet (the watchdog writes it after its first '
                                              'measured page)')
        return answer
    if data is None:
        answer['reason'] = why
        return answer
    try:
        value = json.loads(data.decode('utf-8'))
    except (UnicodeDecodeError, ValueError) as exc:
        answer['reason'] = 'not JSON (%s)' % str(exc)[:120]
        return answer
    try:
        check_measurement(value)
    except PlanInputError as exc:
        answer['reason'] = 'invalid %s' % exc
        return answer
    answer.update(state='read', measurement=value)
    return answer


def read_measurements(files):
    """{deployment name: read_measurement(path)} for parse_measurement_files' result."""
    return {name: read_measurement(name, path) for name, path in sorted(files.items())}
