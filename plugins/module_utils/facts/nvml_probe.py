# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Read a node's NVIDIA GPUs through NVML: the facts behind ``ansible_facts.kvpin_gpus``.

Every function takes the pynvml module object (nvidia-ml-py) as ``nvml``, so callers and
tests choose which binding, and through it which libnvidia-ml, is used. Nothing here
imports pynvml itself.

Result of :func:`probe` (names are a contract; planners read index, uuid, name,
memory_total, memory_used, memory_free and compute_capability)::

    {"driver_version": "570.133.20", "cuda_driver_version": "12.8",
     "nvml_version": "12.570.133.20", "gpu_count": 2,
     "gpus": [{"index": 0, "uuid": "GPU-...", "name": "NVIDIA GeForce RTX 4090",
               "memory_total": 25757220864, "memory_used": ..., "memory_free": ...,
               "memory_reserved": 0 or None,
               "memory_total_cuda": 25345638400 or None,
               "memory_total_cuda_source": "table:RTX 4090",
               "compute_capability": "8.9", "pci_bus_id": "00000000:01:00.0",
               "pci_device_id": "0x268410de", "power_limit_watts": 450.0 or None,
               "mig_mode": {"current": False, "pending": False} or None,
               "nvlink_active_links": 4 or None,
               "processes": [{"pid": 41873, "used_memory": 327155712,
                              "cgroup": "0::/system.slice/x.service"}] or None}],
     "topology": [{"gpu_a": 0, "gpu_b": 1, "link": "PHB", "p2p_read": False,
                   "p2p_write": False, "nvlink": False}],
     "reason": None}

Memory figures come from NVML's nvmlMemory_v2_t when the driver has it: there ``used``
excludes the driver/firmware ``reserved`` part and ``free = total - reserved - used``
(so ``free`` is what a new CUDA context can still get). On a driver without the v2 call,
the v1 figures are used: ``used`` then includes the reserved part and
``memory_reserved`` is None.

