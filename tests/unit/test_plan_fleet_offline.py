# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""playbooks/plan.yml plans a fleet offline: six hosts whose GPUs come from saved
kvpin.fleet.gpu_facts output (kvpin_gpu_facts_file; tests/fleet_inventory.py saves the real
module's output over the NVML stub) and whose ssh address answers nothing, so any task that
connected would fail its host as unreachable. Every host gets a plan for each deployment and
its bars in the HTML report; a host whose saved file is bad fails alone, naming the field."""
from __future__ import annotations

import json
import os
import re

import pytest
from fleet_inventory import LAYOUTS, REPO_ROOT, lab_deployments, run_plan, save_layout_facts, write_fleet

HOSTS = 6


@pytest.fixture(scope='module')
def saved(tmp_path_factory):
    work = tmp_path_factory.mktemp('saved_facts')
    return save_layout_facts(work, str(work / 'saved'))


@pytest.fixture(scope='module')
def fleet_run(tmp_path_factory, saved):
    work = tmp_path_factory.mktemp('plan_fleet')
    inventory, names = write_fleet(work, HOSTS, saved)
    report = work / 'report.html'
    return names, run_plan(work, inventory, str(report), timeout=600), report


def recap(stdout):
    return {m.group(1): dict(re.findall(r'(\w+)=(\d+)', m.group(2)))
            for m in re.finditer(r'^(\S+)\s+: (ok=.*)$', stdout, re.M)}


def test_every_host_is_planned_without_a_connection(fleet_run):
    names, proc, report = fleet_run
    assert proc.returncode == 0, proc.stdout + proc.stderr
    counts = recap(proc.stdout)
    html = report.read_text(encoding='utf-8')
    for position, name in enumerate(names):
        layout = LAYOUTS[position % len(LAYOUTS)]
        assert counts[name]['unreachable'] == '0' and counts[name]['failed'] == '0', counts[name]
        deployments = lab_deployments(layout)
        assert deployments, layout
        for deployment in deployments:
            # The plan's report line, one per deployment, from the plan loop of this host.
            assert 'ok: [%s] => (item=%s)' % (name, deployment['name']) in proc.stdout
        with open(os.path.join(REPO_ROOT, 'tests', 'fixtures', 'nvml', layout + '.json'), encoding='utf-8') as handle:
            gpu_count = len(json.load(handle)['devices'])
        for index in range(gpu_count):
            assert html.count('data-gpu="%s:%d"' % (name, index)) == 1
        assert 'data-gpu="%s:%d"' % (name, gpu_count) not in html
    # The probe was skipped on every host: no gpu_facts ran anywhere.
    assert 'TASK [Probe the GPUs over NVML]' in proc.stdout
    assert re.search(r'^(ok|changed|fatal): \[fleet-\d+\]', proc.stdout.split('TASK [Probe the GPUs over NVML]')[1]
                     .split('TASK [')[0], re.M) is None


def test_a_bad_saved_file_fails_its_host_alone_naming_the_field(tmp_path, saved):
    with open(saved['lab-4090x2'], encoding='utf-8') as handle:
        facts = json.load(handle)
    facts['ansible_facts']['kvpin_gpus']['gpus'][1]['memory_total'] = 24564      # MiB, not bytes
    bad = tmp_path / 'bad.json'
    bad.write_text(json.dumps(facts))
    inventory, names = write_fleet(tmp_path, 2, dict(saved, **{'lab-4090x4': str(bad)}))
    proc = run_plan(tmp_path, inventory, str(tmp_path / 'report.html'), timeout=300)
    counts = recap(proc.stdout)
    assert counts[names[0]]['failed'] == '0'
    assert counts[names[1]]['failed'] == '1'
    out = proc.stdout + proc.stderr
    assert 'ansible_facts.kvpin_gpus.gpus[1].memory_total: 24564 B is less than any GPU' in out
    assert str(bad) in out and 'Traceback' not in out
