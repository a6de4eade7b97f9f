"""Input validation and dispatch of serving_plan (the planners are tested on their own)."""
import os

import pytest
import yaml

from ansible_collections.kvpin.fleet.plugins.module_utils.plan import serving_plan
from ansible_collections.kvpin.fleet.plugins.modules import serving_plan as module
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.plan_types import GpuMemory, Plan, PlanInputError

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
A6000 = {'index': 0, 'uuid': 'GPU-1', 'name': 'NVIDIA RTX A6000', 'memory_total': 51527024640,
         'memory_used': 0, 'memory_free': 51527024640, 'compute_capability': '8.6'}


def params(**overrides):
    base = dict(backend='vllm', backend_version='0.10.1.1', model='meta-llama/Llama-3.3-70B-Instruct',
                gpus=[A6000], prompt_tokens_p99=11000, max_output_tokens=1024, max_concurrency=32)
    base.update(overrides)
    return base


def never_called(*args, **kwargs):
    raise AssertionError('validation should have failed before resolving the model')


@pytest.mark.parametrize('overrides, field, text', [
    (dict(backend='tgi'), 'backend', "got 'tgi'"),
    (dict(backend_version=''), 'backend_version', 'required'),
    (dict(prompt_tokens_p99=-5), 'prompt_tokens_p99', 'must be > 0, got -5'),
    (dict(prompt_tokens_p99=0), 'prompt_tokens_p99', 'must be > 0, got 0'),
    (dict(max_output_tokens=10 ** 9), 'max_output_tokens', 'got 1000000000'),
    (dict(max_concurrency=2.5), 'max_concurrency', 'whole number'),
    (dict(max_concurrency='many'), 'max_concurrency', "'many'"),
    (dict(max_concurrency=True), 'max_concurrency', 'True'),
    (dict(gpus=[]), 'gpus', 'no GPUs given'),
    (dict(gpus=[{'index': 0, 'name': 'x'}]), 'gpus[0]', 'missing memory_total'),
    (dict(gpus=[dict(A6000, memory_total=-1)]), 'gpus[0].memory_total', 'got -1'),
    (dict(gpu_layers=60), 'gpu_layers', 'backend vllm does not take it'),
    (dict(backend='llama-box', gpu_memory_utilization=0.9), 'gpu_memory_utilization', 'vLLM option'),
    (dict(model=''), 'model', 'required'),
])
def test_bad_input_names_the_field(overrides, field, text):
    with pytest.raises(PlanInputError) as raised:
        serving_plan.build_plan(params(**overrides), resolve_model=never_called)
    assert raised.value.field == field
    assert text in str(raised.value)


def test_dispatch_passes_only_set_knobs_to_the_engine_planner():
    seen = {}

    gib = 1 << 30
    planned = Plan(backend='vllm', backend_version='0.10.1.1', args=[], memory=[GpuMemory(
        index=0, name='x', total=48 * gib, budget=40 * gib, weights=30 * gib, activation=gib,
        non_torch=gib, cuda_graph=gib, kv_cache=7 * gib, headroom=7 * gib)], kv_cache_tokens=1000,
        max_concurrency_at_max_len=1.0, feasible=True, settings={}, reasons={})

    def fake_vllm(spec, gpus, traffic, knobs, version):
        seen.update(spec=spec, gpus=gpus, traffic=traffic, knobs=knobs, version=version)
        return planned

    result = serving_plan.build_plan(
        params(tensor_parallel_size=4, max_model_len=None, prompt_tokens_p99='11000'),
        resolve_model=lambda model: 'spec:' + model, planners={'vllm': fake_vllm})
    assert result is planned
    assert seen['spec'] == 'spec:meta-llama/Llama-3.3-70B-Instruct'
    assert seen['knobs'] == {'tensor_parallel_size': 4}
    assert seen['traffic'].prompt_tokens_p99 == 11000
    assert seen['traffic'].tokens_per_sequence == 12024
    assert seen['version'] == '0.10.1.1'


def test_module_argument_spec_covers_every_knob_once():
    assert set(serving_plan.KNOB_TYPES) == set(serving_plan.ALL_KNOBS)
    # The one spec the module and its action plugin both validate with.
    assert set(serving_plan.ALL_KNOBS) <= set(serving_plan.SERVING_PLAN_ARGUMENT_SPEC)
    assert len(serving_plan.ALL_KNOBS) == len(set(serving_plan.ALL_KNOBS))


def test_one_list_of_engine_options_documented_specced_and_passed_by_the_playbook():
    """ENGINE_KNOBS is the list: the module's DOCUMENTATION (kept literal for ansible-test) names
    each knob with its type and engine, the argument spec has them, and the playbook task passes
    every one from ``deployment.engine`` and nothing else from it."""
    options = yaml.safe_load(module.DOCUMENTATION)['options']
    assert set(options) == set(serving_plan.SERVING_PLAN_ARGUMENT_SPEC)
    for name, engine, spec in serving_plan.ENGINE_KNOBS:
        assert serving_plan.SERVING_PLAN_ARGUMENT_SPEC[name] == spec
        assert options[name]['type'] == spec['type'] and options[name].get('elements') == spec.get('elements')
        text = ' '.join(options[name]['description']) if isinstance(options[name]['description'], list) \
            else options[name]['description']
        assert ('vLLM' if engine == serving_plan.ENGINE_VLLM else 'llama-box / llama.cpp') in text, name
    with open(os.path.join(REPO, 'playbooks', 'tasks', 'plan_deployments.yml')) as handle:
        task = [t for t in yaml.safe_load(handle) if 'kvpin.fleet.serving_plan' in t][0]['kvpin.fleet.serving_plan']
    from_engine = dict((name, value) for name, value in task.items() if 'deployment.engine.' in value)
    assert from_engine == dict((name, '{{ deployment.engine.%s | default(omit) }}' % name)
                               for name in serving_plan.ALL_KNOBS)
