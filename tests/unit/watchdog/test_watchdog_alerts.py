# -*- coding: utf-8 -*-
# Copyright (c) 2026, kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The alerting rules shipped with the role: `promtool test rules` (fails, not skips, without
promtool under CI=true), and every metric they read is one the watchdog writes."""
from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from watchdog_program import ROOT  # pylint: disable=import-error

RULES = os.path.join(ROOT, "roles", "serving_watchdog", "files", "kvpin_watchdog_alerts.yml")
TESTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "promtool")


def _promtool():
    found = shutil.which("promtool")
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail("promtool is missing (Debian package prometheus, scripts/bootstrap.sh installs it)")
        pytest.skip("promtool not installed (Debian package prometheus)")
    return found


def test_alert_rules_pass_their_promtool_unit_tests():
    promtool = _promtool()
    check = subprocess.run([promtool, "check", "rules", RULES], capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    run = subprocess.run([promtool, "test", "rules", "kvpin_watchdog_alerts_test.yml"], cwd=TESTS,
                         capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stdout + run.stderr


def test_alert_rules_read_only_metrics_the_watchdog_writes(wd):
    with open(RULES, encoding="utf-8") as handle:
        used = set(re.findall(r"\b(kvpin_watchdog_[a-z_]+)\b", handle.read()))
    state = {"limit_source": "node", "storm_guard_tripped": True, "last_recycle_timestamp": 1.0,
             "last_recycle_ok": False, "recycle_failures_total": 1, "last_tick_timestamp": 2.0,
             "alert_episode_since_timestamp": 3.0}
    decision = wd.Decision(t=0.0, action="alert", reason="x", phase="evaluating", diagnosis="memory_rising",
                           memory_bytes=1, memory_limit_bytes=2, slope_bytes_per_hour=1.0,
                           slope_lower_bytes_per_hour=0.5, slope_upper_bytes_per_hour=2.0,
                           projected_seconds_to_limit=3.0, ttft_p95=0.2, ttft_slope=0.01,
                           alert_episode="memory_rising", alert_episode_since=0.0, alert_episodes_total=1)
    written = set(re.findall(r"^(kvpin_watchdog_[a-z_]+)\{", wd.render_metrics("t", decision, 0, state), re.M))
    assert used <= written, used - written


def test_the_alert_episode_is_exported_only_while_open(wd):
    """The rules page on kvpin_watchdog_alert_episode: an unconfirmed memory rise (a diagnosis,
    no episode) writes no episode series; an open episode writes its diagnosis and start."""
    quiet = wd.Decision(t=5.0, action="none", reason="x", phase="evaluating", diagnosis="memory_rising",
                        alert_episodes_total=2)
    text = wd.render_metrics("t", quiet, 0, {})
    assert "kvpin_watchdog_alert_episode{" not in text and 'kvpin_watchdog_alert_episodes_total{target="t"} 2' in text
    paged = wd.Decision(t=7.0, action="alert", reason="x", phase="evaluating", diagnosis="memory_rising",
                        alert_episode="memory_rising", alert_episode_since=6.0, alert_episodes_total=3)
    text = wd.render_metrics("t", paged, 0, {"alert_episode_since_timestamp": 1700000006.0})
    assert 'kvpin_watchdog_alert_episode{target="t",diagnosis="memory_rising"} 1' in text
    assert 'kvpin_watchdog_alert_episode_since_timestamp_seconds{target="t"} 1700000006.0' in text
    for diagnosis in re.findall(r'diagnosis=~?"([a-z_|]+)"', open(RULES, encoding="utf-8").read()):
        for name in diagnosis.split("|"):
            assert name in wd.DIAGNOSES, name
