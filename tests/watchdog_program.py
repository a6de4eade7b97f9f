# -*- coding: utf-8 -*-
# Copyright (c) 2026, kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The watchdog program (a stdlib-only script the serving_watchdog role ships), loaded by its
path as module ``kvpin_watchdog`` for the tests of the program and of its role. Importable
from any test: pytest puts tests/ on sys.path for tests/conftest.py."""
from __future__ import annotations

import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAM = os.path.join(ROOT, "roles", "serving_watchdog", "files", "kvpin_watchdog.py")


def load_watchdog_program():
    """The program as a module, loaded once per process."""
    if "kvpin_watchdog" in sys.modules:
        return sys.modules["kvpin_watchdog"]
    spec = importlib.util.spec_from_file_location("kvpin_watchdog", PROGRAM)
    module = importlib.util.module_from_spec(spec)
    sys.modules["kvpin_watchdog"] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module