``memory_total_cuda`` is the estimate of the total CUDA sees (cudaMemGetInfo, what vLLM
budgets from), with its source (module_utils/cuda_total.py): NVML's v2 ``reserved`` is part
of ``total`` ("Total physical device memory"; ``reserved``: "Device memory reserved for
system use (driver or firmware)", https://docs.nvidia.com/deploy/nvml-api/structnvmlMemory__v2__t.html).
"""

from __future__ import annotations

import ctypes
import os

from ansible_collections.kvpin.fleet.plugins.module_utils.plan import cuda_total

# NVML return codes (nvml.h nvmlReturn_t).
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25

# An optional query answering one of these means "this GPU/driver has no such thing":
# the fact becomes null instead of failing the probe.
UNSUPPORTED_ERRORS = (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND)

# nvmlGpuP2PCapsIndex_t (nvml.h). Not taken from pynvml: nvidia-ml-py 13.615.71 defines
# NVML_P2P_CAPS_INDEX_READ with a trailing comma, i.e. as the tuple (0,).
P2P_CAPS_INDEX_READ = 0
P2P_CAPS_INDEX_WRITE = 1
P2P_CAPS_INDEX_NVLINK = 2
P2P_STATUS_OK = 0

# nvmlGpuTopologyLevel_t -> the `nvidia-smi topo -m` legend. INTERNAL (two GPUs on one
# board) has no legend entry of its own; it is the closest, a single on-board bridge.
TOPOLOGY_LINKS = {
    0: 'PIX',    # NVML_TOPOLOGY_INTERNAL
    10: 'PIX',   # NVML_TOPOLOGY_SINGLE: at most one PCIe bridge
    20: 'PXB',   # NVML_TOPOLOGY_MULTIPLE: several PCIe bridges, no host bridge
    30: 'PHB',   # NVML_TOPOLOGY_HOSTBRIDGE: through a PCIe host bridge
    40: 'NODE',  # NVML_TOPOLOGY_NODE: between host bridges within a NUMA node
    50: 'SYS',   # NVML_TOPOLOGY_SYSTEM: across the SMP interconnect between NUMA nodes
}
LINK_NVLINK = 'NVLINK'

# NVML_NVLINK_MAX_LINKS (nvml.h); a GPU answers INVALID_ARGUMENT past its last link.
NVLINK_MAX_LINKS = 36

# NVML reports power limits in milliwatts.
MILLIWATTS_PER_WATT = 1000.0


class NvmlProbeError(Exception):
    """An NVML call failed in the middle of a probe. ``call`` is the C function name,
    ``where`` the GPU(s) it was asked about ("GPU 1", "GPUs 0 and 1") or None."""

    def __init__(self, call, message, where=None):
        super().__init__('%s failed%s: %s' % (call, ' on %s' % where if where else '', message))
        self.call = call
        self.message = message
        self.where = where


def preload_library(path):
    """Load the NVML library at ``path`` before pynvml looks for ``libnvidia-ml.so.1``.

    pynvml has no path argument: it calls ``CDLL("libnvidia-ml.so.1")``. The dynamic
    loader answers that from an already-loaded object with the same soname, so loading
    ``path`` first makes pynvml bind to it. Raises OSError when it cannot be loaded."""
    return ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)


def no_gpus(reason):
    """The answer for a node where NVML cannot be used (no library, no driver)."""
    return {
        'driver_version': None,
        'cuda_driver_version': None,
        'nvml_version': None,
        'gpu_count': 0,
        'gpus': [],
        'topology': [],
        'reason': reason,
    }


def format_cuda_version(version):
    """NVML's CUDA driver version int (1000 * major + 10 * minor) as "major.minor"."""
    return '%d.%d' % (version // 1000, (version % 1000) // 10)


def format_compute_capability(major, minor):
    return '%d.%d' % (major, minor)


def _error_value(exc):
    """The nvmlReturn_t of a pynvml NVMLError."""
    return getattr(exc, 'value', None)


def _call(nvml, c_name, fn, *args):
    """Call a required NVML query; an NVML error becomes NvmlProbeError naming ``c_name``."""
    try:
        return fn(*args)
    except nvml.NVMLError as exc:
        raise NvmlProbeError(c_name, '%s (NVML error %s)' % (exc, _error_value(exc)))


def _optional(nvml, c_name, fn, *args):
    """Call an optional NVML query: None when the GPU or driver does not support it,
    NvmlProbeError for any other NVML error (a lost GPU is not "unsupported")."""
    try:
        return fn(*args)
    except nvml.NVMLError as exc:
        if _error_value(exc) in UNSUPPORTED_ERRORS:
            return None
        raise NvmlProbeError(c_name, '%s (NVML error %s)' % (exc, _error_value(exc)))


def read_memory(nvml, handle):
    """(total, used, free, reserved) in bytes; reserved is None on the v1 fallback."""
    try:
        mem = nvml.nvmlDeviceGetMemoryInfo(handle, nvml.nvmlMemory_v2)
        return int(mem.total), int(mem.used), int(mem.free), int(mem.reserved)
    except nvml.NVMLError as exc:
        fallback = UNSUPPORTED_ERRORS + (NVML_ERROR_ARGUMENT_VERSION_MISMATCH,)
        if _error_value(exc) not in fallback:
            raise NvmlProbeError('nvmlDeviceGetMemoryInfo_v2', '%s (NVML error %s)' % (exc, _error_value(exc)))
    mem = _call(nvml, 'nvmlDeviceGetMemoryInfo', nvml.nvmlDeviceGetMemoryInfo, handle)
    return int(mem.total), int(mem.used), int(mem.free), None


def read_power_limit_watts(nvml, handle):
    """The power limit in effect (the enforced one; the management limit if the driver
    has no enforced limit), in watts, or None when the GPU reports none."""
    milliwatts = _optional(nvml, 'nvmlDeviceGetEnforcedPowerLimit', nvml.nvmlDeviceGetEnforcedPowerLimit, handle)
    if milliwatts is None:
        milliwatts = _optional(nvml, 'nvmlDeviceGetPowerManagementLimit', nvml.nvmlDeviceGetPowerManagementLimit, handle)
    return None if milliwatts is None else milliwatts / MILLIWATTS_PER_WATT


def read_mig_mode(nvml, handle):
    modes = _optional(nvml, 'nvmlDeviceGetMigMode', nvml.nvmlDeviceGetMigMode, handle)
    if modes is None:
        return None
    current, pending = modes
    return {'current': bool(current), 'pending': bool(pending)}


def read_nvlink_active_links(nvml, handle):
    """How many of the GPU's NVLinks are up; None for a GPU without NVLink."""
    active = 0
    for link in range(NVLINK_MAX_LINKS):
        try:
            if nvml.nvmlDeviceGetNvLinkState(handle, link):
                active += 1
        except nvml.NVMLError as exc:
            value = _error_value(exc)
            if value in UNSUPPORTED_ERRORS and link == 0:
                return None
            if value in UNSUPPORTED_ERRORS + (NVML_ERROR_INVALID_ARGUMENT,):
                break  # past the GPU's last link
            raise NvmlProbeError('nvmlDeviceGetNvLinkState', '%s (NVML error %s)' % (exc, value))
    return active


# /proc/<pid>/cgroup: read at most this much, keep at most this much (a few lines).
CGROUP_READ_LIMIT = 4096
CGROUP_KEEP = 1024
PROC_ROOT = '/proc'


def read_cgroup(pid, proc_root=None):
    """The cgroup membership of ``pid`` as /proc/<pid>/cgroup lists it (one line per
    hierarchy, e.g. ``0::/system.slice/gpustack.service``), or None where it cannot be read
    (the process ended, or lives in a PID namespace this host does not see). It tells the
    node's GPU ledger whether a process is GPUStack's (module_utils/gpu_ledger.py)."""
    try:
        with open(os.path.join(proc_root or PROC_ROOT, str(int(pid)), 'cgroup'), 'rb') as handle:
            data = handle.read(CGROUP_READ_LIMIT)
    except (OSError, ValueError):
        return None
    text = data.decode('utf-8', 'replace').strip()
    return text[:CGROUP_KEEP] or None


def read_processes(nvml, handle):
    procs = _optional(nvml, 'nvmlDeviceGetComputeRunningProcesses_v3',
                      nvml.nvmlDeviceGetComputeRunningProcesses_v3, handle)
    if procs is None:
        return None
    processes = []
    for proc in procs:
        # usedGpuMemory is None where the driver cannot tell (Windows WDDM).
        process = {'pid': int(proc.pid),
                   'used_memory': None if proc.usedGpuMemory is None else int(proc.usedGpuMemory)}
        cgroup = read_cgroup(proc.pid)
        if cgroup is not None:
            process['cgroup'] = cgroup
        processes.append(process)
    return processes


def read_gpu(nvml, index):
    handle = _call(nvml, 'nvmlDeviceGetHandleByIndex_v2', nvml.nvmlDeviceGetHandleByIndex, index)
    total, used, free, reserved = read_memory(nvml, handle)
    major, minor = _call(nvml, 'nvmlDeviceGetCudaComputeCapability', nvml.nvmlDeviceGetCudaComputeCapability, handle)
    pci = _call(nvml, 'nvmlDeviceGetPciInfo_v3', nvml.nvmlDeviceGetPciInfo_v3, handle)
    name = _call(nvml, 'nvmlDeviceGetName', nvml.nvmlDeviceGetName, handle)
    cuda_estimate, cuda_source = cuda_total.facts_fields(_decode(name), total, reserved)
    gpu = {
        'index': index,
        'uuid': _call(nvml, 'nvmlDeviceGetUUID', nvml.nvmlDeviceGetUUID, handle),
        'name': name,
        'memory_total': total,
        'memory_used': used,
        'memory_free': free,
        'memory_reserved': reserved,
        'memory_total_cuda': cuda_estimate,
        'memory_total_cuda_source': cuda_source,
        'compute_capability': format_compute_capability(major, minor),
        'pci_bus_id': _decode(pci.busId),
        'pci_device_id': '0x%08x' % pci.pciDeviceId,
        'power_limit_watts': read_power_limit_watts(nvml, handle),
        'mig_mode': read_mig_mode(nvml, handle),
        'nvlink_active_links': read_nvlink_active_links(nvml, handle),
        'processes': read_processes(nvml, handle),
    }
    return handle, gpu


def _decode(value):
    return value.decode() if isinstance(value, bytes) else value


def _p2p_ok(nvml, handle_a, handle_b, cap_index):
    status = _optional(nvml, 'nvmlDeviceGetP2PStatus', nvml.nvmlDeviceGetP2PStatus, handle_a, handle_b, cap_index)
    return status == P2P_STATUS_OK


def read_link(nvml, index_a, handle_a, index_b, handle_b):
    """One unordered GPU pair: the `nvidia-smi topo -m` style link and P2P abilities."""
    nvlink = _p2p_ok(nvml, handle_a, handle_b, P2P_CAPS_INDEX_NVLINK)
    level = _optional(nvml, 'nvmlDeviceGetTopologyCommonAncestor',
                      nvml.nvmlDeviceGetTopologyCommonAncestor, handle_a, handle_b)
    if nvlink:
        link = LINK_NVLINK
    else:
        link = TOPOLOGY_LINKS.get(level)  # None when NVML cannot tell
    return {
        'gpu_a': index_a,
        'gpu_b': index_b,
        'link': link,
        'p2p_read': _p2p_ok(nvml, handle_a, handle_b, P2P_CAPS_INDEX_READ),
        'p2p_write': _p2p_ok(nvml, handle_a, handle_b, P2P_CAPS_INDEX_WRITE),
        'nvlink': nvlink,
    }


def probe(nvml):
    """Everything gpu_facts reports, read in one nvmlInit/nvmlShutdown session.

    No NVML library or no loaded driver is an answer (``gpus: []`` and ``reason``);
    any other NVML failure raises NvmlProbeError naming the failing C function."""
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        if isinstance(exc, nvml.NVMLError_LibraryNotFound):
            return no_gpus('NVML library libnvidia-ml.so.1 not found: no NVIDIA driver installed (%s)' % exc)
        if isinstance(exc, nvml.NVMLError_DriverNotLoaded):
            return no_gpus('NVIDIA driver not loaded: nvmlInit answered %s' % exc)
        raise NvmlProbeError('nvmlInitWithFlags', '%s (NVML error %s)' % (exc, _error_value(exc)))
    try:
        return _probe_initialised(nvml)
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass  # the answer (or the error being raised) matters more than a failed shutdown


def _probe_initialised(nvml):
    driver_version = _decode(_call(nvml, 'nvmlSystemGetDriverVersion', nvml.nvmlSystemGetDriverVersion))
    cuda_version = _optional(nvml, 'nvmlSystemGetCudaDriverVersion', nvml.nvmlSystemGetCudaDriverVersion)
    nvml_version = _optional(nvml, 'nvmlSystemGetNVMLVersion', nvml.nvmlSystemGetNVMLVersion)
    count = _call(nvml, 'nvmlDeviceGetCount_v2', nvml.nvmlDeviceGetCount)

    handles = []
    gpus = []
    for index in range(count):
        try:
            handle, gpu = read_gpu(nvml, index)
        except NvmlProbeError as exc:
            raise NvmlProbeError(exc.call, exc.message, where='GPU %d' % index)
        handles.append(handle)
        gpus.append(gpu)

    topology = []
    for a in range(count):
        for b in range(a + 1, count):
            try:
                topology.append(read_link(nvml, a, handles[a], b, handles[b]))
            except NvmlProbeError as exc:
                raise NvmlProbeError(exc.call, exc.message, where='GPUs %d and %d' % (a, b))

    return {
        'driver_version': driver_version,
        'cuda_driver_version': None if cuda_version is None else format_cuda_version(cuda_version),
        'nvml_version': None if nvml_version is None else _decode(nvml_version),
        'gpu_count': count,
        'gpus': gpus,
        'topology': topology,
        'reason': None,
    }
