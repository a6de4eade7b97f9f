# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""No file in the repository points to a document outside it.

The project's "why" lives in docs/ (architecture, lab, data sources, code map) and in upstream
URLs. A reference to design notes, research notes or validation files that only existed next
to the checkout (../shared, shared/docs, shared/research, shared/validation, shared/seed, their
file names) leaves the next engineer with a dead pointer. ``git grep`` scans the working tree
as git sees it (tracked files and untracked ones that are not ignored); this file is the only
one allowed to spell the patterns."""

from __future__ import annotations

import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
THIS_FILE = os.path.relpath(os.path.abspath(__file__), ROOT)

# POSIX extended regular expressions, as git grep -E reads them (no \b, no look-behind).
OUTSIDE_REFERENCES = (
    r'\.\./shared',                                                   # ../shared, ../../shared/...
    r'/work/shared',
    r'(^|[^A-Za-z0-9_])shared/(docs|research|validation|seed|hooks)([^A-Za-z0-9_]|$)',
    r'research/[A-Za-z0-9_.-]+\.md',                                  # research/vllm_memory.md
    r'[Rr]esearch ?(§|sec\.|notes|:|\))',                             # (research), research §3, research notes
    r'(^|[^A-Za-z0-9_/.-])(DESIGN|LAB)\.md',                          # DESIGN.md, LAB.md (docs/lab.md is fine)
    r'field-report\.txt',
    r'(^|[^A-Za-z0-9_/])validation/[A-Za-z0-9_.-]+\.json',            # validation/vllm_public.json
    r'anchors-20[0-9][0-9]',
)


def git_grep(root, extra, paths):
    """(returncode, output lines) of git grep for OUTSIDE_REFERENCES."""
    argv = ['git', '-C', root, 'grep', '-n', '-I', '-E'] + extra
    for pattern in OUTSIDE_REFERENCES:
        argv += ['-e', pattern]
    argv += ['--'] + paths
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120, check=False)
    assert proc.returncode in (0, 1), proc.stderr.decode('utf-8', 'replace')
    return proc.returncode, proc.stdout.decode('utf-8', 'replace').splitlines()


def test_patterns_find_outside_references_and_spare_the_repos_own(tmp_path):
    bad = [
        'see ../shared/docs/LAB.md',
        '# Recipe and traps: shared/docs/LAB.md.',
        'Layout (shared/research/gpustack.md, appendix B)',
        'from shared/validation/vllm_public.json',
        'the report (shared/seed/field-report.txt)',
        '(research/gpustack.md §2)',
        '``research/vllm_memory.md``',
        'by DESIGN.md name',
        'nodes cannot reach PyPI: LAB.md',
        '(research)',
        'research §3, get_batch_defaults',
        '(research notes, GPUStack 2.3.0)',
        '(research: gpustack_worker_native.md)',
        '# validation/vllm_public.json (llm-d)',
        '/work/shared/research/watchdog.md',
        'anchors-2026-12.md',
    ]
    good = [
        'see docs/lab.md and docs/architecture.md',
        'benchmarks/data/vllm_public.json',
        "num_shared_experts=1, 'n_shared_experts': 1",
        'Fixtures shared by the integration tests',
        'gcc -shared -fPIC',
        'https://github.com/vllm-project/vllm/blob/v0.11.0/vllm/v1/worker/gpu_worker.py',
        'the field report (docs/architecture.md)',
        'roles/serving_watchdog/README.md',
    ]
    (tmp_path / 'bad.txt').write_text('\n'.join(bad) + '\n', encoding='utf-8')
    (tmp_path / 'good.txt').write_text('\n'.join(good) + '\n', encoding='utf-8')
    _rc, lines = git_grep(str(tmp_path), ['--no-index'], ['.'])
    found = sorted(line.split(':', 2)[2] for line in lines)
    assert found == sorted(bad)


def test_no_reference_to_documents_outside_the_repository():
    if not os.path.exists(os.path.join(ROOT, '.git')):
        pytest.skip('not a git checkout')
    rc, lines = git_grep(ROOT, ['--untracked'], ['.', ':(exclude)%s' % THIS_FILE])
    assert rc == 1 and lines == [], (
        'references to documents outside the repository (point them at docs/ or an upstream '
        'URL):\n' + '\n'.join(lines))
