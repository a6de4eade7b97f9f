# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""gpustack_model and gpustack_worker_labels against a real GPUStack 2.3 server.

The server, its PostgreSQL and every request live in a network namespace this suite makes
(tests/integration/gpustack_server.py). Modules run the way Ansible runs them: the module
file in a subprocess with its arguments as ANSIBLE_MODULE_ARGS JSON, or ansible-playbook.
"""

import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpustack_server import REPO_ROOT, GpustackServer, ServerUnavailable  # noqa: E402

MODULES_DIR = os.path.join(REPO_ROOT, 'plugins', 'modules')
VENV_BIN = os.path.dirname(sys.executable)

MODEL_ARGS = dict(
    name='qwen3-8b-kvpin',
    source='huggingface',
    huggingface_repo_id='Qwen/Qwen3-8B',
    backend='vLLM',
    backend_version='0.11.0',
    backend_parameters=['--tensor-parallel-size=2', '--max-model-len=16384', '--max-num-seqs=32',
                        '--gpu-memory-utilization=0.88'],
    vram_claim_bytes=40532396032,
    worker_selector={'worker-name': 'lab-4090x2', 'vram-per-gpu-gib': 24},
    categories=['llm'],
    replicas=1,
)


def collections_root():
    for entry in sys.path:
        if os.path.isdir(os.path.join(entry, 'ansible_collections', 'kvpin', 'fleet')):
            return entry
    raise RuntimeError('ansible_collections.kvpin.fleet is not on sys.path (tests/conftest.py sets it up)')


@pytest.fixture(scope='module')
def server():
    # Started once for all the tests here (they are all in this module); module scope stops it
    # as soon as they are done instead of holding it through the rest of the session.
    instance = GpustackServer()
    try:
        instance.start(log=lambda message: print(message, file=sys.stderr))
    except ServerUnavailable as reason:
        pytest.skip('no GPUStack test server on this machine: %s' % reason)
    print('gpustack test server up: %s' % ', '.join('%s=%.1f' % kv for kv in sorted(instance.timings.items())),
          file=sys.stderr)
    yield instance
    instance.stop()


def run_module(server, module, args, check=False, diff=False, tmp_path=None):
    """Run plugins/modules/<module>.py inside the namespace; return its JSON result."""
    payload = dict(args)
    payload.setdefault('server_url', server.url)
    payload.setdefault('api_key', server.api_key)
    payload.update(_ansible_check_mode=check, _ansible_diff=diff)
    env = dict(os.environ, PYTHONPATH=collections_root())
    completed = server.run([sys.executable, os.path.join(MODULES_DIR, module + '.py')],
                           input=json.dumps(dict(ANSIBLE_MODULE_ARGS=payload)), env=env,
                           capture_output=True, text=True, timeout=120)
    try:
        return json.loads(completed.stdout)
    except ValueError:
        raise AssertionError('module printed no JSON (rc %s):\nstdout: %s\nstderr: %s'
                             % (completed.returncode, completed.stdout, completed.stderr))


def model_args(server, **overrides):
    args = dict(MODEL_ARGS, cluster_id=server.cluster_id)
    args.update(overrides)
    return args


def read_model(server, name):
    status, answer = server.http('GET', '/v2/models?search=%s' % name)
    assert status == 200, answer
    found = [m for m in answer['items'] if m['name'] == name]
    return found[0] if found else None


def without_timestamps(record):
    return dict((k, v) for k, v in record.items() if k not in ('updated_at',))


# The tests below build on each other's server state in file order (create, rerun, update,
# ... delete), as one deployment's life would.

def test_create(server):
    result = run_module(server, 'gpustack_model', model_args(server))
    assert not result.get('failed'), result
    assert result['changed'] is True and result['action'] == 'create'
    assert result['api_version'] == 'v2'        # api_version auto: /v2/models answered

    record = read_model(server, MODEL_ARGS['name'])
    assert record['backend_parameters'] == MODEL_ARGS['backend_parameters']    # exact, in order
    # The scheduler reads it with int(): bytes, as a decimal string.
    assert record['env'] == {'GPUSTACK_MODEL_VRAM_CLAIM': '40532396032'}
    assert record['worker_selector'] == {'worker-name': 'lab-4090x2', 'vram-per-gpu-gib': '24'}
    assert record['cluster_id'] == server.cluster_id
    assert record['huggingface_repo_id'] == 'Qwen/Qwen3-8B'


def settled_model(server, name, quiet=2.0, limit=60.0):
    """The record once GPUStack itself has stopped writing it: right after a create, its
    scheduler updates the new model within a fraction of a second (updated_at moved 0.1 s after
    a read in one CI run while the module wrote nothing). Read until updated_at holds still for
    ``quiet`` seconds, at most ``limit``."""
    record, since, start = read_model(server, name), time.monotonic(), time.monotonic()
    while time.monotonic() - since < quiet and time.monotonic() - start < limit:
        time.sleep(0.25)
        again = read_model(server, name)
        if again['updated_at'] != record['updated_at']:
            record, since = again, time.monotonic()
    return record


def test_rerun_is_unchanged(server):
    before = settled_model(server, MODEL_ARGS['name'])
    result = run_module(server, 'gpustack_model', model_args(server))
    assert not result.get('failed'), result
    assert result['changed'] is False and result['action'] == 'none'
    assert result['changes'] == []
    # Nothing was written: not even the server's update timestamp moved.
    assert read_model(server, MODEL_ARGS['name'])['updated_at'] == before['updated_at']


def test_changed_pin_updates_and_diff_shows_only_that_pin(server):
    params = list(MODEL_ARGS['backend_parameters'])
    params[1] = '--max-model-len=8192'
    before = read_model(server, MODEL_ARGS['name'])
    result = run_module(server, 'gpustack_model', model_args(server, backend_parameters=params), diff=True)
    assert not result.get('failed'), result
    assert result['changed'] is True and result['action'] == 'update'
    assert result['changes'] == ["backend_parameters[1]: '--max-model-len=16384' -> '--max-model-len=8192'"]
    diff_before, diff_after = result['diff']['before'], result['diff']['after']
    assert [k for k in diff_after if diff_before[k] != diff_after[k]] == ['backend_parameters']

    after = read_model(server, MODEL_ARGS['name'])
    assert after['backend_parameters'] == params
    assert after['id'] == before['id']
    # The full-record PUT kept every field the module does not manage.
    for field in ('distributed_inference_across_workers', 'restart_on_error', 'placement_strategy',
                  'revision_history_limit', 'env', 'worker_selector'):
        assert after[field] == before[field], field


def test_check_mode_reports_and_writes_nothing(server):
    before = read_model(server, MODEL_ARGS['name'])
    result = run_module(server, 'gpustack_model', model_args(server, replicas=3,
                                                             backend_parameters=before['backend_parameters']),
                        check=True, diff=True)
    assert not result.get('failed'), result
    assert result['changed'] is True and result['action'] == 'update'
    assert result['changes'] == ['replicas: 1 -> 3']
    assert without_timestamps(read_model(server, MODEL_ARGS['name'])) == without_timestamps(before)
    assert read_model(server, MODEL_ARGS['name'])['updated_at'] == before['updated_at']

    created = run_module(server, 'gpustack_model', model_args(server, name='never-created'), check=True)
    assert created['changed'] is True and created['action'] == 'create'
    assert read_model(server, 'never-created') is None


def test_bad_api_key_fails_with_the_servers_401_message(server):
    bad_key = 'gpustack_0000000000000000_00000000000000000000000000000000'
    result = run_module(server, 'gpustack_model', model_args(server, api_key=bad_key))
    assert result['failed'] is True
    assert result['status'] == 401
    assert 'HTTP 401' in result['msg'] and 'Invalid authentication credentials' in result['msg']
    assert bad_key not in json.dumps(result)


def test_invalid_body_surfaces_the_422_detail_and_leaves_the_record(server):
    before = read_model(server, MODEL_ARGS['name'])
    result = run_module(server, 'gpustack_model', model_args(server, replicas=-1,
                                                             backend_parameters=before['backend_parameters']))
    assert result['failed'] is True
    assert result['status'] == 422 and result['method'] == 'PUT'
    assert "'loc': ('body', 'replicas')" in result['msg']
    assert 'Input should be greater than or equal to 0' in result['msg']
    assert read_model(server, MODEL_ARGS['name']) == before   # the refused PUT changed nothing

    created = run_module(server, 'gpustack_model', model_args(server, name='bad-replicas', replicas=-1))
    assert created['status'] == 422 and created['method'] == 'POST'
    assert read_model(server, 'bad-replicas') is None


def test_unknown_source_is_refused_before_any_request(server):
    result = run_module(server, 'gpustack_model', model_args(server, source='ollama'))
    assert result['failed'] is True
    assert 'source' in result['msg'] and 'huggingface, model_scope, local_path' in result['msg']


def test_missing_source_field_is_refused_before_any_request(server):
    result = run_module(server, 'gpustack_model', model_args(server, name='no-repo', huggingface_repo_id=None))
    assert result['failed'] is True and result['field'] == 'huggingface_repo_id'
    assert read_model(server, 'no-repo') is None


def test_unreachable_port_fails_cleanly(server):
    result = run_module(server, 'gpustack_model', model_args(server, server_url='http://127.0.0.1:9', timeout=5))
    assert result['failed'] is True and result['status'] is None
    assert 'cannot reach http://127.0.0.1:9' in result['msg']
    assert 'Traceback' not in json.dumps(result)


def test_tls_to_a_plain_http_port_fails_cleanly(server):
    result = run_module(server, 'gpustack_model',
                        model_args(server, server_url=server.url.replace('http://', 'https://'), timeout=5))
    assert result['failed'] is True and result['status'] is None
    assert 'TLS' in result['msg'] or 'SSL' in result['msg']


def test_server_that_never_answers_times_out(server):
    # A listener inside the test's namespace that accepts and never replies.
    listener = server.call(_silent_listener)
    port = listener.getsockname()[1]
    try:
        result = run_module(server, 'gpustack_model',
                            model_args(server, server_url='http://127.0.0.1:%d' % port, timeout=2))
    finally:
        listener.close()
    assert result['failed'] is True and result['status'] is None
    assert 'timeout' in result['msg']


def _silent_listener():
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(('127.0.0.1', 0))
    sock.listen(4)
    held = []

    def accept():
        while True:
            try:
                held.append(sock.accept()[0])
            except OSError:
                return
    threading.Thread(target=accept, daemon=True).start()
    return sock


def test_delete_and_delete_again(server):
    result = run_module(server, 'gpustack_model', dict(name=MODEL_ARGS['name'], state='absent'), diff=True)
    assert not result.get('failed'), result
    assert result['changed'] is True and result['action'] == 'delete'
    assert read_model(server, MODEL_ARGS['name']) is None
    again = run_module(server, 'gpustack_model', dict(name=MODEL_ARGS['name'], state='absent'))
    assert again['changed'] is False and again['action'] == 'none'


def test_labels_on_an_unregistered_worker_fail_or_are_reported(server):
    result = run_module(server, 'gpustack_worker_labels', dict(workers=['lab-nowhere'], labels={'gpu-class': 'a6000'}))
    assert result['failed'] is True and 'lab-nowhere' in result['msg'] and 'not registered' in result['msg']
    skipped = run_module(server, 'gpustack_worker_labels',
                         dict(workers=['lab-nowhere'], labels={'gpu-class': 'a6000'}, allow_missing=True))
    assert not skipped.get('failed'), skipped
    assert skipped['changed'] is False and skipped['missing'] == ['lab-nowhere']


# -- through ansible-playbook -------------------------------------------------------------

def run_playbook(server, tmp_path, playbook_text, extra_vars, verbosity='-vvv'):
    playbook = tmp_path / 'play.yml'
    playbook.write_text(playbook_text)
    vars_file = tmp_path / 'vars.json'
    vars_file.write_text(json.dumps(extra_vars))
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=collections_root(), ANSIBLE_NOCOLOR='1',
               ANSIBLE_LOCALHOST_WARNING='0', ANSIBLE_INVENTORY_UNPARSED_WARNING='0')
    argv = [os.path.join(VENV_BIN, 'ansible-playbook'), verbosity, '-i', 'localhost,', '-c', 'local',
            '-e', 'ansible_python_interpreter=%s' % sys.executable, '-e', '@%s' % vars_file, str(playbook)]
    return server.run(argv, env=env, capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)


PLAYBOOK_NO_LOG = '''
- hosts: localhost
  gather_facts: false
  tasks:
    - name: create with the real key
      kvpin.fleet.gpustack_model:
        server_url: "{{ url }}"
        api_key: "{{ key }}"
        name: nolog-check
        cluster_id: "{{ cluster }}"
        source: huggingface
        huggingface_repo_id: Qwen/Qwen3-0.6B
        backend: vLLM
    - name: a refused key
      kvpin.fleet.gpustack_model:
        server_url: "{{ url }}"
        api_key: "{{ wrong_key }}"
        name: nolog-check
        source: huggingface
        huggingface_repo_id: Qwen/Qwen3-0.6B
      ignore_errors: true
    - name: delete
      kvpin.fleet.gpustack_model:
        server_url: "{{ url }}"
        api_key: "{{ key }}"
        name: nolog-check
        state: absent
'''


def test_api_key_never_appears_in_vvv_output(server, tmp_path):
    wrong_key = 'gpustack_feedfacefeedface_0123456789abcdef0123456789abcdef'
    completed = run_playbook(server, tmp_path, PLAYBOOK_NO_LOG,
                             dict(url=server.url, key=server.api_key, wrong_key=wrong_key, cluster=server.cluster_id))
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, output[-4000:]
    assert 'changed=2' in output and 'ignored=1' in output, output[-2000:]
    assert server.api_key not in output
    assert wrong_key not in output
    # The secret halves alone must not leak either (e.g. through a URL or a header dump).
    assert server.api_key.split('_')[-1] not in output
    assert read_model(server, 'nolog-check') is None


# -- playbooks/deploy_models.yml ------------------------------------------------------------

# kvpin_plans as tasks/plan_deployments.yml registers it (a looped serving_plan result: each
# item carries its loop var `deployment` and the module's `plan`).
DEPLOY_INVENTORY = {
    'all': {'children': {'gpu_nodes': {'hosts': {'lab-4090x2': {
        'ansible_connection': 'local',
        'kvpin_gpustack_worker_labels': {'gpu-class': 'rtx4090', 'vram-per-gpu-gib': 24},
        'kvpin_deployments': [
            {'name': 'llama-3.1-8b-deploy', 'backend': 'vllm', 'backend_version': '0.11.0',
             'model': 'meta-llama/Llama-3.1-8B-Instruct',
             'traffic': {'prompt_tokens_p99': 4096, 'max_output_tokens': 512, 'max_concurrency': 32},
             'gpustack': {'worker_selector': {'gpu-class': 'rtx4090'}, 'categories': ['llm']}},
            {'name': 'too-big', 'backend': 'vllm', 'backend_version': '0.11.0',
             'model': 'meta-llama/Llama-3.3-70B-Instruct',
             'traffic': {'prompt_tokens_p99': 11000, 'max_output_tokens': 1024, 'max_concurrency': 32}},
        ],
    }}}}},
}


def deploy_plans(inventory):
    deployments = inventory['all']['children']['gpu_nodes']['hosts']['lab-4090x2']['kvpin_deployments']
    return {'results': [
        {'deployment': deployments[0], 'changed': False,
         'plan': {'backend': 'vllm', 'feasible': True, 'vram_claim_bytes': 24827133949,
                  'memory': [{'index': 0, 'total': 25757220864}, {'index': 1, 'total': 25757220864}],
                  'args': ['--tensor-parallel-size=2', '--max-model-len=4608', '--max-num-seqs=32',
                           '--gpu-memory-utilization=0.9']}},
        {'deployment': deployments[1], 'changed': False,
         'plan': {'feasible': False, 'args': [], 'not_fitting': ['weights 65.7 GiB per GPU > budget 21.6 GiB']}},
    ]}


def test_deploy_models_playbook(server, tmp_path):
    inventory = json.loads(json.dumps(DEPLOY_INVENTORY))
    host = inventory['all']['children']['gpu_nodes']['hosts']['lab-4090x2']
    host['kvpin_plans'] = deploy_plans(inventory)
    (tmp_path / 'inventory.json').write_text(json.dumps(inventory))
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=collections_root(), ANSIBLE_NOCOLOR='1')
    argv = [os.path.join(VENV_BIN, 'ansible-playbook'), '-i', str(tmp_path / 'inventory.json'),
            '-e', 'ansible_python_interpreter=%s' % sys.executable,
            '-e', json.dumps(dict(gpustack_server_url=server.url, gpustack_api_key=server.api_key,
                                  gpustack_cluster_id=server.cluster_id)),
            os.path.join(REPO_ROOT, 'playbooks', 'deploy_models.yml')]
    first = server.run(argv, env=env, capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    output = first.stdout + first.stderr
    # No worker is registered on this server: labelling the node's worker fails the host and
    # says which worker is missing (the models are not deployed past that failure).
    assert 'not registered' in output and 'lab-4090x2' in output, output[-3000:]

    del host['kvpin_gpustack_worker_labels']
    (tmp_path / 'inventory.json').write_text(json.dumps(inventory))
    first = server.run(argv, env=env, capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    output = first.stdout + first.stderr
    assert first.returncode == 0, output[-4000:]
    assert 'too-big is not deployed: its plan is not feasible' in output
    record = read_model(server, 'llama-3.1-8b-deploy')
    assert record['backend'] == 'vLLM' and record['backend_version'] == '0.11.0'
    assert record['backend_parameters'] == host['kvpin_plans']['results'][0]['plan']['args']
    # One replica on two 25757220864-byte cards at 0.9: 2 x int(25757220864 x 0.9).
    assert record['env'] == {'GPUSTACK_MODEL_VRAM_CLAIM': str(2 * 23181498777)}
    assert record['worker_selector'] == {'worker-name': 'lab-4090x2', 'gpu-class': 'rtx4090'}
    assert record['huggingface_repo_id'] == 'meta-llama/Llama-3.1-8B-Instruct'
    assert record['categories'] == ['llm'] and record['cluster_id'] == server.cluster_id
    assert read_model(server, 'too-big') is None

    second = server.run(argv, env=env, capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    assert second.returncode == 0 and 'changed=0' in second.stdout, second.stdout[-3000:]
    assert server.api_key not in output + second.stdout + second.stderr
    server.http('DELETE', '/v2/models/%d' % record['id'])


# -- a real worker: native GPUStack 2.3 worker seeing stub GPUs over NVML -------------------

NVML_STUB_BUILD = os.path.join(REPO_ROOT, 'tests', 'nvml_stub', 'build.sh')
WORKER_NODE = 'lab-4090x2'
WORKER_FIXTURE = os.path.join(REPO_ROOT, 'tests', 'fixtures', 'nvml', WORKER_NODE + '.json')


@pytest.fixture(scope='module')
def worker(server):
    """The node lab-4090x2 as a registered worker (two RTX 4090 from its NVML fixture)."""
    try:
        library = subprocess.run(['sh', NVML_STUB_BUILD], check=True, capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError) as error:
        pytest.skip('NVML stub library could not be built (%s): %s' % (NVML_STUB_BUILD, error))
    record = server.start_worker(WORKER_NODE, os.path.dirname(library), WORKER_FIXTURE)
    record['nvml_library_dir'] = os.path.dirname(library)
    return record


def read_worker(server, worker_id):
    status, answer = server.http('GET', '/v2/workers/%d' % worker_id)
    assert status == 200, answer
    return answer


def test_worker_reports_the_fixture_gpus(server, worker):
    with open(WORKER_FIXTURE) as fixture:
        devices = json.load(fixture)['devices']
    gpus = sorted(worker['status']['gpu_devices'], key=lambda g: g['index'])
    assert [(g['name'], g['memory']['total']) for g in gpus] == [(d['name'], d['memory_total']) for d in devices]
    assert worker['labels']['worker-name'] == WORKER_NODE


def test_worker_labels_land_idempotently(server, worker):
    args = dict(workers=[WORKER_NODE], labels={'gpu-class': 'rtx4090', 'vram-per-gpu-gib': 24, 'node-role': 'infer'})
    checked = run_module(server, 'gpustack_worker_labels', args, check=True, diff=True)
    assert checked['changed'] is True and checked['workers'][0]['added'] == ['gpu-class', 'node-role', 'vram-per-gpu-gib']
    assert 'gpu-class' not in read_worker(server, worker['id'])['labels']      # check mode wrote nothing

    first = run_module(server, 'gpustack_worker_labels', args)
    assert not first.get('failed'), first
    assert first['changed'] is True
    labels = read_worker(server, worker['id'])['labels']
    assert labels == {'os': 'linux', 'arch': 'amd64', 'worker-name': WORKER_NODE, 'gpu-class': 'rtx4090',
                      'vram-per-gpu-gib': '24', 'node-role': 'infer'}
    again = run_module(server, 'gpustack_worker_labels', args)
    assert again['changed'] is False


def test_worker_label_removal_and_replace(server, worker):
    before = read_worker(server, worker['id'])
    removed = run_module(server, 'gpustack_worker_labels', dict(workers=[WORKER_NODE], labels={'node-role': None}))
    assert removed['changed'] is True and removed['workers'][0]['removed'] == ['node-role']
    after = read_worker(server, worker['id'])
    assert 'node-role' not in after['labels'] and after['labels']['gpu-class'] == 'rtx4090'
    assert after['maintenance'] == before['maintenance'] and after['name'] == WORKER_NODE

    replaced = run_module(server, 'gpustack_worker_labels',
                          dict(workers=[WORKER_NODE], labels={'gpu-class': 'rtx4090'}, mode='replace'))
    assert replaced['workers'][0]['removed'] == ['vram-per-gpu-gib']
    assert read_worker(server, worker['id'])['labels'] == {
        'os': 'linux', 'arch': 'amd64', 'worker-name': WORKER_NODE, 'gpu-class': 'rtx4090'}


def wait_for_instance(server, model_id, timeout=90):
    """The model's first instance once the scheduler has placed it (or the last state seen)."""
    deadline = time.monotonic() + timeout
    instance = None
    while time.monotonic() < deadline:
        status, answer = server.http('GET', '/v2/models/%d/instances' % model_id)
        items = answer.get('items', []) if status == 200 else []
        if items:
            instance = items[0]
            if instance.get('computed_resource_claim'):
                return instance
        time.sleep(1)
    return instance


