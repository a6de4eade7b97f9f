# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the rollout left on each lab node, checked against the node's own plans and fixture
(every scenario; fixtures in conftest.py).

The expected values are written here from their sources, not taken from the roles: GPUStack's
defaults (data dir /var/lib/gpustack, its unit gpustack.service), GPUStack's reading of
system_reserved (whole GiB, converted with << 30), the watchdog program's own check-config and
metrics, and the node's plans. A failing assertion never prints the worker config (it holds the
registration token): only fields taken out of it are compared.
"""

import json
import os
import re
import subprocess
import time
import urllib.request

import yaml

from kvpin_testinfra import read_lab_secret

GIB = 1 << 30
# GPUStack 0.7.x's data directory and unit (its installer's names; gpustack/config/config.py).
CONFIG_PATH = '/var/lib/gpustack/config.yaml'
WORKER_UNIT = 'gpustack.service'
# `systemd-analyze security` rates a unit 0 (locked down) .. 10 (no sandboxing at all). On the
# lab's systemd 252 the worker unit, as loaded, rates 8.0 (EXPOSED: it runs as root and must see
# the GPUs); the same unit without its hardening directives rates 9.6 (UNSAFE), and without any
# one of NoNewPrivileges, ProtectSystem, ProtectHome, PrivateTmp, ProtectKernelTunables,
# ProtectKernelModules or ProtectControlGroups 8.1 to 8.3 (measured with --offline, which rates
# the full unit 8.2). So the bound is the measured 8.0: any lost directive fails it.
WORKER_EXPOSURE_MAX = float(os.environ.get('KVPIN_TESTINFRA_WORKER_EXPOSURE_MAX', '8.0'))
# The watchdog program, its configs and its textfile metrics (serving_watchdog's documented paths).
WATCHDOG_PROGRAM = '/usr/local/lib/kvpin/kvpin_watchdog.py'
WATCHDOG_CONFIG_DIR = '/etc/kvpin-watchdog'
WATCHDOG_TEXTFILE_DIR = '/var/lib/prometheus/node-exporter'
# How long the engine check waits for GPUStack to (re)start an instance with the planned argv.
ENGINE_WAIT_S = float(os.environ.get('KVPIN_TESTINFRA_ENGINE_WAIT_S', '300'))
ARGV_LINE = re.compile(r'^kvpin-engine-standin argv: (\[.*\])$', re.MULTILINE)
# Test oracle, from nvml.h and the `nvidia-smi topo -m` legend: NVML's common-ancestor level ->
# the link name gpu_facts must report.
EXPECTED_LINK = {'INTERNAL': 'PIX', 'SINGLE': 'PIX', 'MULTIPLE': 'PXB', 'HOSTBRIDGE': 'PHB',
                 'NODE': 'NODE', 'SYSTEM': 'SYS'}


def expected_system_reserved(node):
    """GPUStack's system_reserved for the node's plans: vram per GPU = the largest
    system_reserved_bytes of its plans in whole GiB, rounded up (GPUStack reads int GiB << 30,
    so rounding down would book VRAM the plans keep free), at least the inventory's floor."""
    assert node.system_reserved_ram_gib is not None and node.system_reserved_vram_min_gib is not None, (
        'the inventory must state gpustack_worker_system_reserved_ram_gib and _vram_min_gib')
    largest = max([0] + [int(plan.get('system_reserved_bytes') or 0) for plan in node.plans])
    vram = (largest + GIB - 1) // GIB
    return {'ram': int(node.system_reserved_ram_gib), 'vram': max(vram, int(node.system_reserved_vram_min_gib))}


def worker_config(node):
    """The fields of the worker config the checks need, and whether its server URL and token are
    the lab's (the config itself is not kept: it holds the token)."""
    config = yaml.safe_load(node.host.file(CONFIG_PATH).content_string)
    assert isinstance(config, dict), '%s on %s is not a YAML mapping' % (CONFIG_PATH, node.name)
    fields = {key: config.get(key) for key in ('system_reserved', 'worker_name', 'worker_port', 'data_dir')}
    fields['server_url_is_the_labs'] = config.get('server_url') == read_lab_secret('server_url')
    fields['token_is_the_labs'] = config.get('token') == read_lab_secret('token')
    return fields


# -- GPUs: what the node reports is its fixture ---------------------------------------------

