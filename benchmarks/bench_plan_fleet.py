# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""playbooks/plan.yml at fleet scale, offline; prints a table, asserts nothing.

Fleets of 4, 25 and 100 hosts (tests/fleet_inventory.py: the four lab layouts and their
deployments in turn, GPUs from saved kvpin.fleet.gpu_facts output through kvpin_gpu_facts_file,
no connection). Per size: deployments, GPUs, wall seconds of the whole ansible-playbook run,
seconds per host, and that per-host figure as a ratio to the 4-host run of the same command
(the machine is shared: compare ratios, not seconds). Then the HTML report of the largest
fleet: its size, and whether it renders readable in Chromium (one bar per GPU at the one scale,
no wider than a laptop's window, labels clear of the bars: the checks of
tests/unit/test_plan_report_browser.py).

Run from the repo root: .venv/bin/python benchmarks/bench_plan_fleet.py [HOSTS ...]
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import time

# First: makes ansible_collections.kvpin.fleet importable (benchmarks/_setup.py).
from _setup import ROOT

sys.path.insert(0, os.path.join(ROOT, 'tests'))
sys.path.insert(0, os.path.join(ROOT, 'tests', 'unit'))

from fleet_inventory import run_plan, save_layout_facts, write_fleet  # noqa: E402  pylint: disable=wrong-import-position

SIZES = (4, 25, 100)


def recap_failures(stdout):
    return sum(int(n) for n in re.findall(r'(?:failed|unreachable)=(\d+)', stdout))


def plan_fleet(work, hosts, saved):
    inventory, names = write_fleet(work, hosts, saved)
    report = os.path.join(work, 'report-%d.html' % hosts)
    started = time.monotonic()
    proc = run_plan(work, inventory, report)
    seconds = time.monotonic() - started
    if proc.returncode != 0 or recap_failures(proc.stdout):
        raise SystemExit('plan.yml over %d hosts failed:\n%s%s' % (hosts, proc.stdout[-4000:], proc.stderr[-2000:]))
    deployments = len(re.findall(r'^ok: \[fleet-\d+\] => \(item=', proc.stdout.split('TASK [Show pinned')[1], re.M))
    gpus = len(re.findall(r'data-gpu="', open(report, encoding='utf-8').read()))
    return dict(hosts=len(names), deployments=deployments, gpus=gpus, seconds=seconds, report=report)


def readable(report):
    """(verdict, page height px) of the report in Chromium, or why it was not checked."""
    from test_plan_report_browser import CHROMIUM, check_layout, check_readable, open_report
    if not os.access(CHROMIUM, os.X_OK):
        return 'not checked (%s missing)' % CHROMIUM, None
    figures = {}
    measured, errors, page_errors, requests = open_report(report, readable=figures)
    try:
        check_layout(measured)
        check_readable(figures)
    except AssertionError as exc:
        return 'NOT readable: %s' % exc, figures.get('scrollHeight')
    if errors or page_errors or requests:
        return 'errors: %s %s %s' % (errors, page_errors, requests), figures.get('scrollHeight')
    return ('readable: %d bars, page %d px wide in a %d px window'
            % (len(measured['bars']), figures['scrollWidth'], figures['viewport'])), figures['scrollHeight']


def main(argv):
    sizes = tuple(int(a) for a in argv[1:]) or SIZES
    with tempfile.TemporaryDirectory(prefix='kvpin-bench-plan-fleet-') as work:
        saved = save_layout_facts(work, os.path.join(work, 'saved'))
        runs = [plan_fleet(work, hosts, saved) for hosts in sizes]
        base = runs[0]['seconds'] / runs[0]['hosts']
        print('plan.yml offline (saved gpu_facts, no connection)   hosts  deployments  GPUs  seconds  s/host  '
              'per host x %d-host' % runs[0]['hosts'])
        for run in runs:
            per_host = run['seconds'] / run['hosts']
            print('%-50s %6d %12d %5d %8.1f %7.3f %10.2f' % (
                'fleet of %d' % run['hosts'], run['hosts'], run['deployments'], run['gpus'], run['seconds'],
                per_host, per_host / base))
        largest = runs[-1]
        size = os.path.getsize(largest['report'])
        verdict, height = readable(largest['report'])
        print()
        print('HTML report of the %d-host fleet: %d bytes (%.0f KiB, %.1f KiB per host)%s' % (
            largest['hosts'], size, size / 1024.0, size / 1024.0 / largest['hosts'],
            '' if height is None else ', page %d px tall' % height))
        print('in Chromium: %s' % verdict)
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
