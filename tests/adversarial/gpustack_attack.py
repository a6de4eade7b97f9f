# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Helpers of the adversarial suite: a small GPUStack look-alike on the hostile servers of
attacker_http.py (its routes a test can replace one by one), the secret grep, and runners of
a module or playbook as Ansible runs them. The fixtures are in conftest.py (a module of its own
name, because tests/unit/watchdog has a conftest.py too and both dirs are on sys.path)."""

import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from attacker_http import json_body  # noqa: E402  pylint: disable=wrong-import-position

REPO_ROOT = os.path.dirname(os.path.dirname(HERE))
MODULES_DIR = os.path.join(REPO_ROOT, 'plugins', 'modules')
VENV_BIN = os.path.dirname(sys.executable)

# A key of GPUStack's shape; tests also use it with whitespace around it.
API_KEY = 'gpustack_5ec7e7a1b2c3d4e5_0f1e2d3c4b5a69788796a5b4c3d2e1f0'


def secret_forms(key):
    """Every form of ``key`` that must never be printed: as given, stripped, repr-escaped (how a
    Python error shows it), and its halves (through a URL or a truncated header dump)."""
    stripped = key.strip()
    forms = {key, stripped, repr(key)[1:-1], 'Bearer ' + stripped}
    forms.update(part for part in stripped.split('_') if len(part) >= 12)
    return sorted(f for f in forms if f.strip())


def assert_no_secret(text, key=API_KEY):
    for form in secret_forms(key):
        assert form not in text, 'secret form %r leaked' % form


def collections_root():
    for entry in sys.path:
        if os.path.isdir(os.path.join(entry, 'ansible_collections', 'kvpin', 'fleet')):
            return entry
    raise RuntimeError('ansible_collections.kvpin.fleet is not on sys.path (tests/conftest.py sets it up)')


class FakeGpustack:
    """GPUStack 2.x management routes (models and workers, paged lists) over an AttackerServer.
    ``models`` and ``workers`` are the records (dicts with id and name); ``override(method, path,
    behaviour)`` replaces one route with a hostile behaviour."""

    def __init__(self, server, models=None, workers=None, version='v2'):
        self.server = server
        self.url = server.url
        self.version = version
        # Deep copies: the test's records stay as they were written.
        self.models = {m['id']: json.loads(json.dumps(m)) for m in models or []}
        self.workers = {w['id']: json.loads(json.dumps(w)) for w in workers or []}
        self.overrides = {}
        prefix = '/' + version
        server.route('GET', prefix + '/models', self._route('GET', prefix + '/models', self._list(self.models)))
        server.route('POST', prefix + '/models', self._route('POST', prefix + '/models', self._create))
        server.route('GET', prefix + '/workers', self._route('GET', prefix + '/workers', self._list(self.workers)))
        server.route('POST', prefix + '/workers/labels', self._route('POST', prefix + '/workers/labels', self._merge))
        for record_id in list(self.models):
            self._record_routes('models', self.models, record_id)
        for record_id in list(self.workers):
            self._record_routes('workers', self.workers, record_id)
        if version == 'v2':
            server.route('GET', '/v1/models', json_body(404, {'message': 'Not Found'}))

    def override(self, method, path, behaviour):
        self.overrides[(method, path)] = behaviour

    def _route(self, method, path, handler):
        def route(request):
            if (method, path) in self.overrides:
                return self.overrides[(method, path)]
            return handler(request)
        return route

    def _record_routes(self, resource, store, record_id):
        path = '/%s/%s/%s' % (self.version, resource, record_id)

        def get(_request):
            return json_body(200, store[record_id])

        def put(request):
            record = json.loads(request['body'])
            store[record_id] = dict(record, id=record_id)
            return json_body(200, store[record_id])

        def delete(_request):
            store.pop(record_id, None)
            return json_body(200, None)
        self.server.route('GET', path, self._route('GET', path, get))
        self.server.route('PUT', path, self._route('PUT', path, put))
        self.server.route('DELETE', path, self._route('DELETE', path, delete))

    @staticmethod
    def _list(store):
        def handler(_request):
            items = list(store.values())
            return json_body(200, {'items': items, 'pagination': {'page': 1, 'perPage': 100, 'total': len(items),
                                                                  'totalPage': 1}})
        return handler

    def _create(self, request):
        record = json.loads(request['body'])
        record_id = max(list(self.models) + [0]) + 1
        self.models[record_id] = dict(record, id=record_id)
        self._record_routes('models', self.models, record_id)
        return json_body(200, self.models[record_id])

    def _merge(self, request):
        body = json.loads(request['body'])
        for worker_id in body['worker_ids']:
            self.workers[worker_id].setdefault('labels', {}).update(body['labels'])
        return json_body(200, None)


def run_module(module, args, check=False, diff=False):
    """Run plugins/modules/<module>.py as Ansible runs it (ANSIBLE_MODULE_ARGS on stdin);
    return (result dict, stdout + stderr)."""
    payload = dict(args, _ansible_check_mode=check, _ansible_diff=diff)
    env = dict(os.environ, PYTHONPATH=collections_root())
    env.pop('GPUSTACK_API_KEY', None)
    completed = subprocess.run([sys.executable, os.path.join(MODULES_DIR, module + '.py')],
                               input=json.dumps(dict(ANSIBLE_MODULE_ARGS=payload)), env=env,
                               capture_output=True, text=True, timeout=120, check=False)
    try:
        result = json.loads(completed.stdout)
    except ValueError:
        raise AssertionError('module printed no JSON (rc %s):\nstdout: %s\nstderr: %s'
                             % (completed.returncode, completed.stdout, completed.stderr))
    return result, completed.stdout + completed.stderr


def run_playbook(tmp_path, playbook_text, extra_vars, *options, environment=None):
    """ansible-playbook on localhost (local connection) with ``options`` (e.g. -vvv, --diff),
    ``environment`` added to this process's."""
    playbook = tmp_path / 'play.yml'
    playbook.write_text(playbook_text)
    vars_file = tmp_path / 'vars.json'
    vars_file.write_text(json.dumps(extra_vars))
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=collections_root(), ANSIBLE_NOCOLOR='1',
               ANSIBLE_LOCALHOST_WARNING='0', ANSIBLE_INVENTORY_UNPARSED_WARNING='0',
               ANSIBLE_CONFIG=os.path.join(REPO_ROOT, 'ansible.cfg'), **(environment or {}))
    argv = [os.path.join(VENV_BIN, 'ansible-playbook')] + list(options) + [
        '-i', 'localhost,', '-c', 'local', '-e', 'ansible_python_interpreter=%s' % sys.executable,
        '-e', '@%s' % vars_file, str(playbook)]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, cwd=REPO_ROOT, check=False)
