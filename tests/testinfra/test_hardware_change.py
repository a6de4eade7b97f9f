# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""molecule/hardware_change: after one node's cards were swapped and the rollout rerun, only that
node's worker config and worker changed. The state from before the swap is what the scenario's
side_effect recorded (kvpin_testinfra.STATE_FILE); the swap itself is read from the fixture the
node's stub serves now, against the one the repository holds for it."""

from kvpin_testinfra import repo_fixture, scenario_state

SCENARIO = 'hardware_change'
CONFIG_PATH = '/var/lib/gpustack/config.yaml'
WORKER_UNIT = 'gpustack.service'


def test_the_swapped_node_serves_other_cards(node):
    state = scenario_state()
    served = [d['name'] for d in node.served_fixture['devices']]
    shipped = [d['name'] for d in repo_fixture(node.name)['devices']]
    if node.name == state['node']:
        assert len(served) == len(shipped)
        for index in state['gpu_indexes']:
            assert served[index] != shipped[index], (index, served, shipped)
        assert [g['name'] for g in node.gpus['gpus']] == served
    else:
        assert served == shipped


def test_only_the_swapped_node_has_a_new_config_and_worker(node):
    state = scenario_state()
    before = state['before'][node.name]
    checksum = node.host.file(CONFIG_PATH).sha256sum
    invocation = node.systemd_show(WORKER_UNIT, 'InvocationID')['InvocationID']
    if node.name == state['node']:
        assert checksum != before['config_checksum'], 'the swapped node kept its worker config'
        assert invocation != before['invocation_id'], 'the swapped node kept its worker process'
    else:
        assert checksum == before['config_checksum'], 'the worker config changed on a node whose cards did not'
        assert invocation == before['invocation_id'], 'the worker restarted on a node whose cards did not change'
