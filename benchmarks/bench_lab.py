#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Lab fleet costs: image build cold vs cached, node start, and gpu_facts through Ansible.

Two tables, printed, never asserted:
  1. lab build: the image built from scratch (debootstrap; the .deb files come from
     .lab/debs once downloaded, so "cold" is cold for the image, not for the network) against
     `lab.sh image` with the image present; `lab.sh up` from no containers against `up` on a
     running fleet. Ratios are against the cold/first row of each pair.
  2. gpu_facts end to end (ansible ad hoc, podman connection), per node and for the whole fleet
     in one run, median of N runs, against `ansible.builtin.ping` on the same hosts measured in
     the same process: the difference is what the NVML probe adds to a plain module round trip.
The in-process cost of the probe alone is benchmarks/bench_gpu_facts.py.

    .venv/bin/python benchmarks/bench_lab.py [--runs 3] [--skip-cold]

Needs root and scripts/bootstrap.sh done. Leaves the lab as it found it (up or down); the image
stays. KVPIN_LAB_PREFIX selects the fleet (scripts/lab.sh).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV_BIN = os.path.dirname(sys.executable)
LAB_SH = os.path.join(ROOT, 'scripts', 'lab.sh')
INVENTORY = os.path.join(ROOT, 'inventory', 'lab')
NODES = ('lab-a6000x4', 'lab-4090x4', 'lab-4090x2', 'lab-mixed')
IMAGE = os.environ.get('KVPIN_LAB_IMAGE', 'localhost/kvpin-node:bookworm')  # as scripts/lab.sh


def env():
    e = dict(os.environ)
    e['PATH'] = VENV_BIN + os.pathsep + e.get('PATH', '')
    e['ANSIBLE_NOCOLOR'] = '1'
    return e


def run(argv):
    proc = subprocess.run(argv, cwd=ROOT, env=env(), capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.exit('bench_lab: %s failed (rc=%d):\n%s%s' % (' '.join(argv), proc.returncode, proc.stdout, proc.stderr))
    return proc


def timed(argv):
    start = time.perf_counter()
    run(argv)
    return time.perf_counter() - start


def median_timed(argv, runs):
    return statistics.median(timed(argv) for dummy in range(runs))


def lab(*args):
    return ['bash', LAB_SH] + list(args)


def adhoc(pattern, module, module_args=''):
    return [os.path.join(VENV_BIN, 'ansible'), '-i', INVENTORY, pattern, '-m', module, '-a', module_args]


def print_table(title, header, rows):
    print('\n' + title)
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    line = '  '.join('%-*s' % (w, h) for w, h in zip(widths, header))
    print(line)
    print('-' * len(line))
    for r in rows:
        print('  '.join(('%-*s' if i == 0 else '%*s') % (w, c) for i, (w, c) in enumerate(zip(widths, r))))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n', maxsplit=1)[0])
    parser.add_argument('--runs', type=int, default=3, help='runs per gpu_facts/ping row (median)')
    parser.add_argument('--skip-cold', action='store_true', help='do not rebuild the image')
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit('bench_lab: needs root (podman + runc systemd containers)')

    was_up = subprocess.run(lab('status'), cwd=ROOT, capture_output=True, check=False).returncode == 0
    build_rows = []
    run(lab('down'))
    # Rebuilding replaces the image; lab.sh refuses while any container (another run's fleet)
    # was made from it, so the cold row is skipped then rather than failing the benchmark.
    image_users = subprocess.run(['podman', 'ps', '-a', '--filter', 'ancestor=' + IMAGE, '--format', '{{.Names}}'],
                                 capture_output=True, text=True, check=False).stdout.split()
    if image_users and not args.skip_cold:
        print('bench_lab: cold image build skipped: image in use by %s' % ' '.join(image_users))
    elif not args.skip_cold:
        cold = timed(lab('rebuild-image'))
        cached = timed(lab('image'))
        build_rows += [('image: debootstrap + podman import (cold)', '%.1f' % cold, '1.00'),
                       ('image: present, reused (cached)', '%.2f' % cached, '%.3f' % (cached / cold))]
    first_up = timed(lab('up'))
    again_up = timed(lab('up'))
    build_rows += [('lab.sh up: 4 nodes from no containers', '%.1f' % first_up, '1.00'),
                   ('lab.sh up: fleet already running', '%.1f' % again_up, '%.2f' % (again_up / first_up))]
    # gpu_facts needs nvidia-ml-py on the nodes (the site playbook's prereq phase).
    prereq = timed([os.path.join(VENV_BIN, 'ansible-playbook'), '-i', INVENTORY, os.path.join(ROOT, 'site.yml'),
                    '--tags', 'prereq'])
    build_rows.append(('site.yml --tags prereq on fresh nodes', '%.1f' % prereq, '-'))
    print_table('lab build (seconds; ratio against the first row of each pair)', ('step', 'seconds', 'ratio'),
                build_rows)

    probe_rows = []
    for pattern in NODES + ('gpu_nodes',):
        ping = median_timed(adhoc(pattern, 'ansible.builtin.ping'), args.runs)
        facts = median_timed(adhoc(pattern, 'kvpin.fleet.gpu_facts', 'required=true'), args.runs)
        label = pattern if pattern != 'gpu_nodes' else 'fleet (4 nodes, one run)'
        probe_rows.append((label, '%.2f' % ping, '%.2f' % facts, '%.2f' % (facts / ping), '%+.2f' % (facts - ping)))
    print_table('gpu_facts via ansible ad hoc, median of %d runs (seconds; baseline: ansible.builtin.ping)' % args.runs,
                ('hosts', 'ping', 'gpu_facts', 'ratio', 'added'), probe_rows)

    if not was_up:
        run(lab('down'))


if __name__ == '__main__':
    main()
