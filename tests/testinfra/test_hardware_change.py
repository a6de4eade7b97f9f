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


def test_the_swapped_node_plans_on_a_valid_gpu_choice(node):
    """A card of another kind in the node: each vLLM deployment that pins no GPUs is planned on a
    group of one kind of card that the planner chose and says why (plan.gpu_choice), and it fits.
    On the swapped node the 8B model runs on the swapped-in card alone: a single card, as before
    the swap, and of the two the one with the larger KV pool."""
    state = scenario_state()
    if node.name != state['node']:
        return
    kinds = dict((g['index'], (g['name'], g['memory_total'])) for g in node.gpus['gpus'])
    assert len(set(kinds.values())) > 1, 'the swap left the node with one kind of card: %s' % kinds
    for deployment, plan in zip(node.deployments, node.plans):
        if deployment['backend'] != 'vllm' or 'gpu_indexes' in deployment:
            continue
        assert plan['feasible'], (deployment['name'], plan['not_fitting'])
        chosen = plan['gpu_indexes']
        assert chosen and set(chosen) <= set(kinds), (deployment['name'], chosen, sorted(kinds))
        assert len({kinds[i] for i in chosen}) == 1, (deployment['name'], [kinds[i] for i in chosen])
        assert [row['index'] for row in plan['memory']] == chosen
        assert plan['gpu_choice']['gpu_indexes'] == chosen
        assert plan['reasons']['gpu_indexes'].startswith('chosen by the planner'), plan['reasons']['gpu_indexes']
        # Every kind on the node was a candidate.
        compared = {kinds[c['gpu_indexes'][0]] for c in plan['gpu_choice']['candidates']}
        assert compared == set(kinds.values()), compared
        assert chosen == sorted(state['gpu_indexes']), (deployment['name'], chosen, state['gpu_indexes'])
