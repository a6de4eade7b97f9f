# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Galaxy artifact holds what a user runs and nothing of the lab.

``ansible-galaxy collection build`` runs on a copy of the working tree as git sees it (tracked
and untracked-but-not-ignored files), so the test sees what a release build would see, whatever
else lies in the checkout. The tarball must hold no tests/, molecule/, benchmarks/,
inventory/lab/ or scripts/; it must hold every file of plugins/, roles/, playbooks/ and meta/
(the installed ``kvpin.fleet.site`` needs them); and its roles and plugins carry no test-only
code (no file named or marked as a stand-in / TEST-ONLY)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Directories of the repository that must not ship.
LAB_ONLY = ('tests/', 'molecule/', 'benchmarks/', 'inventory/lab/', 'scripts/', '.ci/')
# Directories whose every file must ship (what the installed playbooks, roles and modules use).
RUNTIME = ('plugins/', 'roles/', 'playbooks/', 'meta/')
# Where test-only code must never be: what a user's play loads.
NO_TEST_CODE = ('roles/', 'plugins/', 'playbooks/')
TEST_ONLY_NAME = re.compile(r'stand-?in|test[-_]?only|fake|mock', re.IGNORECASE)
TEST_ONLY_TEXT = re.compile(r'(?<![A-Za-z])(?:TEST[-_ ]ONLY|stand-?ins?)(?![A-Za-z])', re.IGNORECASE)


def working_tree_files(root=ROOT):
    """Paths git would commit from the working tree: tracked (still present) + untracked, not ignored."""
    out = subprocess.run(['git', '-C', root, 'ls-files', '-z', '--cached', '--others', '--exclude-standard'],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=True, timeout=60).stdout
    paths = sorted(set(p for p in out.decode('utf-8').split('\0') if p))
    return [p for p in paths if os.path.isfile(os.path.join(root, p)) and not os.path.islink(os.path.join(root, p))]


def marked_test_only(members):
    """``members``: {path: bytes}. One line per file under NO_TEST_CODE whose name or text marks
    it as test-only code."""
    findings = []
    for path, data in sorted(members.items()):
        if not path.startswith(NO_TEST_CODE):
            continue
        if TEST_ONLY_NAME.search(os.path.basename(path)):
            findings.append('%s: test-only file name' % path)
        for number, line in enumerate(data.decode('utf-8', 'replace').splitlines(), 1):
            if TEST_ONLY_TEXT.search(line):
                findings.append('%s:%d: %s' % (path, number, line.strip()[:120]))
    return findings


def _galaxy():
    candidate = os.path.join(os.path.dirname(sys.executable), 'ansible-galaxy')
    return candidate if os.path.exists(candidate) else shutil.which('ansible-galaxy')


@pytest.fixture(scope='module')
def artifact(tmp_path_factory):
    """{member path: bytes} of the built tarball, plus the list of working-tree files."""
    if not os.path.isdir(os.path.join(ROOT, '.git')) and not os.path.isfile(os.path.join(ROOT, '.git')):
        pytest.skip('not a git checkout: cannot tell the tracked tree')
    galaxy = _galaxy()
    if galaxy is None:
        pytest.skip('ansible-galaxy not installed')
    base = tmp_path_factory.mktemp('galaxy')
    src = base / 'ansible_collections' / 'kvpin' / 'fleet'
    files = working_tree_files()
    for rel in files:
        dest = src / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(os.path.join(ROOT, rel), str(dest))
    out = base / 'out'
    out.mkdir()
    proc = subprocess.run([galaxy, 'collection', 'build', '--output-path', str(out), str(src)],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout.decode('utf-8', 'replace')
    tarballs = list(out.glob('kvpin-fleet-*.tar.gz'))
    assert len(tarballs) == 1, tarballs
    members = {}
    with tarfile.open(str(tarballs[0])) as tar:
        for member in tar.getmembers():
            if member.isfile():
                members[member.name] = tar.extractfile(member).read()
    return members, files


def test_the_tarball_holds_no_lab_or_test_tree(artifact):
    members, _files = artifact
    shipped = sorted(p for p in members if p.startswith(LAB_ONLY))
    assert shipped == [], 'lab/test files in the Galaxy artifact (galaxy.yml build_ignore): %s' % shipped


def test_the_tarball_holds_every_runtime_file(artifact):
    members, files = artifact
    missing = sorted(p for p in files if p.startswith(RUNTIME) and p not in members)
    assert missing == [], 'runtime files left out of the Galaxy artifact: %s' % missing
    for needed in ('site.yml', 'playbooks/site.yml', 'meta/runtime.yml', 'README.md',
                   'inventory/example/hosts.yml', 'MANIFEST.json', 'FILES.json'):
        assert needed in members, needed


def test_the_test_only_check_finds_marked_code():
    members = {
        'roles/r/files/kvpin-worker-standin.py': b'print(1)\n',
        'roles/r/tasks/main.yml': b'- name: Install | TEST-ONLY thing\n',
        'plugins/modules/m.py': b'# uses a stand-in for the server\n',
        'roles/r/tasks/ok.yml': b'- name: Standing up the worker, outstanding work\n',
        'roles/r/vars/main.yml': b'when: r_native_standin | bool\n',
        'tests/unit/fake_server.py': b'# TEST-ONLY\n',
    }
    found = marked_test_only(members)
    assert found == ['plugins/modules/m.py:1: # uses a stand-in for the server',
                     'roles/r/files/kvpin-worker-standin.py: test-only file name',
                     'roles/r/tasks/main.yml:1: - name: Install | TEST-ONLY thing',
                     'roles/r/vars/main.yml:1: when: r_native_standin | bool']


def test_roles_and_plugins_in_the_tarball_carry_no_test_only_code(artifact):
    members, _files = artifact
    findings = marked_test_only(members)
    assert findings == [], 'test-only code in the Galaxy artifact:\n' + '\n'.join(findings)
