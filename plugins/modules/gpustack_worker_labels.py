#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)


DOCUMENTATION = r'''
---
module: gpustack_worker_labels
short_description: Set labels on registered GPUStack workers so deployment selectors match them
version_added: 0.1.0
description:
  - Sets labels (for example C(gpu-class), C(vram-per-gpu-gib), C(node-role)) on workers found by
    name, through GPUStack's management API. GPUStack has no worker-side setting for custom
    labels; they exist only on the server.
  - Reads each worker's labels first and sends only when they differ.
  - On 2.x, labels that are only added or overwritten go in one C(POST /v2/workers/labels)
    (the server merges them). A worker that loses a label gets a C(PUT /v2/workers/{id}) with its
    name, full label set and maintenance state as read.
  - On 0.7.x (C(/v1)) the worker record is read and sent back whole with the new labels.
  - When a write fails after others succeeded, the task fails with C(changed=true) and lists the
    workers whose labels were written (C(written)) and those that were not (C(not_written)).
author:
  - kvpin.fleet contributors (!UNKNOWN)
attributes:
  check_mode:
    support: full
    description: Reads the workers and reports what would change; writes nothing.
  diff_mode:
    support: full
    description: Labels before and after, per worker.
extends_documentation_fragment:
  - kvpin.fleet.gpustack
options:
  workers:
    description: Names of the workers to label (as registered, usually the host name).
    type: list
    elements: str
    required: true
  labels:
    description:
      - Labels to set, key to value. Values are sent as strings (C(48) becomes C("48")).
      - A value of C(null) removes the key.
    type: dict
    required: true
  mode:
    description:
      - C(merge) keeps labels not named in O(labels).
      - C(replace) removes every label not named in O(labels), except those the worker sets on
        itself (C(os), C(arch), C(worker-name), C(gpustack.*)), which it would only add back.
    type: str
    choices: [merge, replace]
    default: merge
  allow_missing:
    description:
      - Skip workers that are not registered (they are listed in RV(missing)) instead of failing.
    type: bool
    default: false
'''

EXAMPLES = r'''
- name: Label the A6000 node's worker
  kvpin.fleet.gpustack_worker_labels:
    server_url: https://gpustack.example
    api_key: "{{ gpustack_api_key }}"
    workers: [lab-a6000x4]
    labels:
      gpu-class: a6000
      vram-per-gpu-gib: 48
      node-role: inference
  delegate_to: localhost

- name: Drop a label
  kvpin.fleet.gpustack_worker_labels:
    server_url: https://gpustack.example
    api_key: "{{ gpustack_api_key }}"
    workers: [lab-a6000x4]
    labels:
      node-role: null
'''

RETURN = r'''
workers:
  description: Per worker found - name, id, labels before and after, and the keys added, changed and removed.
  returned: always
  type: list
  elements: dict
missing:
  description: Names in O(workers) that are not registered (only with O(allow_missing=true)).
  returned: always
  type: list
  elements: str
api_version:
  description: API generation used (C(v1) or C(v2)).
  returned: always
  type: str
'''

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.kvpin.fleet.plugins.module_utils.gpustack.client import (
    ClientInputError, GpustackApiError, GpustackClient, gpustack_connection_argument_spec,
)
from ansible_collections.kvpin.fleet.plugins.module_utils.gpustack.records import (
    RecordInputError, ServerRecordError, label_values, server_worker_labels, worker_labels_change,
    worker_labels_wanted,
)

RESOURCE = 'workers'
# Server-owned fields of a worker record, left out when a 0.7.x worker is sent back whole.
SERVER_OWNED_WORKER_FIELDS = ('id', 'created_at', 'updated_at', 'deleted_at')


def argument_spec():
    spec = gpustack_connection_argument_spec()
    spec.update(
        workers=dict(type='list', elements='str', required=True),
        labels=dict(type='dict', required=True),
        mode=dict(type='str', choices=['merge', 'replace'], default='merge'),
        allow_missing=dict(type='bool', default=False),
    )
    return spec


