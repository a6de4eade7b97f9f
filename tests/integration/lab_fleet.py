# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Helpers for the integration tests that drive the lab fleet (scripts/lab.sh).

The nodes are podman containers reached through the containers.podman.podman connection: no
network traffic is involved. Commands run from the repository root so ansible.cfg applies.
"""

import collections
import json
import os
import re
import shutil
import subprocess
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VENV_BIN = os.path.dirname(sys.executable)
LAB_SH = os.path.join(REPO_ROOT, 'scripts', 'lab.sh')
FIXTURE_DIR = os.path.join(REPO_ROOT, 'tests', 'fixtures', 'nvml')
STUB_LIB = os.path.join(REPO_ROOT, 'tests', 'nvml_stub', 'build', 'libnvidia-ml.so.1')
INVENTORY = os.path.join(REPO_ROOT, 'inventory', 'lab')
NODES = ('lab-a6000x4', 'lab-4090x4', 'lab-4090x2', 'lab-mixed')

RECAP_LINE = re.compile(r'^(?P<host>\S+)\s+:\s+ok=(?P<ok>\d+)\s+changed=(?P<changed>\d+)\s+unreachable=(?P<unreachable>\d+)'
                        r'\s+failed=(?P<failed>\d+)', re.MULTILINE)


def lab_unavailable_reason():
    """Why the lab cannot run here, or None."""
    if os.geteuid() != 0:
        return 'the lab fleet needs root (podman + runc systemd containers)'
    if shutil.which('podman') is None or shutil.which('runc') is None:
        return 'podman/runc missing: run scripts/bootstrap.sh'
    if not os.path.exists(STUB_LIB):
        return 'NVML stub not built: run scripts/bootstrap.sh'
    return None


def require_lab():
    """Skip the calling test where the lab cannot run (not root, podman/runc or the NVML stub
    missing) - except under CI=true, where the lab is a prerequisite: there it fails, naming
    what is missing, so a CI run without a lab cannot read as green."""
    reason = lab_unavailable_reason()
    if reason is None:
        return
    import pytest  # pylint: disable=import-outside-toplevel
    if os.environ.get('CI', '').strip().lower() in ('true', '1', 'yes'):
        pytest.fail('CI=true and the lab fleet cannot run here: %s' % reason, pytrace=False)
    pytest.skip(reason)


def ansible_env(collections_path=None):
    env = dict(os.environ)
    env['PATH'] = VENV_BIN + os.pathsep + env.get('PATH', '')
    env['ANSIBLE_NOCOLOR'] = '1'
    env['ANSIBLE_FORCE_COLOR'] = '0'
    env.pop('ANSIBLE_CONFIG', None)
    env.pop('ANSIBLE_COLLECTIONS_PATH', None)
    if collections_path is not None:
        env['ANSIBLE_COLLECTIONS_PATH'] = collections_path
    return env


def run(argv, env=None, timeout=600):
    """Run a command from the repository root; returns CompletedProcess with text output."""
    return subprocess.run(argv, cwd=REPO_ROOT, env=env or ansible_env(), capture_output=True, text=True,
                          timeout=timeout, check=False)


def lab(*args):
    proc = run(['bash', LAB_SH] + list(args))
    assert proc.returncode == 0, 'lab.sh %s failed:\n%s%s' % (' '.join(args), proc.stdout, proc.stderr)
    return proc


def lab_is_up():
    return run(['bash', LAB_SH, 'status']).returncode == 0


def playbook(*args, collections_path=None):
    return run([os.path.join(VENV_BIN, 'ansible-playbook'), '-i', INVENTORY] + list(args),
               env=ansible_env(collections_path))


def recap(output):
    """{host: {'ok': n, 'changed': n, 'unreachable': n, 'failed': n}} from a PLAY RECAP."""
    return {m.group('host'): {k: int(m.group(k)) for k in ('ok', 'changed', 'unreachable', 'failed')}
            for m in RECAP_LINE.finditer(output)}


def module_result(node, module, module_args=''):
    """Run one module on one node ad hoc; returns (rc, result dict)."""
    proc = run([os.path.join(VENV_BIN, 'ansible'), '-i', INVENTORY, node, '-m', module, '-a', module_args])
    # The default callback prints "<host> | SUCCESS => {json}" (FAILED! for failures).
    head, sep, body = proc.stdout.partition(' => ')
    assert sep and head.startswith(node), 'unexpected ansible output:\n%s%s' % (proc.stdout, proc.stderr)
    return proc.returncode, json.loads(body)


# "<lab-mixed> PUT /root/.ansible/tmp/.../tmpab12 TO /root/.ansible/tmp/ansible-tmp-.../AnsiballZ_gpu_facts.py"
MODULE_SENT = re.compile(r'^<(?P<host>[^>]+)> PUT \S+ TO \S+/AnsiballZ_(?P<module>\w+)\.py$', re.MULTILINE)


def modules_sent(verbose_output):
    """{host: [module, ...]} in the order Ansible copied them to each node (needs -vvv)."""
    sent = collections.defaultdict(list)
    # The podman connection names the container (KVPIN_LAB_PREFIX + node): report the node.
    prefix = os.environ.get('KVPIN_LAB_PREFIX', '')
    for match in MODULE_SENT.finditer(verbose_output):
        host = match.group('host')
        if prefix and host.startswith(prefix) and host[len(prefix):] in NODES:
            host = host[len(prefix):]
        sent[host].append(match.group('module'))
    return dict(sent)


def node_exec(node, *argv):
    """Run a command inside a lab node (its container); returns CompletedProcess."""
    container = os.environ.get('KVPIN_LAB_PREFIX', '') + node
    return run(['podman', 'exec', container] + list(argv))


def load_fixture(node_or_path):
    path = node_or_path if os.sep in node_or_path else os.path.join(FIXTURE_DIR, node_or_path + '.json')
    with open(path) as f:
        return json.load(f)


def expected_summary(node, fixture):
    """The part of the site playbook's summary line that names the node's cards."""
    counts = collections.Counter(d['name'] for d in fixture['devices'])
    cards = ' + '.join('%d x %s' % (counts[name], name) for name in sorted(counts))
    return '%s: %s' % (node, cards)
