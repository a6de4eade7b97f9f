#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""How long gpu_facts' NVML probe takes per lab node, against the stub libnvidia-ml.so.1.

Prints a table: median probe time per node fixture over N runs, and its ratio to a
baseline measured in the same process (a bare nvmlInit + nvmlShutdown, which is also
where the stub reads its fixture). Printed, never asserted.

    .venv/bin/python benchmarks/bench_gpu_facts.py [--runs 200]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import statistics
import subprocess
import time

# First: makes ansible_collections.kvpin.fleet importable (benchmarks/_setup.py).
from _setup import ROOT

FIXTURES = os.path.join(ROOT, 'tests', 'fixtures', 'nvml')
NODES = ('lab-4090x2', 'lab-mixed', 'lab-4090x4', 'lab-a6000x4', 'no-gpu')


def median_seconds(fn, runs):
    samples = []
    for dummy in range(runs):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n', maxsplit=1)[0])
    parser.add_argument('--runs', type=int, default=200, help='runs per row (median reported)')
    args = parser.parse_args()

    from ansible_collections.kvpin.fleet.plugins.module_utils.facts.nvml_probe import preload_library, probe

    library = subprocess.run([os.path.join(ROOT, 'tests', 'nvml_stub', 'build.sh')],
                             check=True, capture_output=True, text=True).stdout.strip()
    preload_library(library)
    import pynvml

    def bare_init_shutdown():
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()

    os.environ['KVPIN_NVML_STUB_CONFIG'] = os.path.join(FIXTURES, 'lab-a6000x4.json')
    probe(pynvml)  # warm pynvml's function-pointer cache so row order does not matter
    baseline = median_seconds(bare_init_shutdown, args.runs)

    rows = [('nvmlInit+nvmlShutdown (lab-a6000x4)', '-', '-', baseline)]
    for node in NODES:
        os.environ['KVPIN_NVML_STUB_CONFIG'] = os.path.join(FIXTURES, node + '.json')
        facts = probe(pynvml)
        rows.append(('probe ' + node, str(facts['gpu_count']), str(len(facts['topology'])),
                     median_seconds(lambda: probe(pynvml), args.runs)))

    print('gpu_facts NVML probe over the stub library, median of %d runs, nvidia-ml-py %s'
          % (args.runs, importlib.metadata.version('nvidia-ml-py')))
    header = '%-40s %5s %6s %12s %8s' % ('case', 'gpus', 'pairs', 'median ms', 'x base')
    print(header)
    print('-' * len(header))
    for name, gpus, pairs, seconds in rows:
        print('%-40s %5s %6s %12.3f %8.1f' % (name, gpus, pairs, seconds * 1000.0, seconds / baseline))


if __name__ == '__main__':
    main()
