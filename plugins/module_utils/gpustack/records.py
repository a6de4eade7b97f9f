# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""GPUStack records as the modules manage them: pure functions, no I/O.

A model deployment is managed field by field: only the fields the user set are compared and
written; everything else on the server (its defaults, fields this collection does not know)
is left as it is. GPUStack's PUT replaces the whole record (docs/architecture.md, GPUStack generations), so an
update is: read the record, overlay the managed fields, send it all back.

Worker labels are managed per key, with the labels the worker sets itself kept unless the
user names them (see worker_labels_wanted).
"""

from __future__ import annotations

# SERVER_OWNED_MODEL_FIELDS (what a full-record PUT leaves out) lives in api.py with the other
# API facts the watchdog shares; model_update_body uses it, and it stays importable from here.
from ansible_collections.kvpin.fleet.plugins.module_utils.gpustack.api import SERVER_OWNED_MODEL_FIELDS

# Names the scheduler reads from a model's env (gpustack==2.3.0, gpustack/
# policies/utils.py get_vram_claim_from_model_env: int(value), bytes per GPU).
VRAM_CLAIM_ENV = 'GPUSTACK_MODEL_VRAM_CLAIM'

SOURCE_FIELDS = {
    'huggingface': ('huggingface_repo_id', 'huggingface_filename'),
    'model_scope': ('model_scope_model_id', 'model_scope_file_path'),
    'local_path': ('local_path',),
}
# The option that must be set for each source (the server refuses the record without it).
SOURCE_REQUIRED = {
    'huggingface': 'huggingface_repo_id',
    'model_scope': 'model_scope_model_id',
    'local_path': 'local_path',
}
ALL_SOURCE_FIELDS = tuple(f for fields in SOURCE_FIELDS.values() for f in fields)

# Fields the module manages, in the order diffs show them. A field the user leaves unset
# (None) is not managed: the server's value stays.
MANAGED_FIELDS = (
    'name', 'source') + ALL_SOURCE_FIELDS + (
    'cluster_id', 'backend', 'backend_version', 'backend_parameters', 'env',
    'worker_selector', 'gpu_selector', 'replicas', 'categories', 'placement_strategy',
    'restart_on_error', 'distributed_inference_across_workers',
)
# Fields that exist only in the 2.x API (0.7.x has no clusters).
V2_ONLY_FIELDS = ('cluster_id',)

# Labels every 2.x worker sets on itself at registration (worker_manager._ensure_builtin_labels).
# "replace" mode keeps them unless named, so that replacing labels never unbinds a
# worker-name selector.
BUILTIN_WORKER_LABELS = ('os', 'arch', 'worker-name')
BUILTIN_WORKER_LABEL_PREFIX = 'gpustack.'


# GPUStack 2.3 assumes vLLM's default --gpu-memory-utilization when backend_parameters do not
# set it (policies/candidate_selectors/vllm_resource_fit_selector.py, _set_gpu_memory_utilization).
GPUSTACK_ASSUMED_GPU_MEMORY_UTILIZATION = 0.9


class RecordInputError(ValueError):
    """Options that cannot make a valid record. ``field`` names the option at fault."""

    def __init__(self, field_name, message):
        super().__init__('%s: %s' % (field_name, message))
        self.field = field_name


class ServerRecordError(ValueError):
    """A record the server answered with a field of the wrong type. ``field`` names it (for
    example ``model.env`` or ``workers[lab-a].labels``); nothing is written after it."""

    def __init__(self, field_name, message):
        super().__init__('%s: %s' % (field_name, message))
        self.field = field_name


# The JSON type each managed field has on the server, for checking a record read back.
_SERVER_FIELD_TYPES = {
    'env': (dict, 'an object'), 'worker_selector': (dict, 'an object'), 'gpu_selector': (dict, 'an object'),
    'categories': (list, 'a list'), 'backend_parameters': (list, 'a list'),
}


# Characters an API key does not hold (GPUStack's are gpustack_<hex>_<hex>): a sample is cut
# after one of them, never inside a run of key characters.
_SAMPLE_CUT_AFTER = frozenset(' \'",:;[]{}()=')


def _short(value):
    """repr(value) for a message, at most 60 characters. A server may echo the API key into a
    record; the module masks the key wherever it is whole, so a cut must not leave a prefix of
    it: the sample ends before the run of characters the limit falls in."""
    text = repr(value)
    if len(text) <= 60:
        return text
    cut = 57
    while cut > 0 and text[cut - 1] not in _SAMPLE_CUT_AFTER:
        cut -= 1
    return text[:cut] + '...'


def check_server_model(record, fields):
    """``record`` (a model read from the server) if each of ``fields`` it holds has the type the
    comparison needs; else ServerRecordError naming the field."""
    for field_name in fields:
        value = record.get(field_name)
        expected = _SERVER_FIELD_TYPES.get(field_name)
        if value is None or expected is None:
            continue
        if not isinstance(value, expected[0]):
            raise ServerRecordError('model.%s' % field_name, 'the server answered %s, expected %s'
                                    % (_short(value), expected[1]))
        if field_name in ('env', 'worker_selector') and not all(
                isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in value.values()):
            raise ServerRecordError('model.%s' % field_name, 'values must be strings, the server answered %s'
                                    % _short(value))
        if field_name in ('categories', 'backend_parameters') and not all(isinstance(v, str) for v in value):
            raise ServerRecordError('model.%s' % field_name, 'items must be strings, the server answered %s'
                                    % _short(value))
    return record


def server_worker_labels(worker):
    """A worker's labels as read from the server (str -> str), or ServerRecordError naming the worker."""
    labels = worker.get('labels')
    if labels is None:
        return {}
    where = 'workers[%s].labels' % worker.get('name')
    if not isinstance(labels, dict):
        raise ServerRecordError(where, 'the server answered %s, expected an object' % _short(labels))
    bad = sorted(str(k) for k, v in labels.items() if not isinstance(v, str))
    if bad:
        raise ServerRecordError(where, 'values of %s are not strings: %s' % (', '.join(bad), _short(labels)))
    return dict(labels)


