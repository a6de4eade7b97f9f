# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One minimum Ansible version for the collection: every role's
meta/main.yml ``galaxy_info.min_ansible_version`` is the lower bound of meta/runtime.yml's
``requires_ansible`` (the version CI tests). A role claiming an older minimum documents a
version nobody runs it on."""

from __future__ import annotations

import os
import re

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROLES_DIR = os.path.join(ROOT, 'roles')


def _version(text):
    """'2.18' / '2.18.0' -> (2, 18, 0); anything else fails with the text."""
    match = re.match(r'^(\d+)\.(\d+)(?:\.(\d+))?$', str(text).strip())
    assert match, 'not a version: %r' % (text,)
    return tuple(int(part or 0) for part in match.groups())


def requires_ansible_lower_bound(spec):
    """The ``>=`` bound of a requires_ansible specifier such as '>=2.18.0,<2.20.0'."""
    bounds = [part.strip()[2:] for part in str(spec).split(',') if part.strip().startswith('>=')]
    assert len(bounds) == 1, 'requires_ansible needs exactly one ">=" bound, got %r' % (spec,)
    return _version(bounds[0])


def _roles():
    return sorted(name for name in os.listdir(ROLES_DIR)
                  if os.path.isfile(os.path.join(ROLES_DIR, name, 'meta', 'main.yml')))


def test_the_lower_bound_is_read_from_the_specifier():
    assert requires_ansible_lower_bound('>=2.18.0,<2.20.0') == (2, 18, 0)
    assert requires_ansible_lower_bound('<2.20, >=2.17') == (2, 17, 0)
    with pytest.raises(AssertionError):
        requires_ansible_lower_bound('<2.20.0')


def test_there_are_roles_to_compare():
    assert _roles(), 'no roles/*/meta/main.yml found under %s' % ROLES_DIR


@pytest.mark.parametrize('role', _roles())
def test_role_minimum_ansible_matches_meta_runtime(role):
    with open(os.path.join(ROOT, 'meta', 'runtime.yml'), encoding='utf-8') as handle:
        runtime = yaml.safe_load(handle)
    with open(os.path.join(ROLES_DIR, role, 'meta', 'main.yml'), encoding='utf-8') as handle:
        meta = yaml.safe_load(handle)
    declared = meta['galaxy_info']['min_ansible_version']
    assert isinstance(declared, str), 'min_ansible_version must be a quoted string, got %r' % (declared,)
    assert _version(declared) == requires_ansible_lower_bound(runtime['requires_ansible']), (
        'roles/%s/meta/main.yml min_ansible_version %s != meta/runtime.yml requires_ansible %s'
        % (role, declared, runtime['requires_ansible']))


def _requires_ansible():
    with open(os.path.join(ROOT, 'meta', 'runtime.yml'), encoding='utf-8') as handle:
        return yaml.safe_load(handle)['requires_ansible']


def test_this_run_uses_a_core_the_collection_declares():
    """The core these tests run on (the pinned one, or 2.21 in CI's unit-2.21 step) is inside
    requires_ansible: a core CI tests is a core the collection claims, and the other way round
    (requirements.txt and tests/requirements-core-2.21.txt pin the two)."""
    from ansible.release import __version__ as core
    from packaging.specifiers import SpecifierSet
    assert core in SpecifierSet(_requires_ansible()), (
        'ansible-core %s (this run) is outside meta/runtime.yml requires_ansible %s' % (core, _requires_ansible()))


def test_the_ansible_tools_the_tests_run_are_this_runs_core():
    """Tests run ansible-playbook & co. from beside sys.executable: the venv that runs pytest is the
    controller under test. A tool from another venv (a hard-coded .venv/bin) would test the
    pinned core while the run claims another."""
    import subprocess
    import sys
    from ansible.release import __version__ as core
    tool = os.path.join(os.path.dirname(sys.executable), 'ansible-playbook')
    printed = subprocess.run([tool, '--version'], capture_output=True, text=True, timeout=120, check=True).stdout
    assert re.search(r'\[core %s\]' % re.escape(core), printed.splitlines()[0]), (tool, printed.splitlines()[:1], core)


def test_tests_find_ansible_tools_beside_sys_executable():
    """No test reaches into <repo>/.venv for a tool (see the test above); tests/mutation/run.py
    is a tool of its own that copies the tree with its .venv."""
    offenders = []
    for folder, _dirs, files in os.walk(os.path.join(ROOT, 'tests')):
        for name in files:
            path = os.path.join(folder, name)
            if not name.endswith('.py') or os.path.join('tests', 'mutation') in path or path == os.path.abspath(__file__):
                continue
            with open(path, encoding='utf-8') as handle:
                for number, line in enumerate(handle, 1):
                    code = line.split('#', 1)[0]
                    if re.search(r"""['"]\.venv['"]\s*,\s*['"]bin['"]|['"][^'"]*\.venv/bin/""", code):
                        offenders.append('%s:%d: %s' % (os.path.relpath(path, ROOT), number, line.strip()))
    assert not offenders, 'use os.path.dirname(sys.executable):\n' + '\n'.join(offenders)
