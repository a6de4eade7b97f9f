# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Record building, comparison and diffs for gpustack_model / gpustack_worker_labels."""

import pytest

from ansible_collections.kvpin.fleet.plugins.module_utils.gpustack.client import error_message_from_body
from ansible_collections.kvpin.fleet.plugins.module_utils.gpustack.records import (
    MANAGED_FIELDS, RecordInputError, desired_model_fields, field_changes, gpu_vram_bookings, model_update_body,
    normalise_model, plan_model_change, replica_vram_claim, worker_labels_change, worker_labels_wanted,
)

OPTIONS = dict((f, None) for f in MANAGED_FIELDS)
OPTIONS.update(vram_claim_bytes=None, model_scope_file_path=None)


def options(**given):
    params = dict(OPTIONS)
    params.update(given)
    return params


# A record as GPUStack 2.3.0 answers GET /v2/models/{id} (from the live test server).
SERVER_RECORD = {
    'source': 'huggingface', 'huggingface_repo_id': 'Qwen/Qwen3-8B', 'huggingface_filename': None,
    'model_scope_model_id': None, 'model_scope_file_path': None, 'local_path': None,
    'name': 'qwen3-8b', 'description': None, 'meta': {}, 'replicas': 1, 'ready_replicas': 0,
    'categories': [], 'placement_strategy': 'spread', 'cpu_offloading': None,
    'distributed_inference_across_workers': True, 'worker_selector': {}, 'gpu_selector': None,
    'gpu_type_selector': None, 'backend': 'vLLM', 'backend_version': None,
    'backend_parameters': ['--max-model-len=16384', '--max-num-seqs=32'], 'image_name': None,
    'run_command': None, 'native_anthropic_api': False, 'env': {'GPUSTACK_MODEL_VRAM_CLAIM': '123'},
    'restart_on_error': True, 'distributable': False, 'revision_history_limit': 10, 'cluster_id': 1,
    'owner_principal_id': 1, 'access_policy': 'authed', 'id': 7, 'created_at': '2026-12-02T11:29:28',
    'updated_at': '2026-12-02T11:29:28', 'state': None, 'state_message': None, 'role_status': None,
    'stale': None, 'degradations': None, 'restarting_since': None, 'has_stale_lora_instances': None,
}


def test_vram_claim_goes_to_env_as_a_string_of_bytes():
    desired = desired_model_fields(options(name='m', vram_claim_bytes=40532396032, env={'FOO': 1}))
    assert desired['env'] == {'GPUSTACK_MODEL_VRAM_CLAIM': '40532396032', 'FOO': '1'}


@pytest.mark.parametrize('claim', [0, -5, True, '12G'])
def test_vram_claim_must_be_positive_bytes(claim):
    with pytest.raises(RecordInputError) as error:
        desired_model_fields(options(name='m', vram_claim_bytes=claim))
    assert error.value.field == 'vram_claim_bytes'


def test_claim_contradicting_env_is_refused():
    with pytest.raises(RecordInputError) as error:
        desired_model_fields(options(name='m', vram_claim_bytes=100, env={'GPUSTACK_MODEL_VRAM_CLAIM': '200'}))
    assert error.value.field == 'env'


def test_source_fields_of_other_sources_are_cleared():
    desired = desired_model_fields(options(name='m', source='local_path', local_path='/models/a.gguf'))
    assert desired['local_path'] == '/models/a.gguf'
    assert desired['huggingface_repo_id'] is None and desired['model_scope_model_id'] is None


@pytest.mark.parametrize('source,field', [('huggingface', 'huggingface_repo_id'),
                                          ('model_scope', 'model_scope_model_id'),
                                          ('local_path', 'local_path')])
def test_each_source_needs_its_field(source, field):
    with pytest.raises(RecordInputError) as error:
        desired_model_fields(options(name='m', source=source))
    assert error.value.field == field


def test_source_fields_without_source_are_refused():
    with pytest.raises(RecordInputError) as error:
        desired_model_fields(options(name='m', huggingface_repo_id='a/b'))
    assert error.value.field == 'source'


def test_selector_values_become_strings():
    desired = desired_model_fields(options(name='m', worker_selector={'vram-per-gpu-gib': 48, 'nvlink': True}))
    assert desired['worker_selector'] == {'vram-per-gpu-gib': '48', 'nvlink': 'true'}


def test_gpu_ids_must_name_worker_device_and_index():
    with pytest.raises(RecordInputError) as error:
        desired_model_fields(options(name='m', gpu_selector={'gpu_ids': ['lab-a6000x4:0']}))
    assert 'lab-a6000x4:0' in str(error.value)
    ok = desired_model_fields(options(name='m', gpu_selector={'gpu_ids': ['w:cuda:0', 'w:cuda:1'],
                                                              'gpus_per_replica': None}))
    assert ok['gpu_selector'] == {'gpu_ids': ['w:cuda:0', 'w:cuda:1']}


def test_cluster_id_is_refused_on_the_v1_api():
    with pytest.raises(RecordInputError) as error:
        desired_model_fields(options(name='m', cluster_id=1), api_version='v1')
    assert error.value.field == 'cluster_id'