def run(module, client):
    params = module.params
    by_name = dict((worker['name'], worker) for worker in client.list_all(RESOURCE))
    missing = [name for name in params['workers'] if name not in by_name]
    if missing and not params['allow_missing']:
        raise RecordInputError('workers', 'not registered on %s: %s (registered: %s)' % (
            client.server_url, ', '.join(missing), ', '.join(sorted(by_name)) or 'none'))

    plans = []
    for name in params['workers']:
        if name in missing:
            continue
        worker = by_name[name]
        current = server_worker_labels(worker)
        wanted = worker_labels_wanted(current, params['labels'], params['mode'])
        change = worker_labels_change(current, wanted)
        plans.append(dict(worker=worker, current=current, wanted=wanted, change=change))

    to_change = [p for p in plans if p['current'] != p['wanted']]
    if to_change and not module.check_mode:
        written = []
        try:
            apply_labels(client, to_change, params['labels'], written)
        except GpustackApiError as error:
            raise LabelWriteError(error, written, [p for p in to_change if p['worker']['name'] not in written])

    result = dict(
        changed=bool(to_change), missing=missing, api_version=client.api_version,
        workers=[dict(name=p['worker']['name'], id=p['worker']['id'], before=p['current'], after=p['wanted'],
                      added=p['change']['added'], changed=p['change']['changed'],
                      removed=p['change']['removed']) for p in plans],
    )
    if module._diff:
        result['diff'] = dict(before=dict((p['worker']['name'], p['current']) for p in plans),
                              after=dict((p['worker']['name'], p['wanted']) for p in plans))
    return result


class LabelWriteError(Exception):
    """A label write failed after ``written`` (worker names) were written; ``pending`` are the
    plans not written (the first of them failed)."""

    def __init__(self, error, written, pending):
        super().__init__(str(error))
        self.error = error
        self.written = written
        self.pending = pending


def apply_labels(client, to_change, requested, written):
    """Write the labels; append each worker's name to ``written`` as soon as its write answered."""
    if client.api_version == 'v1':
        for plan in to_change:
            body = dict((k, v) for k, v in plan['worker'].items() if k not in SERVER_OWNED_WORKER_FIELDS)
            body['labels'] = plan['wanted']
            client.replace(RESOURCE, plan['worker']['id'], body)
            written.append(plan['worker']['name'])
        return
    # 2.x: the merge endpoint is one transaction for all workers, but it cannot remove a key.
    merge_ids = [p['worker']['id'] for p in to_change if not p['change']['needs_removal']]
    if merge_ids:
        client.request('POST', client.path(RESOURCE, 'labels'),
                       dict(worker_ids=merge_ids, labels=label_values(requested)))
        written.extend(p['worker']['name'] for p in to_change if not p['change']['needs_removal'])
    for plan in to_change:
        if plan['change']['needs_removal']:
            worker = plan['worker']
            # WorkerUpdate writes every field it is given; maintenance must go back as read.
            client.replace(RESOURCE, worker['id'], dict(name=worker['name'], labels=plan['wanted'],
                                                        maintenance=worker.get('maintenance')))
            written.append(worker['name'])


def partial_write_failure(failure):
    """fail_json arguments for a write that failed after others succeeded: ``changed`` is true
    when anything was written, and the message says what was and what was not."""
    error = failure.error
    pending = [p['worker']['name'] for p in failure.pending]
    unknown = error.status is None
    parts = ['gpustack_worker_labels: %s.' % error]
    parts.append('Written before the failure: %s.' % (', '.join(failure.written) if failure.written else 'nothing'))
    parts.append('Not written: %s%s.' % (', '.join(pending),
                                         ' (no answer came for %s: it may have been applied)' % pending[0]
                                         if unknown and pending else ''))
    return dict(msg=' '.join(parts), changed=bool(failure.written), written=failure.written, not_written=pending,
                status=error.status, server_message=error.server_message, method=error.method, path=error.path)


def main():
    module = AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True)
    params = module.params
    try:
        client = GpustackClient.from_module(module)
        result = run(module, client)
    except (RecordInputError, ClientInputError) as error:
        module.fail_json(msg='gpustack_worker_labels: invalid %s' % error, field=error.field)
    except ServerRecordError as error:
        module.fail_json(msg='gpustack_worker_labels: the server answered a malformed worker, nothing was written: %s'
                         % error, field=error.field)
    except LabelWriteError as failure:
        module.fail_json(**partial_write_failure(failure))
    except GpustackApiError as error:
        module.fail_json(msg='gpustack_worker_labels: %s' % error, status=error.status,
                         server_message=error.server_message, method=error.method, path=error.path)
    except ValueError as error:
        module.fail_json(msg='gpustack_worker_labels: %s' % error)
    module.exit_json(**result)


if __name__ == '__main__':
    main()
