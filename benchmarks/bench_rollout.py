# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Fleet rollout cost on the lab (issue 4's benchmark), printed, never asserted:

  cold rollout   site.yml on four freshly started nodes (prereq, probe, plan, worker, watchdog)
  rerun          site.yml again: must report changed=0 on every node
  one node off   site.yml after a hand edit on one node (its worker config made 0644): that node
                 is converged (config mode restored, worker restarted, health checked), the
                 other three stay at one round trip
  baseline       a play that only gathers facts on the same four nodes, same connection

The rerun / baseline ratio is the figure (target <= 2x): what idempotence checking costs over
just reaching the nodes.

    .venv/bin/python benchmarks/bench_rollout.py

Needs root, scripts/bootstrap.sh done and the lab image; leaves the lab as it found it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_lab import INVENTORY, ROOT, VENV_BIN, env, lab, print_table, run  # noqa: E402

PLAYBOOK = os.path.join(VENV_BIN, 'ansible-playbook')
DRIFT_NODE = 'lab-mixed'


def timed_playbook(*args):
    """(seconds, {host: changed}) of one ansible-playbook run."""
    start = time.perf_counter()
    proc = run([PLAYBOOK, '-i', INVENTORY] + list(args))
    seconds = time.perf_counter() - start
    changed = {host: int(count) for host, count in re.findall(r'^(\S+)\s+:\s+ok=\d+\s+changed=(\d+)',
                                                              proc.stdout, re.M)}
    return seconds, changed


def facts_only_playbook(path):
    with open(path, 'w') as handle:
        handle.write('---\n- name: Facts only\n  hosts: gpu_nodes\n  gather_facts: true\n  tasks: []\n')
    return path


def main():
    was_up = subprocess.run(lab('status'), cwd=ROOT, env=env(), capture_output=True,
                            check=False).returncode == 0
    run(lab('down'))
    run(lab('up'))
    baseline_play = facts_only_playbook(os.path.join(ROOT, '.cache', 'bench_facts_only.yml'))
    try:
        cold, cold_changed = timed_playbook(os.path.join(ROOT, 'site.yml'))
        rerun, rerun_changed = timed_playbook(os.path.join(ROOT, 'site.yml'))
        baseline, dummy = timed_playbook(baseline_play)
        container = os.environ.get('KVPIN_LAB_PREFIX', '') + DRIFT_NODE
        run(['podman', 'exec', container, 'chmod', '0644', '/var/lib/gpustack/config.yaml'])
        drifted, drifted_changed = timed_playbook(os.path.join(ROOT, 'site.yml'))
    finally:
        if not was_up:
            run(lab('down'))
    rows = [
        ('facts-only play (baseline)', '%.1f' % baseline, '1.00', '-'),
        ('site.yml cold (fresh nodes)', '%.1f' % cold, '%.2f' % (cold / baseline),
         ' '.join('%s=%d' % item for item in sorted(cold_changed.items()))),
        ('site.yml rerun (idempotent)', '%.1f' % rerun, '%.2f' % (rerun / baseline),
         ' '.join('%s=%d' % item for item in sorted(rerun_changed.items()))),
        ('site.yml, %s edited by hand' % DRIFT_NODE, '%.1f' % drifted, '%.2f' % (drifted / baseline),
         ' '.join('%s=%d' % item for item in sorted(drifted_changed.items()))),
    ]
    print_table('rollout on the 4-node lab (seconds; ratio against the facts-only play)',
                ('run', 'seconds', 'x baseline', 'changed per node'), rows)
    print('rerun/baseline = %.2f (target <= 2.00); changed on rerun: %d (must be 0)'
          % (rerun / baseline, sum(rerun_changed.values())))


if __name__ == '__main__':
    main()
