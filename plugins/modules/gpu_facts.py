#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)


DOCUMENTATION = r'''
---
module: gpu_facts
short_description: Read the node's NVIDIA GPUs, memory and topology through NVML
version_added: "0.1.0"
description:
  - Reads every NVIDIA GPU on the node through NVML (the C(pynvml) binding of
    C(nvidia-ml-py) over C(libnvidia-ml.so.1)) and returns them as
    C(ansible_facts.kvpin_gpus).
  - Per GPU it reports index, UUID, name, memory total/used/free in bytes, compute
    capability, PCI bus and device id, power limit, MIG mode, NVLink state and the
    compute processes; between every pair of GPUs it reports the link
    (C(NVLINK), C(PIX), C(PXB), C(PHB), C(NODE), C(SYS)) and whether P2P reads and
    writes are possible.
  - A node without the NVML library or without a loaded NVIDIA driver is a normal
    answer (no GPUs, with the reason), unless O(required=true).
  - When the node's Python cannot import C(pynvml), the module imports it from the newest copy
    of nvidia-ml-py unpacked in O(library_dir); with O(library_wheel) it imports the copy of
    that wheel's version kept there, unpacking the wheel first when there is none (or it does
    not import). Without either it fails with RV(missing_library).
  - Changes nothing on the node, but for unpacking O(library_wheel) when C(pynvml) was
    missing.
options:
  required:
    description:
      - Fail when NVML cannot be used on the node (no library, driver not loaded)
        instead of returning an empty GPU list with the reason.
    type: bool
    default: false
  library_path:
    description:
      - Path of the C(libnvidia-ml.so.1) to use instead of the one the dynamic loader
        finds, for example a stub library in tests.
      - A path that cannot be loaded fails the module.
    type: path
  observe:
    description:
      - Also read, in the same round trip, every object these checks name (files with their
        sha1, mode and owner; users; groups; systemd units; health URLs; package versions) and
        return what was found as C(ansible_facts.kvpin_node_observed), without comparing.
      - The checks have the format of the O(kvpin.fleet.node_state#module:checks) option; their
        wanted values are not used here. The comparison runs on the controller with the
        P(kvpin.fleet.kvpin_node_drift#filter) filter, after planning. This is how C(site.yml)
        probes and checks an unchanged node with one remote call.
      - File contents are never returned, only their sha1.
    type: list
    elements: dict
    default: []
  measurements:
    description:
      - Also read, in the same round trip, each deployment's measurement file, which its
        watchdog writes (deployment name to path; C(site.yml) passes the
        C(kvpin.fleet.serving_watchdog) role's C(serving_watchdog_measurement_files)).
      - Each is read at most 256 KiB, only from a regular file (never through a symbolic link),
        and checked as M(kvpin.fleet.serving_plan)'s O(kvpin.fleet.serving_plan#module:measurement)
        is. A missing or unusable file is answered as such, never a failure.
      - Returned as C(ansible_facts.kvpin_measurements).
    type: dict
    default: {}
  library_dir:
    description:
      - Where nvidia-ml-py is kept when the node's Python does not have it, one unpacked wheel per
        version (C(nvidia_ml_py-<version>/pynvml.py)); the newest is imported.
      - A copy is imported only when this directory, the copy and its C(pynvml.py) are owned by
        root or the module's user, writable by no one else and not symbolic links; otherwise
        the module fails with RV(missing_library) and the reason.
    type: path
    default: /var/lib/kvpin/python
  library_wheel:
    description:
      - The nvidia-ml-py wheel, sent by the controller, to unpack into O(library_dir) and import
        when C(pynvml) cannot be imported otherwise (C(site.yml)'s prereq phase, after a probe
        that answered RV(missing_library)). The copy of the same version already kept in
        O(library_dir) is imported instead (the same call twice writes nothing the second
        time); a copy that does not import is replaced. Ignored when C(pynvml) can be imported.
      - Pure-Python wheels only, at most 16 MiB; its members must stay inside the directory.
      - In check mode the wheel is unpacked into a temporary directory, imported and removed,
        so the GPUs are read and nothing is kept.
    type: dict
    suboptions:
      name:
        description: The wheel's file name, C(nvidia_ml_py-<version>-py3-none-any.whl).
        type: str
        required: true
      content:
        description: The wheel's bytes, base64 (not logged).
        type: str
        required: true
requirements:
  - nvidia-ml-py (provides the C(pynvml) module) on the managed node, in O(library_dir), or sent
    as O(library_wheel)
attributes:
  check_mode:
    support: full
    description: Reads the same facts; a O(library_wheel) is used from a temporary directory and not kept.
  diff_mode:
    support: none
    description: Nothing changes, so there is nothing to diff.
  facts:
    support: full
    description: Returns C(ansible_facts.kvpin_gpus) (and C(ansible_facts.kvpin_node_observed) with O(observe)).
notes:
  - Memory figures are bytes. With drivers that have NVML's v2 memory query,
    C(memory_used) excludes the memory the driver reserves for itself, reported
    separately as C(memory_reserved), and C(memory_free = memory_total -
    memory_reserved - memory_used).
  - C(memory_total_cuda) estimates the smaller total CUDA (and so vLLM and llama.cpp) sees;
    an RTX 3090 is 24576 MiB to nvidia-smi and 23.58 GiB to vLLM.
author:
  - kvpin.fleet contributors (!UNKNOWN)
'''

