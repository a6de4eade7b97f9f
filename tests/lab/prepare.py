# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""TEST-ONLY lab preparation on the host, called by scripts/lab.sh (never by a role).

    python tests/lab/prepare.py venv VENV_DIR NODE_PATH   the GPUStack 0.7.1 venv the lab shares
    python tests/lab/prepare.py models LAB_DIR            model dirs + engine stand-ins from inventory/lab
    python tests/lab/prepare.py server STATE_DIR TIMEOUT  wait for the lab server, make its API key

venv: GPUStack 0.7.1 pinned by tests/lab/requirements-gpustack071.txt, installed ONCE on the
host with /usr/bin/python3 (Debian's 3.11, the nodes' interpreter) and bind-mounted read-only
into the lab containers at NODE_PATH; the scripts' shebangs name NODE_PATH. Reinstalled only when
the requirements file changes. Then GPUStack's helper tools are seeded (it downloads them at start
otherwise, gpustack/worker/tools_manager.py prepare_tools): fastfetch, gguf-parser and llama-box
v0.0.171 (the engine stand-in) with the versions.json that makes GPUStack skip the download.

models: for each lab deployment whose ``gpustack.local_path`` lies under the lab's model root,
the file or directory GPUStack serves from: a HF-style directory with the catalog's config.json
(vLLM; GPUStack's scheduler reads it), or an empty .gguf file (llama-box: GPUStack only checks it
exists; the server does not see these, so it schedules without gguf-parser). And, for each vLLM
version the lab deploys, ``engines/vllm_<version>``: GPUStack 0.7.1 runs <bin_dir>/vllm_<version>
when a deployment names backend_version (gpustack/worker/backends/vllm.py); for each llama-box
version, ``engines/llama-box/llama-box-<version>/llama-box``, which the worker requires first.

