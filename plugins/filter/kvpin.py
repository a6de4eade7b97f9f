# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Jinja2 filters of kvpin.fleet. Each filter is documented in the sidecar file
plugins/filter/<filter name>.yml (what ansible-doc -t filter reads); the arithmetic lives
in module_utils so it is unit-tested without Ansible."""

from __future__ import annotations

import base64
import binascii

import yaml
from ansible.errors import AnsibleFilterError

from ansible_collections.kvpin.fleet.plugins.module_utils.facts.compile_cache import CompileCacheError, compile_cache
from ansible_collections.kvpin.fleet.plugins.module_utils.facts.container_gpu import ContainerGpuInputError, problems
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.gpu_ledger import (
    LedgerInputError,
    deployments_from_results,
    gpu_ledger,
)
from ansible_collections.kvpin.fleet.plugins.module_utils.facts.gpu_summary import GpuSummaryError, gpu_summary
from ansible_collections.kvpin.fleet.plugins.module_utils.facts.managed_files import ManagedFileError, file_checks, lifecycle
from ansible_collections.kvpin.fleet.plugins.module_utils.facts.node_state import (
    NodeStateInputError,
    compare,
    parse_checks,
    summarize,
)
from ansible_collections.kvpin.fleet.plugins.module_utils.facts.pip_pins import PipPinError, pip_pins
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.plan_html import PlanHtmlError, render_plan_report
from ansible_collections.kvpin.fleet.plugins.module_utils.rollout.batches import RolloutBatchError, rollout_batches
from ansible_collections.kvpin.fleet.plugins.module_utils.rollout.phases import RolloutPhaseError, selected_phases
from ansible_collections.kvpin.fleet.plugins.module_utils.facts.saved_gpu_facts import SavedGpuFactsError, read_saved_gpu_facts
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.system_reserved import (
    SystemReservedError,
    system_reserved,
)
from ansible_collections.kvpin.fleet.plugins.module_utils.facts.systemd_env import (
    SystemdEnvError,
    env_file_content,
    env_names,
)
from ansible_collections.kvpin.fleet.plugins.module_utils.units import GiB
from ansible_collections.kvpin.fleet.plugins.module_utils.gpustack.api import API_VERSION_AUTO
from ansible_collections.kvpin.fleet.plugins.module_utils.rollout.watchdog_targets import (
    WatchdogTargetError,
    due_args,
    watchdog_targets,
)


def kvpin_system_reserved(plans, ram_gib, vram_min_gib=0):
    """GPUStack ``system_reserved`` ({ram, vram} in whole GiB) from a node's plans."""
    try:
        return system_reserved(plans, ram_gib, vram_min_gib)
    except SystemReservedError as exc:
        raise AnsibleFilterError('kvpin_system_reserved: %s' % exc)


def kvpin_gpu_ledger(gpus, plan_results, vram_min_gib=0, gpustack_cgroup_markers=None):
    """The node's per-GPU ledger (module_utils/gpu_ledger.py) from gpu_facts' GPUs and the
    results of the serving_plan loop; system_reserved as the worker config gets it."""
    try:
        plans = [result['plan'] for result in plan_results or []
                 if isinstance(result, dict) and result.get('plan') is not None]
        reserved = system_reserved(plans, 0, vram_min_gib)['vram'] * GiB
        return gpu_ledger(gpus, deployments_from_results(plan_results), reserved,
                          gpustack_cgroup_markers).to_dict()
    except (LedgerInputError, SystemReservedError) as exc:
        raise AnsibleFilterError('kvpin_gpu_ledger: %s' % exc)


def kvpin_saved_gpu_facts(path, required=False):
    """The ``kvpin_gpus`` fact from a file of saved gpu_facts output on the controller
    (module_utils/saved_gpu_facts.py): plan.yml plans from it without a connection."""
    try:
        return read_saved_gpu_facts(path, required)
    except SavedGpuFactsError as exc:
        raise AnsibleFilterError('kvpin_saved_gpu_facts: %s' % exc)


def kvpin_compile_cache(root, field='compile_cache_dir'):
    """{root, dirs, env} of the engines' compile caches under ``root`` (module_utils/compile_cache.py)."""
    try:
        return compile_cache(root, field)
    except CompileCacheError as exc:
        raise AnsibleFilterError('kvpin_compile_cache: %s' % exc)


