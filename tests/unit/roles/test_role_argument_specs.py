# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Every role's meta/argument_specs.yml mirrors its defaults/main.yml: the same variables,
the same default values, and defaults that fit the declared type and choices. Ansible
validates role arguments against the spec at role start; a spec that drifts from the
defaults documents one thing and runs another. Generic over roles/*, as prometheus.prometheus
lints its roles (https://github.com/prometheus-community/ansible)."""

from __future__ import annotations

import os

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
ROLES_DIR = os.path.join(ROOT, 'roles')


def _roles():
    if not os.path.isdir(ROLES_DIR):
        return []
    return sorted(name for name in os.listdir(ROLES_DIR)
                  if os.path.isdir(os.path.join(ROLES_DIR, name)) and not name.startswith('.'))


def _load(role, *parts):
    path = os.path.join(ROLES_DIR, role, *parts)
    if not os.path.exists(path):
        return None
    with open(path, encoding='utf-8') as handle:
        return yaml.safe_load(handle) or {}


# Python types a value of each argument_spec type may have in YAML.
_TYPES = {
    'str': (str,),
    'path': (str,),
    'raw': (object,),
    'int': (int,),
    'float': (int, float),
    'bool': (bool,),
    'list': (list,),
    'dict': (dict,),
}


def _type_errors(name, spec, value):
    """Reasons ``value`` does not fit ``spec`` (empty when it fits)."""
    errors = []
    kind = spec.get('type', 'str')
    if kind not in _TYPES:
        return ['%s: unknown type %r' % (name, kind)]
    if value is None:
        return errors
    # YAML ints are not bools and bools are ints in Python: keep them apart.
    if kind in ('int', 'float') and isinstance(value, bool):
        errors.append('%s: type %s but default %r is a boolean' % (name, kind, value))
    elif not isinstance(value, _TYPES[kind]):
        errors.append('%s: type %s but default %r is %s' % (name, kind, value, type(value).__name__))
    if kind == 'list' and isinstance(value, list) and 'elements' in spec:
        for position, item in enumerate(value):
            errors.extend(_type_errors('%s[%d]' % (name, position),
                                       {'type': spec['elements'], 'options': spec.get('options')}, item))
    if 'choices' in spec and not isinstance(value, (list, dict)) and value not in spec['choices']:
        errors.append('%s: default %r not in choices %r' % (name, value, spec['choices']))
    return errors


ROLES = _roles()


def test_roles_found():
    assert 'gpustack_worker' in ROLES


# A role with nothing to compare is a fact of the tree, not of the machine: right in CI too.
@pytest.mark.ci_may_skip('role without defaults/argument_specs')
@pytest.mark.parametrize('role', ROLES)
def test_spec_and_defaults_have_the_same_variables(role):
    defaults = _load(role, 'defaults', 'main.yml')
    specs = _load(role, 'meta', 'argument_specs.yml')
    if defaults is None and specs is None:
        pytest.skip('%s has neither defaults nor argument_specs' % role)
    assert defaults is not None, '%s: meta/argument_specs.yml without defaults/main.yml' % role
    assert specs is not None, '%s: defaults/main.yml without meta/argument_specs.yml' % role
    options = specs['argument_specs']['main']['options']
    only_in_defaults = sorted(set(defaults) - set(options))
    only_in_spec = sorted(set(options) - set(defaults))
    assert not only_in_defaults, '%s: not in argument_specs: %s' % (role, only_in_defaults)
    assert not only_in_spec, '%s: in argument_specs but not in defaults: %s' % (role, only_in_spec)


# A role with nothing to compare is a fact of the tree, not of the machine: right in CI too.
@pytest.mark.ci_may_skip('role without defaults/argument_specs')
@pytest.mark.parametrize('role', ROLES)
def test_spec_defaults_equal_defaults_and_fit_their_types(role):
    defaults = _load(role, 'defaults', 'main.yml')
    specs = _load(role, 'meta', 'argument_specs.yml')
    if not defaults or not specs:
        pytest.skip('%s: nothing to compare' % role)
    options = specs['argument_specs']['main']['options']
    errors = []
    for name, value in sorted(defaults.items()):
        spec = options.get(name)
        if spec is None:
            continue  # reported by the test above
        if 'default' not in spec:
            errors.append('%s: defaults/main.yml sets %r but the spec has no default' % (name, value))
        elif spec['default'] != value or type(spec['default']) is not type(value):
            errors.append('%s: spec default %r != defaults/main.yml %r' % (name, spec['default'], value))
        if spec.get('required'):
            errors.append('%s: required in the spec yet defaulted in defaults/main.yml' % name)
        if not spec.get('description'):
            errors.append('%s: no description' % name)
        errors.extend(_type_errors(name, spec, value))
    assert not errors, '%s:\n  ' % role + '\n  '.join(errors)


@pytest.mark.parametrize('role', ROLES)
def test_variable_names_carry_the_role_prefix(role):
    defaults = _load(role, 'defaults', 'main.yml') or {}
    internals = _load(role, 'vars', 'main.yml') or {}
    public = [name for name in defaults if not name.startswith(role + '_')]
    private = [name for name in internals if not name.startswith('_' + role + '_')]
    assert not public, '%s: defaults without the %s_ prefix: %s' % (role, role, public)
    assert not private, '%s: vars/main.yml internals without the _%s_ prefix: %s' % (role, role, private)


def test_type_check_catches_drift():
    # The checker itself: a bool passed off as an int, a value outside its choices, a wrong element.
    assert _type_errors('x', {'type': 'int'}, True)
    assert _type_errors('x', {'type': 'str', 'choices': ['a', 'b']}, 'c')
    assert _type_errors('x', {'type': 'list', 'elements': 'str'}, ['a', 1])
    assert not _type_errors('x', {'type': 'list', 'elements': 'dict'}, [{}])
    assert not _type_errors('x', {'type': 'path'}, '/var/lib/gpustack')
