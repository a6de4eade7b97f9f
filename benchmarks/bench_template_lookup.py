# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""kvpin.fleet.template against ansible.builtin.template's lookup, inside one real play;
prints a table, asserts only that both render the same text.

Per row, one ansible-playbook run on localhost (connection local) renders one template (a
watchdog-config-sized file: 24 variables, a loop, a filter) RENDERS times with each lookup, in
alternating tasks, from play variables shaped like a host's during site.yml: role-sized values
plus registered-result-like data of the given JSON size. A lab node holds about 55 KB of those on
a rerun (kvpin_plans 37.5 KB for two deployments, the probe's result 6 KB, its facts 6 KB, the
GPU ledger 3 KB); a node with eight deployments about four times that. The builtin lookup
deep-copies all of the host's variables for each file it renders; kvpin.fleet.template layers a
dict over them instead. Each figure is a difference of timestamps taken inside the play, around
a task (its fork included, the same for both lookups).

Run from the repo root: .venv/bin/python benchmarks/bench_template_lookup.py
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

# First: makes ansible_collections.kvpin.fleet importable (benchmarks/_setup.py).
from _setup import ROOT

sys.path.insert(0, os.path.join(ROOT, 'tests'))

from local_playbook import run_tasks_on_localhost  # noqa: E402  pylint: disable=wrong-import-position

# (label, KB of registered-result-like data)
SIZES = (('no registered results', 0), ('one deployment', 25), ('lab node (2 deployments)', 55),
         ('8 deployments', 220))
RENDERS = 20
PAIRS = 3
LOOKUPS = ('ansible.builtin.template', 'kvpin.fleet.template')

TEMPLATE = ('{{ ansible_managed | comment }}\n{\n'
            + ''.join('  "key_%d": {{ value_%d | to_json }},\n' % (i, i) for i in range(24))
            + '  "gpus": [{% for gpu in gpus %}{{ gpu.index }}{{ "," if not loop.last else "" }}{% endfor %}],\n'
            + '  "name": {{ node_name | to_json }}\n}\n')


def registered_results(kilobytes):
    """Nested dicts and lists like serving_plan's registered results, about ``kilobytes`` of JSON."""
    results = []
    while len(json.dumps(results)) < kilobytes * 1024:
        index = len(results)
        results.append({'changed': False, 'deployment': {'name': 'deployment-%d' % index, 'backend': 'vllm'},
                        'plan': {'feasible': True, 'args': ['--max-model-len', '16384', '--max-num-seqs', '16'],
                                 'per_gpu': [{'index': gpu, 'weights_bytes': 35 * 2 ** 30 + gpu,
                                              'activation_bytes': 2 ** 30, 'cudagraph_bytes': 2 ** 29,
                                              'kv_cache_bytes': 9 * 2 ** 30,
                                              'reasons': ['term %d of gpu %d' % (term, gpu) for term in range(6)]}
                                             for gpu in range(4)]},
                        'plan_report': ['line %d of the report of deployment %d' % (line, index) for line in range(20)]})
    return {'kvpin_plans': {'results': results, 'changed': False, 'msg': 'All items completed'}} if results else {}


def play_variables(kilobytes):
    variables = {'value_%d' % i: ('setting-%d' % i if i % 2 else i * 1000) for i in range(24)}
    variables.update(node_name='lab-a6000x4', gpus=[{'index': i} for i in range(4)], renders=RENDERS)
    variables.update(registered_results(kilobytes))
    return variables


def timed_tasks(pairs):
    """A timestamp before and after each render task; the lookups alternate, PAIRS times."""
    tasks = [{'name': 'start', 'ansible.builtin.set_fact': {'stamps': '{{ [now().timestamp()] }}'}}]
    names = []
    for pair in range(pairs):
        for index, lookup in enumerate(LOOKUPS if pair % 2 == 0 else reversed(LOOKUPS)):
            name = 'rendered_%d_%s' % (pair, lookup.replace('.', '_'))
            names.append(name)
            tasks.append({'name': name, 'ansible.builtin.set_fact': {
                name: "{{ query('%s', *(['config.json.j2'] * renders)) | unique }}" % lookup}})
            tasks.append({'name': 'stamp %s' % name, 'ansible.builtin.set_fact': {
                'stamps': '{{ stamps + [now().timestamp()] }}', 'lookup_order': '{{ lookup_order | default([]) + [%r] }}' % lookup}})
    texts = '[%s]' % ', '.join(names)
    tasks.append({'name': 'save', 'ansible.builtin.copy': {
        'dest': '{{ playbook_dir }}/timings.json',
        'content': '{{ {"stamps": stamps, "order": lookup_order, "texts": %s} | to_json }}' % texts}})
    return tasks


def measure(work, kilobytes):
    """(builtin ms/file, kvpin ms/file, texts equal) for one size."""
    (work / 'templates').mkdir(parents=True, exist_ok=True)
    (work / 'templates' / 'config.json.j2').write_text(TEMPLATE)
    proc = run_tasks_on_localhost(work, timed_tasks(PAIRS), play_vars=play_variables(kilobytes), timeout=600)
    if proc.returncode != 0:
        raise SystemExit('the play failed:\n%s%s' % (proc.stdout[-4000:], proc.stderr[-2000:]))
    timings = json.loads((work / 'timings.json').read_text())
    stamps, order = timings['stamps'], timings['order']
    per_file = {lookup: [] for lookup in LOOKUPS}
    for index, lookup in enumerate(order):
        per_file[lookup].append((stamps[index + 1] - stamps[index]) / RENDERS * 1000)
    texts = {json.dumps(text, sort_keys=True) for text in timings['texts']}
    return statistics.median(per_file[LOOKUPS[0]]), statistics.median(per_file[LOOKUPS[1]]), len(texts) == 1


def main():
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for number, (label, kilobytes) in enumerate(SIZES):
            builtin_ms, ours_ms, same = measure(Path(scratch) / str(number), kilobytes)
            if not same:
                raise SystemExit('%s: kvpin.fleet.template rendered other text than the builtin lookup' % label)
            size = len(json.dumps(play_variables(kilobytes))) / 1024
            rows.append((label, size, builtin_ms, ours_ms, builtin_ms / ours_ms))
    print('one template, %d renders per task, lookups alternating over %d pairs of tasks (median)' % (RENDERS, PAIRS))
    print('%-26s %10s %17s %15s %14s' % ('play variables', 'JSON KB', 'builtin ms/file', 'kvpin ms/file', 'builtin/kvpin'))
    for label, size, builtin_ms, ours_ms, ratio in rows:
        print('%-26s %10.1f %17.2f %15.2f %14.2f' % (label, size, builtin_ms, ours_ms, ratio))


if __name__ == '__main__':
    main()
