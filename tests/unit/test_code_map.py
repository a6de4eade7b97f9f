# -*- coding: utf-8 -*-
# Copyright (c) 2026 kvpin.fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""docs/code-map.md stays true: every file under plugins/ and roles/*/files/, and every filter
the collection's filter plugins register, is named in the map.

A file counts as named when a `code span` of the map is its path or a tail of its path cut at a
'/' that names no other checked file (`plan/vllm_memory.py` names
plugins/module_utils/plan/vllm_memory.py; `client.py` would not do once two files share it)."""
import ast
import os
import re
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CODE_MAP = os.path.join(ROOT, 'docs', 'code-map.md')
SKIPPED_NAMES = ('__init__.py',)


def tracked_files():
    """The files git would commit (tracked + untracked, not ignored), as repo-relative paths."""
    out = subprocess.run(['git', '-C', ROOT, 'ls-files', '--cached', '--others', '--exclude-standard'],
                         check=True, capture_output=True, text=True).stdout
    return sorted({line for line in out.splitlines() if os.path.isfile(os.path.join(ROOT, line))})


def checked_files(files):
    return [path for path in files
            if (path.startswith('plugins/') or re.match(r'roles/[^/]+/files/', path))
            and os.path.basename(path) not in SKIPPED_NAMES and '__pycache__' not in path]


def code_spans(text):
    return set(re.findall(r'`([^`\n]+)`', text))


def tails(path):
    parts = path.split('/')
    return ['/'.join(parts[i:]) for i in range(len(parts))]


def unnamed_files(files, spans):
    """The files no code span names (a tail shared by two checked files names neither)."""
    owners = {}
    for path in files:
        for tail in tails(path):
            owners.setdefault(tail, set()).add(path)
    return [path for path in files
            if not any(tail in spans and owners[tail] == {path} for tail in tails(path))]


def registered_filters(files):
    """Names returned by each filter plugin's FilterModule.filters() dict literal."""
    names = set()
    for path in files:
        if not (path.startswith('plugins/filter/') and path.endswith('.py')):
            continue
        with open(os.path.join(ROOT, path)) as handle:
            tree = ast.parse(handle.read(), path)
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name == 'filters':
                for ret in ast.walk(node):
                    if isinstance(ret, ast.Return) and isinstance(ret.value, ast.Dict):
                        names.update(k.value for k in ret.value.keys if isinstance(k, ast.Constant))
    return names


def test_every_plugin_and_role_file_is_in_the_code_map():
    files = checked_files(tracked_files())
    assert len(files) > 50, files   # the walk found the tree
    with open(CODE_MAP) as handle:
        spans = code_spans(handle.read())
    missing = unnamed_files(files, spans)
    assert not missing, 'docs/code-map.md does not name: %s' % ', '.join(missing)


def test_every_filter_is_in_the_code_map():
    filters = registered_filters(tracked_files())
    assert 'kvpin_node_drift' in filters and 'kvpin_gpustack_vram_claim' in filters, filters
    with open(CODE_MAP) as handle:
        spans = code_spans(handle.read())
    missing = sorted(filters - spans)
    assert not missing, 'docs/code-map.md does not name the filters: %s' % ', '.join(missing)


def test_an_unnamed_or_ambiguous_file_is_reported():
    files = ['plugins/module_utils/gpustack/client.py', 'plugins/module_utils/other/client.py',
             'plugins/module_utils/units.py', 'roles/r/files/prog/cli.py']
    spans = {'client.py', 'units.py', 'prog/cli.py'}
    # 'client.py' names two files, so neither counts as named
    assert unnamed_files(files, spans) == files[:2]
    assert unnamed_files(files, spans | {'gpustack/client.py', 'other/client.py'}) == []
    assert unnamed_files(files, {'client.py', 'units.py'}) == files[:2] + files[3:]
