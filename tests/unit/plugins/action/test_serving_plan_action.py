# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""serving_plan's action plugin: plans on the controller unless the model is a path.

One real ansible-playbook run (localhost, connection local, -vvv) plans several
deployments; each task's result is compared with the module run directly in its own Python
process with the same args, and the -vvv log tells whether the module was sent to the node
(a PUT of AnsiballZ_serving_plan.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from local_playbook import run_tasks_on_localhost

from ansible_collections.kvpin.fleet.plugins.module_utils.plan import cuda_total
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.serving_plan import model_needs_node_files

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
MODULE = os.path.join(ROOT, 'plugins', 'modules', 'serving_plan.py')
A6000X4 = os.path.join(ROOT, 'tests', 'fixtures', 'nvml', 'lab-a6000x4.json')
MODEL_DIR = os.path.join(ROOT, 'tests', 'fixtures', 'models', 'tiny-llama-indexed')
# The directory holding ansible_collections/kvpin/fleet (tests/conftest.py puts it on sys.path).
COLLECTIONS_ROOT = next(p for p in sys.path if os.path.isdir(os.path.join(p, 'ansible_collections', 'kvpin', 'fleet')))
MODULE_SENT = 'AnsiballZ_serving_plan.py'


@pytest.mark.parametrize('model, needs_node', [
    ('llama-3.3-70b', False),
    ('meta-llama/Llama-3.3-70B-Instruct', False),
    ({'model_type': 'llama', 'hidden_size': 4096}, False),
    ('/models/x.gguf', True),
    ('./x.GGUF', True),
    ('x.gguf', True),
    ('~/m', True),
    ('/srv/models/dir', True),
    ('../models/dir', True),
    (None, False),
    (7, False),
])
def test_model_needs_node_files(model, needs_node):
    assert model_needs_node_files(model) is needs_node


def a6000x4_gpus():
    """The lab-a6000x4 fixture's cards as gpu_facts reports them."""
    with open(A6000X4, encoding='utf-8') as handle:
        devices = json.load(handle)['devices']
    return [dict(index=index, uuid=device['uuid'], name=device['name'],
                 memory_total=device['memory_total'], memory_used=device['memory_used'],
                 memory_free=device['memory_total'] - device['memory_used'],
                 compute_capability='%d.%d' % (device['cuda_cc_major'], device['cuda_cc_minor']))
            for index, device in enumerate(devices)]


GPUS = a6000x4_gpus()
# The field report's deployment: Llama-3.3-70B, vLLM 0.10.1.1, TP=4 on four A6000; its team
# consented to fp8 KV (allow_fp8_kv) after their eval.
REPORT = dict(backend='vllm', backend_version='0.10.1.1', model='meta-llama/Llama-3.3-70B-Instruct',
              gpus=GPUS, prompt_tokens_p99=11000, max_output_tokens=1024, max_concurrency=32,
              tensor_parallel_size=4, allow_fp8_kv=True)
SMALL_TRAFFIC = dict(prompt_tokens_p99=128, max_output_tokens=64, max_concurrency=1)
# The field report's open dilemma: daytime chat and a nightly 30k-token batch on one endpoint.
CLASSES = [dict(name='chat', prompt_tokens_p99=2048, max_output_tokens=512, max_concurrency=64, hours='07:00-23:00'),
           dict(name='batch', prompt_tokens_p99=30000, max_output_tokens=2048, max_concurrency=4, hours='00:00-06:00')]
NO_SINGLE_CLASS = dict(prompt_tokens_p99=None, max_output_tokens=None, max_concurrency=None)

# Task name -> (serving_plan args, task keywords).
CASES = {
    'catalog': (REPORT, {}),
    'catalog_check_mode': (REPORT, {'check_mode': True}),
    'hf_config_dict': (dict(REPORT, model=dict(
        model_type='llama', architectures=['LlamaForCausalLM'], hidden_size=512, intermediate_size=1024,
        num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2, vocab_size=1000,
        max_position_embeddings=4096, torch_dtype='bfloat16'), tensor_parallel_size=1, gpus=GPUS[:1],
        **SMALL_TRAFFIC), {}),
    'traffic_classes': (dict(REPORT, traffic_classes=CLASSES, **NO_SINGLE_CLASS), {}),
    'invalid_zero': (dict(REPORT, max_concurrency=0), {}),
    'invalid_traffic_both': (dict(REPORT, traffic_classes=CLASSES), {}),
    'invalid_type': (dict(REPORT, max_concurrency='many'), {}),
    'unsupported_option': (dict(REPORT, max_concurency=32), {}),
    'infeasible': (dict(REPORT, gpu_memory_utilization=0.92), {}),
    'gguf_missing': (dict(REPORT, model='/nonexistent/kvpin-model-Q4_K_M.gguf', backend='llama-box',
                          backend_version='v0.0.171', tensor_parallel_size=None, allow_fp8_kv=None), {}),
    'model_dir': (dict(REPORT, model=MODEL_DIR, tensor_parallel_size=1, gpus=GPUS[:1], **SMALL_TRAFFIC), {}),
}


def task_args(args):
    return dict((name, value) for name, value in args.items() if value is not None)


def run_module(tmp_path, args):
    """The module run directly, the way Ansible runs it (an ANSIBLE_MODULE_ARGS file)."""
    args_file = tmp_path / 'module-args.json'
    args_file.write_text(json.dumps({'ANSIBLE_MODULE_ARGS': task_args(args)}))
    env = {'PATH': os.environ.get('PATH', '/usr/bin:/bin'), 'PYTHONPATH': COLLECTIONS_ROOT,
           'HOME': str(tmp_path), 'LC_ALL': 'C.UTF-8'}
    proc = subprocess.run([sys.executable, MODULE, str(args_file)], env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert 'Traceback' not in proc.stderr, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope='module')
def playbook_run(tmp_path_factory):
    """Runs every case as one task of one play; returns (results by task name, -vvv log by
    task name)."""
    work = tmp_path_factory.mktemp('serving_plan_action')
    results = work / 'results.json'
    tasks = []
    for name, (args, keywords) in CASES.items():
        task = {'name': name, 'kvpin.fleet.serving_plan': task_args(args), 'register': name,
                'ignore_errors': True}
        task.update(keywords)
        tasks.append(task)
    tasks.append({'name': 'save_results', 'check_mode': False, 'ansible.builtin.copy': {
        'dest': str(results), 'mode': '0600',
        'content': '{{ %s | to_json }}' % ('{%s}' % ', '.join("'%s': %s" % (name, name) for name in CASES))}})
    proc = run_tasks_on_localhost(work, tasks, '-vvv')
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    log_by_task = dict(re.findall(r'^TASK \[(\w+)\].*?$(.*?)(?=^TASK \[|^PLAY RECAP)', proc.stdout, re.M | re.S))
    assert set(log_by_task) == set(CASES) | {'save_results'}, proc.stdout[-4000:]
    return json.loads(results.read_text()), log_by_task


@pytest.mark.parametrize('name', ['catalog', 'catalog_check_mode', 'hf_config_dict', 'traffic_classes'])
def test_catalog_model_plans_on_the_controller_as_the_module_would(playbook_run, tmp_path, name):
    results, log = playbook_run
    assert MODULE_SENT not in log[name]
    result = results[name]
    expected = run_module(tmp_path, CASES[name][0])
    assert not result['failed'] and not result['changed']
    assert result['plan'] == expected['plan']
    assert result['plan_report'] == expected['plan_report']
    assert result['plan']['feasible']


def test_traffic_classes_plan_on_the_controller_with_a_strategy(playbook_run):
    plan = playbook_run[0]['traffic_classes']['plan']
    assert plan['strategy'] == 'single' and plan['feasible']
    assert [a['weight_copies'] for a in plan['alternatives']] == [1, 1, 2]
    assert [c['name'] for c in plan['traffic_classes']] == ['chat', 'batch']


def test_report_deployment_gets_the_report_pins_on_the_controller(playbook_run):
    plan = playbook_run[0]['catalog']['plan']
    assert '--tensor-parallel-size=4' in plan['args']
    assert '--max-model-len=16384' in plan['args']
    assert plan['settings']['gpu_memory_utilization'] <= 0.90
    # Per-GPU rows are these GPUs: the vLLM plan's total is the CUDA-visible total (what
    # vLLM budgets from), and the NVML memory_total it came from is kept as a term.
    assert [gpu['terms']['nvml_total'] for gpu in plan['memory']] == [gpu['memory_total'] for gpu in GPUS]
    assert [gpu['total'] for gpu in plan['memory']] == [
        cuda_total.estimate(gpu['name'], gpu['memory_total'], gpu.get('memory_reserved')).cuda_total
        for gpu in GPUS]


@pytest.mark.parametrize('name, message', [
    ('invalid_zero', 'serving_plan: invalid max_concurrency: must be > 0, got 0'),
    ('invalid_traffic_both', 'serving_plan: invalid traffic_classes: replaces prompt_tokens_p99'),
    ('invalid_type', "argument 'max_concurrency' is of type str and we were unable to convert to int"),
    ('unsupported_option', 'Unsupported parameters for (kvpin.fleet.serving_plan) module: max_concurency.'),
])
def test_invalid_input_fails_with_the_modules_message(playbook_run, tmp_path, name, message):
    results, log = playbook_run
    assert MODULE_SENT not in log[name]
    result = results[name]
    expected = run_module(tmp_path, CASES[name][0])
    assert result['failed'] and expected['failed']
    assert message in result['msg']
    assert result.get('field') == expected.get('field')
    if name == 'unsupported_option':
        # Run directly the module names itself by its file (basic.py); under Ansible by its
        # FQCN, as the action plugin does. The rest of the message is the same.
        assert result['msg'].split(' module: ')[1] == expected['msg'].split(' module: ')[1]
    else:
        assert result['msg'] == expected['msg']


def test_infeasible_plan_fails_with_the_plan_and_its_report(playbook_run, tmp_path):
    results, log = playbook_run
    assert MODULE_SENT not in log['infeasible']
    result = results['infeasible']
    expected = run_module(tmp_path, CASES['infeasible'][0])
    assert result['failed']
    assert result['msg'] == expected['msg']
    assert 'infeasible' in result['msg'] and 'gpu_memory_utilization <= 0.89' in result['msg']
    assert result['plan'] == expected['plan'] and not result['plan']['feasible']
    assert result['plan_report'] == expected['plan_report']
    assert result['plan_report'][0].endswith('INFEASIBLE')


def test_gguf_path_runs_the_module_on_the_node(playbook_run):
    results, log = playbook_run
    assert MODULE_SENT in log['gguf_missing']
    result = results['gguf_missing']
    assert result['failed'] and result['field'] == 'model'
    assert result['msg'] == ('serving_plan: invalid model: GGUF file '
                             '/nonexistent/kvpin-model-Q4_K_M.gguf does not exist')


def test_model_directory_is_read_on_the_node(playbook_run, tmp_path):
    results, log = playbook_run
    assert MODULE_SENT in log['model_dir']
    result = results['model_dir']
    assert result['plan'] == run_module(tmp_path, CASES['model_dir'][0])['plan']
