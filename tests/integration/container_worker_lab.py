# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A lab node that runs the GPUStack 2.x worker as a real container (issue 18), for
test_gpustack_worker_container.py. TEST-ONLY; the artefacts are in tests/lab/gpustack_worker_container/.

- The node: a systemd container from the lab's base image, like the fleet's nodes, but
  ``--privileged --cgroupns=private`` so that a container engine runs inside it (on this cgroup v1
  host a shared cgroup namespace makes runc compute nested cgroup paths outside the node's own,
  "stat /sys/fs/docker/<id>: no such file or directory"). Docker 20.10 from Debian 12 inside it,
  from .deb files downloaded on the host (``apt-get download``), with /var/lib/docker on a host
  directory (DOCKER_DIR) so that it uses overlay2, not vfs; podman is 4.3.1 on Debian 12, older
  than the 4.9 GPUStack's podman deployer needs, which the role refuses.
- The worker image: built offline on the host (podman build --squash-all, pip --no-index from a
  wheelhouse that ``pip download gpustack==2.3.0`` filled), then ``docker load``-ed into the node
  (one layer, unpacked once).
- The GPUs: the node's NVML stub library and fixture (tests/nvml_stub) are on the node; docker
  starts with no ``nvidia`` runtime (what the role's preflight must refuse), then
  register_nvidia_runtime() gives it the lab's stand-in for one, which applies a CDI spec binding
  the stub and the fixture into containers that ask for GPUs.
- The server: GPUStack 2.3.0 from the host venv (gpustack_server.py), with its PostgreSQL, in the
  node's own network namespace (``ip netns attach``): it listens on the node's loopback, where the
  worker container (``--network=host``) reaches it. Nothing leaves the node's namespace.
"""

import glob
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time

import gpustack_server
from lab_fleet import REPO_ROOT, STUB_LIB, VENV_BIN

LAB_FILES = os.path.join(REPO_ROOT, 'tests', 'lab', 'gpustack_worker_container')
PREFIX = os.environ.get('KVPIN_LAB_PREFIX', '')
NODE = 'lab-container-worker'
CONTAINER = PREFIX + NODE
BASE_IMAGE = os.environ.get('KVPIN_LAB_IMAGE', 'localhost/kvpin-node:bookworm')
IMAGE = 'localhost/kvpin-gpustack-worker:2.3.0'
FIXTURE = os.path.join(REPO_ROOT, 'tests', 'fixtures', 'nvml', 'lab-4090x2.json')
CACHE = os.path.join(REPO_ROOT, '.cache')
WHEELHOUSE = os.path.join(CACHE, 'gpustack-2.3.0-wheelhouse')
DEBS = os.path.join(CACHE, 'lab-docker-debs')
# Docker 20.10 and what Debian 12's minbase image lacks of its dependencies.
DEB_PACKAGES = ('docker.io', 'containerd', 'runc', 'tini', 'libdevmapper1.02.1', 'dmsetup', 'iptables',
                'libip4tc2', 'libip6tc2', 'libnetfilter-conntrack3', 'libnfnetlink0', 'libnftnl11',
                'libxtables12', 'libaio1', 'netbase')
# The node's /var/lib/docker: a host directory (the host's own file system, ext4 here) bind-mounted
# into the node, so that the nested docker picks overlay2; on the node's overlay root it can only
# use vfs, which copies the whole image for every layer on load and again for every container.
LAB_DIR = os.environ.get('KVPIN_LAB_DIR', os.path.join(REPO_ROOT, '.lab'))
DOCKER_DIR = os.path.join(LAB_DIR, CONTAINER + '-docker')
RUN_OPTS = ('--runtime', 'runc', '--ulimit', 'nofile=20000:20000', '--ulimit', 'nproc=20000:20000',
            '--systemd=always', '--privileged', '--cgroupns=private', '--volume', DOCKER_DIR + ':/var/lib/docker',
            # Only a loopback: the server and the worker meet there, and the worker's probes of
            # registry-1.docker.io and quay.io at start (gpustack/config/registration.py) fail at
            # once instead of waiting for a route that goes nowhere.
            '--network=none')
WORKER_TOOL_VERSIONS = gpustack_server.WORKER_TOOL_VERSIONS
# --squash-all: one layer, which the node's `docker load` unpacks once (not base + pip layers).
BUILD_OPTS = ('--runtime', 'runc', '--ulimit', 'nofile=20000:20000', '--ulimit', 'nproc=20000:20000',
              '--pull=never', '--network=none', '--squash-all')


def sh(argv, timeout=900, **kwargs):
    """subprocess.run with output captured; raises with the output when it fails."""
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, **kwargs)
    if proc.returncode != 0:
        raise RuntimeError('%s failed (%d):\n%s%s' % (' '.join(argv), proc.returncode, proc.stdout[-3000:],
                                                      proc.stderr[-3000:]))
    return proc.stdout


def node_exec(*argv, timeout=600):
    return sh(['podman', 'exec', CONTAINER] + list(argv), timeout=timeout)


def ensure_wheelhouse():
    """gpustack 2.3.0 and its dependencies as wheels (pip download, once per checkout)."""
    marker = os.path.join(WHEELHOUSE, 'kvpin-complete.txt')
    if not os.path.exists(marker):
        os.makedirs(WHEELHOUSE, exist_ok=True)
        sh([os.path.join(VENV_BIN, 'pip'), 'download', '-q', '--disable-pip-version-check', '--only-binary=:all:',
            'gpustack==2.3.0', '-d', WHEELHOUSE])
        with open(marker, 'w') as done:
            done.write('gpustack==2.3.0\n')
    return WHEELHOUSE


def ensure_debs():
    """Docker's .deb files for the node (apt-get download on the host, once per checkout)."""
    marker = os.path.join(DEBS, 'kvpin-complete.txt')
    if not os.path.exists(marker):
        os.makedirs(DEBS, exist_ok=True)
        sh(['apt-get', 'download'] + list(DEB_PACKAGES), cwd=DEBS)
        with open(marker, 'w') as done:
            done.write(' '.join(DEB_PACKAGES) + '\n')
    return sorted(glob.glob(os.path.join(DEBS, '*.deb')))


def _image_inputs():
    """{name in the build context: source path} besides the wheels."""
    return {'Containerfile': os.path.join(LAB_FILES, 'Containerfile'),
            'tools/fastfetch': os.path.join(REPO_ROOT, 'tests', 'lab', 'standins', 'fastfetch'),
            'tools/gguf-parser': os.path.join(REPO_ROOT, 'tests', 'lab', 'standins', 'gguf-parser')}


def _image_digest(wheels):
    digest = hashlib.sha256()
    for name, path in sorted(_image_inputs().items()):
        with open(path, 'rb') as source:
            digest.update(name.encode() + b'\0' + source.read() + b'\0')
    digest.update(json.dumps(sorted(os.listdir(wheels))).encode())
    digest.update(json.dumps(WORKER_TOOL_VERSIONS, sort_keys=True).encode())
    digest.update(json.dumps(BUILD_OPTS).encode())
    return digest.hexdigest()[:16]


def ensure_image(log=print):
    """The worker image on the host (podman build, offline); rebuilt when an input changed."""
    wheels = ensure_wheelhouse()
    digest = _image_digest(wheels)
    probe = subprocess.run(['podman', 'image', 'inspect', '--format', '{{index .Labels "kvpin.inputs"}}', IMAGE],
                           capture_output=True, text=True, check=False)
    if probe.returncode == 0 and probe.stdout.strip() == digest:
        return digest
    log('building %s (offline, from %s)' % (IMAGE, wheels))
    started = time.monotonic()
    context = tempfile.mkdtemp(prefix='kvpin-worker-image-')
    try:
        os.makedirs(os.path.join(context, 'tools'))
        shutil.copytree(wheels, os.path.join(context, 'wheels'), copy_function=os.link)
        for name, path in _image_inputs().items():
            shutil.copy(path, os.path.join(context, name))
        with open(os.path.join(context, 'tools', 'versions.json'), 'w') as versions:
            json.dump(WORKER_TOOL_VERSIONS, versions)
        argv = ['podman', 'build'] + list(BUILD_OPTS) + [
            '--label', 'kvpin.inputs=' + digest, '--build-arg', 'BASE=' + BASE_IMAGE, '-t', IMAGE, context]
        sh(argv, timeout=1800)
    finally:
        shutil.rmtree(context, ignore_errors=True)
    log('%s built in %.0f s' % (IMAGE, time.monotonic() - started))
    return digest


def node_state():
    proc = subprocess.run(['podman', 'container', 'inspect', '--format', '{{.State.Status}}', CONTAINER],
                          capture_output=True, text=True, check=False)
    return proc.stdout.strip() if proc.returncode == 0 else 'absent'


def remove_node():
    subprocess.run(['podman', 'rm', '-f', '-t', '5', CONTAINER], capture_output=True, check=False, timeout=120)
    # The nested docker's storage (overlay2 mounts end with the node's mount namespace).
    shutil.rmtree(DOCKER_DIR, ignore_errors=True)


def _reset_kept_node():
    """A node kept from an earlier run (KVPIN_KEEP_LAB=1) with the image loaded: put it back to
    the state start_node leaves (no worker, no nvidia runtime); False if it cannot be reused.
    Loading the image into the node's vfs storage is the slow part (minutes)."""
    if node_state() != 'running':
        return False
    if subprocess.run(['podman', 'exec', CONTAINER, 'docker', 'image', 'inspect', IMAGE],
                      capture_output=True, check=False, timeout=120).returncode != 0:
        return False
    node_exec('sh', '-c', 'systemctl disable --now gpustack-worker 2>/dev/null; '
                          'rm -f /etc/systemd/system/gpustack-worker.service* /etc/docker/daemon.json %s %s; '
                          'systemctl daemon-reload; docker rm -f gpustack-worker >/dev/null 2>&1; '
                          'rm -rf /var/lib/gpustack; systemctl restart docker' % (RUNTIME_STANDIN, CDI_SPEC))
    return True


def start_node(log=print):
    """A fresh node: docker installed and running WITHOUT the nvidia runtime, the NVML stub, the
    fixture and the CDI spec in place, the worker image loaded into its docker."""
    if os.environ.get('KVPIN_KEEP_LAB') == '1' and _reset_kept_node():
        log('%s: reused (KVPIN_KEEP_LAB=1)' % CONTAINER)
        return
    remove_node()
    os.makedirs(DOCKER_DIR, mode=0o700)
    sh(['podman', 'run', '-d', '--name', CONTAINER, '--hostname', NODE] + list(RUN_OPTS)
       + ['--label', 'kvpin.lab=1', BASE_IMAGE, '/sbin/init'])
    # --wait returns once boot finished ('degraded', rc 1, is booted too); right after the start
    # it fails until systemd's bus is up.
    for _attempt in range(60):
        booted = subprocess.run(['podman', 'exec', CONTAINER, 'systemctl', 'is-system-running', '--wait'],
                                capture_output=True, text=True, timeout=120, check=False)
        if booted.stdout.strip() in ('running', 'degraded'):
            break
        time.sleep(1)
    else:
        raise RuntimeError('%s did not boot: %s' % (CONTAINER, booted.stdout + booted.stderr))
    node_exec('mkdir', '-p', '/tmp/debs', '/etc/kvpin')
    for deb in ensure_debs():
        sh(['podman', 'cp', deb, '%s:/tmp/debs/' % CONTAINER])
    node_exec('sh', '-c', 'dpkg -i /tmp/debs/*.deb >/tmp/dpkg.log 2>&1 || { tail -20 /tmp/dpkg.log; exit 1; }; '
                          'rm -rf /tmp/debs')
    node_exec('systemctl', 'is-active', 'docker')
    driver = node_exec('docker', 'info', '--format', '{{.Driver}}').strip()
    if driver != 'overlay2':
        raise RuntimeError('the node\'s docker uses %r, not overlay2: loading the image would copy it per layer' % driver)
    for source, dest, mode in ((STUB_LIB, '/usr/local/lib/libnvidia-ml.so.1', '0755'),
                               (FIXTURE, '/etc/kvpin/nvml-stub.json', '0644')):
        sh(['podman', 'cp', source, '%s:%s' % (CONTAINER, dest)])
        node_exec('chmod', mode, dest)
    log('loading %s into the node' % IMAGE)
    started = time.monotonic()
    save = subprocess.Popen(['podman', 'save', '--format', 'docker-archive', IMAGE], stdout=subprocess.PIPE)
    try:
        sh(['podman', 'exec', '-i', CONTAINER, 'docker', 'load'], stdin=save.stdout, timeout=1200)
    finally:
        save.stdout.close()
        save.wait()
    log('%s loaded into the node in %.0f s' % (IMAGE, time.monotonic() - started))


RUNTIME_STANDIN = '/usr/local/bin/kvpin-nvidia-runtime-standin'
CDI_SPEC = '/etc/cdi/kvpin-nvml-stub.json'


def register_nvidia_runtime():
    """Give the node's docker an ``nvidia`` runtime: the lab's stand-in for the NVIDIA Container
    Toolkit's runtime (tests/lab/gpustack_worker_container/nvidia-runtime-standin), which applies
    a CDI spec that binds the NVML stub library and the node's fixture into a container asking for
    GPUs, then runs runc. What `nvidia-ctk runtime configure --runtime=docker` would write."""
    node_exec('mkdir', '-p', '/etc/cdi', '/etc/docker')
    for source, dest, mode in ((os.path.join(LAB_FILES, 'nvidia-runtime-standin'), RUNTIME_STANDIN, '0755'),
                               (os.path.join(LAB_FILES, 'nvml-stub-cdi.json'), CDI_SPEC, '0644')):
        sh(['podman', 'cp', source, '%s:%s' % (CONTAINER, dest)])
        node_exec('chmod', mode, dest)
    daemon = json.dumps({'runtimes': {'nvidia': {'path': RUNTIME_STANDIN}}})
    node_exec('sh', '-c', 'printf %s "$1" > /etc/docker/daemon.json && systemctl restart docker', 'sh', daemon)
    runtimes = json.loads(node_exec('docker', 'info', '--format', '{{json .Runtimes}}'))
    if 'nvidia' not in runtimes:
        raise RuntimeError('docker did not take the nvidia runtime: %s' % sorted(runtimes))


def node_pid():
    return sh(['podman', 'container', 'inspect', '--format', '{{.State.Pid}}', CONTAINER]).strip()


class NodeServer(gpustack_server.GpustackServer):
    """The GPUStack 2.3 server of gpustack_server.py, in the node's network namespace instead
    of a fresh one: the name is attached to the namespace the node's container holds."""

    def _make_netns(self):
        self.netns = 'kvpin-%s' % CONTAINER
        subprocess.run(['ip', 'netns', 'delete', self.netns], capture_output=True, check=False)
        subprocess.run(['ip', 'netns', 'attach', self.netns, node_pid()], check=True)
        # delete only detaches the name; the namespace lives as long as the node.
        self._netns_created = True
        enter = gpustack_server._enter_netns  # pylint: disable=protected-access
        self._executor = gpustack_server.ThreadPoolExecutor(max_workers=1, initializer=enter, initargs=(self.netns,))

    def _wait_healthy(self, timeout=300):
        # Observed: more than 90 s to the first /healthz (migrations) at a load average of 14
        # on 2 cores, with the image load and another lab running.
        super()._wait_healthy(timeout)

    def worker(self, name):
        """The server's record of worker ``name``, or None."""
        status, answer = self.http('GET', '/v2/workers?name=%s' % name)
        if status != 200:
            raise RuntimeError('GET /v2/workers: HTTP %s %s' % (status, answer))
        items = [item for item in (answer or {}).get('items', []) if item.get('name') == name]
        return items[0] if items else None

    def wait_ready(self, name, timeout=180):
        """The worker record once the server lists it ready with GPUs; raises after timeout."""
        deadline = time.monotonic() + timeout
        record = None
        while time.monotonic() < deadline:
            record = self.worker(name)
            if record and record.get('state') == 'ready' and (record.get('status') or {}).get('gpu_devices'):
                return record
            time.sleep(2)
        raise RuntimeError('worker %s not ready with GPUs after %ds: %s' % (name, timeout, record))

    def registration_token(self):
        status, registration = self.http('GET', '/v2/clusters/%d/registration-token' % self.cluster_id, auth='basic')
        if status != 200:
            raise RuntimeError('registration token: HTTP %s %s' % (status, registration))
        return registration['token']