# -- model records ------------------------------------------------------------------------

def _string_map(field_name, value):
    if value is None:
        return None
    if not isinstance(value, dict):
        raise RecordInputError(field_name, 'must be a dict of strings, got %s' % type(value).__name__)
    result = {}
    for key, item in value.items():
        if item is None or isinstance(item, (dict, list)):
            raise RecordInputError(field_name, '%r must be a string, got %r' % (key, item))
        # Selectors and env are str -> str on the server; 48 and "48" mean the same label.
        result[str(key)] = str(item).lower() if isinstance(item, bool) else str(item)
    return result


def _gpu_selector(value):
    if value is None:
        return None
    if not isinstance(value, dict):
        raise RecordInputError('gpu_selector', 'must be a dict with gpu_ids and/or gpus_per_replica')
    unknown = sorted(set(value) - {'gpu_ids', 'gpus_per_replica'})
    if unknown:
        raise RecordInputError('gpu_selector', 'unknown keys %s (known: gpu_ids, gpus_per_replica)' % unknown)
    selector = {}
    gpu_ids = value.get('gpu_ids')
    if gpu_ids is not None:
        if not isinstance(gpu_ids, list) or not all(isinstance(i, str) for i in gpu_ids):
            raise RecordInputError('gpu_selector', 'gpu_ids must be a list of "<worker>:<device>:<index>" strings')
        malformed = [i for i in gpu_ids if len(i.split(':')) != 3]
        if malformed:
            raise RecordInputError('gpu_selector', 'gpu_ids %s are not "<worker>:<device>:<index>" '
                                   '(example "lab-a6000x4:cuda:0")' % malformed)
        selector['gpu_ids'] = list(gpu_ids)
    per_replica = value.get('gpus_per_replica')
    if per_replica is not None:
        try:
            per_replica = int(per_replica)
        except (TypeError, ValueError):
            raise RecordInputError('gpu_selector', 'gpus_per_replica must be an integer, got %r' % (per_replica,))
        selector['gpus_per_replica'] = per_replica
    return selector