EXAMPLES = r'''
- name: Read the GPUs of every node
  kvpin.fleet.gpu_facts:

- name: A node that must have GPUs
  kvpin.fleet.gpu_facts:
    required: true

- name: Show the free memory of each GPU
  ansible.builtin.debug:
    msg: "{{ item.name }}: {{ item.memory_free }} bytes free"
  loop: "{{ ansible_facts.kvpin_gpus.gpus }}"

- name: Probe the GPUs and read the worker's files and unit in the same round trip
  kvpin.fleet.gpu_facts:
    required: true
    observe:
      - name: gpustack_worker
        files:
          - path: /var/lib/gpustack/config.yaml
            sha1: 0123456789abcdef0123456789abcdef01234567
        units:
          - name: gpustack.service

- name: Compare after planning, on the controller
  ansible.builtin.set_fact:
    worker_drift: "{{ ansible_facts.kvpin_node_observed | kvpin.fleet.kvpin_node_drift(desired_checks) }}"

- name: Read the GPUs, sending nvidia-ml-py from the controller where the node lacks it
  kvpin.fleet.gpu_facts:
    required: true
    library_wheel: "{{ lookup('kvpin.fleet.wheel', '/srv/wheelhouse/nvidia_ml_py-13.615.71-py3-none-any.whl') }}"

- name: Read the GPUs from a stub NVML library (tests)
  kvpin.fleet.gpu_facts:
    library_path: /opt/kvpin/nvml-stub/libnvidia-ml.so.1
  environment:
    KVPIN_NVML_STUB_CONFIG: /etc/kvpin/nvml-stub.json
'''