def test_gpus_are_the_fixtures(node):
    gpus, fixture = node.gpus, node.fixture
    devices = fixture['devices']
    assert gpus['driver_version'] == fixture['driver_version']
    # NVML's CUDA version is 1000 * major + 10 * minor (12080 -> "12.8").
    cuda = fixture['cuda_driver_version']
    assert gpus['cuda_driver_version'] == '%d.%d' % (cuda // 1000, cuda % 1000 // 10)
    assert gpus['gpu_count'] == len(devices)
    assert [g['index'] for g in gpus['gpus']] == list(range(len(devices)))
    assert [g['name'] for g in gpus['gpus']] == [d['name'] for d in devices]
    assert [g['memory_total'] for g in gpus['gpus']] == [d['memory_total'] for d in devices]
    for index, device in enumerate(devices):
        if 'uuid' in device:
            assert gpus['gpus'][index]['uuid'] == device['uuid']
        if 'pci_bus_id' in device:
            assert gpus['gpus'][index]['pci_bus_id'] == device['pci_bus_id']


def test_gpu_topology_is_the_fixtures(node):
    gpus, pairs = node.gpus, node.fixture.get('topology') or []
    count = gpus['gpu_count']
    assert len(gpus['topology']) == len(pairs) == count * (count - 1) // 2
    for pair in pairs:
        found = [t for t in gpus['topology'] if t['gpu_a'] in pair['gpus'] and t['gpu_b'] in pair['gpus']]
        assert len(found) == 1, pair['gpus']
        p2p = pair.get('p2p') or {}
        nvlink = p2p.get('nvlink', 'NOT_SUPPORTED') == 'OK'
        assert found[0]['p2p_read'] == (p2p.get('read', 'NOT_SUPPORTED') == 'OK'), pair['gpus']
        assert found[0]['p2p_write'] == (p2p.get('write', 'NOT_SUPPORTED') == 'OK'), pair['gpus']
        assert found[0]['nvlink'] == nvlink, pair['gpus']
        assert found[0]['link'] == ('NVLINK' if nvlink else EXPECTED_LINK[pair['common_ancestor']]), pair['gpus']


def test_every_deployment_has_a_feasible_plan(node):
    assert node.plan_error is None, node.plan_error
    assert len(node.plans) == len(node.deployments)
    for deployment, plan in zip(node.deployments, node.plans):
        assert plan.get('feasible') is True, (deployment['name'], plan.get('not_fitting'))
        assert isinstance(plan.get('args'), list) and plan['args'], deployment['name']


# -- The GPUStack worker config ------------------------------------------------------------

def test_worker_config_is_private_to_root(node):
    config = node.host.file(CONFIG_PATH)
    assert config.is_file
    assert config.mode == 0o600, oct(config.mode)
    assert (config.user, config.group) == ('root', 'root')
    # No backup of it (a copy of the token) left next to it by a rollback.
    leftovers = node.host.check_output('find /var/lib/gpustack -maxdepth 1 -name "config.yaml?*"')
    assert leftovers == ''


def test_worker_config_reserves_what_the_plans_ask(node):
    fields = worker_config(node)
    assert fields['system_reserved'] == expected_system_reserved(node)
    assert fields['worker_name'] == node.name
    assert fields['data_dir'] == '/var/lib/gpustack'
    assert fields['server_url_is_the_labs'], 'server_url is not the lab server\'s'
    assert fields['token_is_the_labs'], 'the registration token is not the lab\'s'


# -- The worker unit --------------------------------------------------------------------------

def test_worker_unit_enabled_active_and_running_its_config(node):
    service = node.host.service(WORKER_UNIT)
    assert service.is_enabled
    assert service.is_running
    shown = node.systemd_show(WORKER_UNIT, 'ActiveState', 'SubState', 'NeedDaemonReload', 'NRestarts')
    assert (shown['ActiveState'], shown['SubState']) == ('active', 'running')
    # systemd runs the unit file on disk, and the process started after the config was written.
    assert shown['NeedDaemonReload'] == 'no'
    started = node.unix_time(WORKER_UNIT, 'ExecMainStartTimestamp')
    assert started >= int(node.host.file(CONFIG_PATH).mtime.timestamp()), 'the worker started before its config changed'


def test_worker_unit_is_hardened(node):
    out = node.host.run('systemd-analyze security --no-pager %s', WORKER_UNIT)
    found = re.search(r'Overall exposure level for \S+: ([0-9.]+)', out.stdout + out.stderr)
    assert found, out.stdout[-2000:] + out.stderr[-2000:]
    exposure = float(found.group(1))
    assert exposure <= WORKER_EXPOSURE_MAX, 'exposure %.1f > %.1f' % (exposure, WORKER_EXPOSURE_MAX)
    shown = node.systemd_show(WORKER_UNIT, 'NoNewPrivileges', 'ProtectSystem', 'ProtectHome', 'PrivateTmp')
    assert shown == {'NoNewPrivileges': 'yes', 'ProtectSystem': 'strict', 'ProtectHome': 'yes', 'PrivateTmp': 'yes'}


def test_worker_health_endpoint_answers(node):
    port = int(worker_config(node)['worker_port'])
    probe = ('import urllib.request as u; '
             'print(u.urlopen("http://127.0.0.1:%d/healthz", timeout=5).status)' % port)
    out = node.host.run('python3 -c %s', probe)
    assert out.rc == 0 and out.stdout.strip() == '200', out.stdout[-500:] + out.stderr[-1000:]


# -- One watchdog per deployment ------------------------------------------------------------

def test_one_watchdog_unit_per_deployment(node):
    expected = sorted('kvpin-watchdog-%s.service' % d['name'] for d in node.deployments) if node.watchdogs else []
    listed = node.host.check_output(
        'systemctl list-units --all --plain --no-legend --no-pager "kvpin-watchdog-*.service"')
    found = sorted(line.split()[0] for line in listed.splitlines() if line.strip())
    assert found == expected


def test_watchdogs_active_with_a_valid_config(node):
    for deployment in node.deployments if node.watchdogs else []:
        unit = 'kvpin-watchdog-%s.service' % deployment['name']
        service = node.host.service(unit)
        assert service.is_enabled, unit
        assert service.is_running, unit
        check = node.host.run('python3 %s check-config --config %s/%s.json',
                              WATCHDOG_PROGRAM, WATCHDOG_CONFIG_DIR, deployment['name'])
        assert check.rc == 0, '%s: %s' % (unit, check.stderr[-1000:])


def test_each_watchdog_runs_as_the_system_account_made_for_it(node):
    # serving_watchdog's documented account (defaults: kvpin-watchdog, its own group), created
    # without a login shell or a home, as Debian's useradd --system numbers it (below UID 1000).
    if not (node.watchdogs and node.deployments):
        return
    user = node.host.user('kvpin-watchdog')
    assert user.exists
    assert user.group == 'kvpin-watchdog'
    assert user.uid < 1000 and user.shell == '/usr/sbin/nologin' and user.home == '/nonexistent'
    assert not node.host.file('/nonexistent').exists
    for deployment in node.deployments:
        unit = 'kvpin-watchdog-%s.service' % deployment['name']
        assert node.host.check_output('systemctl show -p User --value %s', unit) == 'kvpin-watchdog', unit
        # Whether it runs is test_watchdogs_active_with_a_valid_config's fact; when it does, as whom.
        pid = node.host.check_output('systemctl show -p MainPID --value %s', unit)
        if pid != '0':
            owner = node.host.check_output('ps -o user= -p %s', pid).strip()
            assert owner in ('kvpin-watchdog', 'kvpin-w+'), (unit, owner)   # ps cuts names at 8


def watchdog_config(node, name):
    """A watchdog's config as its program reads it: JSON after dropping the '#' lines."""
    text = node.host.file('%s/%s.json' % (WATCHDOG_CONFIG_DIR, name)).content_string
    return json.loads('\n'.join(line for line in text.splitlines() if not line.lstrip().startswith('#')))


def test_watchdog_metrics_present_and_fresh(node):
    for deployment in node.deployments if node.watchdogs else []:
        name = deployment['name']
        config = watchdog_config(node, name)
        interval = float(config['interval_seconds'])
        metrics = node.host.file('%s/kvpin_watchdog_%s.prom' % (WATCHDOG_TEXTFILE_DIR, name))
        assert metrics.is_file, name
        # node_exporter runs as another user: the textfile must be readable by it.
        assert metrics.mode & 0o004, oct(metrics.mode)
        found = re.search(r'^kvpin_watchdog_last_tick_timestamp_seconds\{[^}]*target="%s"[^}]*\} (\S+)$'
                          % re.escape(name), metrics.content_string, re.MULTILINE)
        assert found, '%s: no last tick in its metrics' % name
        now = float(node.host.check_output('date +%s'))
        age = now - float(found.group(1))
        # A tick each interval; two missed ticks (plus a tick's own time) is a stalled watchdog.
        assert -5 <= age <= 2 * interval + 30, '%s: last tick %.0f s ago (interval %.0f s)' % (name, age, interval)


# -- The pinned engine arguments reach GPUStack and the engine ----------------------------------

def _gpustack(path):
    request = urllib.request.Request(read_lab_secret('server_url') + path, headers={
        'Accept': 'application/json', 'Authorization': 'Bearer ' + read_lab_secret('api_key')})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read(1 << 22))['items']


