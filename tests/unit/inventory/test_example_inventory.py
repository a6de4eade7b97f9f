"""The example inventory (the field report's fleet) is valid input: every deployment of
every node plans on that node's GPUs, probed through the real pynvml over the NVML stub
with the lab fixture of the same hardware, and the plans show the report's pins."""
import glob
import os

import pytest
import yaml
from nvml_stub_pynvml import stub_pynvml

from ansible_collections.kvpin.fleet.plugins.module_utils.facts.nvml_probe import probe
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.serving_plan import build_plan

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
EXAMPLE = os.path.join(ROOT, 'inventory', 'example')
FIXTURES = os.path.join(ROOT, 'tests', 'fixtures', 'nvml')
# example host -> the lab fixture with the same cards
HARDWARE = {'gpu-a6000-01': 'lab-a6000x4', 'gpu-4090-01': 'lab-4090x4',
            'gpu-4090-02': 'lab-4090x2', 'gpu-mixed-01': 'lab-mixed'}


@pytest.fixture(scope='module')
def nvml():
    return stub_pynvml()


def host_deployments():
    for path in sorted(glob.glob(os.path.join(EXAMPLE, 'host_vars', '*.yml'))):
        host = os.path.basename(path)[:-4]
        with open(path) as handle:
            for deployment in yaml.safe_load(handle)['kvpin_deployments']:
                yield host, deployment


def plan_for(nvml, monkeypatch, host, deployment):
    monkeypatch.setenv('KVPIN_NVML_STUB_CONFIG', os.path.join(FIXTURES, HARDWARE[host] + '.json'))
    gpus = probe(nvml)['gpus']
    if 'gpu_indexes' in deployment:
        gpus = [gpu for gpu in gpus if gpu['index'] in deployment['gpu_indexes']]
    params = dict(backend=deployment['backend'], backend_version=deployment['backend_version'],
                  model=deployment['model'], gpus=gpus, **deployment['traffic'])
    params.update(deployment.get('engine', {}))
    return build_plan(params)


def test_every_host_in_the_inventory_has_its_hardware_here():
    with open(os.path.join(EXAMPLE, 'hosts.yml')) as handle:
        hosts = yaml.safe_load(handle)['all']['children']['gpu_nodes']['hosts']
    assert set(hosts) == set(HARDWARE)
    assert {host for host, _unused in host_deployments()} == set(HARDWARE)


@pytest.mark.parametrize('host, deployment', list(host_deployments()),
                         ids=[d['name'] for _unused, d in host_deployments()])
def test_example_deployment_plans_feasibly(nvml, monkeypatch, host, deployment):
    plan = plan_for(nvml, monkeypatch, host, deployment)
    assert plan.feasible, plan.not_fitting
    assert plan.args and plan.reasons
    for gpu in plan.memory:
        assert gpu.headroom >= 0
        assert gpu.weights + gpu.activation + gpu.kv_cache <= gpu.total


def test_report_deployment_gets_the_report_pins(nvml, monkeypatch):
    host, deployment = next(item for item in host_deployments() if item[0] == 'gpu-a6000-01')
    plan = plan_for(nvml, monkeypatch, host, deployment)
    assert '--max-model-len=16384' in plan.args
    assert '--tensor-parallel-size=4' in plan.args
    assert plan.settings['gpu_memory_utilization'] <= 0.90
    assert '--swap-space=0' in plan.args        # 0.10.1.1 still takes the flag
    assert '--enable-chunked-prefill' in plan.args


def test_report_llama_box_node_caps_layers_below_all(nvml, monkeypatch):
    host, deployment = next(item for item in host_deployments() if item[0] == 'gpu-mixed-01')
    plan = plan_for(nvml, monkeypatch, host, deployment)
    assert 55 <= plan.settings['gpu_layers'] <= 65
    assert [gpu.name for gpu in plan.memory] == ['NVIDIA RTX A6000']
