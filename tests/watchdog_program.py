# -*- coding: utf-8 -*-
# Copyright (c) 2026, kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The watchdog program (a stdlib-only package the serving_watchdog role ships, with a launcher
script), loaded by its path as package ``kvpin_watchdog_lib`` for the tests of the program and
of its role. Importable from any test: pytest puts tests/ on sys.path for tests/conftest.py.

PROGRAM is the launcher (what the units run: `python3 PROGRAM daemon ...`); PACKAGE the package
directory. The package's two shared modules (http_deadline, gpustack_api) are not in the
checkout's package directory: loaded here, the package imports them from the collection
(ansible_collections.kvpin.fleet, which tests/conftest.py puts on sys.path); run as PROGRAM,
the launcher loads them from the checkout's plugins/."""
from __future__ import annotations

import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FILES = os.path.join(ROOT, "roles", "serving_watchdog", "files")
PROGRAM = os.path.join(FILES, "kvpin_watchdog.py")
PACKAGE_NAME = "kvpin_watchdog_lib"
PACKAGE = os.path.join(FILES, PACKAGE_NAME)


def load_watchdog_program():
    """The program's package, loaded once per process."""
    if PACKAGE_NAME in sys.modules:
        return sys.modules[PACKAGE_NAME]
    spec = importlib.util.spec_from_file_location(PACKAGE_NAME, os.path.join(PACKAGE, "__init__.py"),
                                                  submodule_search_locations=[PACKAGE])
    module = importlib.util.module_from_spec(spec)
    sys.modules[PACKAGE_NAME] = module  # its modules import each other by the package's name
    try:
        spec.loader.exec_module(module)
    except BaseException:
        for name in [n for n in sys.modules if n == PACKAGE_NAME or n.startswith(PACKAGE_NAME + ".")]:
            del sys.modules[name]
        raise
    return module


# The two modules the role ships into the package from the collection (vars/main.yml).
SHARED_FILES = {
    "http_deadline.py": os.path.join(ROOT, "plugins", "module_utils", "http_deadline.py"),
    "gpustack_api.py": os.path.join(ROOT, "plugins", "module_utils", "gpustack", "api.py"),
}


def stage_installed_program(dest):
    """Lay the program out in ``dest`` as the role installs it in serving_watchdog_install_dir:
    the launcher kvpin_watchdog.py and the package directory with its modules and the two shared
    files (no __pycache__). Returns (launcher path, package directory)."""
    import shutil  # pylint: disable=import-outside-toplevel
    package = os.path.join(str(dest), PACKAGE_NAME)
    os.makedirs(package, exist_ok=True)
    launcher = shutil.copy(PROGRAM, os.path.join(str(dest), "kvpin_watchdog.py"))
    for name in sorted(os.listdir(PACKAGE)):
        if name.endswith(".py"):
            shutil.copy(os.path.join(PACKAGE, name), os.path.join(package, name))
    for name, source in SHARED_FILES.items():
        shutil.copy(source, os.path.join(package, name))
    return launcher, package


class FixedClock:
    """A wall clock a test sets (``clock.t``) and the daemon reads: the `clock` it takes."""

    def __init__(self, t):
        self.t = t

    def __call__(self):
        return self.t
