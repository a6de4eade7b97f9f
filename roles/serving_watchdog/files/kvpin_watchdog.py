# -*- coding: utf-8 -*-
# Copyright (c) 2026, kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""kvpin serving watchdog: the command the role installs (its units run
``python3 kvpin_watchdog.py daemon|check-config|switch-profile ...``; ``replay`` works here too).

The program is the package kvpin_watchdog_lib/ in the same directory (stdlib only, Python 3.9+;
its docstring says what each subcommand does). This file only puts its own directory first on
sys.path and runs the package's main(): the package has another name than this file, so which
of the two an import finds never depends on the path finder's order.

Two modules of the package are files of the collection (plugins/module_utils/http_deadline.py
and plugins/module_utils/gpustack/api.py) that the role ships into the package directory as
http_deadline.py and gpustack_api.py. Run from a checkout (roles/serving_watchdog/files/), they
are not there: this file loads them from the checkout's plugins/ under the names the package
imports, so ``python3 roles/serving_watchdog/files/kvpin_watchdog.py replay ...`` works as is.
"""

import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.realpath(__file__))
PACKAGE = "kvpin_watchdog_lib"
# package module -> its file in a checkout, relative to the checkout's root
SHARED = {
    "http_deadline": ("plugins", "module_utils", "http_deadline.py"),
    "gpustack_api": ("plugins", "module_utils", "gpustack", "api.py"),
}


def load_shared_from_checkout(here=HERE):
    """In a checkout (no shared file in the package directory), the collection's own files."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(here)))   # roles/serving_watchdog/files
    for name, parts in SHARED.items():
        qualified = "%s.%s" % (PACKAGE, name)
        if qualified in sys.modules or os.path.exists(os.path.join(here, PACKAGE, name + ".py")):
            continue
        path = os.path.join(root, *parts)
        if not os.path.isfile(path):
            continue   # not a checkout either: the package's import names what is missing
        spec = importlib.util.spec_from_file_location(qualified, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[qualified] = module
        spec.loader.exec_module(module)


def run():
    # No __pycache__ next to the program: the role checks that directory's entries, and check-config
    # runs as root.
    sys.dont_write_bytecode = True
    if sys.path[:1] != [HERE]:
        sys.path.insert(0, HERE)
    load_shared_from_checkout()
    from kvpin_watchdog_lib.cli import main  # pylint: disable=import-outside-toplevel
    return main()


if __name__ == "__main__":
    sys.exit(run())
