# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Fixtures shared by the integration tests that drive the lab fleet (helpers: lab_fleet.py)."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lab_fleet  # noqa: E402


@pytest.fixture(scope='module')
def fleet():
    """The four lab nodes, up for the whole test module (scripts/lab.sh up); skipped where the lab
    cannot run, a failure under CI=true (lab_fleet.require_lab); lab.sh up failing is a
    failure everywhere. Afterwards the fleet is left as it was found: brought down when it was down,
    otherwise 'up' again, which puts every node's own NVML fixture back."""
    lab_fleet.require_lab()
    was_up = lab_fleet.lab_is_up()
    lab_fleet.lab('up')
    yield lab_fleet.NODES
    if was_up:
        lab_fleet.lab('up')
    else:
        lab_fleet.lab('down')
