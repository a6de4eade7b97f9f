"""A benchmark script loaded as a module by the tests of its logic (importable from any test:
tests/conftest.py puts tests/ on sys.path)."""
import importlib.util
import os
import sys

BENCH_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'benchmarks')


def load_benchmark(name):
    """benchmarks/<name>.py as a module (its ``import _setup`` / ``_splits`` need benchmarks/ on
    sys.path, as when it runs as a script)."""
    added = BENCH_DIR not in sys.path
    if added:
        sys.path.insert(0, BENCH_DIR)
    try:
        spec = importlib.util.spec_from_file_location('kvpin_' + name, os.path.join(BENCH_DIR, name + '.py'))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        if added:
            sys.path.remove(BENCH_DIR)
    return module
