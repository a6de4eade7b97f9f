# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Scheduled traffic classes end to end on one lab node (needs root, podman and runc; skipped
otherwise): site.yml plans a deployment with two traffic classes as `scheduled`, installs its
profile switch timer (one OnCalendar per window edge, Persistent=true) and deploys the profile
due now into the lab's real GPUStack 0.7.1 server; triggering the window-edge unit switches the
deployment's backend parameters through GPUStack, which restarts the engine (the TEST-ONLY
stand-in, tests/lab/standins/kvpin-engine) with the new argv; a second trigger is a no-op; with
the server not answering (its container paused) the switch fails cleanly and the running
engine is left alone.

The unit is started as systemd starts it at an edge (`systemctl start <switch>.service`); the
only thing the test adds is a drop-in giving that service a TZ in which "now" falls in the
other window, so `--due` picks the other profile now instead of at the next edge.

Only lab-4090x2 and the server are brought up (KVPIN_LAB_PREFIX keeps them apart from other
fleets). Measured: 1021 s for the five tests on a 2-core machine at load average ~28 (other
fleets running): 620 s the first site.yml run and the engine's start, 188 s the switch,
144 s the unreachable server and the switch back, 30 s the -vvv rerun, 25 s the no-op.
"""

import json
import os
import re
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lab_fleet  # noqa: E402
from lab_fleet import REPO_ROOT, node_exec, playbook, recap  # noqa: E402
from test_lab_gpustack import Server, _engine_argv, _http, _watchdog_events  # noqa: E402

pytestmark = pytest.mark.lab

NODE = 'lab-4090x2'
NAME = 'llama-3.1-8b-classes'
SITE = os.path.join(REPO_ROOT, 'site.yml')
SWITCH = 'kvpin-profile-switch-%s' % NAME
DROP_IN_DIR = '/etc/systemd/system/%s.service.d' % SWITCH
DROP_IN = DROP_IN_DIR + '/kvpin-test-timezone.conf'
MARKER = '/run/kvpin-watchdog/profile-switch-%s.json' % NAME
RUNNING_DEADLINE_S = 420
SERVER_CONTAINER = os.environ.get('KVPIN_LAB_PREFIX', '') + 'lab-gpustack'


def _hours():
    """(chat hours, batch hours, the chat/batch edges): chat holds the controller's local now
    with an hour of margin before and three after, batch the rest of the day."""
    hour = time.localtime().tm_hour
    start, end = (hour - 1) % 24, (hour + 3) % 24
    return '%02d:00-%02d:00' % (start, end), '%02d:00-%02d:00' % (end, start), ('%02d:00' % start, '%02d:00' % end)


CHAT_HOURS, BATCH_HOURS, (CHAT_EDGE, BATCH_EDGE) = _hours()
# One GGUF deployment on one card: llama.cpp slots are ctx_size / parallel each, so one
# configuration cannot give 8 chat slots and 2 batch slots of 32k: the planner schedules.
DEPLOYMENT = {
    'name': NAME, 'backend': 'llama-box', 'backend_version': 'v0.0.171',
    'model': 'meta-llama/Llama-3.1-8B-Instruct', 'gpu_indexes': [0],
    'traffic_classes': [
        {'name': 'chat', 'prompt_tokens_p99': 2048, 'max_output_tokens': 512, 'max_concurrency': 8,
         'hours': CHAT_HOURS},
        {'name': 'batch', 'prompt_tokens_p99': 30000, 'max_output_tokens': 2048, 'max_concurrency': 2,
         'hours': BATCH_HOURS},
    ],
    'engine': {'quantization': 'Q4_K_M'},
    # The lab has no hub: GPUStack serves the lab's (empty) GGUF file; the engine is the stand-in.
    'gpustack': {'source': 'local_path', 'local_path': '/var/lib/kvpin-lab/models/gguf/llama-3.3-70b-q4km.gguf'},
}
EXTRA_VARS = {'kvpin_deployments': [DEPLOYMENT], 'serving_watchdog_interval_seconds': 5}
# A POSIX TZ twelve hours ahead of UTC (no zoneinfo file needed): with the controller and the
# node on UTC, "now" there is in the batch window (which is 20 of the day's 24 hours).
AHEAD_TZ = 'UTC-12'


def _ok(proc):
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def _site(*options):
    return playbook('--limit', NODE, '--extra-vars', json.dumps(EXTRA_VARS), SITE, *options)


def _instance(server, deadline_s=RUNNING_DEADLINE_S, not_pid=None, args=None):
    """The deployment's one running instance (another PID than not_pid; with args, one whose
    engine's argv ends with them: GPUStack restarts an instance a little after its record
    changes, so "running" alone may still be the previous engine)."""
    deadline = time.monotonic() + deadline_s
    while True:
        found = server.instances().get(NAME, [])
        if len(found) == 1 and found[0]['state'] == 'running' and found[0].get('pid') and found[0]['pid'] != not_pid:
            engine = _engine(found[0]['pid'])
            if args is None or (engine and _ends_with(engine[1], args)):
                return found[0]
        assert time.monotonic() < deadline, 'no running instance of %s%s after %ds: %s' % (
            NAME, ' with %s' % args if args else '', deadline_s,
            [(i['state'], i.get('pid'), (i.get('state_message') or '')[:300]) for i in found])
        time.sleep(3)


def _profiles():
    """The profiles site.yml gave the watchdog (its config on the node; the plan's args)."""
    text = _ok(node_exec(NODE, 'cat', '/etc/kvpin-watchdog/%s.json' % NAME)).stdout
    # JSON after the "Ansible managed" comment lines (the program drops '#' lines too).
    config = json.loads('\n'.join(line for line in text.splitlines() if not line.startswith('#')))
    return config['profiles'], config['profile_schedule']


def _engine(instance_pid):
    """(pid, argv) of the engine GPUStack runs for an instance: the child of the instance's
    process (GPUStack 0.7.1's "gpustack_serving_process"), read from the node's /proc;
    None when that process is gone."""
    children = node_exec(NODE, 'cat', '/proc/%d/task/%d/children' % (instance_pid, instance_pid))
    if children.returncode != 0 or not children.stdout.split():
        return None
    pid = int(children.stdout.split()[0])
    cmdline = node_exec(NODE, 'cat', '/proc/%d/cmdline' % pid)
    if cmdline.returncode != 0:
        return None
    argv = cmdline.stdout.split('\0')[:-1]
    # The stand-in is a Python script: its argv follows the interpreter.
    return pid, argv[1:] if os.path.basename(argv[0]).startswith('python') else argv


def _ends_with(argv, args):
    return argv[-len(args):] == list(args)


def _trigger():
    """Start the window-edge unit as its timer would; (returncode, journal of this start)."""
    since = _ok(node_exec(NODE, 'date', '+%Y-%m-%d %H:%M:%S')).stdout.strip()
    started = node_exec(NODE, 'systemctl', 'start', SWITCH + '.service')
    journal = node_exec(NODE, 'journalctl', '--no-pager', '--output=cat', '-u', SWITCH + '.service', '--since', since)
    return started.returncode, journal.stdout


def _set_drop_in(tz):
    if tz is None:
        node_exec(NODE, 'rm', '-rf', DROP_IN_DIR)
    else:
        _ok(node_exec(NODE, 'sh', '-c', 'mkdir -p %s && printf "[Service]\\nEnvironment=TZ=%s\\n" > %s'
                      % (DROP_IN_DIR, tz, DROP_IN)))
    _ok(node_exec(NODE, 'systemctl', 'daemon-reload'))


def _resume_server():
    """Unpause the server container if the test paused it (a no-op otherwise)."""
    state = lab_fleet.run(['podman', 'container', 'inspect', '--format', '{{.State.Status}}', SERVER_CONTAINER])
    if state.stdout.strip() == 'paused':
        _ok(lab_fleet.run(['podman', 'unpause', SERVER_CONTAINER]))


def _wait_server(server, deadline_s=180):
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            status, _answer = _http(server.url + '/healthz', timeout=5)
            if status == 200:
                return
        except OSError:
            pass
        assert time.monotonic() < deadline, 'the lab GPUStack server is not healthy after %ds' % deadline_s
        time.sleep(2)


@pytest.fixture(scope='module')
def scheduled(fleet):  # pylint: disable=unused-argument
    """The session's lab fleet (tests/integration/conftest.py); site.yml run on lab-4090x2 with the
    scheduled deployment; the deployment deleted from GPUStack afterwards."""
    # Earlier modules' site.yml runs put the inventory's deployment for this node into GPUStack;
    # its VRAM claim would keep the test's deployment from being placed. Out with it (the next
    # site.yml run puts it back).
    before = Server()
    for name, model in before.models().items():
        if name != NAME and model.get('worker_selector') == {'worker-name': NODE}:
            status, _answer = _http('%s/v1/models/%d' % (before.url, model['id']), 'DELETE', key=before.key)
            assert status in (200, 204), (name, status)
    site = _site()
    assert site.returncode == 0, site.stdout[-6000:] + site.stderr[-2000:]
    server = Server()
    instance = _instance(server, args=_profiles()[0]['chat'])
    yield {'site': site.stdout, 'server': server, 'instance': instance, 'engine': _engine(instance['pid'])}
    _set_drop_in(None)
    _resume_server()
    _wait_server(server)
    # The deployment is the test's own: out of GPUStack, so the node's inventory one has its GPUs.
    model = server.models().get(NAME)
    if model:
        status, _answer = _http('%s/v1/models/%d' % (server.url, model['id']), 'DELETE', key=server.key)
        assert status in (200, 204), status
    # The node keeps the test's watchdog and switch units until the next site.yml run, which
    # removes them with the deployment (a removed target).


def test_site_yml_installs_the_switch_timer_and_deploys_the_profile_due_now(scheduled):
    output, server = scheduled['site'], scheduled['server']
    profiles, schedule = _profiles()
    assert sorted(profiles) == ['batch', 'chat'] and profiles['chat'] != profiles['batch']
    assert sorted((edge['at'], edge['profile']) for edge in schedule) == sorted(
        [(CHAT_EDGE, 'chat'), (BATCH_EDGE, 'batch')])
    timer = _ok(node_exec(NODE, 'cat', '/etc/systemd/system/%s.timer' % SWITCH)).stdout
    assert re.findall(r'^OnCalendar=(.*)$', timer, re.MULTILINE) == [
        '*-*-* %s:00' % at for at in sorted((CHAT_EDGE, BATCH_EDGE))]
    assert 'Persistent=true' in timer.splitlines()
    assert node_exec(NODE, 'systemctl', 'is-enabled', SWITCH + '.timer').stdout.strip() == 'enabled'
    assert node_exec(NODE, 'systemctl', 'is-active', SWITCH + '.timer').stdout.strip() == 'active'
    # systemd itself reads both edges (its own calendar parser, not just the file's text).
    shown = _ok(node_exec(NODE, 'systemctl', 'show', '--property=TimersCalendar', SWITCH + '.timer')).stdout
    for at in (CHAT_EDGE, BATCH_EDGE):
        assert '*-*-* %s:00' % at in shown, shown
    assert '2 traffic classes: strategy scheduled (FEASIBLE)' in output
    # The models phase deployed the profile due now (chat), not the largest one.
    assert server.models()[NAME]['backend_parameters'] == profiles['chat']
    instance = scheduled['instance']
    # The plan's flags come last (after GPUStack's own defaults), so the engine's parser keeps them.
    assert _ends_with(_engine_argv(NODE, instance['id']), profiles['chat'])
    assert _ends_with(_engine(instance['pid'])[1], profiles['chat'])


def test_the_rerun_with_a_scheduled_deployment_is_one_remote_call_and_changes_nothing(scheduled):
    rerun = _site('-vvv')
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-2000:]
    sent = lab_fleet.modules_sent(rerun.stdout)
    assert sent.get(NODE) == ['gpu_facts'], sent
    assert recap(rerun.stdout)[NODE]['changed'] == 0
    assert '%s: in sync, nothing to change' % NODE in rerun.stdout
    # The models phase pushed the same (due) profile again: the engine did not restart.
    assert _instance(scheduled['server'])['pid'] == scheduled['instance']['pid']
    assert _engine(scheduled['instance']['pid']) == scheduled['engine']


