# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)


DOCUMENTATION = r'''
name: template
author: kvpin.fleet contributors (!UNKNOWN)
version_added: "0.2.0"
short_description: ansible.builtin.template's lookup without a deep copy of every variable per file
description:
  - Renders each template exactly as the C(ansible.builtin.template) lookup does (its own code
    runs, with its search path, C(template_*) variables, C(ansible_managed) and options), but
    hands it the task's variables as a layered mapping whose deep copy is a new, empty layer over
    them.
  - The builtin lookup deep-copies all of the host's variables for each file it renders, only to
    add the C(template_*) variables and O(template_vars) without touching the caller's (ansible-core's
    own comment there asks for a layer instead). On a rerun of C(site.yml) the roles render every
    managed file on the controller to compare its sha1; with a lab node's variables a file took
    76 ms that way against 7 ms with this lookup (C(benchmarks/bench_template_lookup.py),
    C(docs/rollout-scale.md)).
  - The variables themselves are not copied, so a template that mutates a variable in place would
    mutate the caller's. The templates of this collection's roles only read variables.
options:
  _terms:
    description: Template files, searched for as C(ansible.builtin.template) does (a role's C(templates/) first).
    type: list
    elements: str
    required: true
  template_vars:
    description: A dictionary, the keys become additional variables available for templating.
    type: dict
    default: {}
  variable_start_string:
    description: The string marking the beginning of a print statement.
    type: str
    default: '{{'
  variable_end_string:
    description: The string marking the end of a print statement.
    type: str
    default: '}}'
  comment_start_string:
    description: The string marking the beginning of a comment statement.
    type: str
    default: '{#'
  comment_end_string:
    description: The string marking the end of a comment statement.
    type: str
    default: '#}'
  trim_blocks:
    description: Whether the first newline after a block is removed (ansible-core 2.19 and later).
    type: bool
    default: true
  convert_data:
    description: Read by ansible-core 2.18's lookup only (as there, whether YAML in the result becomes data).
    type: bool
    default: true
  jinja2_native:
    description: Read by ansible-core 2.18's lookup only (as there, whether to use Jinja2 native types).
    type: bool
    default: false
seealso:
  - plugin: ansible.builtin.template
    plugin_type: lookup
'''

EXAMPLES = r'''
- name: The sha1 of a rendered config, as the roles compare it with the node's
  ansible.builtin.debug:
    msg: "{{ lookup('kvpin.fleet.template', 'config.yaml.j2') | hash('sha1') }}"
'''

RETURN = r'''
_raw:
  description: Per file, its content after templating.
  type: list
  elements: raw
'''

from collections import ChainMap

from ansible.plugins.lookup.template import LookupModule as BuiltinTemplateLookup


class VariablesLayer(ChainMap):
    """The task's variables seen through an empty top layer. Its deep copy is a plain
    ``ChainMap`` with another empty layer over the same variables: what the builtin lookup
    needs from its copy (a mapping it may update without touching the caller's), at the cost
    of one dict instead of a copy of every fact, registered result and role variable of the
    host. Plain, because ansible-core 2.19 accepts only a ``dict`` or a ``ChainMap`` (by exact
    type) as the variables of a template."""

    def __deepcopy__(self, memo):
        return ChainMap({}, *self.maps)


class LookupModule(BuiltinTemplateLookup):

    def run(self, terms, variables=None, **kwargs):
        if variables is not None:
            variables = VariablesLayer({}, variables)
        return super(LookupModule, self).run(terms, variables=variables, **kwargs)
