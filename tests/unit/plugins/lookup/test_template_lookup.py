# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""kvpin.fleet.template: what ansible.builtin.template's lookup renders, without deep-copying
the host's variables for each file (docs/rollout-scale.md, "What a rerun costs on the
controller").

Both lookups are loaded through Ansible's own plugin loader, as a play loads them, and
render the same files from the same variables in one Python process of its own: the plugin
loader's collection finder must be installed before anything imports ``ansible_collections``,
which this pytest process (it imports the collection's code from sys.path) has already done."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from local_playbook import collections_root

OURS, BUILTIN = 'kvpin.fleet.template', 'ansible.builtin.template'

TEMPLATES = {
    # ansible_managed, a template_* variable, a filter, a loop, a comment, a default.
    'plain.j2': ('{{ ansible_managed | comment }}\n'
                 'name={{ name }} file={{ template_path | basename }} extra={{ extra | default("-") }}\n'
                 '{% for port in ports %}port={{ port }}\n{% endfor %}'
                 '{# a comment #}\nsecret_sha1={{ secret | hash("sha1") }}\n'),
    # Other delimiters, as the options set them.
    'brackets.j2': '[# a comment #]name=[% name %] ports=[% ports | join(",") %]\n',
}

# Runs each case with the lookups named after the cases (argv); prints, per case, each
# lookup's result or its error, and what the caller's variables looked like afterwards. A case may add `guard`: a variable whose
# deep copy raises (the builtin lookup copies every variable).
DRIVER = textwrap.dedent("""
    import json, sys
    from ansible.parsing.dataloader import DataLoader
    from ansible.plugins.loader import init_plugin_loader, lookup_loader
    from ansible.template import Templar

    class RefusesDeepCopy:
        def __deepcopy__(self, memo):
            raise AssertionError('a variable was deep-copied')

    init_plugin_loader([sys.argv[1]])
    loader = DataLoader()
    lookups = {name: lookup_loader.get(name, loader=loader, templar=Templar(loader=loader))
               for name in sys.argv[3:]}
    results = []
    for case in json.loads(sys.argv[2]):
        result = {}
        for name, lookup in lookups.items():
            variables = dict(case['variables'])
            if case.get('guard'):
                variables['guard'] = RefusesDeepCopy()
            before = dict(variables)
            try:
                result[name] = {'rendered': lookup.run(case['terms'], variables=variables, **case['options'])}
            except Exception as error:
                result[name] = {'error': '%s: %s' % (type(error).__name__, error)}
            result[name]['variables_kept'] = (sorted(variables) == sorted(before)
                                              and all(variables[key] is before[key] for key in before))
        results.append(result)
    print(json.dumps(results))
""")


@pytest.fixture
def search_path(tmp_path):
    (tmp_path / 'templates').mkdir()
    for name, text in TEMPLATES.items():
        (tmp_path / 'templates' / name).write_text(text)
    return str(tmp_path)


def host_variables(search_path):
    return {'name': 'lab-a6000x4', 'ports': [10150, 10151], 'secret': 's3cret',
            'ansible_search_path': [search_path], 'facts': {'gpus': [{'index': 0, 'memory_total': 51527024640}]}}


def run_cases(cases):
    """Per case: {lookup name: {rendered | error, variables_kept}}."""
    done = subprocess.run([sys.executable, '-c', DRIVER, collections_root(), json.dumps(cases), OURS, BUILTIN],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize('terms, options', [
    (['plain.j2'], {}),
    (['plain.j2'], {'template_vars': {'extra': 'from template_vars'}}),
    (['plain.j2'], {'trim_blocks': False}),
    (['brackets.j2'], {'variable_start_string': '[%', 'variable_end_string': '%]',
                       'comment_start_string': '[#', 'comment_end_string': '#]'}),
    # Two files in one call, each with its own template_path.
    (['plain.j2', 'brackets.j2'], {}),
])
def test_renders_what_the_builtin_lookup_renders(search_path, terms, options):
    [result] = run_cases([{'terms': terms, 'options': options, 'variables': host_variables(search_path)}])
    assert 'rendered' in result[OURS], result[OURS]
    assert result[OURS]['rendered'] == result[BUILTIN]['rendered']
    assert 'lab-a6000x4' in result[OURS]['rendered'][0]
    if terms[0] == 'plain.j2':
        assert 'file=plain.j2' in result[OURS]['rendered'][0]
        assert ('extra=from template_vars' in result[OURS]['rendered'][0]) == bool(options.get('template_vars'))


def test_never_deep_copies_the_host_variables(search_path):
    [result] = run_cases([{'terms': ['plain.j2'], 'options': {}, 'variables': host_variables(search_path),
                           'guard': True}])
    assert 'name=lab-a6000x4' in result[OURS]['rendered'][0]
    # The guard works: the builtin lookup copies it.
    assert result[BUILTIN]['error'] == 'AssertionError: a variable was deep-copied'


def test_leaves_the_callers_variables_as_they_were(search_path):
    [result] = run_cases([{'terms': ['plain.j2'], 'options': {'template_vars': {'extra': 'x'}},
                           'variables': host_variables(search_path)}])
    # No template_* variable, no template_vars and no ansible_managed added; the same objects.
    assert result[OURS]['variables_kept'] is True
    assert result[BUILTIN]['variables_kept'] is True


def test_a_missing_template_fails_naming_it(search_path):
    [result] = run_cases([{'terms': ['no-such.j2'], 'options': {}, 'variables': host_variables(search_path)}])
    assert 'no-such.j2' in result[OURS]['error']
    assert 'rendered' not in result[OURS]
