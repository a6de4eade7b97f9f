#!/usr/bin/env python3
# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lab's inventory at any size (an Ansible inventory script; scripts/lab.sh uses it too).

The lab cycles four card layouts: node i (0-based) has layout LAYOUTS[i % 4] and is named after
it, with "-<copy>" from the second round on: 16 nodes are lab-a6000x4 .. lab-mixed, then
lab-a6000x4-2 .. lab-mixed-2, .. lab-mixed-4. How many nodes:
  1. KVPIN_LAB_NODES, when set;
  2. else what `scripts/lab.sh up` recorded for this KVPIN_LAB_PREFIX ($KVPIN_LAB_DIR/<prefix>nodes);
  3. else 4 (the four layouts once).
A node of the first round takes its variables from host_vars/<node>.yml as any host does. A copy
gets its layout's host_vars here, with each deployment renamed <name>-<copy>: GPUStack names
deployments fleet-wide, so two nodes must not deploy the same name. Every node gets its
container name (KVPIN_LAB_PREFIX + node) as ansible_host and KVPIN_LAB_CONNECTION (default
containers.podman.podman) as ansible_connection.

    lab_nodes.py --list | --host NODE      (Ansible)
    lab_nodes.py --names [COUNT]           (scripts/lab.sh: one node name a line)
"""

import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
# (layout, inventory group): vLLM nodes have identical cards (TP); the mixed one runs GGUF.
LAYOUTS = (('lab-a6000x4', 'lab_vllm'), ('lab-4090x4', 'lab_vllm'), ('lab-4090x2', 'lab_vllm'),
           ('lab-mixed', 'lab_llama_box'))
DEFAULT_NODES = len(LAYOUTS)
MAX_NODES = 64
PREFIX_RE = re.compile(r'^[a-zA-Z0-9_.-]*$')
CONNECTIONS = ('containers.podman.podman', 'podman')


def node_count(text, source):
    """The node count in text, checked: 1..MAX_NODES."""
    text = text.strip()
    if not text.isdigit() or not 1 <= int(text) <= MAX_NODES:
        raise ValueError('%s: node count %r is not an integer in 1..%d' % (source, text, MAX_NODES))
    return int(text)


def recorded_count_path(environ):
    lab_dir = environ.get('KVPIN_LAB_DIR') or os.path.join(HERE, '..', '..', '.lab')
    prefix = environ.get('KVPIN_LAB_PREFIX', '')
    if not PREFIX_RE.match(prefix):
        raise ValueError('KVPIN_LAB_PREFIX %r is not a valid container name prefix' % prefix)
    return os.path.join(lab_dir, prefix + 'nodes')


def wanted_count(environ):
    """The lab's node count: KVPIN_LAB_NODES, else lab.sh's record, else 4."""
    if environ.get('KVPIN_LAB_NODES', '').strip():
        return node_count(environ['KVPIN_LAB_NODES'], 'KVPIN_LAB_NODES')
    path = recorded_count_path(environ)
    try:
        with open(path, encoding='utf-8') as handle:
            text = handle.read(64)
    except FileNotFoundError:
        return DEFAULT_NODES
    return node_count(text, path)


def nodes(count):
    """[(node, layout, group, copy)]: copy 1 is the layout's own name, copy k > 1 adds -k."""
    result = []
    for index in range(count):
        layout, group = LAYOUTS[index % len(LAYOUTS)]
        copy = index // len(LAYOUTS) + 1
        result.append((layout if copy == 1 else '%s-%d' % (layout, copy), layout, group, copy))
    return result


def copy_vars(layout, copy, load_yaml):
    """A copy's host variables: its layout's host_vars, deployments renamed <name>-<copy>."""
    with open(os.path.join(HERE, 'host_vars', layout + '.yml'), encoding='utf-8') as handle:
        host_vars = load_yaml(handle) or {}
    deployments = host_vars.get('kvpin_deployments') or []
    host_vars['kvpin_deployments'] = [dict(d, name='%s-%d' % (d['name'], copy)) for d in deployments]
    host_vars['kvpin_lab_layout'] = layout
    return host_vars


def connection_vars(node, environ):
    """How Ansible reaches a node: its container, PREFIX + node, as a plain string (mitogen, the
    opt-in accelerator of docs/rollout-scale.md, does not template ansible_host), through
    KVPIN_LAB_CONNECTION (default containers.podman.podman; mitogen needs the short name podman)."""
    connection = environ.get('KVPIN_LAB_CONNECTION') or 'containers.podman.podman'
    if connection not in CONNECTIONS:
        raise ValueError('KVPIN_LAB_CONNECTION %r is not one of %s' % (connection, ', '.join(CONNECTIONS)))
    return {'ansible_host': environ.get('KVPIN_LAB_PREFIX', '') + node, 'ansible_connection': connection}


def inventory(count, load_yaml, environ):
    groups = {'lab_vllm': [], 'lab_llama_box': []}
    hostvars = {}
    for node, layout, group, copy in nodes(count):
        groups[group].append(node)
        hostvars[node] = copy_vars(layout, copy, load_yaml) if copy > 1 else {'kvpin_lab_layout': layout}
        hostvars[node].update(connection_vars(node, environ))
    return {
        '_meta': {'hostvars': hostvars},
        'all': {'children': ['gpu_nodes']},
        'gpu_nodes': {'children': ['lab_vllm', 'lab_llama_box']},
        'lab_vllm': {'hosts': groups['lab_vllm']},
        'lab_llama_box': {'hosts': groups['lab_llama_box']},
    }


def main(argv, environ):
    try:
        if argv[:1] == ['--names'] and len(argv) <= 2:
            count = node_count(argv[1], 'COUNT') if len(argv) == 2 else wanted_count(environ)
            sys.stdout.write(''.join(node + '\n' for node, _layout, _group, _copy in nodes(count)))
            return 0
        import yaml  # pylint: disable=import-outside-toplevel
        data = inventory(wanted_count(environ), yaml.safe_load, environ)
        if argv == ['--list']:
            json.dump(data, sys.stdout, indent=1, sort_keys=True)
            return 0
        if len(argv) == 2 and argv[0] == '--host':
            json.dump(data['_meta']['hostvars'].get(argv[1], {}), sys.stdout)
            return 0
    except ValueError as exc:
        sys.stderr.write('lab_nodes.py: %s\n' % exc)
        return 2
    sys.stderr.write('usage: lab_nodes.py --list | --host NODE | --names [COUNT]\n')
    return 2


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:], os.environ))
