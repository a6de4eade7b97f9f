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
