# -*- coding: utf-8 -*-
# Copyright (c) 2026, kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Load the watchdog program (a stdlib-only script shipped by the role) by its path."""
from __future__ import annotations

import importlib.util
import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
PROGRAM = os.path.join(ROOT, "roles", "serving_watchdog", "files", "kvpin_watchdog.py")
TRACES = os.path.join(ROOT, "tests", "traces")


def _load():
    if "kvpin_watchdog" in sys.modules:
        return sys.modules["kvpin_watchdog"]
    spec = importlib.util.spec_from_file_location("kvpin_watchdog", PROGRAM)
    module = importlib.util.module_from_spec(spec)
    sys.modules["kvpin_watchdog"] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def wd():
    return _load()


@pytest.fixture(scope="session")
def manifest():
    with open(os.path.join(TRACES, "manifest.json"), encoding="utf-8") as handle:
        return json.load(handle)
