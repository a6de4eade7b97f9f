# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The whole loop on the lab fleet (needs root, podman and runc; skipped otherwise): site.yml
with the lab's GPUStack 0.7.1 server runs every phase; GPUStack schedules each deployment on its
node's GPUs and launches the TEST-ONLY engine stand-in (tests/lab/standins/kvpin-engine) with
the planner's pins in its argv; one watchdog per deployment is derived, none written by hand;
and a leak injected into one engine gets that instance, and only it, recycled through GPUStack.

Everything is in the lab's containers (scripts/lab.sh): the server in lab-gpustack, workers and
engines in the nodes; the test talks to the server and the engines at their container
addresses on podman's bridge, and to nothing else.
"""

import json
import os
import re
import sys
import time
import urllib.error
import urllib.request

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lab_fleet  # noqa: E402
from lab_fleet import NODES, REPO_ROOT, node_exec, playbook, recap  # noqa: E402

pytestmark = pytest.mark.lab

SITE = os.path.join(REPO_ROOT, 'site.yml')
# Where lab.sh keeps the server's URL and API key (inventory/lab reads the same files).
STATE_DIR = os.path.join(os.environ.get('KVPIN_LAB_DIR') or os.path.join(REPO_ROOT, '.lab'),
                         os.environ.get('KVPIN_LAB_PREFIX', '') + 'gpustack')
# The lab inventory's deployments: node -> (deployment, backend, pinned flags that must arrive).
DEPLOYMENTS = {
    'lab-a6000x4': ('llama-3.3-70b', 'vllm', ('--gpu-memory-utilization', '--max-model-len')),
    'lab-4090x4': ('qwen2.5-32b', 'vllm', ('--gpu-memory-utilization', '--max-model-len')),
    'lab-4090x2': ('llama-3.1-8b', 'vllm', ('--gpu-memory-utilization', '--max-model-len')),
    'lab-mixed': ('llama-3.3-70b-q4km', 'llama-box', ('--gpu-layers', '--ctx-size')),
}
LEAKY_NODE = 'lab-4090x2'
# Watchdog settings short enough for a test (inventory extra vars, as an operator would pass):
# 2 s samples, verdicts after the shortest history the watchdog accepts (60 s), a slope
# threshold far above a steady engine's noise and far below the injected leak
# (LEAK_MIB_PER_MINUTE = 24 GiB/h).
LEAK_MIB_PER_MINUTE = 400
WATCHDOG_VARS = {
    'serving_watchdog_interval_seconds': 2,
    'serving_watchdog_settings': {
        'warmup_seconds': 10, 'min_window_seconds': 60, 'window_seconds': 120, 'min_points': 20,
        'evaluate_every_seconds': 4, 'confirm_seconds': 10, 'cooldown_seconds': 60,
        'slope_threshold_bytes_per_hour': 2 << 30, 'recycle_horizon_seconds': 12 * 3600,
        # Issue 38's hours-long clocks, compressed the same way.
        'settle_window_seconds': 60, 'warmup_hold_max_seconds': 20, 'confirm_max_seconds': 10,
        'rising_grace_seconds': 0, 'alert_enter_seconds': 8, 'alert_clear_seconds': 8,
    },
}
RUNNING_DEADLINE_S = 420
RECYCLE_DEADLINE_S = 300
ARGV_LINE = re.compile(r'^kvpin-engine-standin argv: (\[.*\])$', re.MULTILINE)


def _read(name):
    with open(os.path.join(STATE_DIR, name)) as handle:
        return handle.read().strip()


def _http(url, method='GET', body=None, key=None, timeout=10):
    """(status, JSON) of one request inside the lab; no redirect is followed with the key."""
    headers = {'Accept': 'application/json'}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers['Content-Type'] = 'application/json'
    if key:
        headers['Authorization'] = 'Bearer ' + key
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read(1 << 22) or b'null')
    except urllib.error.HTTPError as error:
        return error.code, None


class Server:
    def __init__(self):
        self.url = _read('server_url')
        self.key = _read('api_key')

    def items(self, path):
        status, answer = _http(self.url + path, key=self.key)
        assert status == 200, '%s: HTTP %s' % (path, status)
        return answer['items']

    def models(self):
        return {model['name']: model for model in self.items('/v1/models?perPage=100')}

    def instances(self):
        """{deployment name: [instances]}."""
        models = {model['id']: model['name'] for model in self.items('/v1/models?perPage=100')}
        found = {}
        for instance in self.items('/v1/model-instances?perPage=100'):
            found.setdefault(models.get(instance['model_id']), []).append(instance)
        return found

    def workers(self):
        return {worker['name']: worker for worker in self.items('/v1/workers?perPage=100')}


def _wait_all_running(server, deadline_s):
    deadline = time.monotonic() + deadline_s
    while True:
        instances = server.instances()
        states = {name: [(i['state'], i['worker_name']) for i in instances.get(name, [])]
                  for name, _b, _p in DEPLOYMENTS.values()}
        if all(len(s) == 1 and s[0][0] == 'running' for s in states.values()):
            return {name: found[0] for name, found in instances.items()}
        if time.monotonic() > deadline:
            messages = {name: [(i['state'], (i.get('state_message') or '')[:300]) for i in found]
                        for name, found in instances.items()}
            raise AssertionError('not all instances running after %ds: %s' % (deadline_s, messages))
        time.sleep(3)


def _engine_argv(node, instance_id):
    """The argv the stand-in printed at its latest start (GPUStack's instance log)."""
    proc = node_exec(node, 'cat', '/var/lib/gpustack/log/serve/%d.log' % instance_id)
    assert proc.returncode == 0, proc.stderr
    found = ARGV_LINE.findall(proc.stdout)
    assert found, 'no argv line in the instance log:\n%s' % proc.stdout[-2000:]
    return json.loads(found[-1])


def _contains_in_order(argv, part):
    return any(argv[start:start + len(part)] == part for start in range(len(argv) - len(part) + 1))


def _watchdog_events(node, deployment):
    """The JSON events the deployment's watchdog logged (one object per journal line)."""
    proc = node_exec(node, 'journalctl', '--no-pager', '--output=cat', '-u', 'kvpin-watchdog-%s.service' % deployment)
    events = []
    for line in proc.stdout.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and event.get('target') == deployment:
            events.append(event)
    return events


def _worker_main_pid(node):
    proc = node_exec(node, 'systemctl', 'show', '--property=MainPID', '--value', 'gpustack.service')
    assert proc.returncode == 0, proc.stderr
    return int(proc.stdout.strip())


@pytest.fixture(scope='module')
def served(fleet):
    """The fleet after one site.yml run with the test's watchdog settings: the run's output and
    the running instances by deployment name."""
    site = playbook('--extra-vars', json.dumps(WATCHDOG_VARS), SITE)
    assert site.returncode == 0, site.stdout[-6000:] + site.stderr[-2000:]
    counts = recap(site.stdout)
    assert sorted(counts) == sorted(NODES) and all(c['failed'] == 0 for c in counts.values()), counts
    server = Server()
    return site.stdout, server, _wait_all_running(server, RUNNING_DEADLINE_S)


def test_site_yml_runs_the_models_phase_into_gpustack(served):
    output, server, _running = served
    assert 'models phase skipped' not in output
    models = server.models()
    for node, (name, backend, _pins) in DEPLOYMENTS.items():
        model = models[name]
        assert model['backend'] == backend
        assert model['source'] == 'local_path'
        assert model['worker_selector'] == {'worker-name': node}
        # What the planner printed for this deployment is exactly what GPUStack holds.
        assert 'args: %s' % ' '.join(model['backend_parameters']) in output, model['backend_parameters']


def test_gpustack_launches_each_engine_on_its_node_with_the_planners_pins(served):
    _output, server, running = served
    models = server.models()
    workers = server.workers()
    for node, (name, backend, pins) in DEPLOYMENTS.items():
        instance = running[name]
        assert instance['worker_name'] == node
        # GPUStack sees exactly the fixture's GPUs (fake nvidia-smi), and places the instance on them.
        fixture = lab_fleet.load_fixture(node)
        gpus = workers[node]['status']['gpu_devices']
        assert [(g['index'], g['name'], g['memory']['total']) for g in gpus] == [
            (i, d['name'], d['memory_total']) for i, d in enumerate(fixture['devices'])]
        parameters = models[name]['backend_parameters']
        argv = _engine_argv(node, instance['id'])
        if backend == 'vllm':
            assert os.path.basename(argv[0]) == 'vllm_0.10.1.1' and argv[1] == 'serve'
        else:
            assert os.path.basename(argv[0]) == 'llama-box'
        # The plan's flags arrive in order; GPUStack's own defaults come before them, so each pin
        # is the last occurrence of its flag (the one the engine's parser keeps).
        assert _contains_in_order(argv, list(parameters)), (parameters, argv)
        for pin in pins:
            planned = [p for p in parameters if p.startswith(pin + '=') or p == pin]
            assert planned, 'the plan for %s has no %s: %s' % (name, pin, parameters)
        if backend == 'vllm':
            tensor_parallel = [p for p in parameters if p.startswith('--tensor-parallel-size=')]
            if tensor_parallel:
                assert len(instance['gpu_indexes']) == int(tensor_parallel[0].split('=')[1])
        else:
            assert instance['gpu_indexes'] == [0]


def test_one_watchdog_per_deployment_without_a_written_target(served):
    _output, _server, _running = served
    inventory = lab_fleet.run([os.path.join(lab_fleet.VENV_BIN, 'ansible-inventory'), '-i', lab_fleet.INVENTORY,
                               '--list'])
    assert inventory.returncode == 0, inventory.stderr
    assert 'kvpin_watchdog_targets' not in inventory.stdout
    for node, (name, _backend, _pins) in DEPLOYMENTS.items():
        listing = node_exec(node, 'ls', '/etc/kvpin-watchdog')
        assert listing.returncode == 0, listing.stderr
        assert sorted(f for f in listing.stdout.split() if f.endswith('.json')) == ['%s.json' % name]
        active = node_exec(node, 'systemctl', 'is-active', 'kvpin-watchdog-%s.service' % name)
        assert active.stdout.strip() == 'active', active.stdout


def test_a_leak_gets_that_instance_alone_recycled_through_gpustack(served):
    _output, server, running = served
    leaky = DEPLOYMENTS[LEAKY_NODE][0]
    worker_pids = {node: _worker_main_pid(node) for node in NODES}
    before = {name: (instance['id'], instance['pid']) for name, instance in running.items()}
    workers = server.workers()
    target = running[leaky]
    injected_at = time.time()
    status, answer = _http('http://%s:%d/kvpin/leak' % (workers[LEAKY_NODE]['ip'], target['port']), 'POST',
                           {'mib_per_minute': LEAK_MIB_PER_MINUTE})
    assert status == 200, answer
    deadline = time.monotonic() + RECYCLE_DEADLINE_S
    while True:
        now = {name: [(i['id'], i['pid']) for i in found] for name, found in server.instances().items()}
        if now.get(leaky) and before[leaky] not in now[leaky]:
            break
        assert time.monotonic() < deadline, 'the leaking %s was not recycled within %ds: %s' % (
            leaky, RECYCLE_DEADLINE_S, node_exec(LEAKY_NODE, 'journalctl', '--no-pager', '-n', '30',
                                                 '-u', 'kvpin-watchdog-%s.service' % leaky).stdout)
        time.sleep(3)
    # The recycle went through GPUStack (a new instance), not through the worker unit: no
    # worker restarted, and every other deployment kept its instance and process.
    assert {node: _worker_main_pid(node) for node in NODES} == worker_pids
    current = {name: [(i['id'], i['pid']) for i in found] for name, found in server.instances().items()}
    for name, identity in before.items():
        if name != leaky:
            assert current[name] == [identity], (name, identity, current[name])
    # It was the deployment's own watchdog, on a leak verdict; it logs the recycle once the
    # replacement runs, which may be a little after GPUStack lists the new instance.
    deadline = time.monotonic() + RUNNING_DEADLINE_S
    while True:
        events = [e for e in _watchdog_events(LEAKY_NODE, leaky) if e.get('ts', 0) >= injected_at]
        recycles = [e for e in events if e['event'] == 'recycle']
        if recycles or time.monotonic() > deadline:
            break
        time.sleep(3)
    assert recycles and recycles[0].get('ok') is True, events[-5:]
    assert [e for e in events if e['event'] == 'decision' and e.get('action') == 'recycle'
            and str(e.get('diagnosis', '')).startswith('leak')], events[-5:]
    # The recreated instance comes back running (with a fresh, non-leaking engine).
    _wait_all_running(server, RUNNING_DEADLINE_S)
    for node, (name, _backend, _pins) in DEPLOYMENTS.items():
        if name != leaky:
            steady = [e for e in _watchdog_events(node, name) if e.get('ts', 0) >= injected_at]
            assert steady, 'no events from the watchdog of %s since the leak began' % name
            assert not [e for e in steady if e['event'] == 'recycle' or e.get('action') == 'recycle'], steady[-5:]
