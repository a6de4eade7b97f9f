# -*- coding: utf-8 -*-
# Copyright (c) 2026 kvpin.fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Every deployment of the example and the lab inventory planned on its fixture GPUs (the NVML
stub), printed as JSON: the plan's output and its report for people. A refactor that must not
change a plan runs this before and after and diffs the two (docs/testing.md):

    .venv/bin/python tests/plan_snapshot.py > /tmp/before.json   # on the old tree
    .venv/bin/python tests/plan_snapshot.py > /tmp/after.json
    diff /tmp/before.json /tmp/after.json && echo identical
"""
import glob
import json
import os
import sys

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

# conftest puts the collection on the import path
import conftest  # noqa: E402,F401  pylint: disable=unused-import,wrong-import-position
from nvml_stub_pynvml import stub_pynvml  # noqa: E402  pylint: disable=wrong-import-position

from ansible_collections.kvpin.fleet.plugins.module_utils.facts.nvml_probe import probe  # noqa: E402
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.serving_plan import (  # noqa: E402
    build_plan, plan_report, serving_plan_result)

FIXTURES = os.path.join(ROOT, 'tests', 'fixtures', 'nvml')
# inventory -> host -> the lab fixture with the same cards
HARDWARE = {
    'example': {'gpu-a6000-01': 'lab-a6000x4', 'gpu-4090-01': 'lab-4090x4',
                'gpu-4090-02': 'lab-4090x2', 'gpu-mixed-01': 'lab-mixed'},
    'lab': {name: name for name in ('lab-a6000x4', 'lab-4090x4', 'lab-4090x2', 'lab-mixed')},
}


def deployments(inventory):
    for path in sorted(glob.glob(os.path.join(ROOT, 'inventory', inventory, 'host_vars', '*.yml'))):
        host = os.path.basename(path)[:-4]
        with open(path) as handle:
            for deployment in yaml.safe_load(handle).get('kvpin_deployments') or []:
                yield host, deployment


def snapshot():
    nvml = stub_pynvml()
    out = {}
    for inventory, hardware in sorted(HARDWARE.items()):
        for host, deployment in deployments(inventory):
            os.environ['KVPIN_NVML_STUB_CONFIG'] = os.path.join(FIXTURES, hardware[host] + '.json')
            gpus = probe(nvml)['gpus']
            if 'gpu_indexes' in deployment:
                gpus = [gpu for gpu in gpus if gpu['index'] in deployment['gpu_indexes']]
            params = dict(backend=deployment['backend'], backend_version=deployment['backend_version'],
                          model=deployment['model'], gpus=gpus, **deployment.get('traffic', {}))
            params.update(deployment.get('engine', {}))
            key = '%s/%s/%s' % (inventory, host, deployment['name'])
            if params.get('traffic_classes') is not None:
                out[key] = serving_plan_result(params)
                continue
            plan = build_plan(params)
            out[key] = dict(plan=plan.to_dict(), plan_report=plan_report(plan))
    return out


if __name__ == '__main__':
    json.dump(snapshot(), sys.stdout, indent=1, sort_keys=True, default=str)
    sys.stdout.write('\n')
