# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What keeps a container engine from handing the NVIDIA GPUs to the GPUStack worker container:
docker without the 'nvidia' runtime, podman older than 4.9 or without a CDI spec declaring
nvidia.com/gpu=all; every answer of the node bounded and type-checked."""
from __future__ import annotations

import json

import pytest

from ansible_collections.kvpin.fleet.plugins.module_utils.facts.container_gpu import (
    MAX_ANSWER_CHARS,
    ContainerGpuInputError,
    cdi_devices,
    docker_runtimes,
    parse_version,
    problems,
)

NVIDIA_SPEC = {'cdiVersion': '0.5.0', 'kind': 'nvidia.com/gpu',
               'devices': [{'name': '0', 'containerEdits': {}}, {'name': 'all', 'containerEdits': {}}]}
DIRS = ['/etc/cdi', '/var/run/cdi']


def test_docker_with_the_nvidia_runtime_is_ready():
    runtimes = json.dumps({'io.containerd.runc.v2': {'path': 'runc'}, 'nvidia': {'path': 'nvidia-container-runtime'},
                           'runc': {'path': 'runc'}})
    assert problems('docker', runtimes_answer=runtimes) == []


def test_docker_without_the_nvidia_runtime_names_it_and_what_it_has():
    [message] = problems('docker', runtimes_answer=json.dumps({'runc': {}, 'io.containerd.runc.v2': {}}))
    assert "docker has no 'nvidia' runtime" in message
    assert 'docker info lists: io.containerd.runc.v2, runc' in message
    assert 'nvidia-ctk runtime configure --runtime=docker' in message


@pytest.mark.parametrize('answer', ['', None, 'Cannot connect to the Docker daemon', '["nvidia"]', '{"nvidia":',
                                    'null'])
def test_docker_info_unreadable_says_so_never_ready(answer):
    [message] = problems('docker', runtimes_answer=answer)
    assert 'docker info did not list the runtimes' in message


def test_podman_new_enough_with_a_cdi_spec_is_ready():
    assert problems('podman', version_answer='4.9.3\n', cdi_specs={'/etc/cdi/nvidia.yaml': NVIDIA_SPEC},
                    spec_dirs=DIRS) == []
    assert problems('podman', version_answer='5.0.0-rc1', cdi_specs={'/var/run/cdi/nvidia.json': NVIDIA_SPEC},
                    spec_dirs=DIRS) == []


def test_podman_too_old_names_both_versions():
    [message] = problems('podman', version_answer='4.3.1', cdi_specs={'/etc/cdi/nvidia.yaml': NVIDIA_SPEC},
                         spec_dirs=DIRS)
    assert message == "podman is 4.3.1: GPUStack's podman deployer needs 4.9.0 or later"


def test_podman_without_a_spec_names_the_device_and_the_directories():
    [message] = problems('podman', version_answer='5.2.0', cdi_specs={}, spec_dirs=DIRS)
    assert 'no CDI spec declares the device nvidia.com/gpu=all' in message
    assert '/etc/cdi, /var/run/cdi' in message and 'no spec files' in message
    assert 'nvidia-ctk cdi generate' in message


@pytest.mark.parametrize('spec', [
    {'cdiVersion': '0.5.0', 'kind': 'vendor.example/fpga', 'devices': [{'name': 'all'}]},
    {'cdiVersion': '0.5.0', 'kind': 'nvidia.com/gpu', 'devices': [{'name': '0'}]},
    {'kind': 'nvidia.com/gpu', 'devices': 'all'},
    {'kind': ['nvidia.com/gpu'], 'devices': [{'name': 'all'}]},
    'kind: nvidia.com/gpu', None, 42, [],
])
def test_a_spec_without_nvidia_gpu_all_does_not_count_and_is_named(spec):
    [message] = problems('podman', version_answer='5.2.0', cdi_specs={'/etc/cdi/other.yaml': spec}, spec_dirs=DIRS)
    assert 'no CDI spec declares the device nvidia.com/gpu=all' in message
    assert '/etc/cdi/other.yaml' in message


def test_podman_missing_both_reports_both():
    found = problems('podman', version_answer='4.3.1', cdi_specs={}, spec_dirs=DIRS)
    assert len(found) == 2
    assert found[0].startswith('podman is 4.3.1') and found[1].startswith('no CDI spec')


@pytest.mark.parametrize('answer', ['', None, 'Error: unknown flag', '4', 'four.nine', '4.x.1'])
def test_an_unreadable_podman_version_is_refused_naming_it(answer):
    found = problems('podman', version_answer=answer, cdi_specs={'/etc/cdi/n.yaml': NVIDIA_SPEC}, spec_dirs=DIRS)
    assert len(found) == 1 and 'podman did not report a version' in found[0] and '4.9.0' in found[0]


@pytest.mark.parametrize('text, version', [('4.9.3', (4, 9, 3)), ('v5.0.0-rc1', (5, 0, 0)), ('4.9', (4, 9, 0)),
                                           (' 4.10.0+dev\n', (4, 10, 0)), ('4.3.1', (4, 3, 1)), ('x', None)])
def test_parse_version(text, version):
    assert parse_version(text) == version


def test_4_10_is_newer_than_4_9_not_a_string_compare():
    assert problems('podman', version_answer='4.10.0', cdi_specs={'/etc/cdi/n.yaml': NVIDIA_SPEC}) == []


def test_cdi_devices_lists_kind_and_name():
    assert cdi_devices(NVIDIA_SPEC) == ['nvidia.com/gpu=0', 'nvidia.com/gpu=all']


def test_docker_runtimes_sorted_names():
    assert docker_runtimes('{"runc": {}, "nvidia": {}}') == ['nvidia', 'runc']


@pytest.mark.parametrize('engine', ['containerd', '', None, 'Docker'])
def test_an_unknown_engine_is_a_caller_error(engine):
    with pytest.raises(ContainerGpuInputError, match='engine must be one of docker, podman'):
        problems(engine)


def test_an_oversized_answer_is_refused_not_parsed():
    with pytest.raises(ContainerGpuInputError, match='more than the %d accepted' % MAX_ANSWER_CHARS):
        problems('docker', runtimes_answer='{"nvidia": {}, "x": "%s"}' % ('a' * MAX_ANSWER_CHARS))


@pytest.mark.parametrize('answer', [b'{"nvidia": {}}', 4, ['nvidia']])
def test_a_non_string_answer_is_refused_naming_the_field(answer):
    with pytest.raises(ContainerGpuInputError, match='docker info runtimes must be a string'):
        problems('docker', runtimes_answer=answer)


def test_cdi_specs_must_be_a_mapping():
    with pytest.raises(ContainerGpuInputError, match='cdi_specs must be a mapping'):
        problems('podman', version_answer='5.0.0', cdi_specs=['/etc/cdi/nvidia.yaml'])
