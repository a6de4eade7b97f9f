# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Fleet rollout cost on the lab at several sizes (issues 4 and 16), printed, never asserted.

For each lab size N (scripts/lab.sh with KVPIN_LAB_NODES=N, cycling the four card layouts):

  facts-only     a play that only gathers facts on the N nodes, same connection (the baseline)
  cold rollout   site.yml on N freshly started nodes (prereq, probe, plan, worker, watchdog, models)
  rerun          site.yml again: must report changed=0 on every node, one module per node;
                 rerun and facts-only alternate --pairs times (default 3), each figure the median,
                 after the lab has settled (--settle: the load average of the workers' boot)
  one node off   site.yml after a hand edit on one node (lab-mixed's worker config made 0644):
                 that node is converged (mode restored, worker restarted, health checked), the
                 others stay at one round trip

Each run is a ratio to its size's facts-only play (the machine's load changes between sizes; the
ratio does not carry it). Remote calls per node are counted from -vvv (each module Ansible
copies to a node is one round trip). Then the growth from the smallest to the largest size, and
the lab's memory and CPU per node after the cold rollout (podman stats, scripts/lab.sh stats).

    .venv/bin/python benchmarks/bench_rollout.py                 # 4 nodes (what CI runs)
    .venv/bin/python benchmarks/bench_rollout.py --sizes 4,8,16  # on demand (or KVPIN_BENCH_ROLLOUT_SIZES)

Goals (issue 16): rerun <= 1.25x facts-only at every size, growth 4 -> 16 nodes < 2x, cold
<= 10x facts-only. Needs root, scripts/bootstrap.sh done and the lab image; leaves the lab as it
found it (a lab that was up comes back at the default 4 nodes).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_lab import INVENTORY, ROOT, VENV_BIN, env, lab, print_table  # noqa: E402

PLAYBOOK = os.path.join(VENV_BIN, 'ansible-playbook')
DRIFT_NODE = 'lab-mixed'
SIZES_ENV = 'KVPIN_BENCH_ROLLOUT_SIZES'
PAIRS_ENV = 'KVPIN_BENCH_ROLLOUT_PAIRS'
SETTLE_ENV = 'KVPIN_BENCH_ROLLOUT_SETTLE'
RECAP = re.compile(r'^(\S+)\s+:\s+ok=\d+\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)', re.M)
# "<container> PUT /root/.ansible/tmp/... TO /root/.ansible/tmp/ansible-tmp-.../AnsiballZ_<module>.py"
MODULE_SENT = re.compile(r'^<([^>]+)> PUT \S+ TO \S+/AnsiballZ_(\w+)\.py$', re.M)


def sizes_arg(text):
    sizes = [int(part) for part in text.split(',') if part.strip()]
    if not sizes or any(not 1 <= size <= 64 for size in sizes):
        raise argparse.ArgumentTypeError('sizes must be node counts in 1..64, e.g. 4,8,16; got %r' % text)
    return sizes


def pairs_arg(text):
    try:
        pairs = int(text)
    except ValueError:
        pairs = 0
    if not 1 <= pairs <= 15 or pairs % 2 == 0:
        raise argparse.ArgumentTypeError('pairs must be an odd count in 1..15 (a median is a real run); got %r' % text)
    return pairs


def settle_arg(text):
    try:
        seconds = int(text)
    except ValueError:
        seconds = -1
    if not 0 <= seconds <= 900:
        raise argparse.ArgumentTypeError('settle must be whole seconds in 0..900 (0: do not wait); got %r' % text)
    return seconds


def settle(max_seconds, cores=None, loadavg=os.getloadavg, clock=time.monotonic, sleep=time.sleep, poll=5):
    """Wait (at most ``max_seconds``) until the 1-minute load average is at most the core count:
    right after a cold rollout every GPUStack worker is still booting (a load average of 20 on
    4 nodes, near 60 on 16, on 2 cores), and a rerun timed then measures their boot, not the
    playbook. Returns (seconds waited, the last load average)."""
    cores = cores or os.cpu_count() or 1
    started = clock()
    while True:
        load = loadavg()[0]
        waited = clock() - started
        if load <= cores or waited >= max_seconds:
            return waited, load
        sleep(min(poll, max_seconds - waited))


def size_env(nodes):
    """The environment for one lab size: its node count, and forks >= the node count (Ansible's
    default of 5 would run 16 nodes in four waves; set ANSIBLE_FORKS to measure another value)."""
    e = env()
    e['KVPIN_LAB_NODES'] = str(nodes)
    e.setdefault('ANSIBLE_FORKS', str(max(5, nodes)))
    return e


def run_checked(argv, nodes):
    proc = subprocess.run(argv, cwd=ROOT, env=size_env(nodes), capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.exit('bench_rollout: %s failed (rc=%d):\n%s%s'
                 % (' '.join(argv), proc.returncode, proc.stdout[-6000:], proc.stderr[-3000:]))
    return proc


def timed_playbook(nodes, playbook):
    """(seconds, {host: changed}, remote calls per node, {node: Counter(module: calls)}) of one
    ansible-playbook -vvv run."""
    start = time.perf_counter()
    proc = run_checked([PLAYBOOK, '-vvv', '-i', INVENTORY, playbook], nodes)
    seconds = time.perf_counter() - start
    recap = RECAP.findall(proc.stdout)
    if len(recap) < nodes or any(int(failed) or int(unreachable) for _h, _c, unreachable, failed in recap):
        sys.exit('bench_rollout: %s on %d nodes: a node failed or is missing:\n%s' % (playbook, nodes, proc.stdout[-4000:]))
    changed = {host: int(count) for host, count, _u, _f in recap}
    prefix = os.environ.get('KVPIN_LAB_PREFIX', '')
    by_module = collections.defaultdict(collections.Counter)
    for host, module in MODULE_SENT.findall(proc.stdout):
        if host.startswith(prefix + 'lab-'):
            by_module[host[len(prefix):]][module] += 1
    per_node = [sum(by_module[host].values()) for host in changed if host.startswith('lab-')]
    return seconds, changed, per_node, by_module


def facts_only_playbook(path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'w') as handle:
        handle.write('---\n- name: Facts only\n  hosts: gpu_nodes\n  gather_facts: true\n  tasks: []\n')
    return path


def changed_text(changed):
    counts = collections.Counter(changed.values())
    return ', '.join('%d node(s) %d' % (n, c) for c, n in sorted(counts.items(), reverse=True))


def calls_text(per_node):
    return '%d-%d' % (min(per_node), max(per_node)) if per_node and min(per_node) != max(per_node) else str(
        per_node[0] if per_node else 0)


def median_run(runs):
    """The run of median seconds (an odd count: a real run, its counts included)."""
    return sorted(runs, key=lambda run: run[0])[len(runs) // 2]


def bench_size(nodes, baseline_play, pairs, settle_seconds=180):
    """Cold, then (once the lab has settled) ``pairs`` alternating (rerun, facts-only) pairs,
    then one node off. A single facts-only run swings 2x with what the freshly booted workers
    are doing (6.4 s and 11.5 s on the same 4 nodes): each figure is the median of its runs, and
    the rerun's ratio the median of the ratios of runs made back to back."""
    site = os.path.join(ROOT, 'site.yml')
    run_checked(lab('down'), nodes)
    run_checked(lab('up'), nodes)
    cold = timed_playbook(nodes, site)
    stats = run_checked(lab('stats'), nodes).stdout
    settled = settle(settle_seconds)
    reruns, baselines = [], []
    for _pair in range(pairs):
        reruns.append(timed_playbook(nodes, site))
        baselines.append(timed_playbook(nodes, baseline_play))
    container = os.environ.get('KVPIN_LAB_PREFIX', '') + DRIFT_NODE
    run_checked(['podman', 'exec', container, 'chmod', '0644', '/var/lib/gpustack/config.yaml'], nodes)
    drift = timed_playbook(nodes, site)
    return {'facts-only': median_run(baselines), 'cold': cold, 'rerun': median_run(reruns), 'one node off': drift,
            'stats': stats, 'samples': {'facts-only': [b[0] for b in baselines], 'rerun': [r[0] for r in reruns]},
            'rerun ratio': statistics.median(r[0] / b[0] for r, b in zip(reruns, baselines)),
            'rerun changed': sum(sum(r[1].values()) for r in reruns), 'settled': settled}


def samples_text(runs, name):
    samples = runs['samples'].get(name)
    return ' '.join('%.1f' % x for x in samples) if samples and len(samples) > 1 else '-'


def print_rows(results, label):
    rows = []
    for nodes, runs in results.items():
        base = runs['facts-only'][0]
        for name in ('facts-only', 'cold', 'rerun', 'one node off'):
            seconds, changed, per_node = runs[name][:3]
            ratio = runs['rerun ratio'] if name == 'rerun' else seconds / base
            rows.append(('%d nodes: %s' % (nodes, name), '%.1f' % seconds, '%.2f' % ratio,
                         calls_text(per_node), changed_text(changed) if name != 'facts-only' else '-',
                         samples_text(runs, name)))
    print_table('site.yml on the lab, %s (seconds: median of the runs; x = ratio to the same size\'s '
                'facts-only play, for the rerun the median of back-to-back pairs; calls = modules sent per node)'
                % label, ('run', 'seconds', 'x facts', 'calls/node', 'changed per node', 'runs s'), rows)


def modules_text(by_module):
    """One line per distinct call list: '<nodes>: N calls = module xK, ...' (the cold rollout's
    round trips, by module, where they are)."""
    lines = collections.defaultdict(list)
    for node, counter in sorted(by_module.items()):
        key = ', '.join('%s x%d' % (m, c) if c > 1 else m for m, c in sorted(counter.items(), key=lambda i: (-i[1], i[0])))
        lines[(sum(counter.values()), key)].append(node)
    return '\n'.join('  %s: %d calls = %s' % (', '.join(names), total, key) for (total, key), names in sorted(lines.items()))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n', maxsplit=1)[0])
    parser.add_argument('--sizes', type=sizes_arg, default=sizes_arg(os.environ.get(SIZES_ENV) or '4'),
                        help='lab sizes, comma-separated (default %s or 4)' % SIZES_ENV)
    parser.add_argument('--pairs', type=pairs_arg, default=pairs_arg(os.environ.get(PAIRS_ENV) or '3'),
                        help='alternating rerun / facts-only pairs per size, odd (default %s or 3)' % PAIRS_ENV)
    parser.add_argument('--settle', type=settle_arg, default=settle_arg(os.environ.get(SETTLE_ENV) or '180'),
                        help='after the cold rollout, wait at most this many seconds for the 1-minute load '
                             'average to fall to the core count before the reruns (default %s or 180; 0: '
                             'do not wait)' % SETTLE_ENV)
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit('bench_rollout: needs root (podman + runc systemd containers)')
    was_up = subprocess.run(lab('status'), cwd=ROOT, env=env(), capture_output=True, check=False).returncode == 0
    baseline_play = facts_only_playbook(os.path.join(ROOT, '.cache', 'bench_facts_only.yml'))
    results = {}
    try:
        for nodes in args.sizes:
            results[nodes] = bench_size(nodes, baseline_play, args.pairs, args.settle)
            # Each size as it completes (a long on-demand run shows its progress).
            print_rows({nodes: results[nodes]}, 'so far')
            sys.stdout.flush()
    finally:
        run_checked(lab('down'), max(args.sizes))
        if was_up:
            run_checked(lab('up'), 4)
    print_rows(results, 'all sizes')
    for nodes, runs in results.items():
        print('\ncold rollout, %d nodes: remote calls per node by module (-vvv)\n%s' % (nodes, modules_text(runs['cold'][3])))
    for nodes, runs in results.items():
        print('\nlab memory and CPU after the cold rollout, %d nodes (scripts/lab.sh stats)\n%s' % (nodes, runs['stats']))
    if len(results) > 1:
        small, large = min(results), max(results)
        growth = []
        for name in ('facts-only', 'cold', 'rerun', 'one node off'):
            a, b = results[small][name][0], results[large][name][0]
            growth.append((name, '%.1f' % a, '%.1f' % b, '%.2f' % (b / a)))
        print_table('growth from %d to %d nodes (%.0fx the nodes; goal < 2x)' % (small, large, large / small),
                    ('run', '%d nodes s' % small, '%d nodes s' % large, 'growth'), growth)
    for nodes, runs in results.items():
        base = runs['facts-only'][0]
        print('%d nodes: rerun/facts = %.2f (goal <= 1.25), cold/facts = %.2f (goal <= 10); changed on reruns: %d (must be 0);'
              ' reruns began %.0f s after the cold rollout, at a load average of %.1f'
              % (nodes, runs['rerun ratio'], runs['cold'][0] / base, runs['rerun changed'], runs['settled'][0],
                 runs['settled'][1]))


if __name__ == '__main__':
    main()