@pytest.fixture(scope='module')
def local_model_dir(tmp_path_factory):
    """A local_path model GPUStack can read without the hub: the real config.json of
    Llama-3.1-8B-Instruct (from the catalog), no weights (nothing runs the engine here)."""
    from ansible_collections.kvpin.fleet.plugins.module_utils.plan.model_catalog import CATALOG
    root = tmp_path_factory.mktemp('models')
    os.chmod(str(root), 0o755)
    model_dir = root / 'Llama-3.1-8B-Instruct'
    model_dir.mkdir()
    config = dict((k, v) for k, v in CATALOG['meta-llama/Llama-3.1-8B-Instruct'].items() if not k.startswith('_'))
    (model_dir / 'config.json').write_text(json.dumps(config))
    return str(model_dir)


def test_deploy_models_standalone_books_the_planned_claim(server, worker, local_model_dir, tmp_path):
    """deploy_models.yml run alone: NVML probe (stub) -> serving_plan -> worker labels ->
    gpustack_model; then GPUStack's scheduler places the replica on the worker's GPUs."""

    inventory = {'all': {'children': {'gpu_nodes': {'hosts': {WORKER_NODE: {
        'ansible_connection': 'local',
        'kvpin_gpustack_worker_labels': {'gpu-class': 'rtx4090'},
        'kvpin_deployments': [{
            'name': 'llama-3.1-8b-chain', 'backend': 'vllm', 'backend_version': '0.11.0',
            'model': 'meta-llama/Llama-3.1-8B-Instruct', 'gpu_indexes': [0, 1],
            'traffic': {'prompt_tokens_p99': 4096, 'max_output_tokens': 512, 'max_concurrency': 32},
            # The fixture's GPU 0 holds a 312 MiB process outside GPUStack: the derived
            # utilization leaves no room for it, and the node's ledger would refuse the plan.
            'engine': {'tensor_parallel_size': 2, 'gpu_memory_utilization': 0.85},
            'gpustack': {'source': 'local_path', 'local_path': local_model_dir,
                         'worker_selector': {'gpu-class': 'rtx4090'}},
        }],
    }}}}}}
    (tmp_path / 'inventory.json').write_text(json.dumps(inventory))
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=collections_root(), ANSIBLE_NOCOLOR='1',
               LD_LIBRARY_PATH=worker['nvml_library_dir'], KVPIN_NVML_STUB_CONFIG=WORKER_FIXTURE)
    argv = [os.path.join(VENV_BIN, 'ansible-playbook'), '-i', str(tmp_path / 'inventory.json'),
            '-e', 'ansible_python_interpreter=%s' % sys.executable,
            '-e', json.dumps(dict(gpustack_server_url=server.url, gpustack_api_key=server.api_key,
                                  gpustack_cluster_id=server.cluster_id)),
            os.path.join(REPO_ROOT, 'playbooks', 'deploy_models.yml')]
    completed = server.run(argv, env=env, capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, output[-5000:]
    assert server.api_key not in output

    record = read_model(server, 'llama-3.1-8b-chain')
    assert record['gpu_selector'] == {'gpu_ids': ['%s:cuda:0' % WORKER_NODE, '%s:cuda:1' % WORKER_NODE],
                                      'gpus_per_replica': 2}
    assert record['worker_selector'] == {'worker-name': WORKER_NODE, 'gpu-class': 'rtx4090'}
    assert '--tensor-parallel-size=2' in record['backend_parameters']
    gmu = float([a for a in record['backend_parameters'] if a.startswith('--gpu-memory-utilization=')][0].split('=')[1])
    claim = int(record['env']['GPUSTACK_MODEL_VRAM_CLAIM'])

    instance = wait_for_instance(server, record['id'])
    assert instance and instance.get('computed_resource_claim'), instance
    booked = instance['computed_resource_claim']['vram']
    totals = dict((str(g['index']), g['memory']['total']) for g in worker['status']['gpu_devices'])
    print('GPUStack booking per GPU: %s; claim %d; gmu %s' % (booked, claim, gmu))
    assert sorted(instance['gpu_indexes']) == [0, 1] and instance['worker_name'] == WORKER_NODE
    # GPUStack books int(total x gmu) on each GPU; the claim we wrote is exactly that, summed.
    assert booked == dict((i, int(total * gmu)) for i, total in totals.items())
    assert sum(booked.values()) == claim
    server.http('DELETE', '/v2/models/%d' % record['id'])


def test_a_claim_above_the_replicas_gpus_is_not_placed(server, worker, local_model_dir):
    """The claim is bytes for the whole replica: one byte more than the worker's two GPUs give
    at gmu 0.9 (summed) and automatic placement refuses, saying how much the model needs.
    With GPUs selected by hand, GPUStack places a single replica anyway (it allows overcommit
    there) and says so in the instance message."""
    total = sum(g['memory']['total'] for g in worker['status']['gpu_devices'])
    claim = int(total * 0.9) + 1
    args = dict(cluster_id=server.cluster_id, source='local_path', local_path=local_model_dir, backend='vLLM',
                backend_parameters=['--tensor-parallel-size=2', '--gpu-memory-utilization=0.9'],
                vram_claim_bytes=claim, worker_selector={'worker-name': WORKER_NODE})
    needs = 'requires approximately %.2f GiB' % (claim / 2.0 ** 30)    # the claim, read as bytes

    auto = run_module(server, 'gpustack_model', dict(args, name='over-claim-auto'))
    assert not auto.get('failed'), auto
    instance = wait_for_instance(server, auto['model']['id'], timeout=20)
    assert instance is not None and not instance.get('computed_resource_claim'), instance
    assert needs in instance['state_message'], instance['state_message']

    manual = run_module(server, 'gpustack_model', dict(
        args, name='over-claim-manual',
        gpu_selector={'gpu_ids': ['%s:cuda:0' % WORKER_NODE, '%s:cuda:1' % WORKER_NODE], 'gpus_per_replica': 2}))
    assert not manual.get('failed'), manual
    placed = wait_for_instance(server, manual['model']['id'], timeout=20)
    assert placed.get('computed_resource_claim'), placed
    for model in (auto, manual):
        server.http('DELETE', '/v2/models/%d' % model['model']['id'])
