# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One entry point for planning a deployment: validate the request, resolve the model,
hand it to the planner of its engine, and render the result for people.

This module owns only input validation and dispatch (the checks ``traffic_classes`` shares
are in ``plan_types``); the memory arithmetic lives in ``vllm_memory``, ``vllm_pipeline``
and ``llamacpp_memory`` (one estimator per engine and layout, nothing recomputed here), and
``build_plan`` is the one place that picks among them. The task interface (argument spec,
result dict, where the plan is computed) is here too, shared by the ``serving_plan`` module
and its action plugin; several traffic classes go to ``traffic_classes`` with ``build_plan``.
"""

from __future__ import annotations

import json
import math
import os
import re

from ansible_collections.kvpin.fleet.plugins.module_utils.plan import llamacpp_memory
from ansible_collections.kvpin.fleet.plugins.module_utils.plan import llamacpp_profile
from ansible_collections.kvpin.fleet.plugins.module_utils.plan import measured_traffic
from ansible_collections.kvpin.fleet.plugins.module_utils.plan import model_loaders
from ansible_collections.kvpin.fleet.plugins.module_utils.plan import traffic_classes
from ansible_collections.kvpin.fleet.plugins.module_utils.plan import vllm_memory
from ansible_collections.kvpin.fleet.plugins.module_utils.plan import vllm_pipeline
from ansible_collections.kvpin.fleet.plugins.module_utils.plan import vllm_profile
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.gpu_choice import choose_gpus, describe_kinds, kinds
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.model_loaders import GGUF_SUFFIX
# with the request's checks shared with traffic_classes (saved_gpu_facts reads MAX_GPUS and check_gpus from here)
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.plan_types import (
    BACKEND_LLAMA_BOX, BACKEND_LLAMA_CPP, BACKEND_VLLM, BACKENDS, MAX_CONCURRENCY, MAX_GPUS, MAX_TOKENS_PER_REQUEST,
    PlanInputError, Traffic, check_gpus, check_plan, is_int, positive_int, type_name)
from ansible_collections.kvpin.fleet.plugins.module_utils.units import GiB


# The engine knobs, one row each: (serving_plan option name, the engine it belongs to, its option
# type in the argument spec). A knob left None is derived by the planner. The module's
# DOCUMENTATION and playbooks/tasks/plan_deployments.yml list the same names (a unit test checks).
ENGINE_VLLM = 'vllm'
ENGINE_LLAMA = 'llama-box / llama.cpp'
ENGINE_KNOBS = (
    ('tensor_parallel_size', ENGINE_VLLM, dict(type='raw')),
    ('gpu_memory_utilization', ENGINE_VLLM, dict(type='float')),
    ('max_model_len', ENGINE_VLLM, dict(type='int')),
    ('max_num_seqs', ENGINE_VLLM, dict(type='int')),
    ('max_num_batched_tokens', ENGINE_VLLM, dict(type='int', no_log=False)),
    ('kv_cache_dtype', ENGINE_VLLM, dict(type='str')),
    ('allow_fp8_kv', ENGINE_VLLM, dict(type='bool')),
    ('block_size', ENGINE_VLLM, dict(type='int')),
    ('enforce_eager', ENGINE_VLLM, dict(type='bool')),
    ('pin_kv_cache_memory', ENGINE_VLLM, dict(type='bool')),
    ('kv_cache_memory_bytes', ENGINE_VLLM, dict(type='int')),
    ('cudagraph_memory_estimate', ENGINE_VLLM, dict(type='bool')),
    ('pipeline_parallel_size', ENGINE_VLLM, dict(type='int')),
    ('pp_layer_partition', ENGINE_VLLM, dict(type='raw')),
    ('vllm_sampler', ENGINE_VLLM, dict(type='str', choices=['flashinfer', 'pytorch'])),
    ('vllm_image', ENGINE_VLLM, dict(type='str')),
    ('gpu_layers', ENGINE_LLAMA, dict(type='int')),
    ('ctx_size', ENGINE_LLAMA, dict(type='int')),
    ('parallel', ENGINE_LLAMA, dict(type='int')),
    ('flash_attn', ENGINE_LLAMA, dict(type='bool')),
    ('cache_type_k', ENGINE_LLAMA, dict(type='str')),
    ('cache_type_v', ENGINE_LLAMA, dict(type='str')),
    ('ubatch_size', ENGINE_LLAMA, dict(type='int')),
    ('batch_size', ENGINE_LLAMA, dict(type='int')),
    ('tensor_split', ENGINE_LLAMA, dict(type='list', elements='float')),
    ('quantization', ENGINE_LLAMA, dict(type='str')),
    ('no_kv_offload', ENGINE_LLAMA, dict(type='bool')),
    ('vram_reserve_bytes', ENGINE_LLAMA, dict(type='int')),
)
VLLM_KNOBS = tuple(name for name, engine, _spec in ENGINE_KNOBS if engine == ENGINE_VLLM)
LLAMA_KNOBS = tuple(name for name, engine, _spec in ENGINE_KNOBS if engine == ENGINE_LLAMA)
ALL_KNOBS = VLLM_KNOBS + tuple(k for k in LLAMA_KNOBS if k not in VLLM_KNOBS)

# A whole number written as text: ASCII digits only (str.isdigit also accepts "²" or "４",
# which int() rejects or reads differently) and few enough of them for int() to parse.
DIGITS_RE = re.compile(r'^\s*[0-9]{1,18}\s*$')

# Option types of the engine knobs (the module's argument spec, less the required inputs).
KNOB_TYPES = dict((name, spec) for name, _engine, spec in ENGINE_KNOBS)

# The serving_plan task's argument spec: the module builds its AnsibleModule from it and the
# action plugin validates the task args with it, so both coerce and reject alike.
SERVING_PLAN_ARGUMENT_SPEC = dict(
    backend=dict(type='str', required=True, choices=list(BACKENDS)),
    backend_version=dict(type='str', required=True),
    model=dict(type='raw', required=True),
    gpus=dict(type='list', elements='dict', required=True),
    gpu_indexes=dict(type='list', elements='int'),
    prompt_tokens_p99=dict(type='int', no_log=False),
    max_output_tokens=dict(type='int', no_log=False),
    max_concurrency=dict(type='int'),
    traffic_classes=dict(type='list', elements='dict'),
    traffic_source=dict(type='str', default='declared', choices=list(measured_traffic.TRAFFIC_SOURCES)),
    measurement=dict(type='dict'),
    fail_on_infeasible=dict(type='bool', default=True),
    **KNOB_TYPES
)


def parse_traffic(prompt_tokens_p99, max_output_tokens, max_concurrency):
    """Traffic from the three inventory figures, each checked and named on error."""
    if prompt_tokens_p99 is None and max_output_tokens is None and max_concurrency is None:
        raise PlanInputError('prompt_tokens_p99', 'is required (with max_output_tokens and max_concurrency) '
                                                  'unless traffic_classes is given')
    return Traffic(
        prompt_tokens_p99=positive_int('prompt_tokens_p99', prompt_tokens_p99, MAX_TOKENS_PER_REQUEST),
        max_output_tokens=positive_int('max_output_tokens', max_output_tokens, MAX_TOKENS_PER_REQUEST),
        max_concurrency=positive_int('max_concurrency', max_concurrency, MAX_CONCURRENCY),
    )


def check_gpu_indexes(gpu_indexes, gpus):
    """The deployment's pin (``gpu_indexes``) checked against the node's checked ``gpus``: a
    non-empty list of distinct indexes, each one of ``gpus``. Returns the sorted list."""
    if not isinstance(gpu_indexes, (list, tuple)) or not gpu_indexes:
        raise PlanInputError('gpu_indexes', 'must be a non-empty list of GPU indexes, got %r' % (gpu_indexes,))
    if len(gpu_indexes) > MAX_GPUS:
        raise PlanInputError('gpu_indexes', '%d indexes given; a node has at most %d GPUs'
                             % (len(gpu_indexes), MAX_GPUS))
    for position, index in enumerate(gpu_indexes):
        if not is_int(index) or not 0 <= index < 1 << 16:
            raise PlanInputError('gpu_indexes[%d]' % position, 'must be a GPU index (integer >= 0), got %r'
                                 % (index,))
    if len(set(gpu_indexes)) != len(gpu_indexes):
        raise PlanInputError('gpu_indexes', 'names a GPU twice: %s' % list(gpu_indexes))
    known = sorted(gpu['index'] for gpu in gpus)
    missing = sorted(set(gpu_indexes) - set(known))
    if missing:
        raise PlanInputError('gpu_indexes', 'GPU %s not among the node\'s GPUs %s'
                             % (', '.join(str(i) for i in missing), known))
    return sorted(gpu_indexes)


def pinned_tp(knobs):
    """The user's tensor_parallel_size as an int in 1..MAX_GPUS, None for unset / auto, or
    False for a value the vLLM planner must refuse itself (out of range)."""
    value = knobs.get('tensor_parallel_size')
    if value is None or (isinstance(value, str) and value.strip() == 'auto'):
        return None
    number = int(value)
    return number if 1 <= number <= MAX_GPUS else False


def _knob_type_error(name, spec, value):
    kind = spec['type'] if spec['type'] != 'list' else 'list of numbers'
    return PlanInputError(name, 'must be of type %s, got %r (%s)' % (kind, value, type_name(value)))


def check_knob_type(name, value):
    """``value`` has the type the argument spec gives knob ``name`` (the module's arguments
    arrive coerced; a direct caller's are checked here, at the same boundary). Numbers must
    be finite; the planner of each engine checks the ranges."""
    spec = KNOB_TYPES[name]
    kind = spec['type']
    if kind == 'int' and not is_int(value):
        raise _knob_type_error(name, spec, value)
    if kind == 'float' and not ((is_int(value) or isinstance(value, float)) and math.isfinite(value)):
        raise _knob_type_error(name, spec, value)
    if kind == 'bool' and not isinstance(value, bool):
        raise _knob_type_error(name, spec, value)
    if kind == 'str' and not isinstance(value, str):
        raise _knob_type_error(name, spec, value)
    if kind == 'list':
        if not isinstance(value, (list, tuple)) or not all(
                (is_int(v) or isinstance(v, float)) and math.isfinite(v) for v in value):
            raise _knob_type_error(name, spec, value)
    if name == 'pp_layer_partition':
        return value    # a list or "40,24": vllm_pipeline.parse_partition checks every entry
    if kind == 'raw' and not (is_int(value) or (isinstance(value, str) and (
            value.strip() == 'auto' or DIGITS_RE.match(value)))):
        # tensor_parallel_size: an integer or "auto" (a templated "4" arrives as a string)
        raise PlanInputError(name, 'must be an integer or "auto", got %r' % (value,))
    return value


def split_knobs(backend, params):
    """The knobs the user set (not None), checked to belong to ``backend``."""
    allowed = VLLM_KNOBS if backend == BACKEND_VLLM else LLAMA_KNOBS
    knobs = {}
    for name in ALL_KNOBS:
        value = params.get(name)
        if value is None:
            continue
        if name not in allowed:
            raise PlanInputError(name, 'is a %s option; backend %s does not take it' % (
                'vLLM' if name in VLLM_KNOBS else 'llama-box / llama.cpp', backend))
        knobs[name] = check_knob_type(name, value)
    return knobs


# The planners key of vLLM plans with pipeline parallelism (the other keys are the backends).
VLLM_PIPELINE = 'vllm pipeline'


def engine_planners():
    """{key: planner} of every engine: vLLM TP, vLLM pipeline parallelism, llama-box and
    llama.cpp (each looked up when called, so a planner replaced on its module is the one used)."""
    return {BACKEND_VLLM: vllm_memory.plan_vllm, VLLM_PIPELINE: vllm_pipeline.plan_vllm_pipeline,
            BACKEND_LLAMA_BOX: llamacpp_memory.plan_llamacpp, BACKEND_LLAMA_CPP: llamacpp_memory.plan_llamacpp}


def plan_vllm_engine(spec, gpus, traffic, knobs, version, planners=None):
    """One vLLM plan on exactly ``gpus``: the pipeline planner when the knobs ask for stages
    (pipeline_parallel_size or pp_layer_partition), the tensor-parallel planner otherwise. The
    one place the two are told apart (build_plan plans through it)."""
    planners = dict(engine_planners(), **(planners or {}))
    key = VLLM_PIPELINE if vllm_pipeline.pipeline_requested(knobs) else BACKEND_VLLM
    return planners[key](spec, gpus, traffic, knobs, version)


def check_engine(params):
    """The request's backend and backend_version, checked (named errors)."""
    backend = params.get('backend')
    if backend not in BACKENDS:
        raise PlanInputError('backend', 'must be one of %s, got %r' % (', '.join(BACKENDS), backend))
    version = params.get('backend_version')
    if version is not None and not isinstance(version, str):
        raise PlanInputError('backend_version', 'must be a string such as "0.10.1.1" (quoted in '
                                                'YAML), got %r (%s)' % (version, type_name(version)))
    if not version or not str(version).strip():
        raise PlanInputError('backend_version', 'is required: flags and memory accounting '
                                                'differ by engine version')
    return backend, version


def build_plan(params, resolve_model=None, planners=None):
    """Plan one deployment from module-style ``params``; returns a plan_types.Plan.

    ``resolve_model`` and ``planners`` (some of engine_planners' entries) default to the real
    implementations; given, they replace those entries. With a ``measurement`` the traffic is
    chosen by ``traffic_source`` (measured_traffic.choose_traffic), the plan's KV pool is
    compared with the engine's, and a vLLM engine that got less KV than planned (same card,
    version and args) is replanned with max_num_seqs sized on the pool it really has.
    """
    backend, _version = check_engine(params)
    declared = parse_traffic(params.get('prompt_tokens_p99'), params.get('max_output_tokens'),
                             params.get('max_concurrency'))
    source = measured_traffic.check_traffic_source(params.get('traffic_source'))
    measurement = measured_traffic.check_measurement(params.get('measurement'))
    if measurement is None and source == measured_traffic.DEFAULT_TRAFFIC_SOURCE:
        return measurable(plan_for_traffic(params, declared, resolve_model, planners))
    # traffic_source measured / larger without a measurement (a new deployment, a watchdog that
    # has not measured yet): the declared traffic, and the plan says why (choose_traffic).
    traffic, check = measured_traffic.choose_traffic(declared, measurement, source)
    plan = measurable(plan_for_traffic(params, traffic, resolve_model, planners))
    if measurement is None or measurement['traffic'] is None:
        plan.warnings.append('traffic_source %s: no traffic measured for this deployment yet (its watchdog '
                             'writes the measurement the next run reads): planned from the declared traffic'
                             % source)
    kv = measured_traffic.kv_check(plan, measurement)
    if kv is not None and kv['short'] and backend == BACKEND_VLLM and plan.feasible:
        seqs, seq_tokens = measured_traffic.resized_max_num_seqs(plan, traffic, kv['actual_kv_cache_tokens'])
        planned_seqs = plan.settings.get('max_num_seqs')
        if params.get('max_num_seqs') is not None:
            kv['action'] = ('max_num_seqs %d set by the user: kept, though the engine\'s pool of %d tokens '
                            'holds %d sequences of %d tokens' % (params['max_num_seqs'],
                                                                 kv['actual_kv_cache_tokens'], seqs, seq_tokens))
        elif planned_seqs is not None and seqs < planned_seqs:
            plan = measurable(plan_for_traffic(dict(params, max_num_seqs=seqs), traffic, resolve_model, planners))
            kv['action'] = ('max_num_seqs %d -> %d: sized on the KV pool the engine really got (%d tokens, '
                            'planned %d) // %d-token sequences' % (
                                planned_seqs, seqs, kv['actual_kv_cache_tokens'], kv['planned_kv_cache_tokens'],
                                seq_tokens))
            plan.reasons['max_num_seqs'] = kv['action']
            plan.warnings.append('the engine got less KV than planned: %s' % kv['action'])
        else:
            kv['action'] = ('max_num_seqs %s kept: the engine\'s pool of %d tokens still holds %d sequences '
                            'of %d tokens' % (planned_seqs, kv['actual_kv_cache_tokens'], seqs, seq_tokens))
    if source != measured_traffic.DEFAULT_TRAFFIC_SOURCE:
        for row in check['figures']:
            plan.reasons['traffic.%s' % row['option']] = '%d: %s' % (row['used'], row['reason'])
    plan.measured = {'traffic': check, 'kv_pool': kv}
    return plan


def measurable(plan):
    """``plan`` with what makes its traffic measurable: vLLM >= 0.32 gets request_tokens
    histogram bounds fine around its max_model_len (--custom-histogram-buckets); llama-box and
    llama.cpp get --metrics (their /metrics endpoint is off by default)."""
    if plan.backend == BACKEND_VLLM:
        version = vllm_profile.parse_version(plan.backend_version)
        max_model_len = plan.settings.get('max_model_len')
        if not vllm_profile.flag_available('custom_histogram_buckets', version) or not max_model_len:
            return plan
        value = measured_traffic.histogram_buckets_value(max_model_len)
        plan.args.append(vllm_profile.render_flag('custom_histogram_buckets', value))
        plan.settings['custom_histogram_buckets'] = json.loads(value)
        plan.reasons['custom_histogram_buckets'] = (
            'request_tokens bounds 1-2-5 below %d, then steps of at most %d %% up to max_model_len %d '
            '(%d bounds): the measured prompt / output p99 bound is within 10 %% (vLLM %s accepts %s)' % (
                measured_traffic.FINE_FROM, round((measured_traffic.FINE_RATIO - 1) * 100), max_model_len,
                len(plan.settings['custom_histogram_buckets']['request_tokens']), version,
                vllm_profile.flag_span('custom_histogram_buckets')))
        return plan
    flag = llamacpp_profile.engine_profile(plan.backend, plan.backend_version).flag('metrics')
    if flag and flag not in plan.args:
        plan.args.append(flag)
        plan.settings['metrics'] = True
        plan.reasons['metrics'] = ('%s: the /metrics endpoint (off by default in %s) is what the watchdog '
                                   'measures KV usage and load from' % (flag, plan.backend))
    return plan


def plan_for_traffic(params, traffic, resolve_model=None, planners=None):
    """Plan one deployment for ``traffic`` (the declared or the chosen measured figures)."""
    backend, version = check_engine(params)
    gpus = check_gpus(params.get('gpus'))
    knobs = split_knobs(backend, params)
    if params.get('model') in (None, '', {}):
        raise PlanInputError('model', 'is required (catalog name, HF config dict, model directory '
                                      'or .gguf path)')
    if resolve_model is None:
        resolve_model = model_loaders.resolve_model
    spec = resolve_model(params['model'])
    pin = params.get('gpu_indexes')
    if pin is not None:
        pin = check_gpu_indexes(pin, gpus)
        gpus = [gpu for gpu in gpus if gpu['index'] in pin]
    planners = dict(engine_planners(), **(planners or {}))
    if backend == BACKEND_VLLM:
        plan_vllm = planners[BACKEND_VLLM]
        tp = pinned_tp(knobs)
        # pipeline parallelism plans its stages on every GPU given (stages may differ in kind)
        pipeline = vllm_pipeline.pipeline_requested(knobs)
        if pin is not None and len(kinds(gpus)) > 1 and not pipeline:
            raise PlanInputError('gpu_indexes', 'pins %s to GPUs of different kinds: %s; vLLM tensor '
                                 'parallelism needs GPUs of one kind. Pin GPUs of one kind, or leave '
                                 'gpu_indexes out and the planner chooses the card or group of identical '
                                 'cards that fits best; for GPUs of different sizes together use backend '
                                 'llama-box (GPUStack 0.7) or llama.cpp (GPUStack 2.x)'
                                 % (pin, describe_kinds(gpus)))
        if pin is None and tp is not False and not pipeline:
            plan, choice = choose_gpus(gpus, tp, traffic, lambda group, size: check_plan(plan_vllm(
                spec, group, traffic, dict(knobs, tensor_parallel_size=size), str(version))))
            if plan is not None:
                return with_gpu_choice(plan, choice, tp)
        return pinned(check_plan(plan_vllm_engine(spec, gpus, traffic, knobs, str(version), planners)), pin)
    return pinned(check_plan(planners[backend](spec, gpus, traffic, knobs, backend, str(version))), pin)


def pinned(plan, pin):
    """``plan`` with the deployment's pin: GPUStack's GPU selector gets exactly those GPUs.
    Without a pin (a llama.cpp / llama-box plan over the GPUs given) GPUStack places it."""
    if pin is not None:
        plan.gpu_indexes = list(pin)
        plan.reasons['gpu_indexes'] = 'pinned by the deployment (gpu_indexes %s); never re-chosen' % list(pin)
    return plan


def with_gpu_choice(plan, choice, tp):
    """``plan`` (the chosen candidate's) carrying the choice: its GPU indexes, what was compared
    and why; with TP unset the TP size is the choice's too."""
    plan.gpu_indexes = list(choice['gpu_indexes'])
    plan.gpu_choice = choice
    plan.reasons['gpu_indexes'] = choice['reason']
    if tp is None:
        plan.reasons['tensor_parallel_size'] = ('auto: %d, the size of the chosen GPU group (see the '
                                                'reason for gpu_indexes)' % len(choice['gpu_indexes']))
    return plan


MEMORY_COLUMNS = ('total', 'budget', 'weights', 'activation', 'non_torch', 'cuda_graph',
                  'kv_cache', 'headroom')


def memory_table(plan):
    """Per-GPU memory table (GiB, two decimals) as text lines, for plan.yml output."""
    header = ['gpu'] + list(MEMORY_COLUMNS)
    rows = [header]
    for gpu in plan.memory:
        rows.append(['%d %s' % (gpu.index, gpu.name)]
                    + ['%.2f' % (getattr(gpu, column) / GiB) for column in MEMORY_COLUMNS])
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ['  '.join(cell.rjust(widths[i]) if i else cell.ljust(widths[i])
                       for i, cell in enumerate(row)) for row in rows]
    lines.insert(1, '  '.join('-' * width for width in widths))
    lines.append('(GiB; every term in bytes in plan.memory, explained in plan.memory[].explain)')
    return lines


def plan_report(plan, name=None):
    """Everything a person needs to read a plan: verdict, args, memory table, and the
    rule behind every pinned value."""
    verdict = 'FEASIBLE' if plan.feasible else 'INFEASIBLE'
    title = '%s%s %s: %s' % ('%s - ' % name if name else '', plan.backend, plan.backend_version, verdict)
    lines = [title, 'args: %s' % ' '.join(plan.args)]
    lines.extend(memory_table(plan))
    if getattr(plan, 'pipeline', None):
        lines.extend(vllm_pipeline.report_lines(plan.pipeline))
    lines.append('kv_cache_tokens: %d; max_concurrency_at_max_len: %.2f'
                 % (plan.kv_cache_tokens, plan.max_concurrency_at_max_len))
    if plan.gpu_indexes is not None:
        lines.append('gpu_indexes: %s' % plan.gpu_indexes)
    if getattr(plan, 'measured', None):
        lines.extend(measured_traffic.report_lines(plan.measured['traffic'], plan.measured['kv_pool']))
    lines.extend('reason %s: %s' % (knob, plan.reasons[knob]) for knob in sorted(plan.reasons))
    lines.extend('rule: %s' % rule for rule in plan.rules)
    lines.extend('warning: %s' % warning for warning in plan.warnings)
    lines.extend('does not fit: %s' % term for term in plan.not_fitting)
    lines.extend('would fit: %s' % suggestion for suggestion in plan.suggestions)
    return lines


def infeasible_message(plan):
    """The failure text for an infeasible plan: what does not add up, and what would."""
    not_fitting = '; '.join(plan.not_fitting) or 'see plan.memory'
    parts = ['%s %s plan is infeasible: %s' % (plan.backend, plan.backend_version, not_fitting)]
    if plan.suggestions:
        parts.append('what would fit: %s' % '; '.join(plan.suggestions))
    return '. '.join(parts)


def model_needs_node_files(model):
    """Whether planning ``model`` reads files, and so must run on the node that has them.

    A path does: a ``.gguf`` file (any case), an absolute path, or one starting with
    ``.`` or ``~``. A catalog name or Hugging Face repo id (``org/name``) and an HF config
    dict need nothing from the node, so the plan can be computed on the controller.
    """
    if not isinstance(model, str):
        return False
    return (model.lower().endswith(GGUF_SUFFIX) or os.path.isabs(model)
            or model.startswith(('.', '~')))


def serving_plan_result(params):
    """The serving_plan task result for validated ``params``: ``changed``, ``plan`` and
    ``plan_report``; ``failed`` and ``msg`` (and ``field``) for invalid input or an
    infeasible plan under ``fail_on_infeasible``. The module and the action plugin both
    return this, so a plan reads the same wherever it was computed. Several traffic classes
    are planned by ``traffic_classes`` (strategy and profiles added to ``plan``)."""
    if params.get('traffic_classes') is not None:
        if params.get('measurement') is not None or params.get('traffic_source') not in (None, 'declared'):
            return dict(failed=True, field='measurement', msg='serving_plan: invalid measurement: plans one '
                        'traffic; with traffic_classes leave measurement and traffic_source out (a measurement\'s '
                        'per-hour figures print a traffic_classes proposal when planned without classes)')
        return traffic_classes.traffic_classes_result(params, build_plan)
    try:
        plan = build_plan(params)
    except PlanInputError as error:
        return dict(failed=True, msg='serving_plan: invalid %s' % error, field=error.field)
    except ImportError as error:
        # The GGUF reader needs the gguf package on the host that reads the file.
        return dict(failed=True, msg='serving_plan: %s' % error)
    result = dict(changed=False, plan=plan.to_dict(), plan_report=plan_report(plan))
    if not plan.feasible and params.get('fail_on_infeasible', True):
        result.update(failed=True, msg=infeasible_message(plan))
    return result