server: waits until the server at STATE_DIR/server_url answers /healthz, then makes sure
STATE_DIR/api_key (0600) holds an API key the server accepts, creating one with the bootstrap
admin's password (STATE_DIR/bootstrap_password) when not. No secret is printed or put in argv.
"""

import base64
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
REQUIREMENTS = os.path.join(HERE, 'requirements-gpustack071.txt')
STANDINS = os.path.join(HERE, 'standins')
BASE_PYTHON = '/usr/bin/python3'
MARKER = 'kvpin-requirements.sha256'
# gpustack/worker/tools_manager.py (0.7.1): BUILTIN_LLAMA_BOX_VERSION, BUILTIN_GGUF_PARSER_VERSION,
# download_fastfetch's version.
LLAMA_BOX_VERSION = 'v0.0.171'
GGUF_PARSER_VERSION = 'v0.22.1'
FASTFETCH_VERSION = '2.25.0.1'
# The lab nodes (and the server container) have the fake nvidia-smi: GPUStack's device is cuda.
LLAMA_BOX_DIR = 'llama-box-%s-linux-amd64-cuda' % LLAMA_BOX_VERSION
# Where GPUStack reads models in the lab (inventory/lab host_vars gpustack.local_path).
NODE_MODEL_ROOT = '/var/lib/kvpin-lab/models'


def log(message):
    sys.stderr.write('lab: %s\n' % message)


def sha256(path):
    with open(path, 'rb') as handle:
        return hashlib.sha256(handle.read()).hexdigest()


def write_if_changed(path, data, mode):
    data = data if isinstance(data, bytes) else data.encode()
    try:
        with open(path, 'rb') as current:
            if current.read() == data and (os.stat(path).st_mode & 0o777) == mode:
                return False
    except OSError:
        pass
    os.makedirs(os.path.dirname(path), exist_ok=True)
    temporary = '%s.tmp.%d' % (path, os.getpid())
    # Created with its final mode: a secret is never readable by others, even for a moment.
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(descriptor, 'wb') as handle:
        handle.write(data)
    os.chmod(temporary, mode)
    os.replace(temporary, path)
    return True


def link_if_changed(path, target):
    if os.path.islink(path) and os.readlink(path) == target:
        return
    if os.path.lexists(path):
        os.remove(path)
    os.symlink(target, path)


def standin(name):
    with open(os.path.join(STANDINS, name), 'rb') as handle:
        return handle.read()


def install(venv, node_path):
    want = sha256(REQUIREMENTS)
    marker = os.path.join(venv, MARKER)
    try:
        with open(marker) as handle:
            if handle.read().strip() == want:
                log('gpustack venv %s is current (reused)' % venv)
                return
    except OSError:
        pass
    if os.path.exists(venv):
        shutil.rmtree(venv)
    log('installing GPUStack into %s (requirements %s)' % (venv, os.path.relpath(REQUIREMENTS, REPO)))
    subprocess.run([BASE_PYTHON, '-m', 'venv', venv], check=True)
    subprocess.run([os.path.join(venv, 'bin', 'python'), '-m', 'pip', 'install', '-q',
                    '--disable-pip-version-check', '-r', REQUIREMENTS], check=True)
    # Console scripts name the venv's interpreter by its host path: name the nodes' path instead.
    old = ('#!' + os.path.join(os.path.abspath(venv), 'bin', 'python')).encode()
    new = ('#!' + os.path.join(node_path, 'bin', 'python')).encode()
    for script in glob.glob(os.path.join(venv, 'bin', '*')):
        if os.path.islink(script) or not os.path.isfile(script):
            continue
        with open(script, 'rb') as handle:
            text = handle.read()
        if text.startswith(old):
            with open(script, 'wb') as handle:
                handle.write(new + text[len(old):])
    with open(marker, 'w') as handle:
        handle.write(want + '\n')


def seed_tools(venv):
    packages = glob.glob(os.path.join(venv, 'lib', 'python3*', 'site-packages', 'gpustack'))
    if not packages:
        raise SystemExit('lab: error: gpustack not installed in %s' % venv)
    bin_dir = os.path.join(packages[0], 'third_party', 'bin')
    write_if_changed(os.path.join(bin_dir, 'fastfetch', 'fastfetch'), standin('fastfetch'), 0o755)
    write_if_changed(os.path.join(bin_dir, 'gguf-parser', 'gguf-parser'), standin('gguf-parser'), 0o755)
    box_dir = os.path.join(bin_dir, 'llama-box', LLAMA_BOX_DIR)
    write_if_changed(os.path.join(box_dir, 'llama-box'), standin('kvpin-engine'), 0o755)
    # What tools_manager links at start; present and right, it skips the (read-only) write.
    link_if_changed(os.path.join(box_dir, 'llama-box-rpc-server'), 'llama-box')
    link_if_changed(os.path.join(bin_dir, 'llama-box', 'llama-box-default'), LLAMA_BOX_DIR)
    versions = {LLAMA_BOX_DIR: LLAMA_BOX_VERSION, 'gguf-parser': GGUF_PARSER_VERSION,
                'fastfetch': FASTFETCH_VERSION}
    write_if_changed(os.path.join(bin_dir, 'versions.json'), json.dumps(versions, indent=4, sort_keys=True), 0o644)


def lab_deployments():
    import yaml  # the controller venv's PyYAML (requirements.txt)
    for path in sorted(glob.glob(os.path.join(REPO, 'inventory', 'lab', 'host_vars', '*.yml'))):
        with open(path) as handle:
            host_vars = yaml.safe_load(handle) or {}
        yield from host_vars.get('kvpin_deployments') or []


def prepare_models(lab_dir):
    sys.path.insert(0, os.path.join(REPO, '.cache', 'collections'))
    from ansible_collections.kvpin.fleet.plugins.module_utils.plan import model_catalog  # noqa: E402
    models = os.path.join(lab_dir, 'models')
    engines = os.path.join(lab_dir, 'engines')
    # Mounted into the containers: they must exist even when nothing is in them.
    for directory in (os.path.join(models, 'hf'), os.path.join(models, 'gguf'), engines):
        os.makedirs(directory, exist_ok=True)
    for deployment in lab_deployments():
        local_path = (deployment.get('gpustack') or {}).get('local_path', '')
        version = deployment['backend_version']
        if deployment['backend'] == 'vllm':
            write_if_changed(os.path.join(engines, 'vllm_%s' % version), standin('kvpin-engine'), 0o755)
        elif deployment['backend'] == 'llama-box':
            # With backend_version set, the worker first looks for <bin_dir>/llama-box/llama-box-<version>
            # (tools_manager.install_versioned_llama_box); it then runs the built-in copy seeded above.
            write_if_changed(os.path.join(engines, 'llama-box', 'llama-box-%s' % version, 'llama-box'),
                             standin('kvpin-engine'), 0o755)
        if not local_path.startswith(NODE_MODEL_ROOT + '/'):
            continue
        host_path = os.path.join(models, os.path.relpath(local_path, NODE_MODEL_ROOT))
        if local_path.endswith('.gguf'):
            write_if_changed(host_path, b'', 0o644)
            continue
        name = deployment['model']
        name = model_catalog.ALIASES.get(name.lower(), name)
        config = {key.lower(): value for key, value in model_catalog.CATALOG.items()}[name.lower()]
        config = {key: value for key, value in config.items() if not key.startswith('_')}
        write_if_changed(os.path.join(host_path, 'config.json'), json.dumps(config, indent=2, sort_keys=True), 0o644)


KEY_REQUEST_TIMEOUT_S = 30


def _request(url, method='GET', body=None, headers=None, timeout=5):
    """(status, parsed JSON or None); the server is in a lab container (never redirected)."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers=dict(headers or {}))
    if data is not None:
        request.add_header('Content-Type', 'application/json')
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, raw = response.status, response.read(1 << 20)
    except urllib.error.HTTPError as error:
        status, raw = error.code, error.read(1 << 20)
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:
        return status, None