def test_the_window_edge_unit_switches_the_profile_and_the_engine_restarts_with_the_new_argv(scheduled):
    server = scheduled['server']
    profiles, _schedule = _profiles()
    before = _instance(server)
    engine_before = _engine(before['pid'])
    assert engine_before and _ends_with(engine_before[1], profiles['chat'])
    _set_drop_in(AHEAD_TZ)
    switched_at = time.time()
    rc, journal = _trigger()
    assert rc == 0, journal
    assert 'Traceback' not in journal
    assert 'switched from profile chat to batch' in journal, journal
    assert server.models()[NAME]['backend_parameters'] == profiles['batch']
    after = _instance(server, not_pid=before['pid'], args=profiles['batch'])
    assert _ends_with(_engine_argv(NODE, after['id']), profiles['batch'])
    engine_after = _engine(after['pid'])
    assert engine_after[0] != engine_before[0] and _ends_with(engine_after[1], profiles['batch']), engine_after
    assert node_exec(NODE, 'test', '-e', '/proc/%d' % engine_before[0]).returncode != 0   # the old engine is gone
    # The watchdog read the switch marker: a profile switch, not a crash or a leak.
    marker = json.loads(_ok(node_exec(NODE, 'cat', MARKER)).stdout)
    assert marker['profile'] == 'batch'
    deadline = time.monotonic() + 60
    while True:
        events = [e for e in _watchdog_events(NODE, NAME) if e.get('ts', 0) >= switched_at]
        if [e for e in events if e.get('phase') == 'profile_switch'] or time.monotonic() > deadline:
            break
        time.sleep(3)
    assert [e for e in events if e.get('phase') == 'profile_switch'], events[-5:]
    assert not [e for e in events if e['event'] == 'recycle' or e.get('action') == 'recycle'], events[-5:]


