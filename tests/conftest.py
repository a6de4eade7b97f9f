"""Make the checkout importable as ``ansible_collections.kvpin.fleet`` for pytest.

ansible-test needs the tree at a path ending in ansible_collections/kvpin/fleet; plain
pytest gets the same import path through a symlink under .cache/ (ignored by git)."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_parts = ROOT.split(os.sep)
if _parts[-3:-2] == ['ansible_collections'] and _parts[-2:] == ['kvpin', 'fleet']:
    _COLL_ROOT = os.sep.join(_parts[:-3])
else:
    _COLL_ROOT = os.path.join(ROOT, '.cache', 'collections')
    _link = os.path.join(_COLL_ROOT, 'ansible_collections', 'kvpin', 'fleet')
    # A link left by another checkout (a copied .cache) would test that checkout's code.
    if os.path.islink(_link) and os.path.realpath(_link) != os.path.realpath(ROOT):
        os.unlink(_link)
    if not os.path.islink(_link):
        os.makedirs(os.path.dirname(_link), exist_ok=True)
        try:
            os.symlink(ROOT, _link)
        except FileExistsError:
            pass
if _COLL_ROOT not in sys.path:
    sys.path.insert(0, _COLL_ROOT)


# -- No skip hides a failure in CI ----------------------------------------------------------
# CI (CI=true; .ci/run as root on a machine bootstrap.sh prepared) has everything every test
# needs: root, podman/runc for the lab, PostgreSQL for the GPUStack server, the .venv's tools.
# A test that skips there (the lab did not start, a tool is missing) would read as green while
# testing nothing, so under CI=true every skip is reported as a failure, with its reason.
# A skip that is right even in CI (the condition is not this machine's fault: e.g. a real
# NVML library on a GPU runner for a test of the no-NVML path) says so with
# @pytest.mark.ci_may_skip("why") (marker registered in pytest.ini).
def running_in_ci():
    return os.environ.get('CI', '').strip().lower() in ('true', '1', 'yes')


try:
    import pytest as _pytest
except ImportError:  # pragma: no cover - ansible-test imports this file without pytest hooks
    _pytest = None

if _pytest is not None:
    @_pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(item, call):  # pylint: disable=unused-argument
        outcome = yield
        report = outcome.get_result()
        if not report.skipped or hasattr(report, 'wasxfail') or not running_in_ci():
            return
        if item.get_closest_marker('ci_may_skip') is not None:
            return
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
        report.outcome = 'failed'
        report.longrepr = ('CI=true: this test skipped (%s); in CI that would hide a failure, so it '
                           'fails. Mark a skip that is right even in CI with '
                           '@pytest.mark.ci_may_skip(reason).' % reason)


def pytest_report_header(config):
    """Which controller this run tests (scripts/test.sh runs the unit tests on two cores)."""
    del config
    try:
        from ansible.release import __version__ as core
    except ImportError:
        core = 'not importable'
    return 'controller: ansible-core %s, Python %s (%s)' % (core, sys.version.split()[0], sys.executable)
