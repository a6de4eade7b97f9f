# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Run a list of tasks as one play on localhost with the repository's ansible.cfg and the
collection as it is checked out; tests that need Ansible's own task execution (action
plugins, -vvv output, register) share it. Importable from any test: pytest puts tests/ on
sys.path for tests/conftest.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import yaml

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLAYBOOK = os.path.join(os.path.dirname(sys.executable), 'ansible-playbook')


def collections_root():
    """The sys.path entry holding ansible_collections/kvpin/fleet (tests/conftest.py adds it)."""
    return next(p for p in sys.path if os.path.isdir(os.path.join(p, 'ansible_collections', 'kvpin', 'fleet')))


def run_tasks_on_localhost(work, tasks, *options, timeout=300, play_vars=None):
    """Write ``tasks`` as one play under the directory ``work`` (a pathlib.Path) and run it
    with ``options`` (e.g. -vvv); returns the CompletedProcess. ``play_vars``: the play's
    ``vars`` (templates stay lazy, as in a playbook's play vars)."""
    playbook = work / 'playbook.yml'
    play = {'hosts': 'localhost', 'gather_facts': False, 'tasks': tasks}
    if play_vars:
        play['vars'] = play_vars
    playbook.write_text(yaml.safe_dump([play], sort_keys=False))
    inventory = work / 'inventory.ini'
    inventory.write_text('localhost ansible_connection=local ansible_python_interpreter=%s\n' % sys.executable)
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO_ROOT, 'ansible.cfg'),
               ANSIBLE_COLLECTIONS_PATH=collections_root(), HOME=str(work), ANSIBLE_NOCOLOR='1',
               ANSIBLE_LOCAL_TEMP=str(work / 'local_tmp'), ANSIBLE_REMOTE_TMP=str(work / 'remote_tmp'),
               ANSIBLE_RETRY_FILES_ENABLED='0')
    return subprocess.run([PLAYBOOK, '-i', str(inventory), str(playbook)] + list(options), env=env,
                          cwd=str(work), capture_output=True, text=True, timeout=timeout, check=False)


def run_repo_playbook(work, playbook, *options, nodes=('node0',), timeout=300):
    """Run the repository's ``playbooks/<playbook>`` with ``options`` against an inventory of
    ``nodes`` in group gpu_nodes, under the directory ``work``; returns the CompletedProcess.
    For what Ansible does before it connects (--list-hosts, --list-tasks, a play's serial)."""
    inventory = work / 'inventory.ini'
    inventory.write_text('[gpu_nodes]\n' + ''.join('%s\n' % node for node in nodes))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO_ROOT, 'ansible.cfg'), ANSIBLE_NOCOLOR='1',
               HOME=str(work), ANSIBLE_LOCAL_TEMP=str(work / 'tmp'))
    return subprocess.run([PLAYBOOK, '-i', str(inventory), os.path.join(REPO_ROOT, 'playbooks', playbook)]
                          + list(options), cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


def run_module_file(work, module, args, wrapper=()):
    """Run one module file in its own Python process the way Ansible runs it (an args file
    holding ANSIBLE_MODULE_ARGS), on the collection as it is checked out, with a clean
    environment under the directory ``work``; returns the CompletedProcess. A traceback is a
    failure here: bad input must come back as a message. ``wrapper``: a command the Python
    process runs under (e.g. a private mount namespace), its argv prefix."""
    args_file = work / 'args.json'
    args_file.write_text(json.dumps({'ANSIBLE_MODULE_ARGS': args}))
    env = {'PATH': os.environ.get('PATH', '/usr/bin:/bin'), 'PYTHONPATH': collections_root(),
           'HOME': str(work), 'LC_ALL': 'C.UTF-8'}
    proc = subprocess.run(list(wrapper) + [sys.executable, module, str(args_file)], env=env, capture_output=True, text=True,
                          timeout=60, check=False)
    assert 'Traceback' not in proc.stderr, proc.stderr
    return proc
