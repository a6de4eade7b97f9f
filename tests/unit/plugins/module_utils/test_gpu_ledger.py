# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The per-GPU ledger: deployments sharing a node's GPUs are charged together.

Plans are real serving_plan plans (build_plan over catalog models), GPUs are the lab fixtures'
cards as gpu_facts reports them; the lab inventory's own deployments are charged over the lab
fixtures, probed through the real pynvml over the NVML stub, and must pass."""
from __future__ import annotations

import copy
import glob
import json
import os

import pytest
import yaml
from nvml_stub_pynvml import stub_pynvml

from ansible_collections.kvpin.fleet.plugins.filter.gpustack import FilterModule as GpustackFilters
from ansible_collections.kvpin.fleet.plugins.filter.kvpin import FilterModule
from ansible_collections.kvpin.fleet.plugins.module_utils.facts import nvml_probe
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.gpu_ledger import (
    LedgerInputError,
    deployments_from_results,
    gpu_ledger,
)
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.serving_plan import build_plan
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.system_reserved import system_reserved
from ansible_collections.kvpin.fleet.plugins.module_utils.units import GiB, MiB

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
FIXTURES = os.path.join(ROOT, 'tests', 'fixtures', 'nvml')
LAB_HOST_VARS = os.path.join(ROOT, 'inventory', 'lab', 'host_vars')
LEDGER_FILTER = FilterModule().filters()['kvpin_gpu_ledger']
CLAIM_FILTER = GpustackFilters().filters()['kvpin_gpustack_vram_claim']

# Two RTX A6000 (48 GB) as gpu_facts reports them (figures of tests/fixtures/nvml/lab-a6000x4.json).
A6000 = 51527024640


def a6000(index, processes=()):
    return {'index': index, 'name': 'NVIDIA RTX A6000', 'memory_total': A6000, 'memory_used': 70254592,
            'memory_reserved': 0, 'processes': [dict(p) for p in processes]}


def plan_8b(gpus, util):
    """A real plan: Llama-3.1-8B on vLLM 0.10.1.1 at the given utilization, as JSON gives it back."""
    plan = build_plan(dict(backend='vllm', backend_version='0.10.1.1', model='meta-llama/Llama-3.1-8B-Instruct',
                           gpus=gpus, prompt_tokens_p99=4096, max_output_tokens=512, max_concurrency=8,
                           gpu_memory_utilization=util))
    assert plan.feasible, plan.not_fitting
    return json.loads(json.dumps(plan.to_dict()))


def results(*pairs):
    """kvpin_plans.results as site.yml's serving_plan loop registers them."""
    return [{'deployment': {'name': name, 'gpu_indexes': [row['index'] for row in plan['memory']]},
             'plan': plan, 'changed': False} for name, plan in pairs]


def reserved_bytes(res, vram_min_gib=1):
    return system_reserved([r['plan'] for r in res], 0, vram_min_gib)['vram'] * GiB


def test_two_deployments_sharing_a_gpu_that_fit():
    gpus = [a6000(0), a6000(1)]
    res = results(('chat', plan_8b([gpus[0]], 0.42)), ('code', plan_8b([gpus[0]], 0.42)))
    ledger = LEDGER_FILTER(gpus, res, 1)
    assert ledger['fits'], ledger['problems']
    gpu0 = ledger['gpus'][0]
    assert [e['deployment'] for e in gpu0['entries']] == ['chat', 'code']
    # Memory: both deployments' budgets and outside parts add up (nothing charged twice).
    plans = [r['plan'] for r in res]
    held = sum(p['memory'][0]['budget'] + p['memory'][0]['terms']['outside_required'] for p in plans)
    assert gpu0['memory_charged'] == held
    assert gpu0['memory_free'] == gpu0['card'] - held >= 0
    # Booking: both claims + system_reserved once, against the NVML total.
    assert gpu0['booking_charged'] == sum(e['booked'] for e in gpu0['entries']) + reserved_bytes(res)
    assert gpu0['booking_free'] == A6000 - gpu0['booking_charged'] >= 0
    # GPU 1 holds nothing but the reservation GPUStack keeps on every GPU.
    assert ledger['gpus'][1]['entries'] == [] and ledger['gpus'][1]['memory_charged'] == 0


