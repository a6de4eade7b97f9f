# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One serving watchdog target per deployment of a node (site.yml's derivation), as the
serving_watchdog role takes it. Pure data: unit-tested without Ansible."""

from __future__ import annotations

from ansible_collections.kvpin.fleet.plugins.module_utils.gpustack.api import API_VERSION_AUTO, API_VERSION_CHOICES

# ``plans`` before planning (site.yml's probe): see watchdog_targets.
PLANS_PENDING = 'pending'


class WatchdogTargetError(ValueError):
    """A deployment or setting that cannot become a watchdog target (message names it)."""


def scheduled_profiles(plan):
    """(profiles, profile_schedule) of a plan whose strategy is ``scheduled`` (serving_plan's
    plan.profiles[].name/args and plan.schedule, docs/traffic-classes.md), else None: what the
    watchdog's profile switch puts in place at each window edge."""
    if not isinstance(plan, dict) or plan.get('strategy') != 'scheduled' or not plan.get('schedule'):
        return None
    profiles = {}
    for index, profile in enumerate(plan.get('profiles') or []):
        if not isinstance(profile, dict) or not isinstance(profile.get('name'), str) \
                or not isinstance(profile.get('args'), list):
            raise WatchdogTargetError('plan.profiles[%d] needs a name and an args list' % index)
        profiles[profile['name']] = [str(arg) for arg in profile['args']]
    schedule = []
    for index, edge in enumerate(plan['schedule']):
        if not isinstance(edge, dict) or edge.get('profile') not in profiles or not isinstance(edge.get('at'), str):
            raise WatchdogTargetError('plan.schedule[%d] needs an at (HH:MM) and a profile of plan.profiles' % index)
        schedule.append({'at': edge['at'], 'profile': edge['profile']})
    return profiles, schedule


def due_args(plan, at):
    """The backend_parameters a deployment should run at ``at`` ("HH:MM", local time): for a
    ``scheduled`` plan the args of the profile of the latest schedule edge at or before ``at``
    (before the day's first edge, the previous day's last), as the watchdog's profile switch
    (``switch-profile --due``) puts in place; for any other plan its ``args``. So deploying
    during a window deploys that window's profile, and a rerun agrees with the last switch."""
    scheduled = scheduled_profiles(plan)
    if not scheduled:
        return plan.get('args') if isinstance(plan, dict) else None
    if not isinstance(at, str) or len(at) != 5 or at[2] != ':' or not (at[:2] + at[3:]).isdigit():
        raise WatchdogTargetError('the time must be HH:MM, got %r' % (at,))
    profiles, schedule = scheduled
    edges = sorted(schedule, key=lambda edge: edge['at'])
    due = edges[-1]['profile']
    for edge in edges:
        if edge['at'] <= at:
            due = edge['profile']
    return profiles[due]


def measurement_context(plan):
    """What a plan tells its engine, for the watchdog to tag the KV pool it reads back with
    (serving_plan's ``measurement`` gpu / backend_version / args): the card (the first GPU's
    name; the planner compares it with every card of the plan), the engine version and the args.
    None for no plan, and for a ``scheduled`` plan, whose engine switches args by the hour: a
    pool read back from it is not attributed to one set of args."""
    if not isinstance(plan, dict) or scheduled_profiles(plan) is not None:
        return None
    args = plan.get('args')
    memory = plan.get('memory') or []
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        return None
    gpu = memory[0].get('name') if memory and isinstance(memory[0], dict) else None
    return {'gpu': gpu if isinstance(gpu, str) and gpu else None,
            'backend_version': plan.get('backend_version') if isinstance(plan.get('backend_version'), str) else None,
            'args': list(args)}


