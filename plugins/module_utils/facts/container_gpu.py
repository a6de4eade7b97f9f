# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Can this node's container engine hand the NVIDIA GPUs to the GPUStack 2.x worker container?

GPUStack 2.3 exposes the GPUs to its worker container per engine
(https://github.com/gpustack/gpustack/blob/main/docs/installation/nvidia/installation.md and
the worker command its UI generates):

- docker: ``--runtime nvidia``, the runtime the NVIDIA Container Toolkit registers with
  ``nvidia-ctk runtime configure --runtime=docker``; GPUStack checks it with
  ``docker info | grep nvidia``. Without it the container starts on runc and sees no GPU.
- podman: a CDI device, ``--device nvidia.com/gpu=all``, from a CDI spec that
  ``nvidia-ctk cdi generate`` writes to /etc/cdi or /var/run/cdi (the spec directories podman
  reads); GPUStack's podman deployer needs podman 4.9 or later
  (https://github.com/gpustack/gpustack/blob/main/docs/environment-variables.md).

``problems`` takes what the node answered (each bounded and type-checked here) and returns
one message per missing piece, naming it and how to provide it: empty means ready."""


import json
import re

ENGINES = ('docker', 'podman')
DOCKER_RUNTIME = 'nvidia'
CDI_KIND = 'nvidia.com/gpu'
CDI_DEVICE = 'all'
PODMAN_MIN_VERSION = (4, 9, 0)
# What a node's answer may be at most; longer answers are refused, not parsed.
MAX_ANSWER_CHARS = 64 * 1024

_VERSION = re.compile(r'^\s*v?(\d{1,4})\.(\d{1,4})(?:\.(\d{1,6}))?(?:[-+~.].*)?\s*$', re.S)


class ContainerGpuInputError(ValueError):
    """An argument of the wrong type or size (a caller bug, not a node problem)."""


def _text(value, field, limit):
    if value is None:
        return ''
    if not isinstance(value, str):
        raise ContainerGpuInputError('%s must be a string, got %s' % (field, type(value).__name__))
    if len(value) > limit:
        raise ContainerGpuInputError('%s is %d characters, more than the %d accepted' % (field, len(value), limit))
    return value


def parse_version(text):
    """(major, minor, patch) of a version string such as '4.9.3', 'v5.0.0-rc1'; None if it is not one."""
    match = _VERSION.match(_text(text, 'version', MAX_ANSWER_CHARS))
    if match is None:
        return None
    return (int(match.group(1)), int(match.group(2)), int(match.group(3) or 0))


def docker_runtimes(text):
    """Runtime names from ``docker info --format '{{json .Runtimes}}'`` (a JSON object); None if unreadable."""
    text = _text(text, 'docker info runtimes', MAX_ANSWER_CHARS)
    try:
        runtimes = json.loads(text)
    except ValueError:
        return None
    if not isinstance(runtimes, dict):
        return None
    return sorted(str(name) for name in runtimes)


def cdi_devices(spec):
    """Fully qualified device names (kind=name) a parsed CDI spec declares; [] if it is not a spec.
    (The filter plugin parses the YAML or JSON text on the controller.)"""
    if not isinstance(spec, dict) or not isinstance(spec.get('kind'), str):
        return []
    devices = spec.get('devices')
    if not isinstance(devices, list):
        return []
    return ['%s=%s' % (spec['kind'], device['name']) for device in devices
            if isinstance(device, dict) and isinstance(device.get('name'), (str, int))]


def _dotted(version):
    return '.'.join(str(part) for part in version)


def problems(engine, version_answer=None, runtimes_answer=None, cdi_specs=None, spec_dirs=()):
    """Messages naming what keeps ``engine`` from exposing the GPUs; [] when nothing does.

    version_answer: the engine's client version (podman); runtimes_answer: ``docker info``'s
    runtimes as JSON, or the error text when ``docker info`` failed (``runtimes_failed``
    below); cdi_specs: {path: parsed spec} of the spec files found in ``spec_dirs``."""
    if engine not in ENGINES:
        raise ContainerGpuInputError('engine must be one of %s, got %r' % (', '.join(ENGINES), engine))
    found = []
    if engine == 'docker':
        runtimes = docker_runtimes(runtimes_answer)
        if runtimes is None:
            found.append("docker info did not list the runtimes (is dockerd running?): cannot tell whether the "
                         "NVIDIA runtime '%s' is registered" % DOCKER_RUNTIME)
        elif DOCKER_RUNTIME not in runtimes:
            found.append("docker has no '%s' runtime (docker info lists: %s): install the NVIDIA Container Toolkit, "
                         "run 'nvidia-ctk runtime configure --runtime=docker' and restart docker; the worker "
                         "container runs with --runtime %s" % (DOCKER_RUNTIME, ', '.join(runtimes) or 'none', DOCKER_RUNTIME))
        return found
    version = parse_version(version_answer)
    if version is None:
        found.append('podman did not report a version (%r): GPUStack needs podman %s or later'
                     % ((version_answer or '')[:80], _dotted(PODMAN_MIN_VERSION)))
    elif version < PODMAN_MIN_VERSION:
        found.append("podman is %s: GPUStack's podman deployer needs %s or later"
                     % (_dotted(version), _dotted(PODMAN_MIN_VERSION)))
    if cdi_specs is not None and not isinstance(cdi_specs, dict):
        raise ContainerGpuInputError('cdi_specs must be a mapping of path to text')
    wanted = '%s=%s' % (CDI_KIND, CDI_DEVICE)
    declared = sorted(path for path, spec in (cdi_specs or {}).items() if wanted in cdi_devices(spec))
    if not declared:
        found.append('no CDI spec declares the device %s (looked in %s: %s): generate one with '
                     "'nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml'; the worker container runs "
                     'with --device %s' % (wanted, ', '.join(spec_dirs) or 'no directory',
                                           ', '.join(sorted(cdi_specs or {})) or 'no spec files', wanted))
    return found