def desired_model_fields(params, api_version='v2'):
    """The managed fields of the model record the options describe.

    ``params`` are the module options (unset ones None). Raises RecordInputError before
    anything is sent when the options cannot make a valid record.
    """
    desired = {'name': params['name']}
    source = params.get('source')
    if source is not None:
        if source not in SOURCE_FIELDS:
            raise RecordInputError('source', 'must be one of %s, got %r' % (sorted(SOURCE_FIELDS), source))
        required = SOURCE_REQUIRED[source]
        if not params.get(required):
            raise RecordInputError(required, 'required when source is %s' % source)
        desired['source'] = source
        # Switching source clears the previous source's fields, so none is left dangling.
        for field_name in ALL_SOURCE_FIELDS:
            desired[field_name] = params.get(field_name) if field_name in SOURCE_FIELDS[source] else None
    else:
        given = [f for f in ALL_SOURCE_FIELDS if params.get(f) is not None]
        if given:
            raise RecordInputError('source', 'required with %s' % ', '.join(given))

    for field_name in ('backend', 'backend_version', 'placement_strategy', 'restart_on_error',
                       'distributed_inference_across_workers', 'replicas', 'cluster_id'):
        if params.get(field_name) is not None:
            desired[field_name] = params[field_name]
    if params.get('backend_parameters') is not None:
        # Kept exactly and in order: they are an argv, and the plan's order is the contract.
        desired['backend_parameters'] = [str(arg) for arg in params['backend_parameters']]
    if params.get('categories') is not None:
        desired['categories'] = list(params['categories'])

    env = _string_map('env', params.get('env'))
    claim = params.get('vram_claim_bytes')
    if claim is not None:
        if isinstance(claim, bool) or not isinstance(claim, int) or claim <= 0:
            raise RecordInputError('vram_claim_bytes', 'must be a positive number of bytes, got %r' % (claim,))
        env = dict(env or {})
        if VRAM_CLAIM_ENV in env and env[VRAM_CLAIM_ENV] != str(claim):
            raise RecordInputError('env', '%s=%s contradicts vram_claim_bytes=%d; set one of them'
                                   % (VRAM_CLAIM_ENV, env[VRAM_CLAIM_ENV], claim))
        env[VRAM_CLAIM_ENV] = str(claim)
    if env is not None:
        desired['env'] = env
    selector = _string_map('worker_selector', params.get('worker_selector'))
    if selector is not None:
        desired['worker_selector'] = selector
    gpu_selector = _gpu_selector(params.get('gpu_selector'))
    if gpu_selector is not None:
        desired['gpu_selector'] = gpu_selector

    if api_version == 'v1':
        dropped = [f for f in V2_ONLY_FIELDS if f in desired]
        if dropped:
            raise RecordInputError(dropped[0], 'not supported by the GPUStack 0.7.x API (v1)')
    return desired


def _flag_value(args, flag):
    """The value of ``--flag=value`` or ``--flag value`` in an argv list, else None."""
    for index, arg in enumerate(args):
        if arg.startswith(flag + '='):
            return arg.split('=', 1)[1]
        if arg == flag and index + 1 < len(args):
            return args[index + 1]
    return None


def _booked_total(row, position):
    """The GPU total GPUStack books from: NVML's (terms.nvml_total), which a plan from before
    the CUDA-visible total existed carried as its ``total``."""
    terms = row.get('terms') if isinstance(row.get('terms'), dict) else {}
    total = terms.get('nvml_total', row.get('total'))
    if isinstance(total, bool) or not isinstance(total, int) or total <= 0:
        raise RecordInputError('plan.memory[%d].terms.nvml_total' % position,
                               'must be a positive whole number of bytes, got %r' % (total,))
    return total


def gpu_vram_bookings(plan):
    """What GPUStack books for one replica of a serving_plan result on each of its GPUs, in
    bytes, in the order of the plan's ``memory`` rows (the per-GPU shares of
    :func:`replica_vram_claim`, which is their sum; the node's GPU ledger charges them).

    vLLM: int(total x gmu) per GPU, gmu read from the plan's args the way GPUStack 2.3 reads it
    (0.9 without the flag). ``total`` is the NVML total GPUStack's worker reports for the GPU
    (the row's ``terms.nvml_total``), not the smaller CUDA-visible total vLLM budgets from (the
    row's ``total``): GPUStack books from what it sees. Other backends: the plan's per-GPU
    ``vram_claim_bytes`` on each GPU.
    """
    memory = plan.get('memory') or []
    if not memory:
        raise RecordInputError('plan', 'has no per-GPU memory rows')
    if plan.get('backend') == 'vllm':
        value = _flag_value(plan.get('args') or [], '--gpu-memory-utilization')
        gmu = float(value) if value is not None else GPUSTACK_ASSUMED_GPU_MEMORY_UTILIZATION
        return [int(_booked_total(row, position) * gmu) for position, row in enumerate(memory)]
    per_gpu = plan.get('vram_claim_bytes')
    if not per_gpu:
        raise RecordInputError('plan', 'has no vram_claim_bytes')
    return [int(per_gpu)] * len(memory)