def test_a_second_trigger_is_a_no_op(scheduled):
    server = scheduled['server']
    before = _instance(server)
    engine = _engine(before['pid'])
    parameters = server.models()[NAME]['backend_parameters']
    rc, journal = _trigger()
    assert rc == 0, journal
    assert 'already runs profile batch: nothing to do' in journal
    time.sleep(5)
    assert server.models()[NAME]['backend_parameters'] == parameters
    assert _instance(server)['pid'] == before['pid']
    assert _engine(before['pid']) == engine           # the same engine process, same argv


def test_with_the_server_down_the_switch_fails_cleanly_and_the_old_profile_keeps_running(scheduled):
    server = scheduled['server']
    profiles, _schedule = _profiles()
    running = _instance(server)
    engine = _engine(running['pid'])
    assert engine and _ends_with(engine[1], profiles['batch'])
    _set_drop_in(None)          # now due: chat again
    # Paused, the server answers nothing (its address stays; a stopped and restarted container
    # could get another one, which the workers' and watchdogs' configs hold).
    _ok(lab_fleet.run(['podman', 'pause', SERVER_CONTAINER]))
    try:
        rc, journal = _trigger()
        assert rc != 0, journal
        assert 'failed, nothing changed' in journal and 'keeps its current backend parameters' in journal, journal
        assert 'Traceback' not in journal
        assert server.key not in journal
        state = node_exec(NODE, 'systemctl', 'show', '--property=Result', '--value', SWITCH + '.service')
        assert state.stdout.strip() == 'exit-code'
        time.sleep(5)
        assert _engine(running['pid']) == engine        # the batch engine keeps running
    finally:
        _resume_server()
    _wait_server(server)
    # Back up, the server still holds batch and the same instance; the next edge's switch works.
    assert server.models()[NAME]['backend_parameters'] == profiles['batch']
    rc, journal = _trigger()
    assert rc == 0, journal
    assert server.models()[NAME]['backend_parameters'] == profiles['chat']
    after = _instance(server, not_pid=running['pid'], args=profiles['chat'])
    assert _ends_with(_engine(after['pid'])[1], profiles['chat'])
