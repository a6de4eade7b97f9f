# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Nodes for the HTML plan report's tests, as playbooks/plan.yml collects them: real
serving_plan results (catalog models, the task's return as JSON gives it back) on the lab
fixtures' RTX A6000 cards, and the real per-GPU ledger filter over them."""

from __future__ import annotations

import json

from ansible_collections.kvpin.fleet.plugins.filter.kvpin import FilterModule
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.serving_plan import serving_plan_result
from ansible_collections.kvpin.fleet.plugins.module_utils.units import GiB

LEDGER_FILTER = FilterModule().filters()['kvpin_gpu_ledger']
A6000 = 51527024640      # NVML total of tests/fixtures/nvml/lab-a6000x4.json's cards
XSS = '<script>window.kvpinPwned=1</script><img src=x onerror="window.kvpinPwned=2">'
FAKE_API_KEY = 'gpustack_fake_api_key_5c1e7d0b9f'


def a6000(index, processes=()):
    return {'index': index, 'name': 'NVIDIA RTX A6000', 'memory_total': A6000, 'memory_used': 70254592,
            'memory_reserved': 0, 'processes': [dict(p) for p in processes]}


def result(name, gpus, model='meta-llama/Llama-3.1-8B-Instruct', **engine):
    """One kvpin_plans.results item: the serving_plan return plus the loop's deployment."""
    params = dict(backend='vllm', backend_version='0.10.1.1', model=model, gpus=gpus, prompt_tokens_p99=4096,
                  max_output_tokens=512, max_concurrency=8, fail_on_infeasible=False, **engine)
    out = serving_plan_result(params)
    # What Ansible registers beside the return: the loop variable (the inventory's deployment, which
    # may carry anything) and the invocation; neither may reach the page but the named fields.
    out['deployment'] = {'name': name, 'backend': 'vllm', 'model': model, 'gpu_indexes': [g['index'] for g in gpus],
                         'engine': dict(engine, api_key=FAKE_API_KEY)}
    out['invocation'] = {'module_args': dict(params, api_key=FAKE_API_KEY)}
    return json.loads(json.dumps(out))


def node(host, gpus, results):
    return {'host': host, 'gpus': gpus, 'plans': results, 'ledger': LEDGER_FILTER(gpus, results, 1)}


def fleet():
    """Three nodes: two deployments sharing a GPU next to an outside process, an infeasible
    70B plan on one card, an XSS payload as deployment and model name, an overcommitted GPU,
    and a node with no deployment."""
    gpus1 = [a6000(0, [{'pid': 4242, 'used_memory': 2 * GiB}]), a6000(1)]
    node1 = node('gpu-node-1', gpus1, [result('chat', [gpus1[0]], gpu_memory_utilization=0.42),
                                       result(XSS, [gpus1[1]], model='qwen2.5-7b', gpu_memory_utilization=0.5),
                                       result('big', [gpus1[1]], model='llama-3.1-70b')])
    gpus2 = [a6000(0), a6000(1), a6000(2), a6000(3)]
    node2 = node('gpu-node-2', gpus2, [result('tp2', gpus2[:2], tensor_parallel_size=2, gpu_memory_utilization=0.9),
                                       result('a', [gpus2[2]], gpu_memory_utilization=0.5),
                                       result('b', [gpus2[2]], gpu_memory_utilization=0.5)])
    node3 = {'host': 'gpu-node-3', 'gpus': [a6000(0)], 'plans': [], 'ledger': None}
    return [node1, node2, node3]


def many_nodes(count):
    """``count`` nodes: fleet()'s three in turn under the names gpu-node-001 ... (a fleet-scale
    report of real plans and ledgers)."""
    base = fleet()
    nodes = []
    for number in range(count):
        node_copy = json.loads(json.dumps(base[number % len(base)]))
        node_copy['host'] = 'gpu-node-%03d' % (number + 1)
        nodes.append(node_copy)
    return nodes
