# -*- coding: utf-8 -*-
# Copyright (c) 2026, kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Load the watchdog program (the stdlib-only package kvpin_watchdog_lib the role ships) by its path."""
from __future__ import annotations

import json
import os

import pytest

from watchdog_program import PROGRAM, ROOT  # noqa: F401  pylint: disable=unused-import
from watchdog_program import load_watchdog_program as _load

TRACES = os.path.join(ROOT, "tests", "traces")


@pytest.fixture(scope="session")
def wd():
    return _load()


@pytest.fixture(scope="session")
def manifest():
    with open(os.path.join(TRACES, "manifest.json"), encoding="utf-8") as handle:
        return json.load(handle)