def replica_vram_claim(plan):
    """GPUSTACK_MODEL_VRAM_CLAIM, in bytes, for one replica of a serving_plan result.

    How GPUStack 2.3 uses the claim (vllm_resource_fit_selector.py, verified against a live
    2.3.0 server in tests/integration/test_gpustack_api.py): it is what one replica needs, in
    bytes; on one GPU it must be <= total x gmu, on several <= the sum of total x gmu; then every
    GPU picked is booked int(total x gmu), whatever the claim.

    vLLM fills its budget (total x gmu) with KV cache, so a replica holds exactly that budget on
    each of its GPUs: the claim is the sum of int(total x gmu), the figure GPUStack books. What
    vLLM holds outside the budget is not GPUStack's to book (it goes into system_reserved,
    plan ``system_reserved_bytes``). gmu is read from the plan's args the way GPUStack reads it.

    Other backends: the plan's per-GPU claim times its GPUs. (GPUStack 2.3 sizes GGUF models
    with gguf-parser and does not read this env for them.)
    """
    return sum(gpu_vram_bookings(plan))


def _normalise_value(field_name, value):
    """One field in the form used for comparison (server-filled empties count as unset)."""
    if field_name in ('env', 'worker_selector'):
        return dict(sorted((value or {}).items())) or None
    if field_name == 'categories':
        return sorted(value or []) or None
    if field_name == 'backend_parameters':
        return list(value or []) or None
    if field_name == 'gpu_selector':
        selector = {k: v for k, v in (value or {}).items()
                    if k in ('gpu_ids', 'gpus_per_replica') and v not in (None, [])}
        return selector or None
    if isinstance(value, str) and value == '' and field_name in ALL_SOURCE_FIELDS:
        return None
    return value


def normalise_model(record, fields):
    """``record`` reduced to ``fields``, each normalised for comparison."""
    record = record or {}
    return dict((f, _normalise_value(f, record.get(f))) for f in fields)


def model_update_body(existing, desired):
    """The full-record PUT body: the existing record, minus server-owned status, with the
    managed fields overlaid."""
    body = dict((k, v) for k, v in existing.items() if k not in SERVER_OWNED_MODEL_FIELDS)
    body.update(desired)
    return body


def model_create_body(desired):
    return dict(desired)


def field_changes(before, after, fields):
    """Human-readable lines for what differs between two normalised records.

    Lists are compared element by element, so one changed backend parameter is one line.
    """
    lines = []
    for field_name in fields:
        old, new = before.get(field_name), after.get(field_name)
        if old == new:
            continue
        if isinstance(old, list) and isinstance(new, list) and field_name == 'backend_parameters':
            for index in range(max(len(old), len(new))):
                left = old[index] if index < len(old) else None
                right = new[index] if index < len(new) else None
                if left != right:
                    lines.append('%s[%d]: %s -> %s' % (field_name, index, _show(left), _show(right)))
        elif isinstance(old, dict) and isinstance(new, dict):
            for key in sorted(set(old) | set(new)):
                if old.get(key) != new.get(key):
                    lines.append('%s.%s: %s -> %s' % (field_name, key, _show(old.get(key)), _show(new.get(key))))
        else:
            lines.append('%s: %s -> %s' % (field_name, _show(old), _show(new)))
    return lines


def _show(value):
    return '(unset)' if value is None else repr(value)


