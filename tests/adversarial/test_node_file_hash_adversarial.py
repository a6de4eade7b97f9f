# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Hashing a node file inside the probe's one round trip is bounded (issue 39 item 3): a 20 GB
sparse file is not read (reported over-size, drift only where its size or mtime is not the one
wanted), a path swapped for a FIFO between lstat and open is not blocked on, a path swapped for a
symbolic link is not followed, and the bytes and seconds of one call are capped."""

from __future__ import annotations

import hashlib
import os
import threading

import pytest

from ansible_collections.kvpin.fleet.plugins.module_utils.facts import node_state as ns

SPARSE_BYTES = 20 * 1000 ** 3


def _sparse(path, size=SPARSE_BYTES):
    with open(str(path), 'wb') as handle:
        handle.truncate(size)          # a hole: no disk used, every byte reads as zero
    return str(path)


class CountingReads:
    """os.read wrapped: how many bytes the probe read, in all."""

    def __init__(self, monkeypatch):
        self.total = 0
        real = os.read

        def counted(fd, n):
            data = real(fd, n)
            self.total += len(data)
            return data
        monkeypatch.setattr(ns.os, 'read', counted)


def test_a_20_gb_sparse_file_is_reported_over_size_and_not_read(tmp_path, monkeypatch):
    path = _sparse(tmp_path / 'config.yaml')
    reads = CountingReads(monkeypatch)
    seen = ns.observe_file(path, want_sha1=True)
    assert reads.total == 0
    assert 'sha1' not in seen and seen['size'] == SPARSE_BYTES
    assert seen['sha1_skipped'].startswith('over-size'), seen
    assert str(SPARSE_BYTES) in seen['sha1_skipped'] and str(ns.HASH_MAX_FILE_BYTES) in seen['sha1_skipped']


def test_an_over_size_file_is_drift_only_where_its_size_or_mtime_is_not_the_wanted_one(tmp_path):
    path = _sparse(tmp_path / 'big.bin')
    mtime = os.stat(path).st_mtime
    want = '0' * 40
    # what the probe saw crosses the wire as JSON; compare it with three desired states
    checks = ns.parse_checks([
        {'name': 'same', 'files': [{'path': path, 'sha1': want, 'size': SPARSE_BYTES, 'mtime': mtime}]},
        {'name': 'resized', 'files': [{'path': path, 'sha1': want, 'size': 1234}]},
        {'name': 'touched', 'files': [{'path': path, 'sha1': want, 'size': SPARSE_BYTES, 'mtime': mtime - 60}]},
        {'name': 'unknown', 'files': [{'path': path, 'sha1': want}]},
    ])
    same, resized, touched, unknown = ns.compare(checks, ns.observe(checks))
    assert same.in_sync, same.drift
    assert resized.drift_items == [{'object': path, 'field': 'size', 'want': 1234, 'got': SPARSE_BYTES}]
    assert [item['field'] for item in touched.drift_items] == ['mtime']
    # with nothing to compare the size with, a file that cannot be hashed is drift (never in sync unread)
    assert unknown.drift_items == [{'object': path, 'field': 'sha1', 'want': want, 'got': None}]
    assert 'over-size' in str(unknown.drift[0])


def test_one_call_hashes_at_most_its_byte_budget(tmp_path, monkeypatch):
    data = os.urandom(3 * 1024 * 1024)
    paths = []
    for number in range(4):
        path = tmp_path / ('f%d' % number)
        path.write_bytes(data)
        paths.append(str(path))
    monkeypatch.setattr(ns, 'HASH_MAX_CALL_BYTES', 7 * 1024 * 1024)
    reads = CountingReads(monkeypatch)
    observed = ns.observe(ns.parse_checks([{'name': 'c', 'files': [{'path': p, 'read_sha1': True} for p in paths]}]))
    files = observed['files']
    assert [files[p].get('sha1') for p in paths[:2]] == [hashlib.sha1(data).hexdigest()] * 2
    assert all('call' in files[p]['sha1_skipped'] for p in paths[2:]), files
    assert reads.total <= 7 * 1024 * 1024


def test_hashing_stops_at_its_time_limit(tmp_path, monkeypatch):
    path = tmp_path / 'slow'
    path.write_bytes(b'x' * (4 * ns.HASH_CHUNK_BYTES))
    ticks = iter(range(0, 10 ** 6, 7))   # a disk this slow: every read costs 7 s
    budget = ns.HashBudget(clock=lambda: next(ticks))
    seen = ns.observe_file(str(path), want_sha1=True, budget=budget)
    assert 'sha1' not in seen and seen['sha1_skipped'].startswith('not hashed within'), seen


def _in_thread(function, timeout=10):
    """``function()``'s result, or a failure (not a hang) when it blocks longer than ``timeout``."""
    box = {}
    worker = threading.Thread(target=lambda: box.update(result=function()), daemon=True)
    worker.start()
    worker.join(timeout)
    return worker, box