def _contains_in_order(argv, part):
    return any(argv[start:start + len(part)] == part for start in range(len(argv) - len(part) + 1))


def _engine_argv(node, model_id):
    """(argv, why, GPU indexes): the argv the engine of the model's running instance on this node
    printed at its latest start (GPUStack's instance log) and the GPUs GPUStack gave that instance,
    or None, a reason why there is none yet, and None."""
    instances = [i for i in _gpustack('/v1/model-instances?perPage=100')
                 if i['model_id'] == model_id and i.get('worker_name') == node.name]
    running = [i for i in instances if i['state'] == 'running']
    if not running:
        return None, 'instances on %s: %s' % (node.name, [(i['state'], (i.get('state_message') or '')[:200])
                                                          for i in instances]), None
    log = node.host.file('/var/lib/gpustack/log/serve/%d.log' % running[0]['id'])
    found = ARGV_LINE.findall(log.content_string) if log.exists else []
    if not found:
        return None, 'no argv line in instance %d\'s log' % running[0]['id'], None
    return json.loads(found[-1]), 'instance %d' % running[0]['id'], running[0].get('gpu_indexes')


def test_pinned_engine_arguments_reach_gpustack_and_the_engine(node):
    models = {m['name']: m for m in _gpustack('/v1/models?perPage=100')}
    for deployment, plan in zip(node.deployments, node.plans):
        model = models.get(deployment['name'])
        assert model is not None, '%s is not deployed in GPUStack' % deployment['name']
        assert model['backend_parameters'] == plan['args']
        assert model['worker_selector'] == {'worker-name': node.name}
        # The plan's GPUs (the inventory's pin or the planner's choice) reach GPUStack's GPU
        # selector as <worker>:cuda:<index>; a plan without them leaves the placement to GPUStack.
        pinned = plan.get('gpu_indexes')
        selected = (model.get('gpu_selector') or {}).get('gpu_ids')
        if pinned:
            assert sorted(selected or []) == ['%s:cuda:%d' % (node.name, i) for i in sorted(pinned)], (
                deployment['name'], pinned, model.get('gpu_selector'))
        else:
            assert not selected, (deployment['name'], model.get('gpu_selector'))
        # GPUStack puts its own defaults first: each pin must arrive, in order, after them.
        deadline = time.monotonic() + ENGINE_WAIT_S
        while True:
            argv, why, gpus = _engine_argv(node, model['id'])
            if argv is not None and _contains_in_order(argv, plan['args']):
                break
            assert time.monotonic() < deadline, '%s: the engine did not start with %s within %.0f s (%s; argv %s)' % (
                deployment['name'], plan['args'], ENGINE_WAIT_S, why, argv)
            time.sleep(3)
        if pinned:
            assert gpus and set(gpus) <= set(pinned), (deployment['name'], pinned, gpus)


