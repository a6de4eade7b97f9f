# -*- coding: utf-8 -*-
# Copyright (c) 2026, kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Mutation check: does the suite fail when the code is wrong?

Each mutation below breaks one rule the project depends on (the planner's safety margin and
per-GPU KV split, a feasibility comparison, the drift comparison, the watchdog's gates, the
rerun gate in site.yml). For each, on a fresh temp copy of the working tree (what git would
commit), the mutation is applied - its text must occur exactly once - and its focused tests
run (pytest -x: the first failure is enough). A mutation no test notices SURVIVED.

    .venv/bin/python tests/mutation/run.py            # all; exit 1 if any survives
    .venv/bin/python tests/mutation/run.py -k watchdog  # names containing 'watchdog'
    .venv/bin/python tests/mutation/run.py --list

Run on demand, not in every CI run (it replays the watchdog's seeded traces several times:
about 15 minutes with the baseline). A baseline run of the same tests on an unmutated copy comes
first: a test that already fails proves nothing about a mutation.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import List, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PYTHON = os.path.join(ROOT, '.venv', 'bin', 'python')

WATCHDOG_CONFIG = 'roles/serving_watchdog/files/kvpin_watchdog_lib/config.py'
WATCHDOG_DECISION = 'roles/serving_watchdog/files/kvpin_watchdog_lib/decision.py'
NODE_STATE = 'plugins/module_utils/facts/node_state.py'
VLLM_MEMORY = 'plugins/module_utils/plan/vllm_memory.py'
SITE = 'playbooks/site.yml'
VLLM_PIPELINE = 'plugins/module_utils/plan/vllm_pipeline.py'
ATTENTION_KINDS = 'plugins/module_utils/plan/attention_kinds.py'

T_VLLM = ['tests/unit/plugins/module_utils/test_vllm_memory.py', 'tests/unit/plugins/module_utils/test_serving_plan.py']
T_PP = ['tests/unit/plugins/module_utils/test_vllm_pipeline.py']
T_NODE = ['tests/unit/plugins/module_utils/test_node_state.py', 'tests/unit/plugins/filter/test_kvpin.py',
          'tests/unit/plugins/modules/test_node_state_module.py']
T_WD_FAST = ['tests/unit/watchdog/test_watchdog_statistics.py', 'tests/unit/watchdog/test_watchdog_daemon.py']
T_WD = T_WD_FAST + ['tests/unit/watchdog/test_watchdog_engine.py', 'tests/unit/watchdog/test_watchdog_seeds.py']
T_SITE = ['tests/unit/test_site_rerun_gate.py']
# The significance gate's own test first: it needs only its two replays (with -x, a caught
# mutation stops there instead of after every seeded class).
T_WD_MK = ['tests/unit/watchdog/test_watchdog_seeds.py::'
           'test_mann_kendall_gate_holds_false_alarms_when_the_slope_ci_is_loose'] + T_WD


@dataclass
class Mutation:
    name: str
    path: str
    old: str
    new: str
    tests: List[str]


MUTATIONS = [
    # -- planner ---------------------------------------------------------------------------
    Mutation('planner: no safety margin', VLLM_MEMORY,
             'return max(total * SAFETY_MARGIN_FRACTION_X1000 // 1000, SAFETY_MARGIN_MIN_BYTES)',
             'return 0', T_VLLM),
    Mutation('planner: KV heads per GPU without the TP split', ATTENTION_KINDS,
             'return max(1, spec.num_kv_heads // tp)', 'return max(1, spec.num_kv_heads)', T_VLLM),
    Mutation('planner: feasibility comparison flipped (slack < required)', VLLM_MEMORY,
             '    if slack >= required:\n        return None\n', '    if slack < required:\n        return None\n', T_VLLM),
    Mutation('planner PP: engine KV from the largest stage', VLLM_PIPELINE,
             "    usable = min(st.blocks for st in stages) - (1 if",
             "    usable = max(st.blocks for st in stages) - (1 if", T_PP),
    Mutation('planner PP: remainder layers on the last stage', VLLM_PIPELINE,
             '    for i in range(2, num_layers % pp + 2):', '    for i in range(1, num_layers % pp + 1):', T_PP),
    Mutation('planner PP: no partition search', VLLM_PIPELINE,
             '    for _step in range(n * pp):', '    for _step in range(0):', T_PP),
    # -- drift comparison ------------------------------------------------------------------
    Mutation('node_state: mode ignored', NODE_STATE,
             'if spec.mode is not None and seen.get(\'mode\') != spec.mode:',
             'if False and spec.mode is not None and seen.get(\'mode\') != spec.mode:', T_NODE),
    Mutation('node_state: a file not observed is in sync', NODE_STATE,
             "        return [Drift('%s: not observed' % path, path, 'state', spec.state, None)]", '        return []', T_NODE),
    Mutation('node_state: enabled-runtime counts as enabled', NODE_STATE,
             'if spec.enabled is True and unit_file_state != ENABLED_AT_BOOT_UNIT_FILE_STATE:',
             'if spec.enabled is True and unit_file_state not in ENABLED_UNIT_FILE_STATES:', T_NODE),
    Mutation('node_state: unreadable content is in sync', NODE_STATE,
             "            drift.append(Drift('%s: content cannot be read (%s)' % (path, seen['sha1_error']), path, 'sha1',"
             " spec.sha1, None))",
             '            pass', T_NODE),
    # -- watchdog gates --------------------------------------------------------------------
    Mutation('watchdog: mk_alpha 0.01 -> 1.0 (no significance gate)', WATCHDOG_CONFIG,
             '"mk_alpha": 0.01,', '"mk_alpha": 1.0,', T_WD_MK),
    Mutation('watchdog: confirm_seconds 0', WATCHDOG_CONFIG,
             '"confirm_seconds": 3600,', '"confirm_seconds": 0,', T_WD),
    Mutation('watchdog: storm guard off', WATCHDOG_DECISION,
             'elif len(self.recycle_times) >= int(cfg["storm_max_recycles"]):', 'elif False:', T_WD),
    # -- site.yml rerun gate ---------------------------------------------------------------
    Mutation('site.yml: worker gate without `not`', SITE,
             '        - not kvpin_node_state.checks.gpustack_worker.in_sync\n',
             '        - kvpin_node_state.checks.gpustack_worker.in_sync\n', T_SITE),
    Mutation('site.yml: watchdog gate without `not`', SITE,
             '        - not kvpin_node_state.checks.serving_watchdog.in_sync\n',
             '        - kvpin_node_state.checks.serving_watchdog.in_sync\n', T_SITE),
    Mutation('site.yml: watchdog gated on the worker check', SITE,
             '        - not kvpin_node_state.checks.serving_watchdog.in_sync\n',
             '        - not kvpin_node_state.checks.gpustack_worker.in_sync\n', T_SITE),
]