RETURN = r'''
missing_library:
  description: The Python distribution to install on the node when the module fails because it cannot import pynvml.
  returned: failure, when pynvml cannot be imported
  type: str
  sample: nvidia-ml-py
pynvml_from:
  description:
    - Where C(pynvml) was imported from - C(installed) (the node's Python), C(library_dir) (a
      copy unpacked there before), C(library_wheel) (the wheel sent with this call, unpacked into
      O(library_dir), or into a temporary directory in check mode).
  returned: success
  type: str
  sample: library_dir
ansible_facts:
  description: Facts to add to the host's ansible_facts.
  returned: always
  type: dict
  contains:
    kvpin_node_observed:
      description:
        - What the node has for every object named in O(observe), for
          P(kvpin.fleet.kvpin_node_drift#filter) - per file path its kind, mode, owner, group, size,
          mtime and sha1 (or C(sha1_skipped), why it was not hashed - over the per-file or per-call
          bound); per user its primary group, shell and home (null when missing); per group whether
          it exists; per unit its C(systemctl show) properties;
          per URL the HTTP status; per interpreter the installed versions. Readers that failed
          carry C(error) with the reason.
      returned: when O(observe) is given
      type: dict
      sample:
        files:
          /var/lib/gpustack/config.yaml: {kind: a file, mode: 384, owner: root, group: root, size: 412,
                                          mtime: 1764990000.5, sha1: 0123456789abcdef0123456789abcdef01234567}
        users:
          kvpin-watchdog: {group: kvpin-watchdog, shell: /usr/sbin/nologin, home: /nonexistent}
        groups: {kvpin-watchdog: true}
        units:
          gpustack.service: {properties: {LoadState: loaded, ActiveState: active, SubState: running}, error: null}
        http: {}
        python_packages: {}
    kvpin_measurements:
      description:
        - Per deployment named in O(measurements) - C(path), C(state) (C(read), C(missing) or
          C(unusable)), C(measurement) (the file's content, valid for
          M(kvpin.fleet.serving_plan), when read), C(reason) (why not) and C(note) (for an unusable
          file, the line the plan report prints).
      returned: when O(measurements) is given
      type: dict
      sample:
        chat:
          path: /var/lib/kvpin-watchdog/chat/measurement.json
          state: read
          reason: null
          note: null
          measurement: {traffic: {requests: 4210, prompt_tokens_p99_upper: 9216}, kv_pool: {kv_cache_tokens: 524288},
                        gpu: NVIDIA L40S, backend_version: 0.32.0, args: [--max-model-len, '16384'],
                        measured_at: '2026-12-07T06:00:00Z'}
    kvpin_gpus:
      description: The node's NVIDIA GPUs as NVML reports them.
      returned: always
      type: dict
      contains:
        driver_version:
          description: NVIDIA driver version; null without NVML.
          returned: always
          type: str
          sample: "570.133.20"
        cuda_driver_version:
          description: Newest CUDA version the driver supports, C(major.minor); null without NVML.
          returned: always
          type: str
          sample: "12.8"
        nvml_version:
          description: NVML library version; null without NVML or where NVML does not report it.
          returned: always
          type: str
          sample: "12.570.133.20"
        gpu_count:
          description: Number of GPUs.
          returned: always
          type: int
          sample: 2
        reason:
          description: Why there are no GPUs (no NVML library, driver not loaded); null when NVML answered.
          returned: always
          type: str
          sample: null
        gpus:
          description: One entry per GPU, in NVML index order.
          returned: always
          type: list
          elements: dict
          contains:
            index:
              description: NVML index.
              type: int
              returned: always
              sample: 0
            uuid:
              description: GPU UUID.
              type: str
              returned: always
              sample: GPU-8a29a722-39c6-4ad5-8e55-3d7229938a7f
            name:
              description: Product name.
              type: str
              returned: always
              sample: NVIDIA GeForce RTX 4090
            memory_total:
              description: Total memory, bytes.
              type: int
              returned: always
              sample: 25757220864
            memory_used:
              description: Memory allocated by contexts, bytes (includes the reserved part where the driver lacks the v2 query).
              type: int
              returned: always
              sample: 481296384
            memory_free:
              description: Memory still available, bytes.
              type: int
              returned: always
              sample: 25275924480
            memory_reserved:
              description: Memory the driver and firmware reserve, bytes; null where the driver lacks the v2 query.
              type: int
              returned: always
              sample: 0
            memory_total_cuda:
              description:
                - Estimate of the total a CUDA process sees (C(cudaMemGetInfo), C(torch.cuda.mem_get_info()[1]),
                  what vLLM budgets C(gpu_memory_utilization) of), bytes. NVML's C(memory_total) less what the
                  driver keeps; the planners budget from this, not from C(memory_total).
                - Null when the NVML figures cannot give one (see C(memory_total_cuda_source)).
              type: int
              returned: always
              sample: 25345638400
            memory_total_cuda_source:
              description:
                - Where the driver's share came from, the larger when several are known.
                  C(nvml_v2_reserved) (NVML's v2 C(reserved)), C(table:<card>) (the largest gap seen in
                  public logs for that card class, or a derived figure, module_utils/cuda_total.py), or
                  C(default margin) (2 % of the card, at least 512 MiB, for a card in no table row);
                  C(none) followed by the reason when C(memory_total_cuda) is null.
              type: str
              returned: always
              sample: table:RTX 4090
            compute_capability:
              description: CUDA compute capability, C(major.minor).
              type: str
              returned: always
              sample: "8.9"
            pci_bus_id:
              description: PCI bus id.
              type: str
              returned: always
              sample: "00000000:01:00.0"
            pci_device_id:
              description: PCI device id and vendor id, as NVML combines them.
              type: str
              returned: always
              sample: "0x268410de"
            power_limit_watts:
              description: Power limit in effect, watts; null where the GPU reports none.
              type: float
              returned: always
              sample: 450.0
            mig_mode:
              description: MIG mode, current and pending; null on GPUs without MIG.
              type: dict
              returned: always
              sample: null
              contains:
                current:
                  description: MIG enabled now.
                  type: bool
                  returned: when the GPU supports MIG
                pending:
                  description: MIG enabled after the next GPU reset.
                  type: bool
                  returned: when the GPU supports MIG
            nvlink_active_links:
              description: Number of NVLinks up; null on GPUs without NVLink.
              type: int
              returned: always
              sample: 4
            processes:
              description: Compute processes on the GPU; null where NVML cannot list them.
              type: list
              elements: dict
              returned: always
              contains:
                pid:
                  description: Process id.
                  type: int
                  returned: always
                used_memory:
                  description: GPU memory the process uses, bytes; null where the driver cannot tell.
                  type: int
                  returned: always
                cgroup:
                  description:
                    - The process's cgroup membership as C(/proc/<pid>/cgroup) lists it (at most 1024 characters).
                    - The node's GPU ledger (filter C(kvpin.fleet.kvpin_gpu_ledger)) tells GPUStack's processes by it.
                  type: str
                  returned: when /proc/<pid>/cgroup can be read on the node
                  sample: "0::/system.slice/gpustack.service"
        topology:
          description: One entry per unordered pair of GPUs.
          returned: always
          type: list
          elements: dict
          contains:
            gpu_a:
              description: Index of the first GPU.
              type: int
              returned: always
            gpu_b:
              description: Index of the second GPU.
              type: int
              returned: always
            link:
              description:
                - How the pair is connected, as in C(nvidia-smi topo -m) - C(NVLINK), C(PIX), C(PXB),
                  C(PHB), C(NODE) or C(SYS); null where NVML cannot tell.
              type: str
              returned: always
              sample: PHB
            p2p_read:
              description: P2P reads between the pair are possible.
              type: bool
              returned: always
            p2p_write:
              description: P2P writes between the pair are possible.
              type: bool
              returned: always
            nvlink:
              description: The pair is connected by NVLink.
              type: bool
              returned: always
'''

