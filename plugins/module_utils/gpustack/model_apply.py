# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""kvpin.fleet.gpustack_model's work, for its module and for its action plugin.

The module runs it where the task runs; the action plugin (plugins/action/gpustack_model.py)
runs the same function in the controller's own process when the task runs on the controller
(delegate_to: localhost, as site.yml does), which saves starting a Python process per
deployment. Both return what ``gpustack_model_result`` returns: the module's result, or a
failure (``failed``, ``msg`` and the fields that name what failed), the API key masked in it.
"""


from ansible_collections.kvpin.fleet.plugins.module_utils.gpustack.client import (
    ClientInputError, GpustackApiError, GpustackClient, gpustack_connection_argument_spec,
)
from ansible_collections.kvpin.fleet.plugins.module_utils.gpustack.records import (
    RecordInputError, ServerRecordError, desired_model_fields, misplaced_instances, model_create_body,
    model_update_body, plan_model_change,
)

RESOURCE = 'models'
INSTANCES = 'model-instances'


def gpustack_model_argument_spec():
    """The module's options: the GPUStack connection, then the deployment's fields."""
    spec = gpustack_connection_argument_spec()
    spec.update(
        state=dict(type='str', choices=['present', 'absent'], default='present'),
        name=dict(type='str', required=True),
        cluster_id=dict(type='int'),
        source=dict(type='str', choices=['huggingface', 'model_scope', 'local_path']),
        huggingface_repo_id=dict(type='str'),
        huggingface_filename=dict(type='str'),
        model_scope_model_id=dict(type='str'),
        model_scope_file_path=dict(type='str'),
        local_path=dict(type='str'),
        backend=dict(type='str'),
        backend_version=dict(type='str'),
        backend_parameters=dict(type='list', elements='str'),
        vram_claim_bytes=dict(type='int'),
        env=dict(type='dict'),
        worker_selector=dict(type='dict'),
        gpu_selector=dict(type='dict', options=dict(
            gpu_ids=dict(type='list', elements='str'),
            gpus_per_replica=dict(type='int'),
        )),
        replicas=dict(type='int'),
        categories=dict(type='list', elements='str'),
        placement_strategy=dict(type='str', choices=['spread', 'binpack']),
        restart_on_error=dict(type='bool'),
        distributed_inference_across_workers=dict(type='bool'),
    )
    return spec


def apply_model(params, client, check_mode=False, diff=False):
    """Create, update or delete the deployment ``params`` describes; the result dict."""
    desired = desired_model_fields(params, client.api_version)
    existing = client.find_by_name(RESOURCE, params['name'])
    if existing is not None:
        # List answers may be abridged; the update body must start from the full record.
        existing = client.get(RESOURCE, existing['id'])
    decision = plan_model_change(existing, desired, params['state'])
    action = decision['action']
    result = dict(changed=action != 'none', action=action, changes=decision['changes'],
                  api_version=client.api_version, model=existing or {})
    if diff:
        result['diff'] = dict(before=decision['before'], after=decision['after'])

    if action == 'create':
        body = model_create_body(desired)
        result['model'] = body if check_mode else client.create(RESOURCE, body)
    elif action == 'update':
        body = model_update_body(existing, desired)
        result['model'] = body if check_mode else client.replace(RESOURCE, existing['id'], body)
        if decision['before'].get('gpu_selector') != decision['after'].get('gpu_selector'):
            result['replaced_instances'] = replace_misplaced_instances(
                client, existing['id'], decision['after'].get('gpu_selector'), check_mode)
    elif action == 'delete':
        result['model'] = {}
        if not check_mode:
            client.delete(RESOURCE, existing['id'])
    return result


def replace_misplaced_instances(client, model_id, gpu_selector, check_mode=False):
    """Delete the model's instances placed on GPUs outside its new GPU selector, so that
    GPUStack recreates them where the selector says (it keeps an instance's GPUs otherwise).
    Returns their names; in check mode deletes nothing and names what it would delete."""
    instances = client.list_all(INSTANCES, {'model_id': model_id})
    misplaced = misplaced_instances(instances, model_id, gpu_selector)
    for instance in misplaced:
        if not check_mode:
            client.delete(INSTANCES, instance['id'])
    return [instance['name'] for instance in misplaced]


def _unknown_outcome(error):
    if error.status is None and error.method in ('POST', 'PUT', 'DELETE'):
        return ' (no answer came: the server may or may not have applied the %s; rerun to see)' % error.method
    return ''


def gpustack_model_result(params, check_mode=False, diff=False, keys_to_mask=None):
    """The module's result for validated ``params``, or a failure dict (``failed: true``,
    ``msg`` naming the deployment and what failed, and its fields). ``keys_to_mask`` (a set) gets
    the API key as it is sent, for the caller to mask in everything it prints."""
    name = params['name']
    try:
        client = GpustackClient.from_params(params)
        if keys_to_mask is not None:
            keys_to_mask.update(client.secret_values())
        return apply_model(params, client, check_mode=check_mode, diff=diff)
    except (RecordInputError, ClientInputError) as error:
        return dict(failed=True, msg='gpustack_model %s: invalid %s' % (name, error), field=error.field)
    except ServerRecordError as error:
        return dict(failed=True, msg='gpustack_model %s: the server answered a malformed record, nothing was written: %s'
                    % (name, error), field=error.field)
    except GpustackApiError as error:
        # One write per run: nothing is written unless the write itself answered (a write with no
        # answer - status None after it was sent - may have been applied; the message says so).
        return dict(failed=True, msg='gpustack_model %s: %s%s' % (name, error, _unknown_outcome(error)),
                    status=error.status, server_message=error.server_message, method=error.method,
                    path=error.path)
    except ValueError as error:
        return dict(failed=True, msg='gpustack_model %s: %s' % (name, error))