def copy_tree(dest):
    """What git would commit (tracked + untracked, not ignored) -> dest; the venv linked."""
    listing = subprocess.run(['git', '-C', ROOT, 'ls-files', '-z', '--cached', '--others', '--exclude-standard'],
                             check=True, capture_output=True).stdout.split(b'\0')
    for rel in (p.decode() for p in listing if p):
        if rel == '.venv':
            continue          # a worktree's link to a shared venv: linked below
        src = os.path.join(ROOT, rel)
        if not os.path.lexists(src):
            continue          # deleted in the working tree
        target = os.path.join(dest, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if os.path.islink(src):
            os.symlink(os.readlink(src), target)
        else:
            shutil.copy2(src, target)
    os.symlink(os.path.realpath(os.path.join(ROOT, '.venv')), os.path.join(dest, '.venv'))


def apply(tree, mutation):
    path = os.path.join(tree, mutation.path)
    with open(path, encoding='utf-8') as handle:
        text = handle.read()
    count = text.count(mutation.old)
    if count != 1:
        return 'pattern found %d times in %s (the code moved: update this mutation)' % (count, mutation.path)
    with open(path, 'w', encoding='utf-8') as handle:
        handle.write(text.replace(mutation.old, mutation.new))
    return None


def run_tests(tree, tests, first_failure=True) -> Tuple[int, List[str], str]:
    env = dict(os.environ)
    env.pop('CI', None)
    argv = [PYTHON, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', '-rfE'] + (['-x'] if first_failure else []) + tests
    proc = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True, check=False)
    failed = re.findall(r'^(?:FAILED|ERROR) (\S+)', proc.stdout, re.MULTILINE)
    return proc.returncode, failed, proc.stdout[-3000:] + proc.stderr[-2000:]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n', maxsplit=1)[0])
    parser.add_argument('-k', default='', help='only mutations whose name contains this')
    parser.add_argument('--list', action='store_true')
    parser.add_argument('--no-baseline', action='store_true', help='skip the unmutated run')
    args = parser.parse_args(argv)
    chosen = [m for m in MUTATIONS if args.k in m.name]
    if args.list:
        for m in chosen:
            print('%-60s %s' % (m.name, m.path))
        return 0
    if not chosen:
        print('no mutation matches %r' % args.k)
        return 2
    work = tempfile.mkdtemp(prefix='kvpin-mutation-')
    rows = []
    try:
        if not args.no_baseline:
            tests = sorted(set(t for m in chosen for t in m.tests if '::' not in t))
            base = os.path.join(work, 'baseline')
            copy_tree(base)
            start = time.time()
            rc, failed, tail = run_tests(base, tests, first_failure=False)
            print('baseline (unmutated): rc %d in %.0f s' % (rc, time.time() - start), flush=True)
            if rc != 0:
                print(tail)
                print('baseline fails: fix the suite first (%s)' % ', '.join(failed))
                return 2
        for index, mutation in enumerate(chosen):
            tree = os.path.join(work, 'm%02d' % index)
            copy_tree(tree)
            problem = apply(tree, mutation)
            start = time.time()
            if problem:
                rows.append((mutation.name, 'NOT APPLIED', problem, 0.0))
            else:
                rc, failed, tail = run_tests(tree, mutation.tests)
                if rc == 0:
                    rows.append((mutation.name, 'SURVIVED', 'all of %s passed' % ', '.join(
                        os.path.basename(t) for t in mutation.tests), time.time() - start))
                elif failed:
                    rows.append((mutation.name, 'caught', failed[0], time.time() - start))
                else:
                    rows.append((mutation.name, 'caught?', 'pytest rc %d, no failed test named: %s' % (
                        rc, tail.strip().splitlines()[-1] if tail.strip() else ''), time.time() - start))
            print('%-58s %-11s %s' % rows[-1][:3], flush=True)
            shutil.rmtree(tree, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print()
    print('| mutation | result | first failing test | s |')
    print('|---|---|---|---|')
    for name, result, detail, seconds in rows:
        print('| %s | %s | %s | %.0f |' % (name, result, detail.replace('|', '/'), seconds))
    bad = [r for r in rows if r[1] != 'caught']
    print('\nmutations: %d caught, %d not (%s)' % (len(rows) - len(bad), len(bad),
                                                   ', '.join(r[0] for r in bad) or 'none'))
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main())
