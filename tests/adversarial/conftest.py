# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Fixtures of the adversarial suite: hostile servers on 127.0.0.1 (attacker_http.py) and the
GPUStack look-alike of gpustack_attack.py built on them."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attacker_http import AttackerServer  # noqa: E402  pylint: disable=wrong-import-position
from gpustack_attack import FakeGpustack  # noqa: E402  pylint: disable=wrong-import-position


@pytest.fixture
def attacker():
    """A factory of AttackerServers, all closed after the test."""
    servers = []

    def make(routes=None, host='127.0.0.1'):
        servers.append(AttackerServer(routes, host=host))
        return servers[-1]
    yield make
    for server in servers:
        server.close()


@pytest.fixture
def fake_gpustack(attacker):
    def make(**kwargs):
        return FakeGpustack(attacker(), **kwargs)
    return make
