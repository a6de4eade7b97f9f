# -*- coding: utf-8 -*-
# Copyright (c) 2026, kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The decision engine's detectors (kvpin_watchdog_lib/decision.py DETECTORS: one function per
diagnosis, tried in priority order) and the alerting rules shipped with the role
(files/kvpin_watchdog_alerts.yml), whose diagnosis="..." labels must be names the engine gives."""
from __future__ import annotations

import os
import re

from watchdog_program import ROOT  # pylint: disable=import-error

RULES = os.path.join(ROOT, "roles", "serving_watchdog", "files", "kvpin_watchdog_alerts.yml")
# Diagnoses no alerting rule matches, and why none needs to: "steady" is no finding;
# "latency_with_memory_bump" (TTFT p95 up with memory up, but the memory floor not ramping: a
# burst or a plateau) is an alert decision of the engine that Prometheus does not page on - a
# rule for it is a decision to make in the rules file, and this list changes with it.
NO_ALERT_RULE = {"steady", "latency_with_memory_bump"}


def _rule_diagnoses():
    """Every diagnosis a rule matches: diagnosis="a" and each alternative of diagnosis=~"a|b"."""
    with open(RULES, encoding="utf-8") as handle:
        text = handle.read()
    names = set()
    for value in re.findall(r'diagnosis\s*=~?\s*"([^"]*)"', text):
        assert re.fullmatch(r"[a-z_]+(\|[a-z_]+)*", value), "not a plain list of names: %r" % value
        names.update(value.split("|"))
    return names


def test_every_alert_matches_a_diagnosis_the_engine_gives(wd):
    used = _rule_diagnoses()
    assert used, "no diagnosis label found in %s" % RULES
    assert used <= set(wd.DIAGNOSES), sorted(used - set(wd.DIAGNOSES))


def test_the_diagnoses_without_an_alert_rule_are_the_known_quiet_ones(wd):
    """Not every diagnosis needs an alert; the ones without are named here, so a new diagnosis
    comes with a rule or with a line saying why none."""
    assert set(wd.DIAGNOSES) - _rule_diagnoses() == NO_ALERT_RULE


def test_diagnoses_are_the_detectors_names_in_priority_order(wd):
    names = [name for name, _detect in wd.DETECTORS]
    assert wd.DIAGNOSES == tuple(dict.fromkeys(names))
    assert all(callable(detect) for _name, detect in wd.DETECTORS)
    # Recycles outrank alerts (a confirmed leak, then the slow decay), "steady" is the last word.
    assert names[:3] == ["leak_with_latency", "leak_projected", "slow_decay"]
    assert names[-1] == "steady"
    assert names.count("steady") == 1