def test_unset_options_are_not_managed():
    desired = desired_model_fields(options(name='m', backend='vLLM'))
    assert set(desired) == {'name', 'backend'}


def test_server_defaults_do_not_count_as_changes():
    desired = desired_model_fields(options(
        name='qwen3-8b', source='huggingface', huggingface_repo_id='Qwen/Qwen3-8B', backend='vLLM',
        backend_parameters=['--max-model-len=16384', '--max-num-seqs=32'], vram_claim_bytes=123,
        worker_selector={}, categories=[], cluster_id=1))
    decision = plan_model_change(SERVER_RECORD, desired, 'present')
    assert decision['action'] == 'none' and decision['changes'] == []


def test_backend_parameter_order_is_a_change():
    desired = desired_model_fields(options(name='qwen3-8b',
                                           backend_parameters=['--max-num-seqs=32', '--max-model-len=16384']))
    decision = plan_model_change(SERVER_RECORD, desired, 'present')
    assert decision['action'] == 'update'
    assert decision['changes'] == [
        "backend_parameters[0]: '--max-model-len=16384' -> '--max-num-seqs=32'",
        "backend_parameters[1]: '--max-num-seqs=32' -> '--max-model-len=16384'",
    ]


def test_one_changed_pin_is_one_change_line():
    desired = desired_model_fields(options(name='qwen3-8b',
                                           backend_parameters=['--max-model-len=8192', '--max-num-seqs=32']))
    decision = plan_model_change(SERVER_RECORD, desired, 'present')
    assert decision['changes'] == ["backend_parameters[0]: '--max-model-len=16384' -> '--max-model-len=8192'"]
    assert decision['before']['backend_parameters'][1] == decision['after']['backend_parameters'][1]


def test_added_parameter_and_env_key_are_shown():
    desired = desired_model_fields(options(name='qwen3-8b', vram_claim_bytes=456,
                                           backend_parameters=SERVER_RECORD['backend_parameters'] + ['--enforce-eager']))
    lines = plan_model_change(SERVER_RECORD, desired, 'present')['changes']
    assert lines == ["backend_parameters[2]: (unset) -> '--enforce-eager'",
                     "env.GPUSTACK_MODEL_VRAM_CLAIM: '123' -> '456'"]


def test_update_body_is_the_full_record_without_server_status():
    desired = {'name': 'qwen3-8b', 'replicas': 2}
    body = model_update_body(SERVER_RECORD, desired)
    assert body['replicas'] == 2
    assert body['revision_history_limit'] == 10 and body['owner_principal_id'] == 1
    for server_owned in ('id', 'created_at', 'updated_at', 'state', 'ready_replicas', 'stale'):
        assert server_owned not in body
    assert SERVER_RECORD['replicas'] == 1     # the existing record is not modified


def test_create_needs_a_source():
    with pytest.raises(RecordInputError) as error:
        plan_model_change(None, {'name': 'new'}, 'present')
    assert error.value.field == 'source'


def test_absent():
    assert plan_model_change(None, {'name': 'x'}, 'absent')['action'] == 'none'
    decision = plan_model_change(SERVER_RECORD, {'name': 'qwen3-8b'}, 'absent')
    assert decision['action'] == 'delete' and decision['after'] == {}


def test_normalise_treats_empty_and_missing_alike():
    assert normalise_model({'env': None, 'gpu_selector': {'gpu_ids': None, 'gpus_per_replica': None}},
                           ['env', 'gpu_selector']) == {'env': None, 'gpu_selector': None}
    assert normalise_model({'categories': ['llm', 'embedding']}, ['categories']) == {'categories': ['embedding', 'llm']}


def test_field_changes_scalar():
    assert field_changes({'replicas': 1}, {'replicas': 3}, ['replicas']) == ['replicas: 1 -> 3']


# -- worker labels ------------------------------------------------------------------------

BUILTIN = {'os': 'linux', 'arch': 'amd64', 'worker-name': 'lab-a6000x4'}


def test_merge_adds_and_overwrites_and_keeps_others():
    current = dict(BUILTIN, **{'gpu-class': 'a5000', 'rack': 'r1'})
    wanted = worker_labels_wanted(current, {'gpu-class': 'a6000', 'vram-per-gpu-gib': 48}, 'merge')
    assert wanted == dict(BUILTIN, **{'gpu-class': 'a6000', 'rack': 'r1', 'vram-per-gpu-gib': '48'})
    change = worker_labels_change(current, wanted)
    assert change == dict(added=['vram-per-gpu-gib'], changed=['gpu-class'], removed=[], needs_removal=False)


def test_null_value_removes_a_label():
    current = dict(BUILTIN, **{'node-role': 'inference'})
    wanted = worker_labels_wanted(current, {'node-role': None}, 'merge')
    assert wanted == BUILTIN
    assert worker_labels_change(current, wanted)['needs_removal'] is True


