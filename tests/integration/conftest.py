# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Fixtures shared by the integration tests that drive the lab fleet (helpers: lab_fleet.py)."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lab_fleet  # noqa: E402


@pytest.fixture(scope='session')
def lab_session():
    """The four lab nodes, up once for the whole session (scripts/lab.sh up): every module that
    needs the fleet shares it, so each module's first site.yml run is a rerun on converged nodes
    rather than a cold rollout on fresh containers (a cold rollout is bench_rollout's to measure,
    and the molecule scenarios converge from whatever the fleet holds). Skipped where the lab
    cannot run, a failure under CI=true (lab_fleet.require_lab); lab.sh up failing is a failure
    everywhere. At the end the fleet is left as it was found: brought down when it was down."""
    lab_fleet.require_lab()
    was_up = lab_fleet.lab_is_up()
    lab_fleet.lab('up')
    yield lab_fleet.NODES
    if not was_up:
        lab_fleet.lab('down')


@pytest.fixture(scope='module')
def fleet(lab_session):  # pylint: disable=redefined-outer-name
    """The session's fleet for one test module, after 'lab.sh up' (seconds on a running fleet): it
    restarts any node an earlier module took down and puts every node's own NVML fixture back, so
    modules do not see each other's swapped cards or stopped containers."""
    lab_fleet.lab('up')
    return lab_session