def test_a_pair_that_does_not_fit_is_refused_naming_the_gpu_deployments_and_bytes():
    gpus = [a6000(0), a6000(1)]
    res = results(('chat', plan_8b([gpus[0]], 0.5)), ('code', plan_8b([gpus[0]], 0.5)))
    # Each plan alone is feasible on the card; together they are not.
    ledger = LEDGER_FILTER(gpus, res, 1)
    assert not ledger['fits']
    gpu0 = ledger['gpus'][0]
    assert gpu0['memory_free'] < 0 and not gpu0['fits']
    memory_problem = next(p for p in ledger['problems'] if 'memory overcommitted' in p)
    assert memory_problem.startswith('GPU 0 (NVIDIA RTX A6000): memory overcommitted by %d B' % -gpu0['memory_free'])
    assert 'deployments on it: chat, code' in memory_problem
    assert '= %d B, more than the card\'s CUDA-visible %d B' % (gpu0['memory_charged'], gpu0['card']) in memory_problem
    for entry in gpu0['entries']:
        assert '%s %d B (held %d B + outside its budget %d B)' % (
            entry['deployment'], entry['held'] + entry['outside'], entry['held'], entry['outside']) in memory_problem
    booking_problem = next(p for p in ledger['problems'] if 'booking overcommitted' in p)
    assert 'system_reserved %d B' % reserved_bytes(res) in booking_problem
    assert ledger['gpus'][1]['fits']


def test_a_process_outside_gpustack_is_charged_and_one_of_gpustack_is_not():
    plan_gpus = [a6000(0)]
    res = results(('chat', plan_8b(plan_gpus, 0.43)), ('code', plan_8b(plan_gpus, 0.43)))
    assert LEDGER_FILTER([a6000(0)], res, 1)['fits']
    # A CUDA process of someone else (a notebook, a monitoring agent) holding 2 GiB on GPU 0.
    other = {'pid': 4242, 'used_memory': 2 * GiB}
    ledger = LEDGER_FILTER([a6000(0, [other])], res, 1)
    gpu0 = ledger['gpus'][0]
    assert gpu0['outside_processes'] == 2 * GiB and gpu0['processes'] == [other]
    assert not ledger['fits']
    assert 'processes outside GPUStack %d B (pid 4242 %d B)' % (2 * GiB, 2 * GiB) in ledger['problems'][0]
    # The same memory held by GPUStack's own engine (its cgroup is the worker's unit) is the
    # deployments' own, already charged: not counted again.
    engine = dict(other, cgroup='0::/system.slice/gpustack.service')
    assert LEDGER_FILTER([a6000(0, [engine])], res, 1)['fits']
    # Markers are configurable (e.g. a container runtime's scope).
    docker = dict(other, cgroup='0::/system.slice/docker-0123abcd.scope')
    assert not LEDGER_FILTER([a6000(0, [docker])], res, 1)['fits']
    assert LEDGER_FILTER([a6000(0, [docker])], res, 1, ['docker-0123abcd'])['fits']
    # GPUStack's booking does not see the outside process (its issues #6044, #2852).
    assert ledger['gpus'][0]['booking_free'] >= 0


def test_the_vram_claims_sent_to_gpustack_equal_the_ledgers_figures():
    gpus = [a6000(0), a6000(1)]
    tp2 = plan_8b(gpus, 0.4)
    single = plan_8b([gpus[1]], 0.4)
    res = results(('tp2', tp2), ('single', single))
    ledger = LEDGER_FILTER(gpus, res, 1)
    assert ledger['fits'], ledger['problems']
    for name, plan in (('tp2', tp2), ('single', single)):
        sent = CLAIM_FILTER(plan)      # what deploy_models.yml sends as vram_claim_bytes
        assert ledger['claims'][name] == sent
        assert sent == sum(e['booked'] for g in ledger['gpus'] for e in g['entries'] if e['deployment'] == name)
    # vLLM fills its budget, CUDA-visible total x gmu; GPUStack books NVML total x gmu, more by
    # gmu x what the driver keeps (the ledger's booking account holds that difference).
    driver_reserved = tp2['memory'][0]['terms']['driver_reserved']
    assert driver_reserved > 0
    for gpu in ledger['gpus']:
        for entry in gpu['entries']:
            assert 0 <= entry['booked'] - entry['held'] <= 0.4 * driver_reserved + 1


