# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Make the checkout importable as ``ansible_collections.kvpin.fleet`` for the benchmarks.

Each benchmark imports this first (``from _setup import ROOT``); run as a script, a benchmark
has benchmarks/ on sys.path, so the import needs no package. The name does not match
``bench_*.py``, so scripts/test.sh does not run it as a benchmark.
"""

from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def collections_root(root=ROOT):
    """The folder to put on sys.path: the one above ansible_collections/kvpin/fleet when the
    checkout already sits there (ansible-test's copy), else .cache/collections, where a link
    named ansible_collections/kvpin/fleet points at the checkout (made here when missing)."""
    parts = root.split(os.sep)
    if parts[-3:] == ['ansible_collections', 'kvpin', 'fleet']:
        return os.sep.join(parts[:-3])
    collections = os.path.join(root, '.cache', 'collections')
    link = os.path.join(collections, 'ansible_collections', 'kvpin', 'fleet')
    if not os.path.islink(link) and not os.path.isdir(link):
        os.makedirs(os.path.dirname(link), exist_ok=True)
        try:
            os.symlink(root, link)
        except FileExistsError:  # another process made it first
            pass
    return collections


COLLECTIONS_ROOT = collections_root()
if COLLECTIONS_ROOT not in sys.path:
    sys.path.insert(0, COLLECTIONS_ROOT)