import os
import shutil
import tempfile
import traceback

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.kvpin.fleet.plugins.module_utils.facts.measurement_files import (
    MeasurementFilesInputError,
    parse_measurement_files,
    read_measurements,
)
from ansible_collections.kvpin.fleet.plugins.module_utils.facts.node_state import (
    NodeStateInputError,
    module_command_runner,
    observe,
    parse_checks,
)
from ansible_collections.kvpin.fleet.plugins.module_utils.facts.nvml_probe import (
    NvmlProbeError,
    preload_library,
    probe,
)
from ansible_collections.kvpin.fleet.plugins.module_utils.facts.python_library import (
    LIBRARY_DIR_DEFAULT,
    PythonLibraryError,
    ensure_library_dir,
    find_unpacked,
    load_module_file,
    parse_wheel,
    trusted_copy,
    unpack_wheel,
)

try:
    import pynvml
except ImportError:
    PYNVML_IMPORT_ERROR = traceback.format_exc()
    pynvml = None
else:
    PYNVML_IMPORT_ERROR = None

DISTRIBUTION = 'nvidia-ml-py'


def load_pynvml(module, wheel):
    """pynvml from library_dir, after unpacking ``wheel`` (checked: (stem, bytes)) there if given:
    (the module, where it came from), or fail with missing_library and the reason."""
    library_dir = module.params['library_dir']
    if wheel is None:
        module_file, reason = find_unpacked(library_dir, DISTRIBUTION, 'pynvml')
        if module_file is None:
            # missing_library lets a playbook send the wheel and probe again (site.yml's prereq
            # step) without parsing the message.
            module.fail_json(msg='%s (%s)' % (missing_required_lib(DISTRIBUTION), reason),
                             exception=PYNVML_IMPORT_ERROR, missing_library=DISTRIBUTION)
        return load_module_file('pynvml', module_file), 'library_dir'
    stem, data = wheel
    # The copy this same wheel left on an earlier run is imported as it is: the same call twice
    # writes nothing the second time.
    kept, dummy_reason = trusted_copy(library_dir, stem, 'pynvml')
    if kept is not None:
        try:
            return load_module_file('pynvml', kept), 'library_dir'
        except Exception:  # pylint: disable=broad-except
            pass  # a damaged copy: the wheel replaces it whole below
    if module.check_mode:
        # Read the GPUs as a real run would, keep nothing.
        scratch = tempfile.mkdtemp(prefix='kvpin-pynvml-')
        try:
            return load_module_file('pynvml', os.path.join(unpack_wheel(data, scratch, stem), 'pynvml.py')), 'library_wheel'
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    try:
        ensure_library_dir(library_dir)
        unpacked = unpack_wheel(data, library_dir, stem)
    except PythonLibraryError as exc:
        module.fail_json(msg='Cannot keep %s in %s' % (DISTRIBUTION, exc), field=exc.field)
    except OSError as exc:
        module.fail_json(msg='Cannot unpack %s into library_dir %s: %s' % (DISTRIBUTION, library_dir, exc))
    return load_module_file('pynvml', os.path.join(unpacked, 'pynvml.py')), 'library_wheel'