def plan_model_change(existing, desired, state):
    """Decide what to do with one model.

    Returns a dict: ``action`` (``none``, ``create``, ``update``, ``delete``), ``before`` and
    ``after`` (managed fields, normalised; {} for a record that does not exist), ``changes``
    (lines from field_changes).
    """
    fields = [f for f in MANAGED_FIELDS if f in desired]
    before = normalise_model(check_server_model(existing, fields), fields) if existing is not None else {}
    if state == 'absent':
        if existing is None:
            return dict(action='none', before={}, after={}, changes=[])
        return dict(action='delete', before=before, after={}, changes=['model %r deleted' % desired['name']])
    after = normalise_model(desired, fields)
    if existing is None:
        if 'source' not in desired:
            raise RecordInputError('source', 'required to create model %r (it does not exist yet)' % desired['name'])
        return dict(action='create', before={}, after=after, changes=['model %r created' % desired['name']])
    if before == after:
        return dict(action='none', before=before, after=after, changes=[])
    return dict(action='update', before=before, after=after, changes=field_changes(before, after, fields))


def selected_gpus(gpu_selector):
    """{(worker name, GPU index)} named by a normalised gpu_selector's ``gpu_ids``
    (``<worker>:<device>:<index>``), or None when it names none (GPUStack places freely)."""
    gpu_ids = (gpu_selector or {}).get('gpu_ids')
    if not gpu_ids:
        return None
    selected = set()
    for gpu_id in gpu_ids:
        worker, _device, index = gpu_id.split(':')
        if not index.isdigit():
            raise RecordInputError('gpu_selector', 'gpu_ids %r: the index %r is not a whole number' % (gpu_id, index))
        selected.add((worker, int(index)))
    return selected


def misplaced_instances(instances, model_id, gpu_selector):
    """The instances of model ``model_id`` that run on GPUs outside ``gpu_selector`` (placed
    before the selector changed). GPUStack keeps an instance's GPUs for its lifetime (0.7.1's
    ModelController only syncs the replica count on a model update; a restart keeps the GPUs),
    so such an instance serves from GPUs other than the plan's until it is deleted and GPUStack
    schedules its replacement by the new selector. An instance not placed yet (no worker or no
    GPUs) is left to the scheduler."""
    selected = selected_gpus(gpu_selector)
    if selected is None:
        return []
    misplaced = []
    for instance in instances:
        if not isinstance(instance, dict) or instance.get('model_id') != model_id:
            continue
        worker, gpus = instance.get('worker_name'), instance.get('gpu_indexes')
        if not isinstance(worker, str) or not worker or not isinstance(gpus, list) or not gpus:
            continue
        if not all(isinstance(g, int) and not isinstance(g, bool) and (worker, g) in selected for g in gpus):
            misplaced.append(instance)
    return misplaced


# -- worker labels ------------------------------------------------------------------------

def is_builtin_worker_label(key):
    return key in BUILTIN_WORKER_LABELS or key.startswith(BUILTIN_WORKER_LABEL_PREFIX)


def label_values(labels):
    """The labels to set, as the server stores them (str -> str); None values (removals) left out."""
    return _string_map('labels', dict((k, v) for k, v in labels.items() if v is not None)) or {}


def worker_labels_wanted(current, labels, mode):
    """The full label set a worker should end with.

    ``labels`` maps key -> value; a value of None removes the key. ``mode`` ``merge`` keeps
    other keys; ``replace`` removes every other key except the labels the worker sets on itself
    (os, arch, worker-name, gpustack.*), which it would only put back.
    """
    if mode not in ('merge', 'replace'):
        raise RecordInputError('mode', 'must be merge or replace, got %r' % (mode,))
    wanted_values = label_values(labels)
    removals = set(k for k, v in labels.items() if v is None)
    current = dict(current or {})
    if mode == 'merge':
        result = dict(current)
    else:
        result = dict((k, v) for k, v in current.items() if is_builtin_worker_label(k))
    result.update(wanted_values)
    for key in removals:
        result.pop(key, None)
    return result


def worker_labels_change(current, wanted):
    """``added``/``changed``/``removed`` keys between two label dicts; ``needs_removal`` when
    a plain merge (POST /v2/workers/labels, which only adds or overwrites) cannot get there."""
    current = current or {}
    added = sorted(k for k in wanted if k not in current)
    changed = sorted(k for k in wanted if k in current and current[k] != wanted[k])
    removed = sorted(k for k in current if k not in wanted)
    return dict(added=added, changed=changed, removed=removed, needs_removal=bool(removed))