# -- No secret in a world-readable file ---------------------------------------------------------

# Runs on the node (python3 there): walks the directories the rollout and GPUStack write, keeps
# to what any user can reach (every directory on the way o+x, the file o+r) and names each file
# holding one of the secrets read from stdin (one per line; they never appear in argv).
_SECRET_SCAN = r'''
import os, stat, sys
secrets = [s.encode() for s in sys.stdin.read().split("\n") if s]
roots = ["/etc", "/var", "/run", "/tmp", "/root", "/home", "/srv", "/opt", "/usr/local"]
skip = {"/opt/gpustack/venv", "/var/lib/kvpin-lab/models"}
def reachable(path):
    while path not in ("/", ""):
        try:
            if not os.stat(path).st_mode & stat.S_IXOTH:
                return False
        except OSError:
            return False
        path = os.path.dirname(path)
    return True
for root in roots:
    if not reachable(root):
        continue
    for top, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if os.path.join(top, d) not in skip
                   and not os.path.islink(os.path.join(top, d))
                   and os.lstat(os.path.join(top, d)).st_mode & stat.S_IXOTH]
        for name in files:
            path = os.path.join(top, name)
            try:
                st = os.lstat(path)
                if not stat.S_ISREG(st.st_mode) or not st.st_mode & stat.S_IROTH:
                    continue
                with open(path, "rb") as handle:
                    data = handle.read(16 << 20)
            except OSError:
                continue
            if any(s in data for s in secrets):
                print(path)
'''


def test_no_secret_in_a_world_readable_file(node):
    secrets = [read_lab_secret(name) for name in ('token', 'api_key', 'bootstrap_password')]
    assert all(len(s) >= 16 for s in secrets)
    proc = subprocess.run(['podman', 'exec', '-i', node.container, 'python3', '-c', _SECRET_SCAN],
                          input='\n'.join(secrets) + '\n', capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == [], 'world-readable files holding a GPUStack secret'