# A CDI spec larger than this is not read (nvidia-ctk writes a few KiB per GPU).
CDI_SPEC_MAX_BYTES = 1024 * 1024


def _cdi_spec(slurped):
    """(path, parsed spec or None) of one ansible.builtin.slurp result."""
    if not isinstance(slurped, dict) or not isinstance(slurped.get('content'), str):
        raise ContainerGpuInputError('each CDI spec must be a slurp result with content and source')
    path = str(slurped.get('source', '?'))
    if len(slurped['content']) > CDI_SPEC_MAX_BYTES * 4 // 3 + 4:
        return path, None
    try:
        return path, yaml.safe_load(base64.b64decode(slurped['content']).decode('utf-8'))
    except (binascii.Error, UnicodeDecodeError, yaml.YAMLError):
        return path, None


def kvpin_container_gpu_problems(engine, version=None, runtimes=None, cdi_specs=None, spec_dirs=None):
    """What keeps ``engine`` from handing the NVIDIA GPUs to the worker container
    (module_utils/container_gpu.py); [] when nothing does. ``cdi_specs``: slurp results."""
    try:
        specs = dict(_cdi_spec(slurped) for slurped in cdi_specs or [])
        return problems(engine, version, runtimes, specs, list(spec_dirs or []))
    except ContainerGpuInputError as exc:
        raise AnsibleFilterError('kvpin_container_gpu_problems: %s' % exc)


def kvpin_file_checks(table, paths_only=False):
    """node_state ``files`` entries for a role's table of managed files (content -> sha1, or
    with ``paths_only`` -> read_sha1, the content not rendered)."""
    if not isinstance(paths_only, bool):
        raise AnsibleFilterError('kvpin_file_checks: paths_only must be true or false, got %r' % (paths_only,))
    try:
        return file_checks(table, paths_only=paths_only)
    except ManagedFileError as exc:
        raise AnsibleFilterError('kvpin_file_checks: %s' % exc)


def kvpin_managed_lifecycle(table, written=None):
    """The restart, rollback and cleanup lists of a role's table of managed files, from its rows'
    backup / restart / verify_unit columns; with ``written`` (the managed_files result) what that
    write changed, replaced and created (module_utils/facts/managed_files.py)."""
    try:
        return lifecycle(table, written)
    except ManagedFileError as exc:
        raise AnsibleFilterError('kvpin_managed_lifecycle: %s' % exc)


def kvpin_gpu_summary(gpus_fact, host, deployment_count=0):
    """site.yml's one-line report of a node's GPUs (module_utils/gpu_summary.py)."""
    try:
        return gpu_summary(gpus_fact, host, deployment_count)
    except GpuSummaryError as exc:
        raise AnsibleFilterError('kvpin_gpu_summary: %s' % exc)


def kvpin_node_drift(observed, checks):
    """node_state's answer (in_sync, checks, drift) for ``checks`` against an observation
    gpu_facts made on the node (its ``observe`` option): the same comparison, on the controller."""
    if not isinstance(observed, dict):
        raise AnsibleFilterError('kvpin_node_drift: expected the kvpin_node_observed dict of gpu_facts, got %r'
                                 % (type(observed).__name__,))
    try:
        return summarize(compare(parse_checks(checks), observed))
    except NodeStateInputError as exc:
        raise AnsibleFilterError('kvpin_node_drift: %s' % exc)


# What Ansible itself prints for a no_log value.
MASKED_VALUE = 'VALUE_SPECIFIED_IN_NO_LOG_PARAMETER'


def kvpin_mask_keys(items, keys):
    """``items`` (dicts) with the set (non-null) values of ``keys`` replaced by Ansible's mask.
    A loop result carries its item and -v prints it: loops over records holding a secret
    iterate over the masked copy, so presence checks still see the key."""
    if not isinstance(items, (list, tuple)) or not all(isinstance(item, dict) for item in items):
        raise AnsibleFilterError('kvpin_mask_keys: expected a list of dicts, got %r' % (type(items).__name__,))
    return [dict((key, MASKED_VALUE if key in keys and value is not None else value) for key, value in item.items())
            for item in items]


