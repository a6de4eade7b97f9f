#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)


DOCUMENTATION = r'''
---
module: gpustack_model
short_description: Create, update or delete a model deployment on a GPUStack server
version_added: 0.1.0
description:
  - Manages one model deployment through GPUStack's management API - C(/v2) on GPUStack 2.x,
    C(/v1) on 0.7.x - idempotently.
  - Only the fields set in the task are managed. They are compared with the server's record
    after normalisation (server-filled defaults do not count); nothing is sent when they match.
  - An update reads the record, overlays the managed fields and sends the whole record back
    (GPUStack's PUT replaces the record). A refused update leaves the old record as it was.
  - All options are validated before the first request that writes.
author:
  - kvpin.fleet contributors (!UNKNOWN)
attributes:
  check_mode:
    support: full
    description: Reads the server and reports what would change; writes nothing.
  diff_mode:
    support: full
    description: Before and after of the managed fields.
extends_documentation_fragment:
  - kvpin.fleet.gpustack
options:
  state:
    description: Whether the deployment exists.
    type: str
    choices: [present, absent]
    default: present
  name:
    description: Deployment name (unique on the server); the model is found by it.
    type: str
    required: true
  cluster_id:
    description: Cluster to deploy into (GPUStack 2.x only).
    type: int
  source:
    description:
      - Where the model comes from. Required to create a deployment.
      - Setting it manages all source fields - those of other sources are cleared.
    type: str
    choices: [huggingface, model_scope, local_path]
  huggingface_repo_id:
    description: Hugging Face repository, for example C(Qwen/Qwen3-8B). Required with O(source=huggingface).
    type: str
  huggingface_filename:
    description: File in the Hugging Face repository (a C(.gguf) file for GGUF models).
    type: str
  model_scope_model_id:
    description: ModelScope model id. Required with O(source=model_scope).
    type: str
  model_scope_file_path:
    description: File in the ModelScope repository.
    type: str
  local_path:
    description: Path of the model on the workers. Required with O(source=local_path).
    type: str
  backend:
    description:
      - Inference backend, spelled as GPUStack spells it - C(vLLM), C(SGLang), C(llama.cpp)
        (2.x), C(llama-box) or C(vllm) (0.7.x).
    type: str
  backend_version:
    description: Backend version, for example C(0.11.0) for vLLM.
    type: str
  backend_parameters:
    description:
      - Engine arguments, exactly and in order (for example the C(args) of a
        M(kvpin.fleet.serving_plan) result).
    type: list
    elements: str
  vram_claim_bytes:
    description:
      - VRAM one replica needs, in bytes, summed over its GPUs. Written to the deployment's env as
        C(GPUSTACK_MODEL_VRAM_CLAIM), which GPUStack's scheduler reads (as bytes) in place of its
        own estimate - on one GPU it must be at most C(total x gpu-memory-utilization), on several
        at most the sum.
      - From a M(kvpin.fleet.serving_plan) result use the filter
        C(plan | kvpin.fleet.kvpin_gpustack_vram_claim), not the plan's per-GPU C(vram_claim_bytes).
    type: int
  env:
    description:
      - Environment of the deployment. When O(env) or O(vram_claim_bytes) is set, the whole env
        is managed - keys not listed are removed.
    type: dict
  worker_selector:
    description: Worker labels (key, value) a worker must carry to run the deployment.
    type: dict
  gpu_selector:
    description:
      - Manual GPU selection.
      - When an update changes it, the model's instances running on GPUs outside the new
        selection are deleted so that GPUStack recreates them on the selected GPUs (RV(replaced_instances)).
    type: dict
    suboptions:
      gpu_ids:
        description: GPUs as C(<worker name>:<device>:<index>), for example C(lab-a6000x4:cuda:0).
        type: list
        elements: str
      gpus_per_replica:
        description: GPUs each replica uses.
        type: int
  replicas:
    description: Number of replicas.
    type: int
  categories:
    description: Model categories, for example C(llm) or C(embedding).
    type: list
    elements: str
  placement_strategy:
    description: How replicas are placed.
    type: str
    choices: [spread, binpack]
  restart_on_error:
    description: Let GPUStack restart instances that fail.
    type: bool
  distributed_inference_across_workers:
    description: Allow one replica to span several workers.
    type: bool
notes:
  - GPUStack books C(total x gpu-memory-utilization) per GPU for a vLLM LLM instance whatever
    the claim; the claim decides whether a GPU is feasible (GPUStack 2.3.0 vllm_resource_fit_selector.py).
'''

EXAMPLES = r'''
- name: Deploy the planned Llama-3.3-70B on the A6000 node
  kvpin.fleet.gpustack_model:
    server_url: https://gpustack.example
    api_key: "{{ gpustack_api_key }}"
    name: llama-3.3-70b
    cluster_id: 1
    source: huggingface
    huggingface_repo_id: meta-llama/Llama-3.3-70B-Instruct
    backend: vLLM
    backend_version: "0.11.0"
    backend_parameters: "{{ llama_plan.plan.args }}"
    vram_claim_bytes: "{{ llama_plan.plan | kvpin.fleet.kvpin_gpustack_vram_claim }}"
    worker_selector:
      worker-name: lab-a6000x4
    gpu_selector:
      gpu_ids: [lab-a6000x4:cuda:0, lab-a6000x4:cuda:1, lab-a6000x4:cuda:2, lab-a6000x4:cuda:3]
      gpus_per_replica: 4
  delegate_to: localhost

- name: Remove a deployment
  kvpin.fleet.gpustack_model:
    server_url: https://gpustack.example
    api_key: "{{ gpustack_api_key }}"
    name: old-model
    state: absent
'''

RETURN = r'''
action:
  description: What was done (or, in check mode, would be done).
  returned: always
  type: str
  choices: [none, create, update, delete]
changes:
  description: One line per changed managed field (one per changed element of a list).
  returned: always
  type: list
  elements: str
  sample: ["backend_parameters[1]: '--max-model-len=16384' -> '--max-model-len=8192'"]
model:
  description:
    - The deployment record as the server returned it after the change, or as read when nothing
      changed. In check mode, the record that would be sent. Empty when absent.
  returned: always
  type: dict
replaced_instances:
  description:
    - When the update changed the GPU selector, the names of the model's instances that ran on
      GPUs outside the new one and were deleted, so that GPUStack recreates them on the selected
      GPUs (GPUStack keeps an instance's GPUs for its lifetime). In check mode, those it would delete.
  returned: when the GPU selector changed
  type: list
  elements: str
api_version:
  description: API generation used (C(v1) or C(v2)).
  returned: always
  type: str
diff:
  description: Before and after of the managed fields.
  returned: when diff mode is on
  type: dict
'''

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.kvpin.fleet.plugins.module_utils.gpustack.model_apply import (
    gpustack_model_argument_spec, gpustack_model_result,
)


def main():
    module = AnsibleModule(argument_spec=gpustack_model_argument_spec(), supports_check_mode=True)
    # The key as sent joins the no_log values, so exit_json/fail_json mask it wherever it appears.
    result = gpustack_model_result(module.params, check_mode=module.check_mode, diff=module._diff,
                                   keys_to_mask=module.no_log_values)
    if result.pop('failed', False):
        module.fail_json(**result)
    module.exit_json(**result)


if __name__ == '__main__':
    main()
