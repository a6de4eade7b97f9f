# -*- coding: utf-8 -*-
# Copyright (c) 2026 kvpin.fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The import graph of the collection's own modules under ``plugins/``, read with ``ast``
(nothing is imported), and three rules it must keep:

* no import cycle among the collection's modules (module_utils, modules, action, filter,
  lookup, plugin_utils): a cycle hidden behind a function-local import is still a cycle;
* every import of ``ansible_collections.kvpin.fleet...`` at module top level, never inside a
  def, class, if or try body (a function that needs another stage gets it as a parameter);
* no module reads another collection module's ``_private`` names, neither
  ``from X import _name`` nor ``module._name`` on an imported collection module.

    .venv/bin/python tests/import_graph.py          # prints the edge count; exit 1 + problems

tests/unit/test_import_graph.py runs ``check_tree`` on the real tree and on small synthetic
ones, so CI's unit step enforces the rules.
"""
from __future__ import annotations

import ast
import os
import sys

COLLECTION = 'ansible_collections.kvpin.fleet'
PLUGIN_DIRS = ('module_utils', 'modules', 'action', 'filter', 'lookup', 'plugin_utils')
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def module_files(root):
    """{dotted module name: path} of every .py under root/plugins/<PLUGIN_DIRS>."""
    found = {}
    plugins = os.path.join(root, 'plugins')
    for kind in PLUGIN_DIRS:
        top = os.path.join(plugins, kind)
        for folder, dirs, files in os.walk(top):
            dirs[:] = sorted(d for d in dirs if d != '__pycache__')
            for name in sorted(files):
                if not name.endswith('.py'):
                    continue
                rel = os.path.relpath(os.path.join(folder, name), root)[:-len('.py')]
                parts = rel.split(os.sep)
                if parts[-1] == '__init__':
                    parts = parts[:-1]
                found['.'.join([COLLECTION] + parts)] = os.path.join(folder, name)
    return found


def _short(module):
    """``module`` without the collection prefix: plugins.module_utils.plan.vllm_memory."""
    return module[len(COLLECTION) + 1:] if module.startswith(COLLECTION + '.') else module


def _resolve_from(module, node):
    """The absolute package a ``from ... import`` names (relative imports resolved)."""
    if not node.level:
        return node.module or ''
    base = module.split('.')[:-node.level]
    return '.'.join(base + ([node.module] if node.module else []))


class _Reader(ast.NodeVisitor):
    """One module's imports of collection modules and its reads of their private names."""

    def __init__(self, module, modules, path):
        self.module, self.modules, self.path = module, modules, path
        self.edges = set()           # target modules
        self.problems = []
        self.aliases = {}            # local name -> collection module it is bound to
        self.depth = 0               # >0 inside def / class / if / try / with / loop bodies

    def _where(self, node):
        return '%s:%d' % (os.path.relpath(self.path, ROOT) if self.path.startswith(ROOT) else self.path,
                          node.lineno)

    def _ours(self, name):
        return name == COLLECTION or name.startswith(COLLECTION + '.')

    def _import_of(self, node, target):
        if target in self.modules and target != self.module:
            self.edges.add(target)
        if self.depth:
            self.problems.append('%s: %s imports %s inside a function/class/if/try body (import it at '
                                 'the top of the module, or pass what it needs as a parameter)'
                                 % (self._where(node), _short(self.module), _short(target)))

    def visit_Import(self, node):
        for alias in node.names:
            if not self._ours(alias.name):
                continue
            self._import_of(node, alias.name)
            if alias.asname:
                self.aliases[alias.asname] = alias.name
            # a plain ``import a.b.c`` binds ``a``: attribute chains are resolved in visit_Attribute

    def visit_ImportFrom(self, node):
        package = _resolve_from(self.module, node)
        if not self._ours(package):
            return
        for alias in node.names:
            child = '%s.%s' % (package, alias.name)
            if child in self.modules:
                self._import_of(node, child)
                self.aliases[alias.asname or alias.name] = child
                continue
            self._import_of(node, package)
            if alias.name.startswith('_') and not alias.name.startswith('__'):
                self.problems.append('%s: %s imports the private name %s from %s'
                                     % (self._where(node), _short(self.module), alias.name, _short(package)))

    def visit_Attribute(self, node):
        chain, inner = [node.attr], node.value
        while isinstance(inner, ast.Attribute):
            chain.append(inner.attr)
            inner = inner.value
        if isinstance(inner, ast.Name):
            chain.append(inner.id)
            chain.reverse()           # [name, attr1, attr2, ...]
            head = self.aliases.get(chain[0])
            dotted = [head] if head else [chain[0]]
            for attr in chain[1:]:
                here = '.'.join(dotted)
                if here in self.modules and here != self.module:
                    if attr.startswith('_') and not attr.startswith('__'):
                        self.problems.append('%s: %s reads the private name %s of %s'
                                             % (self._where(node), _short(self.module), attr, _short(here)))
                    break
                dotted.append(attr)
        self.generic_visit(node)

    def _nested(self, node):
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = visit_Lambda = _nested
    visit_If = visit_Try = visit_With = visit_AsyncWith = visit_For = visit_AsyncFor = visit_While = _nested
    if hasattr(ast, 'TryStar'):
        visit_TryStar = _nested
    if hasattr(ast, 'Match'):
        visit_Match = _nested


def _cycles(graph):
    """Strongly connected components of more than one module (or a module importing itself),
    each as a sorted list, found with Tarjan's algorithm (iteratively)."""
    index, low, on_stack, stack, found, counter = {}, {}, set(), [], [], [0]
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph.get(node, ()):
                    found.append(sorted(component))
    return sorted(found)


def check_tree(root=ROOT):
    """(graph {module: set of collection modules it imports}, [problem text]) for the
    collection checked out at ``root`` (the folder holding ``plugins/``)."""
    modules = module_files(root)
    graph, problems = {}, []
    for module, path in sorted(modules.items()):
        with open(path, encoding='utf-8') as handle:
            source = handle.read()
        try:
            tree = ast.parse(source, filename=path)
        except SyntaxError as error:
            problems.append('%s: does not parse: %s' % (path, error))
            continue
        reader = _Reader(module, modules, path)
        reader.visit(tree)
        graph[module] = reader.edges
        problems.extend(reader.problems)
    for component in _cycles(graph):
        problems.append('import cycle: %s' % ' <-> '.join(_short(name) for name in component))
    return graph, problems


def main(root=ROOT):
    graph, problems = check_tree(root)
    edges = sum(len(targets) for targets in graph.values())
    print('import graph: %d modules, %d edges among the collection\'s modules' % (len(graph), edges))
    for problem in problems:
        print('problem: %s' % problem)
    if problems:
        print('%d problem(s)' % len(problems))
        return 1
    print('no cycles, no function-local collection imports, no private names read across modules')
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else ROOT))
