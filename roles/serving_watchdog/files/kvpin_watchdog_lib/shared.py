# -*- coding: utf-8 -*-
# Copyright (c) 2026, kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The two modules the program shares with the collection, one copy of each in the repository:
plugins/module_utils/http_deadline.py (one deadline for a whole HTTP exchange) and
plugins/module_utils/gpustack/api.py (GPUStack's API generations, the rule that tells them
apart, the server-owned model fields). The role ships them into this package directory as
http_deadline.py and gpustack_api.py; in a checkout they are the collection's own modules
(tests/conftest.py and benchmarks/_setup.py put the collection on sys.path; the launcher
../kvpin_watchdog.py loads the checkout's files under the package's names)."""

from __future__ import annotations

try:   # on the node: the files the role ships into this package
    from . import http_deadline
except ImportError:   # in a checkout: the collection itself
    from ansible_collections.kvpin.fleet.plugins.module_utils import http_deadline
try:
    from . import gpustack_api
except ImportError:
    from ansible_collections.kvpin.fleet.plugins.module_utils.gpustack import api as gpustack_api

__all__ = ("http_deadline", "gpustack_api")