def main():
    module = AnsibleModule(
        argument_spec=dict(
            required=dict(type='bool', default=False),
            library_path=dict(type='path'),
            observe=dict(type='list', elements='dict', default=[]),
            measurements=dict(type='dict', default={}),
            library_dir=dict(type='path', default=LIBRARY_DIR_DEFAULT),
            library_wheel=dict(type='dict', options=dict(
                name=dict(type='str', required=True),
                content=dict(type='str', required=True, no_log=True),
            )),
        ),
        supports_check_mode=True,
    )
    # Bad input fails before anything on the node is read or written.
    try:
        checks = parse_checks(module.params['observe'])
    except NodeStateInputError as exc:
        module.fail_json(msg='observe: %s' % exc, check=exc.check, field=exc.field)
    try:
        measurement_files = parse_measurement_files(module.params['measurements'])
    except MeasurementFilesInputError as exc:
        module.fail_json(msg='measurements: %s' % exc, field='measurements')
    wheel = None
    sent = module.params['library_wheel']
    if pynvml is None and sent:
        try:
            wheel = parse_wheel(sent['name'], sent['content'], DISTRIBUTION, 'pynvml')
        except PythonLibraryError as exc:
            module.fail_json(msg=str(exc), field=exc.field)

    nvml, pynvml_from = pynvml, 'installed'
    if nvml is None:
        try:
            nvml, pynvml_from = load_pynvml(module, wheel)
        except Exception as exc:  # a copy that does not import: say so, never a traceback
            module.fail_json(msg='Cannot import pynvml from %s: %s: %s' % (module.params['library_dir'], type(exc).__name__, exc),
                             missing_library=DISTRIBUTION)

    library_path = module.params['library_path']
    if library_path:
        try:
            preload_library(library_path)
        except OSError as exc:
            module.fail_json(msg='Cannot load the NVML library at library_path %s: %s' % (library_path, exc))

    try:
        facts = probe(nvml)
    except NvmlProbeError as exc:
        module.fail_json(msg='NVML error while reading the GPUs: %s' % exc, nvml_call=exc.call)
    except Exception as exc:  # e.g. a library answering bytes that are not UTF-8: report, never a traceback
        module.fail_json(msg='Unexpected error while reading the GPUs through NVML: %s: %s'
                         % (type(exc).__name__, exc), exception=traceback.format_exc())

    if module.params['required'] and facts['reason']:
        module.fail_json(msg='No usable NVIDIA GPUs and required=true: %s' % facts['reason'])
    ansible_facts = dict(kvpin_gpus=facts)
    if checks:
        ansible_facts['kvpin_node_observed'] = observe(checks, run_command=module_command_runner(module))
    if measurement_files:
        ansible_facts['kvpin_measurements'] = read_measurements(measurement_files)
    # Changed only when a sent wheel was unpacked (in check mode: would have been).
    module.exit_json(changed=pynvml_from == 'library_wheel', pynvml_from=pynvml_from, ansible_facts=ansible_facts)


if __name__ == '__main__':
    main()
