# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""molecule/bad_node: after a rollout whose change the bad node's worker refused, that node runs
its previous config again (restored and restarted), and every other node runs the config the
rollout asked for it. The bad change touches only the bad node, so what the rollout asked for the
others is what they had: their config, unit and worker process are the ones the scenario's
side_effect recorded before the rollout (kvpin_testinfra.STATE_FILE). That each config's
system_reserved is what the node's plans ask is test_node_rollout's check."""

from kvpin_testinfra import scenario_state

SCENARIO = 'bad_node'
CONFIG_PATH = '/var/lib/gpustack/config.yaml'
UNIT_PATH = '/etc/systemd/system/gpustack.service'
WORKER_UNIT = 'gpustack.service'


def test_bad_node_runs_its_previous_config_the_others_the_new_one(node):
    state = scenario_state()
    before = state['before'][node.name]
    now = {
        'config_checksum': node.host.file(CONFIG_PATH).sha256sum,
        'unit_checksum': node.host.file(UNIT_PATH).sha256sum,
        'invocation_id': node.systemd_show(WORKER_UNIT, 'InvocationID')['InvocationID'],
    }
    assert now['config_checksum'] == before['config_checksum']
    assert now['unit_checksum'] == before['unit_checksum']
    if node.name == state['node']:
        # Restarted on the new config, refused, then restored and restarted on the old one.
        assert now['invocation_id'] != before['invocation_id'], 'the bad node\'s worker was never restarted'
    else:
        assert now['invocation_id'] == before['invocation_id'], 'a worker the bad change did not concern restarted'