def test_deployments_sharing_a_node_must_pin_their_gpus():
    gpus = [a6000(0), a6000(1)]
    res = results(('chat', plan_8b([gpus[0]], 0.4)), ('code', plan_8b([gpus[1]], 0.4)))
    # Neither the inventory nor the planner pins it (a plan GPUStack places itself, as a
    # llama.cpp plan without gpu_indexes is).
    del res[1]['deployment']['gpu_indexes']
    res[1]['plan'].update(gpu_indexes=None, gpu_choice=None)
    ledger = LEDGER_FILTER(gpus, res, 1)
    assert not ledger['fits']
    assert ledger['problems'] == [p for p in ledger['problems'] if 'do not pin their GPUs' in p]
    assert 'deployments code do not pin' in ledger['problems'][0]
    # One deployment alone may leave the choice to GPUStack: nothing shares its GPUs.
    assert LEDGER_FILTER(gpus, res[1:], 1)['fits']


def test_the_planners_gpu_choice_pins_a_deployment_and_only_its_gpus_are_charged():
    """A vLLM deployment without gpu_indexes on a node of mixed cards: the planner chose its GPU
    (plan.gpu_indexes, which GPUStack's GPU selector gets), so the ledger charges that GPU only
    and counts it as pinned next to another deployment."""
    rtx4090 = {'index': 0, 'name': 'NVIDIA GeForce RTX 4090', 'memory_total': 25757220864,
               'memory_used': 0, 'memory_reserved': 0, 'processes': []}
    gpus = [rtx4090, a6000(1)]
    chosen = plan_8b(gpus, 0.4)
    assert chosen['gpu_indexes'] == [1] and chosen['gpu_choice']['gpu_indexes'] == [1]
    assert [row['index'] for row in chosen['memory']] == [1]
    pinned = plan_8b([rtx4090], 0.85)
    res = [{'deployment': {'name': 'chat'}, 'plan': chosen, 'changed': False},
           {'deployment': {'name': 'code', 'gpu_indexes': [0]}, 'plan': pinned, 'changed': False}]
    ledger = LEDGER_FILTER(gpus, res, 1)
    assert ledger['fits'], ledger['problems']
    by_gpu = {row['index']: [entry['deployment'] for entry in row['entries']] for row in ledger['gpus']}
    assert by_gpu == {0: ['code'], 1: ['chat']}
    assert ledger['claims']['chat'] == sum(e['booked'] for e in ledger['gpus'][1]['entries'])


def test_an_infeasible_plan_is_not_deployed_and_holds_nothing():
    gpus = [a6000(0)]
    res = results(('chat', plan_8b(gpus, 0.5)), ('code', plan_8b(gpus, 0.5)))
    res[1]['plan']['feasible'] = False
    ledger = gpu_ledger(gpus, deployments_from_results(res), GiB)
    assert ledger.fits and list(ledger.claims) == ['chat']
    assert any('code: its plan is infeasible' in w for w in ledger.warnings)


def test_a_llama_cpp_plan_with_nothing_on_the_gpu_books_nothing():
    plan = json.loads(json.dumps(build_plan(dict(
        backend='llama.cpp', backend_version='b7710', model='meta-llama/Llama-3.3-70B-Instruct',
        gpus=[a6000(0)], prompt_tokens_p99=4096, max_output_tokens=512, max_concurrency=1,
        quantization='Q4_K_M', gpu_layers=0)).to_dict()))
    assert plan['vram_claim_bytes'] == 0
    ledger = gpu_ledger([a6000(0)], [{'name': 'cpu-only', 'plan': plan, 'pinned': True}], GiB)
    assert ledger.claims == {'cpu-only': 0}
    entry = ledger.gpus[0].entries[0]
    assert entry.booked == 0 and entry.held == sum(plan['memory'][0][t] for t in (
        'weights', 'activation', 'non_torch', 'cuda_graph', 'kv_cache'))


