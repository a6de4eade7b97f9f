# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one-line GPU summary site.yml prints per node after the probe, from the kvpin_gpus fact
of kvpin.fleet.gpu_facts, e.g.

    lab-mixed: 1 x NVIDIA GeForce RTX 4090 + 1 x NVIDIA RTX A6000 (72.0 GiB), driver 570.133.20,
    CUDA 12.8, 1 deployment(s) in inventory

(one line). Cards are grouped by name, names sorted ignoring case; the total is the sum of memory_total
(bytes, as NVML reports it) in GiB rounded to one decimal; a missing driver or CUDA version
reads "-"; the fact's reason, if any, follows after "; "."""


from ansible_collections.kvpin.fleet.plugins.module_utils.units import GiB


class GpuSummaryError(ValueError):
    """A kvpin_gpus fact or count the summary cannot be made from (the field is named)."""


def _int(value, field):
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise GpuSummaryError('%s must be a non-negative integer, got %r' % (field, value))
    return value


def gpu_summary(gpus_fact, host, deployment_count):
    """One line: the node's cards, their total memory, driver and CUDA versions, how many
    deployments the inventory gives it, and the fact's reason (no GPUs, no library)."""
    if not isinstance(gpus_fact, dict):
        raise GpuSummaryError('kvpin_gpus must be a dict, got %s' % type(gpus_fact).__name__)
    gpus = gpus_fact.get('gpus')
    if gpus is None:
        gpus = []
    if not isinstance(gpus, list):
        raise GpuSummaryError('kvpin_gpus.gpus must be a list, got %s' % type(gpus).__name__)
    counts = {}
    total = 0
    for index, gpu in enumerate(gpus):
        if not isinstance(gpu, dict):
            raise GpuSummaryError('kvpin_gpus.gpus[%d] must be a dict, got %s' % (index, type(gpu).__name__))
        name = gpu.get('name')
        if not isinstance(name, str):
            raise GpuSummaryError('kvpin_gpus.gpus[%d].name must be a string, got %r' % (index, name))
        counts[name] = counts.get(name, 0) + 1
        total += _int(gpu.get('memory_total'), 'kvpin_gpus.gpus[%d].memory_total' % index)
    deployment_count = _int(deployment_count, 'deployment_count')
    cards = ' + '.join('%d x %s' % (counts[name], name) for name in sorted(counts, key=lambda n: (n.lower(), n)))
    reason = gpus_fact.get('reason')
    return '%s: %s (%s GiB), driver %s, CUDA %s, %d deployment(s) in inventory%s' % (
        host, cards or 'no GPUs', round(total / GiB, 1),
        gpus_fact.get('driver_version') or '-', gpus_fact.get('cuda_driver_version') or '-',
        deployment_count, ('; %s' % reason) if reason else '')
