# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Bad types and values in serving_plan's task arguments (issue 11 items 8 and 10): every one
ends as the module's normal failure (fail_json, msg naming the field), never a traceback, both
in the pure function, through the module entry point and through the action plugin."""

from __future__ import annotations

import json
import math
import os
import re

import pytest

from local_playbook import run_tasks_on_localhost
from model_files import GiB, SMALL_LLAMA, gpu, params, run_module

from ansible_collections.kvpin.fleet.plugins.module_utils.plan.serving_plan import serving_plan_result

SECRET = 'root:$6$kvpinSECRET$hash:19000:0:99999:7:::'

# (name, overrides, field, message fragment)
BAD_INPUTS = [
    ('memory_total_str', dict(gpus=[gpu(total='51527024640')]), 'gpus[0].memory_total',
     "must be a positive number of bytes, got '51527024640'"),
    ('memory_total_none', dict(gpus=[gpu(total=None)]), 'gpus[0].memory_total', 'got None'),
    ('memory_total_list', dict(gpus=[gpu(total=[48])]), 'gpus[0].memory_total', 'got [48]'),
    ('memory_total_float', dict(gpus=[gpu(total=4.8e10)]), 'gpus[0].memory_total', 'got 48000000000.0'),
    ('memory_total_bool', dict(gpus=[gpu(total=True)]), 'gpus[0].memory_total', 'got True'),
    ('memory_total_absurd', dict(gpus=[gpu(total=1 << 50)]), 'gpus[0].memory_total', 'more than any GPU has'),
    ('memory_total_zero', dict(gpus=[gpu(total=0)]), 'gpus[0].memory_total', 'got 0'),
    ('index_str', dict(gpus=[gpu(index='0')]), 'gpus[0].index', "got '0'"),
    ('index_negative', dict(gpus=[gpu(index=-1)]), 'gpus[0].index', 'got -1'),
    ('name_list', dict(gpus=[gpu(name=['A6000'])]), 'gpus[0].name', 'must be a string'),
    ('memory_free_str', dict(gpus=[gpu(memory_free='lots')]), 'gpus[0].memory_free', "got 'lots'"),
    ('memory_used_over_total', dict(gpus=[gpu(memory_used=100 * GiB)]), 'gpus[0].memory_used',
     'between 0 and memory_total'),
    ('compute_capability_float', dict(gpus=[gpu(compute_capability=8.6)]), 'gpus[0].compute_capability',
     'must be a string like "8.6"'),
    ('compute_capability_junk', dict(gpus=[gpu(compute_capability='eight')]), 'gpus[0].compute_capability',
     "got 'eight'"),
    ('gpu_not_dict', dict(gpus=['GPU-0']), 'gpus[0]', 'must be a dict'),
    ('too_many_gpus', dict(gpus=[gpu(index=i) for i in range(17)]), 'gpus', '17 GPUs given'),
    ('version_series', dict(backend_version='0.10'), 'backend_version', "vLLM version '0.10' is ambiguous"),
    ('version_yaml_float', dict(backend_version='0.1'), 'backend_version', 'unquoted 0.10 is the number 0.1'),
    ('version_nine', dict(backend_version='v0.9'), 'backend_version', 'ambiguous'),
    ('util_nan', dict(gpu_memory_utilization=float('nan')), 'gpu_memory_utilization', 'nan'),
    ('util_over_one', dict(gpu_memory_utilization=1.5), 'gpu_memory_utilization', 'must be in (0, 1]'),
    ('max_model_len_negative', dict(max_model_len=-1), 'max_model_len', 'must be >= 16'),
    ('tp_list', dict(tensor_parallel_size=[4]), 'tensor_parallel_size', 'must be an integer or "auto"'),
    ('tp_word', dict(tensor_parallel_size='four'), 'tensor_parallel_size', 'must be an integer or "auto"'),
    ('tp_zero', dict(tensor_parallel_size=0), 'tensor_parallel_size', 'must be >= 1'),
    ('block_size_odd', dict(block_size=7), 'block_size', 'must be one of'),
    ('kv_dtype_junk', dict(kv_cache_dtype='fp3'), 'kv_cache_dtype', "'fp3'"),
    ('prompt_negative', dict(prompt_tokens_p99=-5), 'prompt_tokens_p99', 'must be > 0'),
    ('concurrency_huge', dict(max_concurrency=10 ** 9), 'max_concurrency', 'typo'),
    ('model_negative_window', dict(model=dict(SMALL_LLAMA, sliding_window=-4096)), 'model',
     "'sliding_window' = -4096 is out of range"),
    ('model_bool_layers', dict(model=dict(SMALL_LLAMA, num_hidden_layers=True)), 'model',
     "'num_hidden_layers' must be an integer, got True"),
    ('model_string_heads', dict(model=dict(SMALL_LLAMA, num_attention_heads='8')), 'model',
     "'num_attention_heads' must be an integer, got '8'"),
    ('model_list', dict(model=['x']), 'model', 'expected a catalog name'),
    ('llama_tensor_split_words', dict(backend='llama.cpp', backend_version='b6327', quantization='Q8_0',
                                      tensor_split=['a']), 'tensor_split', ''),
    ('llama_ctx_negative', dict(backend='llama.cpp', backend_version='b6327', quantization='Q8_0',
                                ctx_size=-1), 'ctx_size', ''),
    ('llama_gpu_layers_huge', dict(backend='llama-box', backend_version='v0.0.171', quantization='Q8_0',
                                   gpu_layers=10 ** 6), 'gpu_layers', 'must be between'),
    ('llama_quantization_junk', dict(backend='llama-box', backend_version='v0.0.171',
                                     quantization='Q1_Z'), 'quantization', "'Q1_Z' is not known"),
]

# knob values Ansible would coerce or refuse before the module runs, but that a direct caller
# of the pure function can pass: refused at the same boundary by type
DIRECT_ONLY = [
    ('tp_float', dict(tensor_parallel_size=float('inf')), 'tensor_parallel_size', 'must be an integer'),
    ('max_num_seqs_str', dict(max_num_seqs='8'), 'max_num_seqs', 'must be of type int'),
    ('max_num_seqs_inf', dict(max_num_seqs=float('inf')), 'max_num_seqs', 'must be of type int'),
    ('enforce_eager_str', dict(enforce_eager='yes'), 'enforce_eager', 'must be of type bool'),
    ('util_str', dict(gpu_memory_utilization='0.9'), 'gpu_memory_utilization', 'must be of type float'),
    ('kv_dtype_list', dict(kv_cache_dtype=['fp8']), 'kv_cache_dtype', 'must be of type str'),
    ('tensor_split_nan', dict(backend='llama.cpp', backend_version='b6327', quantization='Q8_0',
                              tensor_split=[float('nan')]), 'tensor_split', 'must be of type list of numbers'),
    ('prompt_inf', dict(prompt_tokens_p99=float('inf')), 'prompt_tokens_p99', 'must be a positive integer'),
    ('version_float', dict(backend_version=0.1), 'backend_version', 'must be a string'),
    ('version_list', dict(backend_version=['0.10.1.1']), 'backend_version', 'must be a string'),
    ('gpus_str', dict(gpus='GPU-0'), 'gpus', 'must be a list'),
]


@pytest.mark.parametrize('name, overrides, field, fragment', BAD_INPUTS + DIRECT_ONLY,
                         ids=[case[0] for case in BAD_INPUTS + DIRECT_ONLY])
def test_bad_input_is_a_failure_naming_the_field(name, overrides, field, fragment):
    result = serving_plan_result(params(**overrides))
    assert result['failed'], name
    assert result['field'] == field, result['msg']
    assert result['msg'].startswith('serving_plan: invalid %s: ' % field)
    assert fragment in result['msg']


def test_the_sound_baseline_plans():
    # the cases above differ from this feasible plan by the one bad value each
    result = serving_plan_result(params())
    assert not result.get('failed') and result['plan']['feasible'], result.get('msg')


def json_safe(overrides):
    return all(not (isinstance(v, float) and math.isnan(v)) for v in overrides.values())


MODULE_CASES = [case for case in BAD_INPUTS if json_safe(case[1])]


@pytest.mark.parametrize('name, overrides, field, fragment', MODULE_CASES, ids=[c[0] for c in MODULE_CASES])
def test_module_entry_point_fails_cleanly(tmp_path, name, overrides, field, fragment):
    result, stderr = run_module(tmp_path, params(**overrides))
    assert 'Traceback' not in stderr and 'exception' not in result, stderr
    assert result['failed']
    if 'field' not in result:
        # Ansible's own argument check came first (elements of the wrong type): its message
        # names the option
        assert "for option '%s'" % field.split('[')[0] in result['msg'], result
        return
    assert result['field'] == field, result
    assert fragment in result['msg']


def test_module_entry_point_never_echoes_a_symlinked_file(tmp_path):
    target = tmp_path / 'shadow'
    target.write_text(SECRET)
    link = tmp_path / 'model.gguf'
    os.symlink(str(target), str(link))
    result, stderr = run_module(tmp_path, params(model=str(link), backend='llama-box',
                                                 backend_version='v0.0.171'))
    assert 'Traceback' not in stderr
    assert result['failed'] and result['field'] == 'model'
    assert 'kvpinSECRET' not in json.dumps(result) and 'root:' not in result['msg']


# ---- the action plugin: the same failures from a real ansible-playbook run

ACTION_CASES = ['memory_total_str', 'index_str', 'compute_capability_float', 'version_series',
                'model_negative_window', 'model_bool_layers', 'tp_word', 'llama_ctx_negative']


@pytest.fixture(scope='module')
def playbook_results(tmp_path_factory):
    work = tmp_path_factory.mktemp('serving_plan_adversarial')
    by_name = dict((case[0], case) for case in BAD_INPUTS)
    secret_file = work / 'shadow'
    secret_file.write_text(SECRET)
    os.symlink(str(secret_file), str(work / 'model.gguf'))
    cases = dict((name, params(**by_name[name][1])) for name in ACTION_CASES)
    cases['gguf_symlink'] = params(model=str(work / 'model.gguf'), backend='llama-box',
                                   backend_version='v0.0.171')
    tasks = [{'name': name, 'kvpin.fleet.serving_plan': args, 'register': name, 'ignore_errors': True}
             for name, args in cases.items()]
    results = work / 'results.json'
    tasks.append({'name': 'save', 'ansible.builtin.copy': {
        'dest': str(results), 'mode': '0600',
        'content': '{{ {%s} | to_json }}' % ', '.join("'%s': %s" % (n, n) for n in cases)}})
    proc = run_tasks_on_localhost(work, tasks, '-vvv')
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return json.loads(results.read_text()), proc.stdout + proc.stderr


@pytest.mark.parametrize('name', ACTION_CASES)
def test_action_plugin_fails_cleanly_naming_the_field(playbook_results, name):
    results, _log = playbook_results
    _name, _overrides, field, fragment = [case for case in BAD_INPUTS if case[0] == name][0]
    result = results[name]
    assert result['failed'] and result['field'] == field, result
    assert fragment in result['msg']
    # Ansible 2.19 marks every failure "exception: (traceback unavailable)"; a real one would
    # carry the traceback text or the module's stderr
    assert 'Traceback' not in result.get('exception', '') and 'module_stderr' not in result


def test_action_plugin_run_never_echoes_a_symlinked_file_or_a_traceback(playbook_results):
    results, log = playbook_results
    result = results['gguf_symlink']
    assert result['failed'] and result['field'] == 'model'
    assert 'is not a GGUF file' in result['msg']
    assert 'kvpinSECRET' not in log and not re.search(r'Traceback \(most recent call last\)', log)