# ---------------------------------------------------------------- adversarial input

def _bad_process(process):
    return [dict(a6000(0), processes=[process])]


@pytest.mark.parametrize('gpus, field', [
    ('not a list', 'gpus'),
    ([], 'gpus'),
    (['x'], 'gpus[0]'),
    ([dict(a6000(0), index=-1)], 'gpus[0].index'),
    ([dict(a6000(0), index=True)], 'gpus[0].index'),
    ([a6000(0), a6000(0)], 'gpus[1].index'),
    ([dict(a6000(0), memory_total='48GB')], 'gpus[0].memory_total'),
    ([dict(a6000(0), processes='pid 1')], 'GPU 0.processes'),
    (_bad_process('x'), 'GPU 0.processes[0]'),
    (_bad_process({'pid': -3, 'used_memory': 1}), 'GPU 0.processes[0].pid'),
    (_bad_process({'pid': '12', 'used_memory': 1}), 'GPU 0.processes[0].pid'),
    (_bad_process({'pid': 12, 'used_memory': -1}), 'GPU 0.processes[0].used_memory'),
    (_bad_process({'pid': 12, 'used_memory': '1 GiB'}), 'GPU 0.processes[0].used_memory'),
    (_bad_process({'pid': 12, 'used_memory': float('nan')}), 'GPU 0.processes[0].used_memory'),
    (_bad_process({'pid': 12, 'used_memory': A6000 + 1}), 'GPU 0.processes[0].used_memory'),
    (_bad_process({'pid': 12, 'used_memory': 1, 'cgroup': 7}), 'GPU 0.processes[0].cgroup'),
])
def test_bad_gpus_and_processes_name_the_field(gpus, field):
    with pytest.raises(LedgerInputError) as error:
        gpu_ledger(gpus, [], 0)
    assert error.value.field == field
    assert str(error.value).startswith(field + ': ')


def _plan():
    return plan_8b([a6000(0)], 0.4)


def _with(path, value):
    plan = _plan()
    target = plan
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return plan


@pytest.mark.parametrize('deployments, field', [
    ('x', 'deployments'),
    (['x'], 'deployments[0]'),
    ([{'name': '', 'plan': {}}], 'deployments[0].name'),
    ([{'name': 'a', 'plan': 'p'}], 'deployments[0].plan'),
    ([{'name': 'a', 'plan': {}, 'pinned': 'yes'}], 'deployments[0].pinned'),
    ([{'name': 'a', 'plan': {'backend': 'vllm', 'memory': []}}], 'deployments[0].plan.memory'),
    ([{'name': 'a', 'plan': _with(('memory', 0, 'budget'), -5)}], 'deployments[0].plan.memory[0].budget'),
    ([{'name': 'a', 'plan': _with(('memory', 0, 'budget'), '20 GiB')}], 'deployments[0].plan.memory[0].budget'),
    ([{'name': 'a', 'plan': _with(('memory', 0, 'total'), -1)}], 'deployments[0].plan.memory[0].total'),
    ([{'name': 'a', 'plan': _with(('memory', 0, 'index'), 9)}], 'deployments[0].plan.memory'),
    ([{'name': 'a', 'plan': _with(('memory', 0, 'index'), 'zero')}], 'deployments[0].plan.memory[0].index'),
    ([{'name': 'a', 'plan': _with(('memory', 0, 'terms', 'outside_required'), -1)}],
     'deployments[0].plan.memory[0].terms.outside_required'),
    ([{'name': 'a', 'plan': _with(('args',), ['--gpu-memory-utilization=lots'])}], 'deployments[0].plan'),
    ([{'name': 'a', 'plan': _plan()}, {'name': 'a', 'plan': _plan()}], 'deployments[1].name'),
])
def test_bad_plans_name_the_field(deployments, field):
    with pytest.raises(LedgerInputError) as error:
        gpu_ledger([a6000(0)], deployments, 0)
    assert error.value.field == field