def test_a_fifo_swapped_in_after_lstat_is_not_blocked_on(tmp_path, monkeypatch):
    regular = tmp_path / 'regular'
    regular.write_bytes(b'content')
    fifo = str(tmp_path / 'config.yaml')
    os.mkfifo(fifo)
    real_lstat = os.lstat
    # the path was a regular file when lstat looked, and is a FIFO (no writer) when it is opened
    monkeypatch.setattr(ns.os, 'lstat', lambda p, *a, **k: real_lstat(str(regular)) if p == fifo else real_lstat(p, *a, **k))
    worker, box = _in_thread(lambda: ns.observe_file(fifo, want_sha1=True))
    if worker.is_alive():
        # release the blocked open (a writer appears) before failing
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        worker.join(5)
        pytest.fail('observe_file blocked on a FIFO')
    seen = box['result']
    assert seen['kind'] == 'a fifo' and 'sha1' not in seen, seen


def test_a_symlink_swapped_in_after_lstat_is_not_followed(tmp_path, monkeypatch):
    secret = tmp_path / 'shadow'
    secret.write_bytes(b'not to be hashed')
    regular = tmp_path / 'regular'
    regular.write_bytes(b'x')
    link = str(tmp_path / 'config.yaml')
    os.symlink(str(secret), link)
    real_lstat = os.lstat
    lies = [str(regular)]     # the first lstat of the path sees a regular file, later ones the link

    def lstat(p, *a, **k):
        return real_lstat(lies.pop()) if p == link and lies else real_lstat(p, *a, **k)
    monkeypatch.setattr(ns.os, 'lstat', lstat)
    seen = ns.observe_file(link, want_sha1=True)
    assert 'sha1' not in seen, seen
    assert seen.get('kind') == 'a symlink', seen


def test_the_probe_reports_a_plain_symlink_and_does_not_hash_its_target(tmp_path):
    target = tmp_path / 'target'
    target.write_bytes(b'x')
    link = tmp_path / 'link'
    os.symlink(str(target), str(link))
    seen = ns.observe_file(str(link), want_sha1=True)
    assert seen['kind'] == 'a symlink' and 'sha1' not in seen


def test_a_regular_file_is_still_hashed_with_its_size_and_mtime(tmp_path):
    path = tmp_path / 'config.yaml'
    path.write_bytes(b'listen: 127.0.0.1\n')
    seen = ns.observe_file(str(path), want_sha1=True)
    assert seen['sha1'] == hashlib.sha1(b'listen: 127.0.0.1\n').hexdigest()
    assert seen['size'] == 18 and seen['mtime'] == os.stat(str(path)).st_mtime


@pytest.mark.parametrize('raw, field', [
    ({'size': -1}, 'files[0].size'), ({'size': '12'}, 'files[0].size'), ({'size': True}, 'files[0].size'),
    ({'mtime': float('nan')}, 'files[0].mtime'), ({'mtime': 'yesterday'}, 'files[0].mtime'),
    ({'size': 1, 'state': 'directory'}, 'files[0].size'),
])
def test_size_and_mtime_are_checked(raw, field):
    with pytest.raises(ns.NodeStateInputError) as err:
        ns.parse_checks([{'name': 'c', 'files': [dict({'path': '/x'}, **raw)]}])
    assert err.value.field == field