def test_replace_keeps_the_labels_the_worker_sets_itself():
    current = dict(BUILTIN, **{'gpustack.existence-check': 'x', 'rack': 'r1'})
    wanted = worker_labels_wanted(current, {'gpu-class': 'a6000'}, 'replace')
    assert wanted == dict(BUILTIN, **{'gpustack.existence-check': 'x', 'gpu-class': 'a6000'})
    assert worker_labels_change(current, wanted)['removed'] == ['rack']


def test_same_labels_are_no_change():
    current = dict(BUILTIN, **{'vram-per-gpu-gib': '48'})
    wanted = worker_labels_wanted(current, {'vram-per-gpu-gib': 48}, 'merge')
    assert wanted == current


# -- server error bodies ------------------------------------------------------------------

def test_error_message_from_gpustack_422_is_verbatim():
    body = (b'{"code":422,"reason":"Invalid","message":"1 validation errors:\\n  {\'type\': '
            b'\'greater_than_equal\', \'loc\': (\'body\', \'replicas\')}\\n"}')
    assert error_message_from_body(body) == "1 validation errors:\n  {'type': 'greater_than_equal', 'loc': ('body', 'replicas')}"


def test_error_message_from_fastapi_detail_and_plain_text():
    assert error_message_from_body(b'{"detail":[{"msg":"field required"}]}') == '[{"msg": "field required"}]'
    assert error_message_from_body(b'<html>502 Bad Gateway</html>') == '<html>502 Bad Gateway</html>'
    assert error_message_from_body(b'') == '(empty body)'


# -- the replica claim GPUStack reads -------------------------------------------------------

RTX4090_TOTAL = 25757220864


def test_vllm_claim_is_what_gpustack_books_summed_over_the_replica():
    plan = {'backend': 'vllm', 'vram_claim_bytes': 24827133949,
            'args': ['--tensor-parallel-size=2', '--gpu-memory-utilization=0.88'],
            'memory': [{'total': RTX4090_TOTAL}, {'total': RTX4090_TOTAL}]}
    # GPUStack books int(total x gmu) per GPU: int(22666354360.32) each.
    assert replica_vram_claim(plan) == 2 * 22666354360
    # Never above what GPUStack's feasibility check allows (sum of total x gmu, unrounded).
    assert replica_vram_claim(plan) <= 2 * RTX4090_TOTAL * 0.88


def test_vllm_claim_books_from_the_nvml_total_gpustack_sees_not_the_cuda_total():
    # A plan row's total is the CUDA-visible total vLLM budgets from; GPUStack's worker reports
    # (and books from) the NVML total, which the row carries as terms.nvml_total.
    cuda_total = RTX4090_TOTAL - 512 * 1024 * 1024
    plan = {'backend': 'vllm', 'args': ['--gpu-memory-utilization=0.88'],
            'memory': [{'total': cuda_total, 'terms': {'nvml_total': RTX4090_TOTAL}}] * 2}
    assert gpu_vram_bookings(plan) == [22666354360, 22666354360]
    assert replica_vram_claim(plan) == 2 * 22666354360


@pytest.mark.parametrize('nvml_total', [0, -1, 1.5, '25757220864', True, None])
def test_vllm_booking_refuses_a_bad_nvml_total_naming_it(nvml_total):
    plan = {'backend': 'vllm', 'args': [], 'memory': [{'total': 1000}, {'total': 1000, 'terms': {'nvml_total': nvml_total}}]}
    with pytest.raises(RecordInputError) as raised:
        gpu_vram_bookings(plan)
    assert raised.value.field == 'plan.memory[1].terms.nvml_total'


def test_vllm_claim_reads_gmu_like_gpustack_and_defaults_to_its_assumption():
    spaced = {'backend': 'vllm', 'args': ['--gpu-memory-utilization', '0.5'], 'memory': [{'total': 1000}]}
    assert replica_vram_claim(spaced) == 500
    unset = {'backend': 'vllm', 'args': [], 'memory': [{'total': 1000}]}
    assert replica_vram_claim(unset) == 900


def test_one_gpu_vllm_claim_stays_schedulable():
    # The plan's per-GPU resident figure (budget + memory outside it) is above total x gmu, which
    # GPUStack would refuse on one GPU; the claim it gets is the booking instead.
    plan = {'backend': 'vllm', 'vram_claim_bytes': 24827133949, 'args': ['--gpu-memory-utilization=0.88'],
            'memory': [{'total': RTX4090_TOTAL}]}
    assert plan['vram_claim_bytes'] > RTX4090_TOTAL * 0.88
    assert replica_vram_claim(plan) <= RTX4090_TOTAL * 0.88


def test_other_backends_claim_per_gpu_times_gpus():
    plan = {'backend': 'llama-box', 'vram_claim_bytes': 1000, 'args': [], 'memory': [{'total': 1}, {'total': 1}]}
    assert replica_vram_claim(plan) == 2000


def test_plan_without_memory_rows_is_refused():
    with pytest.raises(RecordInputError):
        replica_vram_claim({'backend': 'vllm', 'args': [], 'memory': []})
