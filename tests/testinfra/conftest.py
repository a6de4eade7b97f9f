# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The testinfra suite the molecule scenarios verify with (verifier: testinfra, directory
../../tests/testinfra). It checks what the rollout left on each lab node against that node's
own plans and NVML fixture, never against the roles' templates:

- the nodes are the inventory's gpu_nodes, reached as testinfra hosts through podman
  (podman://<KVPIN_LAB_PREFIX><node>: the containers scripts/lab.sh starts);
- each node's plans are made once per session by plans.yml (the node's GPUs through
  kvpin.fleet.gpu_facts, then playbooks/tasks/plan_deployments.yml, as site.yml does);
- the NVML fixture is the one the node's stub serves (/etc/kvpin/nvml-stub.json on the node);
- the GPUStack server URL, registration token and API key are the lab's files on the controller
  (.lab/<prefix>gpustack/, what inventory/lab reads).

A test module that belongs to one scenario says so with SCENARIO = '<name>'; under another
scenario (MOLECULE_SCENARIO_NAME) its tests are deselected, not skipped.
"""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kvpin_testinfra  # noqa: E402  pylint: disable=wrong-import-position


def pytest_configure(config):
    config.kvpin_nodes = None


def pytest_generate_tests(metafunc):
    if 'node' in metafunc.fixturenames:
        if metafunc.config.kvpin_nodes is None:
            metafunc.config.kvpin_nodes = kvpin_testinfra.inventory_nodes()
        nodes = metafunc.config.kvpin_nodes
        metafunc.parametrize('node', nodes, ids=nodes, indirect=True, scope='module')


def pytest_collection_modifyitems(config, items):
    """Deselect the tests of modules that belong to another scenario."""
    keep, drop = [], []
    for item in items:
        wanted = getattr(item.module, 'SCENARIO', None)
        (drop if wanted is not None and wanted != kvpin_testinfra.scenario_name() else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture(scope='session')
def plans():
    return kvpin_testinfra.node_plans()


@pytest.fixture(scope='module')
def node(request, plans):  # pylint: disable=redefined-outer-name
    name = request.param
    assert name in plans, 'plans.yml wrote no plans for %s (it wrote %s)' % (name, sorted(plans))
    return kvpin_testinfra.Node(name, plans[name])
