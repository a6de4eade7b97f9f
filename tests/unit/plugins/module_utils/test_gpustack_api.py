# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""module_utils/gpustack/api.py, the GPUStack API facts the collection and the watchdog share:
the detection rule against a scripted ``status_of``, routes, that the file needs nothing but the
standard library (it ships alone next to the watchdog program), and that every literal copy of
the API version list Ansible reads as YAML (doc fragment, role argument specs and validate
tasks, filter and module docs) agrees with it."""

from __future__ import annotations

import ast
import glob
import os
import re
import subprocess
import sys

import pytest
import yaml

from ansible_collections.kvpin.fleet.plugins.doc_fragments.gpustack import ModuleDocFragment
from ansible_collections.kvpin.fleet.plugins.module_utils.gpustack import api, records
from ansible_collections.kvpin.fleet.plugins.module_utils.gpustack.api import (
    API_VERSION_AUTO, API_VERSION_CHOICES, API_VERSIONS, DETECTION_ORDER, ApiVersionError,
    detect_api_version, detection_path, route,
)
from ansible_collections.kvpin.fleet.plugins.module_utils.gpustack.client import gpustack_connection_argument_spec

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
API_FILE = os.path.join(ROOT, 'plugins', 'module_utils', 'gpustack', 'api.py')


class Server:
    """``status_of`` for detect_api_version: answers each path from ``statuses`` (404 when not
    listed) and records the paths asked, in order."""

    def __init__(self, **statuses):
        self.statuses = {'/%s/models' % version: status for version, status in statuses.items()}
        self.asked = []

    def __call__(self, path):
        self.asked.append(path)
        return self.statuses.get(path, 404)


# -- the lists ----------------------------------------------------------------------------

def test_the_version_lists():
    assert API_VERSIONS == ('v1', 'v2')
    assert API_VERSION_AUTO == 'auto'
    assert API_VERSION_CHOICES == ('auto', 'v1', 'v2')
    assert DETECTION_ORDER == ('v2', 'v1')
    assert sorted(DETECTION_ORDER) == sorted(API_VERSIONS)


def test_detection_paths_are_the_model_lists():
    assert [detection_path(version) for version in DETECTION_ORDER] == ['/v2/models', '/v1/models']


def test_route_of_a_resource_and_of_one_record():
    assert route('v2', 'models') == '/v2/models'
    assert route('v1', 'model-instances', 7) == '/v1/model-instances/7'
    assert route('v2', 'workers/labels') == '/v2/workers/labels'


@pytest.mark.parametrize('version', ['auto', 'v3', None, ''])
def test_route_needs_a_generation(version):
    with pytest.raises(ApiVersionError, match='must be one of v1, v2'):
        route(version, 'models')


def test_records_keeps_the_server_owned_fields_of_api():
    assert records.SERVER_OWNED_MODEL_FIELDS is api.SERVER_OWNED_MODEL_FIELDS
    assert 'id' in api.SERVER_OWNED_MODEL_FIELDS and 'name' not in api.SERVER_OWNED_MODEL_FIELDS


def test_running_instance_states():
    assert api.INSTANCE_STATES_RUNNING == ('running',)


# -- detect_api_version -------------------------------------------------------------------

@pytest.mark.parametrize('status', [200, 204, 302, 401, 403, 500, 503])
def test_any_answer_but_404_on_v2_is_v2_without_asking_v1(status):
    server = Server(v2=status, v1=200)
    assert detect_api_version(server) == 'v2'
    assert server.asked == ['/v2/models']


@pytest.mark.parametrize('status', [200, 401, 403, 500])
def test_404_on_v2_and_an_answer_on_v1_is_v1(status):
    server = Server(v2=404, v1=status)
    assert detect_api_version(server) == 'v1'
    assert server.asked == ['/v2/models', '/v1/models']


def test_404_on_both_names_both_paths_and_statuses():
    server = Server()
    with pytest.raises(ApiVersionError) as error:
        detect_api_version(server)
    assert server.asked == ['/v2/models', '/v1/models']
    assert error.value.probes == (('/v2/models', 404), ('/v1/models', 404))
    assert str(error.value) == ('neither /v2/models nor /v1/models exists (GET /v2/models answered HTTP 404, '
                                'GET /v1/models answered HTTP 404): is this a GPUStack server?')
    assert isinstance(error.value, ValueError)


def test_a_probe_without_an_answer_goes_through_as_raised():
    asked = []

    def status_of(path):
        asked.append(path)
        raise OSError('connection refused')
    with pytest.raises(OSError, match='connection refused'):
        detect_api_version(status_of)
    assert asked == ['/v2/models']


@pytest.mark.parametrize('status', [None, '200', True, 200.0])
def test_a_status_that_is_not_an_int_is_refused(status):
    with pytest.raises(TypeError, match="status_of\\('/v2/models'\\) must return the HTTP status"):
        detect_api_version(lambda path: status)


# -- it ships alone -----------------------------------------------------------------------

def _imported_modules(path):
    with open(path) as handle:
        tree = ast.parse(handle.read(), path)
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.append('.' * node.level + (node.module or ''))
    return names


def test_api_imports_only_the_standard_library():
    for name in _imported_modules(API_FILE):
        top = name.split('.')[0]
        assert not name.startswith('.') and not top.startswith('ansible'), name
        assert top == '__future__' or top in sys.stdlib_module_names, name


def test_api_runs_alone_without_ansible_or_site_packages():
    """What the watchdog's node has: the file and a bare Python (-I -S: no site-packages, no
    collection path)."""
    code = ('import runpy, sys; ns = runpy.run_path(sys.argv[1]); '
            'assert "ansible" not in sys.modules and "ansible_collections" not in sys.modules; '
            'print(ns["API_VERSION_CHOICES"], ns["detect_api_version"](lambda path: 404 if "v2" in path else 200))')
    done = subprocess.run([sys.executable, '-I', '-S', '-c', code, API_FILE], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "('auto', 'v1', 'v2') v1"


# -- the literal copies Ansible reads -----------------------------------------------------

def _mentioning_api_version(pattern):
    """The files of ``pattern`` (under ROOT) whose text names an api_version: only those are
    parsed, so a half-edited unrelated file fails its own tests, not these."""
    found = []
    for path in sorted(glob.glob(os.path.join(ROOT, pattern))):
        with open(path) as handle:
            if 'api_version' in handle.read():
                found.append(path)
    return found


def _check_option(where, spec):
    assert spec.get('choices') == list(API_VERSION_CHOICES), '%s: choices %r' % (where, spec.get('choices'))
    assert spec.get('default') == API_VERSION_AUTO, '%s: default %r' % (where, spec.get('default'))


def _api_version_options(options, where):
    """(where, spec) of every option named api_version or *_api_version, nested ones too."""
    found = []
    for name, spec in (options or {}).items():
        if not isinstance(spec, dict):
            continue
        if name == 'api_version' or name.endswith('_api_version'):
            found.append(('%s: %s' % (where, name), spec))
        found.extend(_api_version_options(spec.get('options'), '%s: %s' % (where, name)))
    return found


def test_client_argument_spec():
    _check_option('gpustack_connection_argument_spec', gpustack_connection_argument_spec()['api_version'])


def test_doc_fragment():
    options = yaml.safe_load(ModuleDocFragment.DOCUMENTATION)['options']
    _check_option('doc_fragments/gpustack.py', options['api_version'])


def test_role_argument_specs():
    found = []
    for path in _mentioning_api_version('roles/*/meta/argument_specs.yml'):
        with open(path) as handle:
            specs = yaml.safe_load(handle)['argument_specs']
        for entry, spec in specs.items():
            found.extend(_api_version_options(spec.get('options'), '%s %s' % (os.path.relpath(path, ROOT), entry)))
    assert any('serving_watchdog' in where and 'gpustack_api_version' in where for where, _spec in found), found
    for where, spec in found:
        _check_option(where, spec)


# ``gpustack_api_version | default('auto') in ['auto', 'v1', 'v2']`` in a role's assert.
ASSERTED_CHOICES = re.compile(r"api_version\s*\|\s*default\('([^']*)'\)\s*in\s*(\[[^\]]*\])")


def test_role_validate_tasks():
    found = []
    for path in _mentioning_api_version('roles/*/tasks/*.yml'):
        with open(path) as handle:
            for default, choices in ASSERTED_CHOICES.findall(handle.read()):
                found.append(os.path.relpath(path, ROOT))
                assert default == API_VERSION_AUTO, path
                assert ast.literal_eval(choices) == list(API_VERSION_CHOICES), path
    assert 'roles/serving_watchdog/tasks/validate.yml' in found, found


def test_filter_docs():
    found = []
    for path in _mentioning_api_version('plugins/filter/*.yml'):
        with open(path) as handle:
            doc = yaml.safe_load(handle)['DOCUMENTATION']
        found.extend(_api_version_options(doc.get('options'), os.path.relpath(path, ROOT)))
    assert any('kvpin_watchdog_targets' in where for where, _spec in found), found
    for where, spec in found:
        _check_option(where, spec)


def _module_docs(path):
    """{DOCUMENTATION, RETURN, ...: parsed YAML} of a module, read without importing it."""
    with open(path) as handle:
        tree = ast.parse(handle.read(), path)
    docs = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id in ('DOCUMENTATION', 'RETURN'):
                    docs[target.id] = yaml.safe_load(node.value.value)
    return docs


def test_module_docs():
    """An api_version option a module documents itself matches; an api_version it returns names
    exactly the generations (C(v1) or C(v2))."""
    returned = []
    for path in _mentioning_api_version('plugins/modules/*.py'):
        where = os.path.relpath(path, ROOT)
        docs = _module_docs(path)
        for option, spec in _api_version_options((docs.get('DOCUMENTATION') or {}).get('options'), where):
            _check_option(option, spec)
        value = (docs.get('RETURN') or {}).get('api_version')
        if value is not None:
            returned.append(os.path.basename(path))
            assert tuple(sorted(re.findall(r'C\((\w+)\)', value['description']))) == API_VERSIONS, where
    assert {'gpustack_model.py', 'gpustack_worker_labels.py'} <= set(returned), returned
