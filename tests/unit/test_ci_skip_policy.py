# -*- coding: utf-8 -*-
# Copyright (c) 2026, kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Under CI=true a skip is a failure (tests/conftest.py), except where marked ci_may_skip.

Runs pytest on a throw-away tree that carries this checkout's tests/conftest.py and
pytest.ini, with and without CI=true, and reads the outcome of each test."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SAMPLE = '''
import pytest

def test_plain_skip():
    pytest.skip('the lab cannot start')

@pytest.mark.skipif(True, reason='tool missing')
def test_skipif():
    pass

@pytest.mark.ci_may_skip('not this machine's fault')
def test_allowed_skip():
    pytest.skip('real NVML present')

@pytest.mark.xfail(strict=True, reason='known')
def test_known_failure():
    assert False

def test_passes():
    pass
'''


def _outcomes(tmp_path, ci):
    tree = tmp_path / ('ci' if ci else 'dev')
    (tree / 'tests').mkdir(parents=True)
    shutil.copy(os.path.join(ROOT, 'tests', 'conftest.py'), str(tree / 'tests' / 'conftest.py'))
    shutil.copy(os.path.join(ROOT, 'pytest.ini'), str(tree / 'pytest.ini'))
    (tree / 'tests' / 'test_sample.py').write_text(SAMPLE.replace("'not this machine's fault'", '"not ours"'))
    env = dict(os.environ)
    env.pop('CI', None)
    if ci:
        env['CI'] = 'true'
    proc = subprocess.run([sys.executable, '-m', 'pytest', '-v', '-p', 'no:cacheprovider', 'tests'],
                          cwd=str(tree), env=env, capture_output=True, text=True, timeout=120, check=False)
    found = dict(re.findall(r'::(test_\w+) (PASSED|FAILED|SKIPPED|XFAIL|ERROR)', proc.stdout))
    return proc, found


def test_skips_fail_under_ci_unless_marked(tmp_path):
    proc, found = _outcomes(tmp_path, ci=True)
    # A skip at setup (skipif) is reported as an error: not green either.
    assert found == {'test_plain_skip': 'FAILED', 'test_skipif': 'ERROR', 'test_allowed_skip': 'SKIPPED',
                     'test_known_failure': 'XFAIL', 'test_passes': 'PASSED'}, proc.stdout
    assert 'CI=true: this test skipped' in proc.stdout and 'the lab cannot start' in proc.stdout
    assert proc.returncode == 1


def test_skips_stay_skips_outside_ci(tmp_path):
    proc, found = _outcomes(tmp_path, ci=False)
    assert found == {'test_plain_skip': 'SKIPPED', 'test_skipif': 'SKIPPED', 'test_allowed_skip': 'SKIPPED',
                     'test_known_failure': 'XFAIL', 'test_passes': 'PASSED'}, proc.stdout
    assert proc.returncode == 0


def _lab_fleet():
    sys.path.insert(0, os.path.join(ROOT, 'tests', 'integration'))
    try:
        import lab_fleet  # pylint: disable=import-error,import-outside-toplevel
    finally:
        sys.path.pop(0)
    return lab_fleet


def test_lab_that_cannot_run_fails_under_ci_and_skips_elsewhere(monkeypatch):
    lab_fleet = _lab_fleet()
    monkeypatch.setattr(lab_fleet, 'lab_unavailable_reason', lambda: 'podman/runc missing: run scripts/bootstrap.sh')
    monkeypatch.setenv('CI', 'true')
    with pytest.raises(pytest.fail.Exception, match='CI=true and the lab fleet cannot run here: podman/runc missing'):
        lab_fleet.require_lab()
    monkeypatch.delenv('CI')
    with pytest.raises(pytest.skip.Exception, match='podman/runc missing'):
        lab_fleet.require_lab()
    monkeypatch.setattr(lab_fleet, 'lab_unavailable_reason', lambda: None)
    monkeypatch.setenv('CI', 'true')
    assert lab_fleet.require_lab() is None
