# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A real GPUStack 2.3 server for tests, in a network namespace the test makes itself.

Layout (docs/lab.md, "A real GPUStack 2.3 server, without a GPU"):
- ``ip netns add kvpin-gs-<pid>`` with only ``lo`` up: nothing started here can reach or be
  reached from any other address;
- PostgreSQL from the Debian packages (``initdb --auth=trust`` as user postgres) on
  127.0.0.1 inside that namespace;
- ``gpustack==2.3.0`` from its own venv, cached under ``<repo>/.cache/gpustack-venv``;
- the server started with ``setsid`` so that its whole process group can be stopped.

The test process itself stays in the host namespace. Its HTTP calls run on one thread that
has entered the namespace (``setns`` is per thread), and commands (Ansible, module
subprocesses) run under ``ip netns exec``.
"""

from __future__ import annotations

import base64
import ctypes
import fcntl
import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GPUSTACK_REQUIREMENT = 'gpustack==2.3.0'
VENV_DIR = os.path.join(REPO_ROOT, '.cache', 'gpustack-venv')
# Written after a complete install, so an interrupted pip run is never mistaken for a venv.
VENV_MARKER = os.path.join(VENV_DIR, 'kvpin-installed.txt')
PG_BIN_CANDIDATES = ('/usr/lib/postgresql/15/bin', '/usr/lib/postgresql/16/bin', '/usr/lib/postgresql/17/bin')
# A fresh namespace has no other listeners, so fixed ports cannot collide.
PG_PORT = 55432
API_PORT = 30080
BOOTSTRAP_PASSWORD = 'Kvpin-test-pass-1'
CLONE_NEWNET = 0x40000000
STOP_GRACE_SECONDS = 5


# The worker downloads two helper tools from GitHub at start (gpustack/worker/tools_manager.py)
# and skips the download when they are already in the package with a matching versions.json.
# Nothing outside the namespace is reachable, so the test venv gets stand-ins
# (tests/lab/standins/fastfetch reports this machine from /proc; gguf-parser refuses: no GGUF
# model is evaluated in these tests).
WORKER_TOOL_VERSIONS = {'gguf-parser': 'v0.26.4', 'fastfetch': '2.25.0.1'}
# The fastfetch stand-in is shared with the lab's GPUStack 0.7.1 venv (scripts/lab.sh).
FASTFETCH_STANDIN_PATH = os.path.join(REPO_ROOT, 'tests', 'lab', 'standins', 'fastfetch')
GGUF_PARSER_STANDIN = '''#!/bin/sh
echo "gguf-parser is not installed in the kvpin test venv" >&2
exit 1
'''
WORKER_PORT = 10150
WORKER_METRICS_PORT = 10151


class ServerUnavailable(Exception):
    """This machine cannot run the server (the reason is the message): tests skip."""


def postgres_bin_dir():
    for candidate in PG_BIN_CANDIDATES:
        if os.path.exists(os.path.join(candidate, 'initdb')):
            return candidate
    return None


def check_prerequisites():
    """Raise ServerUnavailable with the reason when this machine cannot run the server."""
    if postgres_bin_dir() is None:
        raise ServerUnavailable('PostgreSQL server binaries (initdb) not installed: apt-get install postgresql')
    if os.geteuid() != 0:
        raise ServerUnavailable('creating a network namespace needs root')
    for tool in ('ip', 'runuser'):
        if shutil.which(tool) is None:
            raise ServerUnavailable('%s not found' % tool)


def base_python():
    """A Python 3.10-3.12 interpreter that is not itself inside a venv (gpustack's range)."""
    return os.path.join(getattr(sys, 'base_prefix', sys.prefix), 'bin', 'python3')


def ensure_venv(log=print):
    """Create the cached gpustack venv once per machine (about 35 s with a warm pip cache).
    A lock file serialises concurrent test runs sharing the checkout."""
    os.makedirs(os.path.dirname(VENV_DIR), exist_ok=True)
    with open(VENV_DIR + '.lock', 'w') as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(VENV_MARKER):
            return VENV_DIR
        if os.path.exists(VENV_DIR):
            shutil.rmtree(VENV_DIR)   # an interrupted install
        log('installing %s into %s' % (GPUSTACK_REQUIREMENT, VENV_DIR))
        subprocess.run([base_python(), '-m', 'venv', VENV_DIR], check=True)
        subprocess.run([os.path.join(VENV_DIR, 'bin', 'pip'), 'install', '-q', '--disable-pip-version-check',
                        GPUSTACK_REQUIREMENT], check=True)
        with open(VENV_MARKER, 'w') as marker:
            marker.write(GPUSTACK_REQUIREMENT + '\n')
    return VENV_DIR


def _write_if_changed(path, text, mode):
    """Write atomically, and only when different: another test run may be using the file."""
    try:
        with open(path) as current:
            if current.read() == text:
                return
    except OSError:
        pass
    temporary = '%s.tmp.%d' % (path, os.getpid())
    with open(temporary, 'w') as new:
        new.write(text)
    os.chmod(temporary, mode)
    os.replace(temporary, path)


def seed_worker_tools(venv):
    """Put the worker's helper tools (stand-ins, see FASTFETCH_STANDIN_PATH) into the venv."""
    packages = glob.glob(os.path.join(venv, 'lib', 'python3*', 'site-packages', 'gpustack'))
    if not packages:
        raise RuntimeError('gpustack package not found in %s' % venv)
    bin_dir = os.path.join(packages[0], 'third_party', 'bin')
    with open(FASTFETCH_STANDIN_PATH) as standin:
        # Its first line is the shebang: this venv's base interpreter instead.
        fastfetch = '#!%s\n' % base_python() + standin.read().split('\n', 1)[1]
    tools = {'fastfetch': fastfetch, 'gguf-parser': GGUF_PARSER_STANDIN}
    for tool, text in tools.items():
        os.makedirs(os.path.join(bin_dir, tool), exist_ok=True)
        _write_if_changed(os.path.join(bin_dir, tool, tool), text, 0o755)
    _write_if_changed(os.path.join(bin_dir, 'versions.json'), json.dumps(WORKER_TOOL_VERSIONS), 0o644)


def _port_accepts(port):
    try:
        socket.create_connection(('127.0.0.1', port), timeout=1).close()
        return True
    except OSError:
        return False


def _enter_netns(name):
    libc = ctypes.CDLL('libc.so.6', use_errno=True)
    fd = os.open('/run/netns/%s' % name, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, 'setns(%s): %s' % (name, os.strerror(err)))
    finally:
        os.close(fd)


def stop_process_group(process):
    """SIGTERM the group ``process`` leads, SIGKILL after STOP_GRACE_SECONDS."""
    if process is None or process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(STOP_GRACE_SECONDS)
    except subprocess.TimeoutExpired:
        # Observed: 2.3.0 does not always exit on SIGTERM within 5 s.
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    except ProcessLookupError:
        pass


class GpustackServer:
    """Start with ``start()``, stop with ``stop()``; see the module docstring."""

    def __init__(self, workdir=None):
        self.netns = 'kvpin-gs-%d' % os.getpid()
        self.workdir = workdir or tempfile.mkdtemp(prefix='kvpin-gpustack-')
        self.pg_dir = os.path.join(self.workdir, 'pg')
        self.data_dir = os.path.join(self.workdir, 'gpustack-data')
        self.server_log = os.path.join(self.workdir, 'gpustack-server.log')
        self.url = 'http://127.0.0.1:%d' % API_PORT
        self.password = BOOTSTRAP_PASSWORD
        self.api_key = None
        self.cluster_id = None
        self.timings = {}
        self._server = None
        self._workers = {}
        self._netns_created = False
        self._pg_started = False
        self._executor = None

    # -- running things inside the namespace ----------------------------------------------

    def netns_command(self, argv):
        return ['ip', 'netns', 'exec', self.netns] + list(argv)

    def run(self, argv, **kwargs):
        """subprocess.run of argv inside the namespace."""
        check = kwargs.pop('check', False)
        return subprocess.run(self.netns_command(argv), check=check, **kwargs)

    def call(self, function, *args, **kwargs):
        """Run function(*args, **kwargs) on the thread that lives in the namespace."""
        return self._executor.submit(function, *args, **kwargs).result()

    def http(self, method, path, body=None, auth='key', timeout=30):
        """One request to the server; returns (status, parsed JSON or text)."""
        return self.call(self._http, method, path, body, auth, timeout)

    def _http(self, method, path, body, auth, timeout):
        headers = {'Accept': 'application/json'}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers['Content-Type'] = 'application/json'
        if auth == 'basic':
            token = base64.b64encode(('admin:%s' % self.password).encode()).decode()
            headers['Authorization'] = 'Basic ' + token
        elif auth == 'key':
            headers['Authorization'] = 'Bearer ' + self.api_key
        request = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                status, raw = response.status, response.read()
        except urllib.error.HTTPError as error:
            status, raw = error.code, error.read()
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, raw.decode(errors='replace')

    # -- lifecycle ----------------------------------------------------------------------

    def start(self, log=print):
        check_prerequisites()
        t0 = time.monotonic()
        venv = ensure_venv(log)
        self.timings['venv_s'] = time.monotonic() - t0
        try:
            t1 = time.monotonic()
            self._make_netns()
            self._start_postgres()
            self.timings['postgres_s'] = time.monotonic() - t1
            t2 = time.monotonic()
            self._start_server(venv)
            self._wait_healthy()
            self.timings['server_s'] = time.monotonic() - t2
            self._bootstrap()
        except BaseException:
            self.stop()
            raise
        self.timings['total_s'] = time.monotonic() - t0
        return self

    def _make_netns(self):
        subprocess.run(['ip', 'netns', 'add', self.netns], check=True)
        self._netns_created = True
        self.run(['ip', 'link', 'set', 'lo', 'up'], check=True)
        self._executor = ThreadPoolExecutor(max_workers=1, initializer=_enter_netns, initargs=(self.netns,))

    def _start_postgres(self):
        pg_bin = postgres_bin_dir()
        os.makedirs(self.pg_dir)
        shutil.chown(self.workdir, user='postgres')
        shutil.chown(self.pg_dir, user='postgres')
        as_postgres = ['runuser', '-u', 'postgres', '--']
        subprocess.run(as_postgres + [os.path.join(pg_bin, 'initdb'), '-D', os.path.join(self.pg_dir, 'data'),
                                      '--auth=trust', '-U', 'postgres', '-E', 'UTF8'],
                       check=True, stdout=subprocess.DEVNULL)
        options = '-c listen_addresses=127.0.0.1 -p %d -k %s' % (PG_PORT, self.pg_dir)
        self.run(as_postgres + [os.path.join(pg_bin, 'pg_ctl'), '-D', os.path.join(self.pg_dir, 'data'),
                                '-o', options, '-l', os.path.join(self.pg_dir, 'postgres.log'), '-w', 'start'],
                 check=True, stdout=subprocess.DEVNULL)
        self._pg_started = True
        self.run([os.path.join(pg_bin, 'psql'), '-h', '127.0.0.1', '-p', str(PG_PORT), '-U', 'postgres',
                  '-q', '-c', 'CREATE DATABASE gpustack'], check=True)

    def server_env(self):
        env = dict(os.environ)
        # Nothing outside the namespace is reachable; stop the hub clients from trying.
        env.update(HF_HUB_OFFLINE='1', HF_HUB_DISABLE_TELEMETRY='1')
        return env

    def _start_server(self, venv):
        argv = [os.path.join(venv, 'bin', 'gpustack'), 'start',
                '--data-dir', self.data_dir,
                '--database-url', 'postgresql://postgres@127.0.0.1:%d/gpustack' % PG_PORT,
                '--gateway-mode', 'disabled', '--api-port', str(API_PORT),
                '--disable-builtin-observability', '--advertise-address', '127.0.0.1',
                '--disable-update-check', '--disable-metrics',
                '--bootstrap-password', self.password]
        with open(self.server_log, 'ab') as log_file:
            # start_new_session: the server leads its own process group, stopped as a whole.
            self._server = subprocess.Popen(self.netns_command(argv), stdout=log_file, stderr=subprocess.STDOUT,
                                            env=self.server_env(), start_new_session=True)

    def _wait_healthy(self, timeout=90):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._server.poll() is not None:
                raise RuntimeError('gpustack server exited with %s; last log lines:\n%s'
                                   % (self._server.returncode, self.log_tail()))
            try:
                status, _unused = self.http('GET', '/healthz', auth=None, timeout=2)
                if status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError('gpustack server not healthy after %ds; last log lines:\n%s' % (timeout, self.log_tail()))

    def _bootstrap(self):
        status, cluster = self.http('POST', '/v2/clusters', {'name': 'kvpin-test', 'provider': 'Docker'},
                                    auth='basic')
        if status != 200:
            raise RuntimeError('POST /v2/clusters answered %s: %s' % (status, cluster))
        self.cluster_id = cluster['id']
        status, key = self.http('POST', '/v2/api-keys', {'name': 'kvpin-test'}, auth='basic')
        if status != 200:
            raise RuntimeError('POST /v2/api-keys answered %s: %s' % (status, key))
        self.api_key = key['value']

    def start_worker(self, name, nvml_library_dir, nvml_fixture, timeout=120):
        """Start a native 2.3 worker named ``name`` in the namespace, seeing the GPUs of
        ``nvml_fixture`` through the NVML stub library in ``nvml_library_dir``. Returns the
        worker record once the server lists it ready with its GPUs."""
        seed_worker_tools(VENV_DIR)
        status, registration = self.http('GET', '/v2/clusters/%d/registration-token' % self.cluster_id, auth='basic')
        if status != 200:
            raise RuntimeError('registration token: HTTP %s %s' % (status, registration))
        data_dir = os.path.join(self.workdir, 'worker-%s' % name)
        env = self.server_env()
        env.update(GPUSTACK_TOKEN=registration['token'], LD_LIBRARY_PATH=nvml_library_dir,
                   KVPIN_NVML_STUB_CONFIG=nvml_fixture,
                   # gpustack-runtime looks for NVIDIA PCI devices before it loads NVML.
                   GPUSTACK_RUNTIME_DETECT_NO_PCI_CHECK='1')
        argv = [os.path.join(VENV_DIR, 'bin', 'gpustack'), 'start', '--server-url', self.url,
                '--data-dir', data_dir, '--worker-name', name, '--worker-ip', '127.0.0.1',
                # Loopback is the namespace's only interface; auto-detection skips it.
                '--worker-ifname', 'lo', '--advertise-address', '127.0.0.1',
                '--worker-port', str(WORKER_PORT), '--worker-metrics-port', str(WORKER_METRICS_PORT)]
        log_path = os.path.join(self.workdir, 'gpustack-worker-%s.log' % name)
        with open(log_path, 'ab') as log_file:
            self._workers[name] = subprocess.Popen(self.netns_command(argv), stdout=log_file,
                                                   stderr=subprocess.STDOUT, env=env, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._workers[name].poll() is not None:
                raise RuntimeError('worker %s exited; last log lines:\n%s' % (name, self.log_tail(path=log_path)))
            status, answer = self.http('GET', '/v2/workers?name=%s' % name)
            workers = (answer or {}).get('items', []) if status == 200 else []
            ready = workers and workers[0].get('state') == 'ready' and (workers[0].get('status') or {}).get('gpu_devices')
            # The worker registers before its own API listens; the scheduler calls that API
            # (e.g. to check a local model path), so wait for both.
            if ready and self.call(_port_accepts, WORKER_PORT):
                return workers[0]
            time.sleep(1)
        raise RuntimeError('worker %s not ready with GPUs after %ds; last log lines:\n%s'
                           % (name, timeout, self.log_tail(path=log_path)))

    def log_tail(self, lines=40, path=None):
        try:
            with open(path or self.server_log, errors='replace') as log_file:
                return ''.join(log_file.readlines()[-lines:])
        except OSError:
            return ''

    def stop(self):
        """Stop everything this object started; safe to call more than once."""
        for process in list(self._workers.values()) + [self._server]:
            stop_process_group(process)
        self._workers = {}
        if self._pg_started:
            subprocess.run(['runuser', '-u', 'postgres', '--', os.path.join(postgres_bin_dir(), 'pg_ctl'),
                            '-D', os.path.join(self.pg_dir, 'data'), '-m', 'fast', '-w', 'stop'],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
            self._pg_started = False
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        if self._netns_created:
            subprocess.run(['ip', 'netns', 'delete', self.netns], stderr=subprocess.DEVNULL, check=False)
            self._netns_created = False
        if os.environ.get('KVPIN_KEEP_GPUSTACK_WORKDIR') != '1':
            shutil.rmtree(self.workdir, ignore_errors=True)


if __name__ == '__main__':
    # Manual use: start a server, print how to reach it, stop on Enter or Ctrl-C.
    server = GpustackServer()
    try:
        server.start()
        print(json.dumps(dict(netns=server.netns, url=server.url, api_key=server.api_key,
                              cluster_id=server.cluster_id, timings=server.timings), indent=2))
        print('reach it with: ip netns exec %s curl %s/healthz' % (server.netns, server.url))
        input('press Enter to stop ')
    finally:
        server.stop()
