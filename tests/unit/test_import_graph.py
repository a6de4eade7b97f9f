# -*- coding: utf-8 -*-
# Copyright (c) 2026 kvpin.fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""tests/import_graph.py on the real tree (no cycle, no function-local import of a collection
module, no private name read across modules) and on small trees that break each rule."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import import_graph

PKG = 'ansible_collections.kvpin.fleet.plugins.module_utils'


def write_tree(root, files):
    """``files``: {path under plugins/: source}; returns ``root``."""
    for rel, source in files.items():
        path = os.path.join(str(root), 'plugins', rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, 'w', encoding='utf-8') as handle:
            handle.write(textwrap.dedent(source))
    return str(root)


def problems_of(root, files):
    return import_graph.check_tree(write_tree(root, files))[1]


def test_the_collection_has_no_cycle_no_local_import_and_no_private_read():
    graph, problems = import_graph.check_tree()
    assert problems == []
    # the checker sees the planners' real edges (it would pass an empty graph too)
    serving_plan = PKG + '.plan.serving_plan'
    assert PKG + '.plan.vllm_pipeline' in graph[serving_plan]
    assert PKG + '.plan.traffic_classes' in graph[serving_plan]
    assert serving_plan not in graph[PKG + '.plan.traffic_classes']
    assert PKG + '.plan.vllm_pipeline' not in graph[PKG + '.plan.vllm_memory']


def test_the_script_prints_the_edge_count_and_exits_zero():
    script = os.path.join(import_graph.ROOT, 'tests', 'import_graph.py')
    run = subprocess.run([sys.executable, script], capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    assert ' edges ' in run.stdout


def test_a_clean_tree_has_no_problem(tmp_path):
    graph, problems = import_graph.check_tree(write_tree(tmp_path, {
        'module_utils/a.py': 'from %s import b\nfrom %s.b import VALUE, public\n' % (PKG, PKG),
        'module_utils/b.py': 'VALUE = 1\n\ndef public():\n    return _private()\n\ndef _private():\n    return 2\n',
    }))
    assert problems == []
    assert graph[PKG + '.a'] == {PKG + '.b'} and graph[PKG + '.b'] == set()


def test_a_cycle_is_reported_even_behind_a_function_local_import(tmp_path):
    problems = problems_of(tmp_path, {
        'module_utils/plan/a.py': 'from %s.plan import b\n' % PKG,
        'module_utils/plan/b.py': 'def f():\n    from %s.plan import a\n    return a\n' % PKG,
    })
    assert any(p.startswith('import cycle: ') and 'plan.a' in p and 'plan.b' in p for p in problems), problems


def test_a_three_module_cycle_across_plugin_types_is_reported(tmp_path):
    problems = problems_of(tmp_path, {
        'module_utils/a.py': 'import %s.b as b\n' % PKG,
        'module_utils/b.py': 'from ansible_collections.kvpin.fleet.plugins.action import c\n',
        'action/c.py': 'from %s.a import thing\n' % PKG,
    })
    cycles = [p for p in problems if p.startswith('import cycle: ')]
    assert len(cycles) == 1 and all(name in cycles[0] for name in ('module_utils.a', 'module_utils.b', 'action.c'))


def test_a_function_local_import_is_reported(tmp_path):
    problems = problems_of(tmp_path, {
        'module_utils/a.py': 'def f():\n    from %s.b import g\n    return g()\n' % PKG,
        'module_utils/b.py': 'def g():\n    return 1\n',
    })
    assert len(problems) == 1 and 'inside a function/class/if/try body' in problems[0], problems
    assert 'a.py:2' in problems[0]


def test_imports_inside_class_if_and_try_bodies_are_reported(tmp_path):
    problems = problems_of(tmp_path, {
        'modules/m.py': '''\
            try:
                from %(p)s import b
            except ImportError:
                b = None
            if b:
                import %(p)s.b
            class C:
                from %(p)s.b import g
            import json
            def lazy():
                import gguf   # a third-party library may stay lazy
                return gguf
            ''' % dict(p=PKG),
        'module_utils/b.py': 'def g():\n    return 1\n',
    })
    assert len(problems) == 3 and all('inside a function/class/if/try body' in p for p in problems), problems


def test_a_private_name_imported_from_another_module_is_reported(tmp_path):
    problems = problems_of(tmp_path, {
        'module_utils/a.py': 'from %s.b import _hidden, shown\n' % PKG,
        'module_utils/b.py': '_hidden = 1\nshown = 2\n',
    })
    assert len(problems) == 1 and 'private name _hidden' in problems[0], problems


def test_a_private_attribute_of_another_module_is_reported(tmp_path):
    problems = problems_of(tmp_path, {
        'module_utils/a.py': '''\
            from %(p)s import b as bee
            import %(p)s.c
            def f():
                return bee._hidden(1) + bee.shown + %(p)s.c._other + bee.__name__.count('x')
            ''' % dict(p=PKG),
        'module_utils/b.py': 'def _hidden(x):\n    return x\nshown = 2\n',
        'module_utils/c.py': '_other = 3\n',
    })
    private = sorted(p for p in problems if 'private name' in p)
    assert len(private) == 2 and len(problems) == 2, problems
    assert any('private name _hidden of plugins.module_utils.b' in p for p in private), private
    assert any('private name _other of plugins.module_utils.c' in p for p in private), private


def test_a_module_may_read_its_own_private_names_and_third_party_ones(tmp_path):
    problems = problems_of(tmp_path, {
        'module_utils/a.py': 'import os\n\ndef _mine():\n    return os._exit\n\nVALUE = _mine()\n',
    })
    assert problems == []
