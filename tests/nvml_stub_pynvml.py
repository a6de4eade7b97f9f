# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The real pynvml bound to the NVML stub library (tests/nvml_stub, built here if needed), for
tests that probe fixture GPUs in-process. Importable from any test: pytest puts tests/ on
sys.path for tests/conftest.py."""
from __future__ import annotations

import os
import subprocess

from ansible_collections.kvpin.fleet.plugins.module_utils.facts.nvml_probe import preload_library

BUILD_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'nvml_stub', 'build.sh')


def stub_library_path():
    """Build the stub (a no-op when it is current) and return its path."""
    return subprocess.run([BUILD_SCRIPT], check=True, capture_output=True, text=True).stdout.strip()


def stub_pynvml():
    """pynvml with the stub library preloaded."""
    preload_library(stub_library_path())
    import pynvml  # pylint: disable=import-outside-toplevel
    return pynvml
