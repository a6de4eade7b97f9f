# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""gpustack_model moves a deployment's instances when its GPU selector changes (the planner chose
other GPUs after a card swap): GPUStack keeps an instance's GPUs for its lifetime, so the module
deletes the instances placed outside the new selection and GPUStack recreates them by it. Run as
Ansible runs the module, against the GPUStack look-alike on 127.0.0.1 (gpustack_attack.py)."""

from attacker_http import json_body
from gpustack_attack import API_KEY, assert_no_secret, run_module

from ansible_collections.kvpin.fleet.plugins.module_utils.gpustack.records import (
    RecordInputError, misplaced_instances, selected_gpus)

import pytest

MODEL = dict(name='llama-3.1-8b', source='local_path', local_path='/models/llama-3.1-8b', backend='vLLM')


def selector(*indexes, worker='lab-4090x2'):
    return {'gpu_ids': ['%s:cuda:%d' % (worker, i) for i in indexes], 'gpus_per_replica': len(indexes)}


def args(gpustack, gpus, **extra):
    return dict(MODEL, server_url=gpustack.url, api_key=API_KEY, api_version='v2', timeout=5,
                gpu_selector=selector(*gpus), **extra)


def instance(instance_id, model_id, gpus, worker='lab-4090x2', name=None):
    return {'id': instance_id, 'name': name or 'llama-3.1-8b-%d' % instance_id, 'model_id': model_id,
            'worker_name': worker, 'gpu_indexes': list(gpus), 'state': 'running'}


def serve_instances(gpustack, items):
    gpustack.server.route('GET', '/v2/model-instances', json_body(200, {
        'items': items, 'pagination': {'page': 1, 'perPage': 100, 'total': len(items), 'totalPage': 1}}))
    for item in items:
        gpustack.server.route('DELETE', '/v2/model-instances/%d' % item['id'], json_body(200, None))


def deployed_on(fake_gpustack, gpus):
    gpustack = fake_gpustack()
    result, _output = run_module('gpustack_model', args(gpustack, gpus))
    assert result['action'] == 'create', result
    return gpustack, result['model']['id']


def test_a_changed_selector_replaces_the_instances_outside_it(fake_gpustack):
    gpustack, model_id = deployed_on(fake_gpustack, [0])
    serve_instances(gpustack, [instance(5, model_id, [0]), instance(6, model_id + 1, [0], name='other-6')])
    result, output = run_module('gpustack_model', args(gpustack, [1]))
    assert result['action'] == 'update' and result['replaced_instances'] == ['llama-3.1-8b-5'], result
    assert gpustack.models[model_id]['gpu_selector'] == selector(1)
    # The PUT first, then the one misplaced instance of this model (not the other model's).
    methods = [(r['method'], r['path']) for r in gpustack.server.requests if r['method'] in ('PUT', 'DELETE')]
    assert methods == [('PUT', '/v2/models/%d' % model_id), ('DELETE', '/v2/model-instances/5')]
    assert 'model_id=%d' % model_id in gpustack.server.seen('GET', '/v2/model-instances')[0]['query']
    assert_no_secret(output)


def test_an_unchanged_selector_touches_no_instance(fake_gpustack):
    gpustack, model_id = deployed_on(fake_gpustack, [1])
    serve_instances(gpustack, [instance(5, model_id, [0])])
    result, _output = run_module('gpustack_model', args(gpustack, [1]))
    assert result['action'] == 'none' and 'replaced_instances' not in result, result
    assert gpustack.server.seen('GET', '/v2/model-instances') == [] and gpustack.server.seen('DELETE') == []


def test_check_mode_names_the_instances_and_deletes_none(fake_gpustack):
    gpustack, model_id = deployed_on(fake_gpustack, [0])
    serve_instances(gpustack, [instance(5, model_id, [0])])
    result, _output = run_module('gpustack_model', args(gpustack, [1]), check=True)
    assert result['changed'] and result['replaced_instances'] == ['llama-3.1-8b-5'], result
    assert gpustack.server.seen('PUT') == [] and gpustack.server.seen('DELETE') == []


def test_an_instance_already_inside_the_new_selection_stays(fake_gpustack):
    gpustack, model_id = deployed_on(fake_gpustack, [0, 1])
    serve_instances(gpustack, [instance(5, model_id, [1])])
    result, _output = run_module('gpustack_model', args(gpustack, [1]))
    assert result['action'] == 'update' and result['replaced_instances'] == [], result
    assert gpustack.server.seen('DELETE') == []


@pytest.mark.parametrize('item, moved', [
    (instance(1, 7, [0]), True),                              # on a GPU outside the selection
    (instance(1, 7, [1, 0]), True),                           # partly outside
    (instance(1, 7, [1]), False),                             # inside
    (instance(1, 7, [1], worker='lab-mixed'), True),          # another worker's GPU 1
    (instance(1, 8, [0]), False),                             # another model
    (dict(instance(1, 7, []), worker_name=None), False),      # not placed yet
    (dict(instance(1, 7, [0]), gpu_indexes=None), False),     # no GPUs reported
    (dict(instance(1, 7, [True])), True),                     # a boolean is no GPU index
    ('not a record', False),
])
def test_misplaced_instances(item, moved):
    assert misplaced_instances([item], 7, selector(1)) == ([item] if moved else [])


def test_no_gpu_ids_means_nothing_is_misplaced():
    assert selected_gpus(None) is None and selected_gpus({'gpus_per_replica': 2}) is None
    assert misplaced_instances([instance(1, 7, [0])], 7, {'gpus_per_replica': 1}) == []
    assert selected_gpus(selector(0, 3)) == {('lab-4090x2', 0), ('lab-4090x2', 3)}
    with pytest.raises(RecordInputError):
        selected_gpus({'gpu_ids': ['w:cuda:x']})