@pytest.mark.parametrize('reserved, markers, field', [
    (-1, None, 'system_reserved_bytes'), ('1', None, 'system_reserved_bytes'),
    (0, 'gpustack', 'gpustack_cgroup_markers'), (0, [''], 'gpustack_cgroup_markers'),
])
def test_bad_reservation_and_markers_name_the_field(reserved, markers, field):
    with pytest.raises(LedgerInputError) as error:
        gpu_ledger([a6000(0)], [], reserved, markers)
    assert error.value.field == field


def test_filter_errors_name_the_filter_and_the_field():
    from ansible.errors import AnsibleFilterError
    with pytest.raises(AnsibleFilterError, match=r'^kvpin_gpu_ledger: GPU 0\.processes\[0\]\.used_memory: '):
        LEDGER_FILTER(_bad_process({'pid': 1, 'used_memory': -1}), [], 1)
    with pytest.raises(AnsibleFilterError, match=r'^kvpin_gpu_ledger: results\[0\]\.deployment: '):
        LEDGER_FILTER([a6000(0)], [{'plan': _plan()}], 1)
    with pytest.raises(AnsibleFilterError, match=r'^kvpin_gpu_ledger: vram_min_gib'):
        LEDGER_FILTER([a6000(0)], [], -1)


# ---------------------------------------------------------------- the lab inventory passes

@pytest.fixture(scope='module')
def nvml():
    return stub_pynvml()


LAB_HOSTS = sorted(os.path.basename(p)[:-4] for p in glob.glob(os.path.join(LAB_HOST_VARS, '*.yml')))


@pytest.mark.parametrize('host', LAB_HOSTS)
def test_the_lab_inventory_passes_the_ledger(nvml, monkeypatch, host):
    """Each lab node's deployments, planned as site.yml plans them on the node's fixture GPUs,
    pass the ledger with the worker role's default system_reserved floor (1 GiB)."""
    from ansible_collections.kvpin.fleet.plugins.module_utils.facts.nvml_probe import probe
    monkeypatch.setenv('KVPIN_NVML_STUB_CONFIG', os.path.join(FIXTURES, host + '.json'))
    monkeypatch.setattr(nvml_probe, 'PROC_ROOT', '/nonexistent-proc')   # fixture pids are not ours
    gpus = json.loads(json.dumps(probe(nvml)['gpus']))
    with open(os.path.join(LAB_HOST_VARS, host + '.yml')) as handle:
        deployments = yaml.safe_load(handle)['kvpin_deployments']
    res = []
    for deployment in deployments:
        picked = [g for g in gpus if 'gpu_indexes' not in deployment or g['index'] in deployment['gpu_indexes']]
        params = dict(backend=deployment['backend'], backend_version=deployment['backend_version'],
                      model=deployment['model'], gpus=picked, **deployment['traffic'])
        params.update(deployment.get('engine', {}))
        res.append({'deployment': deployment, 'plan': json.loads(json.dumps(build_plan(params).to_dict()))})
    with open(os.path.join(ROOT, 'roles', 'gpustack_worker', 'defaults', 'main.yml')) as handle:
        vram_min = yaml.safe_load(handle)['gpustack_worker_system_reserved_vram_min_gib']
    ledger = LEDGER_FILTER(gpus, copy.deepcopy(res), vram_min)
    assert ledger['fits'], ledger['problems']
    assert len(ledger['report']) >= len(gpus)
    for result in res:
        assert ledger['claims'][result['deployment']['name']] == CLAIM_FILTER(result['plan'])


def test_the_lab_fixture_process_is_charged_outside_gpustack(nvml, monkeypatch):
    """lab-4090x2's fixture has a 312 MiB process on GPU 0 (a monitoring agent's context)."""
    from ansible_collections.kvpin.fleet.plugins.module_utils.facts.nvml_probe import probe
    monkeypatch.setenv('KVPIN_NVML_STUB_CONFIG', os.path.join(FIXTURES, 'lab-4090x2.json'))
    monkeypatch.setattr(nvml_probe, 'PROC_ROOT', '/nonexistent-proc')
    gpus = probe(nvml)['gpus']
    ledger = gpu_ledger(gpus, [], 0)
    assert ledger.gpus[0].outside_processes == 312 * MiB
    assert ledger.gpus[1].outside_processes == 0