def watchdog_targets(deployments, server_url, api_key=None, api_version=API_VERSION_AUTO, worker_name=None,
                     worker_runtime='container', plans=None):
    """[{name, gpustack_deployment, gpustack_server, gpustack_api_key, gpustack_api_version,
    gpustack_worker_name, engine_runtime, gpu_indexes, metrics_path[, memory_limit_bytes,
    settings]}] for ``deployments`` (kvpin_deployments entries), or [] without a server URL:
    a watchdog that cannot find or restart its instance would only alert on nothing.

    engine_runtime follows the worker: GPUStack 0.7.x native workers run engines as child
    processes of the worker unit (``native``); 2.x runs each instance in its own container.
    A deployment's optional ``watchdog`` dict may set memory_limit_bytes, metrics_path,
    gpustack_deployment (the model name in GPUStack, default the deployment name) and
    settings (decision-engine overrides).

    ``plans`` (kvpin_plans.results: {deployment: {name}, plan}) adds, for a deployment whose plan
    has strategy ``scheduled``, its profiles and profile_schedule (the role then installs the
    profile switch timer). ``plans='pending'`` (PLANS_PENDING) is site.yml's probe, before
    planning: a deployment with ``traffic_classes`` may turn out ``scheduled``, so its target gets
    empty ``profiles`` and ``profile_schedule``, which names the switch units' paths for the probe
    to observe (their content is known only after planning, when the targets are derived again
    with the plans); such targets are for observing, never for installing."""
    if not server_url:
        return []
    if not isinstance(deployments, (list, tuple)):
        raise WatchdogTargetError('kvpin_deployments must be a list, got %s' % type(deployments).__name__)
    if api_version not in API_VERSION_CHOICES:
        raise WatchdogTargetError('gpustack_api_version must be one of %s, got %r'
                                  % (', '.join(API_VERSION_CHOICES), api_version))
    runtime = 'native' if worker_runtime == 'native' else 'container'
    pending = plans == PLANS_PENDING
    if not pending and plans is not None and not isinstance(plans, (list, tuple)):
        raise WatchdogTargetError("plans must be kvpin_plans.results (a list) or '%s', got %s"
                                  % (PLANS_PENDING, type(plans).__name__))
    plan_of = {}
    for entry in [] if pending else plans or []:
        if isinstance(entry, dict) and isinstance(entry.get('deployment'), dict):
            plan_of[entry['deployment'].get('name')] = entry.get('plan')
    if not isinstance(worker_name, str) or not worker_name:
        raise WatchdogTargetError('the GPUStack worker name must be a non-empty string, got %r' % (worker_name,))
    targets = []
    for index, deployment in enumerate(deployments):
        if not isinstance(deployment, dict) or not isinstance(deployment.get('name'), str):
            raise WatchdogTargetError('kvpin_deployments[%d] needs a name' % index)
        extra = deployment.get('watchdog') or {}
        if not isinstance(extra, dict):
            raise WatchdogTargetError('kvpin_deployments[%d].watchdog must be a dict' % index)
        gpus = deployment.get('gpu_indexes') or []
        if not isinstance(gpus, list) or not all(isinstance(g, int) and not isinstance(g, bool) and g >= 0
                                                 for g in gpus):
            raise WatchdogTargetError('kvpin_deployments[%d].gpu_indexes must be a list of GPU indexes' % index)
        target = {
            'name': deployment['name'],
            'gpustack_deployment': extra.get('gpustack_deployment') or deployment['name'],
            'gpustack_server': server_url,
            'gpustack_api_key': api_key,
            'gpustack_api_version': api_version,
            'gpustack_worker_name': worker_name,
            'engine_runtime': runtime,
            'gpu_indexes': sorted(gpus),
            'metrics_path': extra.get('metrics_path') or '/metrics',
        }
        if extra.get('memory_limit_bytes') is not None:
            target['memory_limit_bytes'] = extra['memory_limit_bytes']
        if extra.get('settings'):
            target['settings'] = extra['settings']
        plan = plan_of.get(deployment['name'])
        scheduled = scheduled_profiles(plan)
        if pending and deployment.get('traffic_classes') is not None:
            target['profiles'], target['profile_schedule'] = {}, []
        elif scheduled:
            target['profiles'], target['profile_schedule'] = scheduled
        context = measurement_context(plan)
        if context is not None:
            target['measurement_context'] = context
        targets.append(target)
    return targets