def _read(path):
    with open(path) as handle:
        return handle.read().strip()


def _request_until(deadline, url, *args, **kwargs):
    """_request, retried on a connection error or a read timeout until ``deadline`` (monotonic): a
    server that just answered /healthz may still be slow on a loaded machine."""
    while True:
        try:
            return _request(url, *args, **kwargs)
        except OSError as error:
            if time.monotonic() > deadline:
                raise SystemExit('lab: error: %s did not answer before the deadline: %s' % (url, error))
            log('%s: request failed (%s), trying again' % (url, error))
        time.sleep(1)


def server_ready(state_dir, timeout):
    url = _read(os.path.join(state_dir, 'server_url'))
    deadline = time.monotonic() + timeout
    while True:
        try:
            if _request(url + '/healthz', timeout=2)[0] == 200:
                break
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit('lab: error: %s/healthz did not answer 200 within %ds' % (url, timeout))
        time.sleep(1)
    key_path = os.path.join(state_dir, 'api_key')
    # The key requests hash a password or key on the server (CPU-bound): on a loaded machine one
    # takes longer than a health check, so each may take KEY_REQUEST_TIMEOUT_S and a timed-out
    # one is tried again until the deadline (_request_until).
    if os.path.exists(key_path):
        status, _unused = _request_until(deadline, url + '/v1/models', timeout=KEY_REQUEST_TIMEOUT_S,
                                         headers={'Authorization': 'Bearer ' + _read(key_path)})
        if status == 200:
            log('gpustack server %s ready (API key reused)' % url)
            return
    basic = base64.b64encode(('admin:' + _read(os.path.join(state_dir, 'bootstrap_password'))).encode()).decode()
    status, answer = _request_until(deadline, url + '/v1/api-keys', 'POST', {'name': 'kvpin-lab-%d' % time.time()},
                                    headers={'Authorization': 'Basic ' + basic}, timeout=KEY_REQUEST_TIMEOUT_S)
    if status != 200 or not isinstance(answer, dict) or not isinstance(answer.get('value'), str):
        raise SystemExit('lab: error: POST %s/v1/api-keys answered HTTP %s' % (url, status))
    write_if_changed(key_path, answer['value'], 0o600)
    log('gpustack server %s ready (API key written to %s, mode 0600)' % (url, key_path))


def main(argv):
    if len(argv) == 3 and argv[0] == 'venv':
        install(argv[1], argv[2])
        seed_tools(argv[1])
        return 0
    if len(argv) == 3 and argv[0] == 'server':
        server_ready(argv[1], int(argv[2]))
        return 0
    if len(argv) == 2 and argv[0] == 'models':
        prepare_models(argv[1])
        return 0
    sys.stderr.write(__doc__)
    return 2


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