def kvpin_plan_report_html(nodes, title='kvpin.fleet plan'):
    """The fleet's plans as one self-contained HTML page (module_utils/plan_html.py)."""
    try:
        return render_plan_report(nodes, title)
    except PlanHtmlError as exc:
        raise AnsibleFilterError('kvpin_plan_report_html: %s' % exc)


def kvpin_pip_pins(requirements):
    """[{name, version}] of exact pins / bare names, for kvpin.fleet.node_state."""
    try:
        return pip_pins(requirements)
    except PipPinError as exc:
        raise AnsibleFilterError('kvpin_pip_pins: %s' % exc)


def kvpin_rollout_batches(value, field='kvpin_serial'):
    """The play's ``serial`` (a batch size or a list of them), each batch checked
    (module_utils/rollout_batches.py)."""
    try:
        return rollout_batches(value, field)
    except RolloutBatchError as exc:
        raise AnsibleFilterError('kvpin_rollout_batches: %s' % exc)


def kvpin_rollout_phases(run_tags, skip_tags=None):
    """site.yml's phases that --tags / --skip-tags select, in run order
    (module_utils/rollout_phases.py)."""
    try:
        return selected_phases(run_tags, skip_tags)
    except RolloutPhaseError as exc:
        raise AnsibleFilterError('kvpin_rollout_phases: %s' % exc)


def kvpin_systemd_env_file(environment, what='environment'):
    """An EnvironmentFile= body (systemd's quoting) for a dict of NAME: value."""
    try:
        return env_file_content(environment, what=what)
    except SystemdEnvError as exc:
        raise AnsibleFilterError('kvpin_systemd_env_file: %s' % exc)


def kvpin_systemd_env_names(environment, what='environment'):
    """The checked, sorted variable names of a dict of NAME: value."""
    try:
        return env_names(environment, what=what)
    except SystemdEnvError as exc:
        raise AnsibleFilterError('kvpin_systemd_env_names: %s' % exc)


def kvpin_due_args(plan, at):
    """The backend_parameters due at ``at`` (HH:MM) for a plan (module_utils/watchdog_targets.py)."""
    try:
        return due_args(plan, at)
    except WatchdogTargetError as exc:
        raise AnsibleFilterError('kvpin_due_args: %s' % exc)


def kvpin_watchdog_targets(deployments, server_url, api_key=None, api_version=API_VERSION_AUTO, worker_name=None,
                           worker_runtime='container', plans=None):
    """One serving_watchdog target per deployment (module_utils/watchdog_targets.py)."""
    try:
        return watchdog_targets(deployments, server_url, api_key, api_version, worker_name, worker_runtime, plans)
    except WatchdogTargetError as exc:
        raise AnsibleFilterError('kvpin_watchdog_targets: %s' % exc)


class FilterModule(object):
    """kvpin.fleet filters."""

    def filters(self):
        return {
            'kvpin_compile_cache': kvpin_compile_cache,
            'kvpin_container_gpu_problems': kvpin_container_gpu_problems,
            'kvpin_due_args': kvpin_due_args,
            'kvpin_file_checks': kvpin_file_checks,
            'kvpin_gpu_ledger': kvpin_gpu_ledger,
            'kvpin_gpu_summary': kvpin_gpu_summary,
            'kvpin_managed_lifecycle': kvpin_managed_lifecycle,
            'kvpin_mask_keys': kvpin_mask_keys,
            'kvpin_node_drift': kvpin_node_drift,
            'kvpin_pip_pins': kvpin_pip_pins,
            'kvpin_plan_report_html': kvpin_plan_report_html,
            'kvpin_rollout_batches': kvpin_rollout_batches,
            'kvpin_rollout_phases': kvpin_rollout_phases,
            'kvpin_saved_gpu_facts': kvpin_saved_gpu_facts,
            'kvpin_system_reserved': kvpin_system_reserved,
            'kvpin_systemd_env_file': kvpin_systemd_env_file,
            'kvpin_systemd_env_names': kvpin_systemd_env_names,
            'kvpin_watchdog_targets': kvpin_watchdog_targets,
        }
