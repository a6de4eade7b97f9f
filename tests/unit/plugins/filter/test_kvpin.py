# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import grp
import hashlib
import json
import os
import pwd

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.kvpin.fleet.plugins.filter.kvpin import FilterModule
from ansible_collections.kvpin.fleet.plugins.module_utils.facts.node_state import evaluate, observe, parse_checks, summarize
from ansible_collections.kvpin.fleet.plugins.module_utils.units import GiB

FILTER = FilterModule().filters()['kvpin_system_reserved']


def test_filter_is_the_module_utils_computation():
    assert FILTER([{'system_reserved_bytes': GiB + 1}], 2, 1) == {'ram': 2, 'vram': 2}
    assert FILTER([], 2) == {'ram': 2, 'vram': 0}


def test_bad_input_is_a_filter_error_naming_the_filter():
    with pytest.raises(AnsibleFilterError, match='kvpin_system_reserved: plans\\[0\\].system_reserved_bytes'):
        FILTER([{'system_reserved_bytes': -5}], 2, 1)


# kvpin_node_drift: node_state's comparison on the controller, against gpu_facts' observation.
NODE_DRIFT = FilterModule().filters()['kvpin_node_drift']


def _checks(tmp_path, wanted_content):
    owner = pwd.getpwuid(os.getuid()).pw_name
    group = grp.getgrgid(os.getgid()).gr_name
    return [{'name': 'worker',
             'files': [{'path': str(tmp_path / 'config.yaml'), 'sha1': hashlib.sha1(wanted_content).hexdigest(),
                        'mode': '0600', 'owner': owner, 'group': group},
                       {'path': str(tmp_path), 'state': 'directory'},
                       {'path': str(tmp_path / 'gone'), 'state': 'absent'}],
             'users': [owner], 'groups': [group]}]


def test_node_drift_on_the_controller_equals_node_state_on_the_node(tmp_path):
    config = tmp_path / 'config.yaml'
    config.write_bytes(b'token: old\n')
    config.chmod(0o644)
    # Observed before planning (the probe does not know the wanted content yet) ...
    observed = json.loads(json.dumps(observe(parse_checks(_checks(tmp_path, b'whatever')))))
    # ... compared after planning with the content the plan asks for.
    wanted = _checks(tmp_path, b'token: new\n')
    on_controller = NODE_DRIFT(observed, wanted)
    assert on_controller == summarize(evaluate(parse_checks(wanted)))
    assert on_controller['in_sync'] is False
    assert [line.split(': ', 2)[2] for line in on_controller['drift']] == [
        'content differs (sha1 %s wanted %s)' % (hashlib.sha1(b'token: old\n').hexdigest(),
                                                 hashlib.sha1(b'token: new\n').hexdigest()),
        'mode 0644, wanted 0600']
    # The same differences as items, what the roles decide on.
    assert [(i['check'], i['field'], i['got']) for i in on_controller['drift_items']] == [
        ('worker', 'sha1', hashlib.sha1(b'token: old\n').hexdigest()), ('worker', 'mode', '0644')]
    assert on_controller['checks']['worker']['drift_items'][1] == {
        'object': str(config), 'field': 'mode', 'want': '0600', 'got': '0644'}
    # The observation never carries the content, only its hash.
    assert 'token' not in json.dumps(observed)

    config.write_bytes(b'token: new\n')
    config.chmod(0o600)
    observed = json.loads(json.dumps(observe(parse_checks(_checks(tmp_path, b'whatever')))))
    assert NODE_DRIFT(observed, wanted) == {'in_sync': True,
                                            'checks': {'worker': {'in_sync': True, 'drift': [], 'drift_items': []}},
                                            'drift': [], 'drift_items': []}


def test_anything_not_observed_is_drift_never_in_sync(tmp_path):
    wanted = _checks(tmp_path, b'x') + [{'name': 'watchdog', 'units': [{'name': 'kvpin-watchdog-a.service', 'active': True}],
                                         'http': [{'url': 'http://127.0.0.1:9/healthz'}],
                                         'python_packages': [{'python': '/usr/bin/python3', 'name': 'gpustack'}]}]
    result = NODE_DRIFT({}, wanted)
    assert result['in_sync'] is False
    assert result['checks']['watchdog']['drift'] == [
        'kvpin-watchdog-a.service: state unknown (not observed)',
        'http://127.0.0.1:9/healthz: no answer (not observed), wanted status 200',
        'gpustack (any version) in /usr/bin/python3: not observed']
    assert [(i['object'], i['field'], i['got']) for i in result['checks']['watchdog']['drift_items']] == [
        ('kvpin-watchdog-a.service', 'state', None), ('http://127.0.0.1:9/healthz', 'status', None),
        ('gpustack in /usr/bin/python3', 'version', None)]
    assert '%s: not observed' % (tmp_path / 'config.yaml') in result['checks']['worker']['drift']


def test_node_drift_input_errors_name_the_filter_and_field():
    with pytest.raises(AnsibleFilterError, match="kvpin_node_drift: check worker: files\\[0\\].path 'etc/x'"):
        NODE_DRIFT({}, [{'name': 'worker', 'files': [{'path': 'etc/x'}]}])
    with pytest.raises(AnsibleFilterError, match='kvpin_node_drift: expected the kvpin_node_observed dict'):
        NODE_DRIFT(None, [])


MASK_KEYS = FilterModule().filters()['kvpin_mask_keys']


def test_mask_keys_masks_set_values_and_keeps_presence():
    targets = [{'name': 'a', 'gpustack_api_key': 's3cret'}, {'name': 'b'}, {'name': 'c', 'gpustack_api_key': None}]
    masked = MASK_KEYS(targets, ['gpustack_api_key'])
    assert masked == [{'name': 'a', 'gpustack_api_key': 'VALUE_SPECIFIED_IN_NO_LOG_PARAMETER'}, {'name': 'b'},
                      {'name': 'c', 'gpustack_api_key': None}]
    assert targets[0]['gpustack_api_key'] == 's3cret'  # a copy: the input is untouched
    with pytest.raises(AnsibleFilterError, match='kvpin_mask_keys: expected a list of dicts'):
        MASK_KEYS({'name': 'a'}, ['x'])
