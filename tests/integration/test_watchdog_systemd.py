# -*- coding: utf-8 -*-
# Copyright (c) 2026, kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The watchdog under real systemd in a lab node (scripts/lab.sh up): the role's templates
rendered by ansible, units installed under /run/systemd/system (gone at reboot, removed after).

- a leaking workload (HTTP on the node's 127.0.0.1, vLLM-format /metrics, TTFT rising) is
  recycled, and the storm guard stops the recycles after storm_max_recycles;
- a steady workload is not recycled;
- a killed or hung watchdog is restarted by systemd (Restart=on-failure, WatchdogSec=);
- prints `systemd-analyze security` exposure of the unit as systemd 252 sees it there.
Time is compressed through the engine's settings (1 s samples, 60 s window).
The lab nodes have no polkit, so these watchdogs run as root (without capabilities).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lab_fleet  # noqa: E402
from watchdog_program import stage_installed_program  # noqa: E402  pylint: disable=import-error

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROLE = os.path.join(ROOT, "roles", "serving_watchdog")
PLAYBOOK = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
# The container of the lab node (scripts/lab.sh names it KVPIN_LAB_PREFIX + node).
NODE = os.environ.get("KVPIN_WATCHDOG_LAB_NODE", os.environ.get("KVPIN_LAB_PREFIX", "") + "lab-mixed")
TAG = "itest%d" % os.getpid()
BASE = "/run/kvpin-wd-%s" % TAG

WORKLOAD = r'''
import http.server, sys, threading, time
port, leak_mib_s, ttft_growth = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
BOUNDS = [0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0]
counts = [0] * len(BOUNDS)
total = [0]
hog = []
start = time.time()
def work():
    while True:
        if leak_mib_s:
            hog.append(b"x" * int(leak_mib_s * 1024 * 1024))   # touched pages: anon grows
        ttft = 0.2 + ttft_growth * (time.time() - start)
        for i, b in enumerate(BOUNDS):
            if ttft <= b:
                counts[i] += 10
        total[0] += 10
        time.sleep(1)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        lines = ['vllm:time_to_first_token_seconds_bucket{engine="0",le="%s"} %d' % (b, c)
                 for b, c in zip(BOUNDS, counts)]
        lines.append('vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf"} %d' % total[0])
        lines.append('vllm:num_preemptions_total{engine="0"} 0')
        body = ("\n".join(lines) + "\n").encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
threading.Thread(target=work, daemon=True).start()
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
'''

SETTINGS = {
    "warmup_seconds": 5, "min_window_seconds": 20, "window_seconds": 60, "evaluate_every_seconds": 2,
    "min_points": 10, "ttft_min_points": 8, "confirm_seconds": 6, "cooldown_seconds": 0,
    "storm_max_recycles": 2, "storm_window_seconds": 3600,
    "slope_threshold_bytes_per_hour": 1024 ** 3, "ttft_slope_threshold_seconds_per_hour": 1.0,
    "ttft_min_observations": 5,
    # Issue 38's hours-long clocks on the same compressed scale: the warm-up hold ends at the
    # first evaluation, a rise is confirmed after confirm_seconds, alerts page after 6 s.
    "settle_window_seconds": 60, "warmup_hold_max_seconds": 10, "confirm_max_seconds": 6,
    "rising_grace_seconds": 0, "alert_enter_seconds": 6, "alert_clear_seconds": 6,
    # WatchdogSec=20 here: check-config wants a tick's deadline at most half of it.
    "tick_deadline_seconds": 5,
}


def _podman(*args, check=True, timeout=120):
    return subprocess.run(["podman"] + list(args), capture_output=True, text=True, check=check,
                          timeout=timeout)


def _sh(cmd, check=True, timeout=120):
    return _podman("exec", NODE, "sh", "-c", cmd, check=check, timeout=timeout)


def _node_up():
    if shutil.which("podman") is None or not os.path.exists(PLAYBOOK):
        return False
    try:
        out = _podman("exec", NODE, "systemctl", "is-system-running", check=False, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.stdout.strip() in ("running", "degraded")


@pytest.fixture(scope="module")
def node():
    """The lab node, started with scripts/lab.sh when it is not running (and stopped again)."""
    lab_fleet.require_lab()   # skipped without a lab; under CI=true a failure
    was_up = _node_up()
    if not was_up:
        lab_fleet.lab("up", NODE)
    yield NODE
    if not was_up:
        lab_fleet.lab("down", NODE)


def _render(tmp_path, targets):
    """The role's own config and unit templates, rendered by ansible-playbook for the node."""
    extra = {
        "ansible_managed": "Ansible managed (integration test)",
        "serving_watchdog_python": "/usr/bin/python3", "serving_watchdog_install_dir": BASE,
        "serving_watchdog_config_dir": BASE, "serving_watchdog_textfile_dir": BASE + "/tf",
        "serving_watchdog_lock_dir": BASE, "serving_watchdog_user": "root",
        "serving_watchdog_group": "root", "serving_watchdog_watchdog_sec": 20,
        "serving_watchdog_interval_seconds": 1, "serving_watchdog_settings": SETTINGS,
        "serving_watchdog_targets": targets,
    }
    play = tmp_path / "play.yml"
    play.write_text("""
- hosts: localhost
  gather_facts: false
  vars_files: [{role}/defaults/main.yml, {role}/vars/main.yml]
  tasks:
    - name: Render
      ansible.builtin.template:
        src: "{role}/templates/{{{{ item.1 }}}}"
        dest: "{out}/{{{{ item.0.name }}}}-{{{{ item.1 }}}}"
        mode: "0644"
      loop: "{{{{ serving_watchdog_targets | product(['watchdog.json.j2', 'kvpin-watchdog.service.j2']) | list }}}}"
      loop_control:
        label: "{{{{ item.0.name }}}} {{{{ item.1 }}}}"
      vars:
        serving_watchdog_target: "{{{{ item.0 }}}}"
""".format(role=ROLE, out=tmp_path))
    (tmp_path / "extra.json").write_text(json.dumps(extra))
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_PYTHON_INTERPRETER=sys.executable)
    subprocess.run([PLAYBOOK, "-i", "localhost,", "-c", "local", "-e", "@%s" % (tmp_path / "extra.json"),
                    str(play)], env=env, check=True, capture_output=True, timeout=300)


def _show(unit, *props):
    out = _sh("systemctl show -p %s %s" % (",".join(props), unit)).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def _decisions(unit):
    out = _sh("journalctl -u %s --no-pager -o cat" % unit, check=False).stdout
    records = []
    for line in out.splitlines():
        if line.startswith("{"):
            try:
                records.append(json.loads(line))
            except ValueError:
                pass
    return records


@pytest.fixture(scope="module")
def lab(node, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wd-itest")
    workloads = {"leaky": (18081, 2.0, 0.01), "steady": (18082, 0.0, 0.0)}
    targets = []
    for name, (port, _unused, _unused) in workloads.items():
        targets.append({"name": "%s-%s" % (TAG, name), "unit": "kvpin-%s-%s.service" % (TAG, name),
                        "metrics_url": "http://127.0.0.1:%d/metrics" % port})
    _render(tmp, targets)
    units = []
    try:
        _sh("mkdir -p %s/tf" % BASE)
        # The program as the role installs it: the launcher and its package directory (with the
        # two modules shipped from the collection's plugins/module_utils).
        launcher, package = stage_installed_program(tmp / "program")
        _podman("cp", launcher, "%s:%s/kvpin_watchdog.py" % (NODE, BASE))
        _podman("cp", package, "%s:%s/kvpin_watchdog_lib" % (NODE, BASE))
        (tmp / "workload.py").write_text(WORKLOAD)
        _podman("cp", str(tmp / "workload.py"), "%s:%s/workload.py" % (NODE, BASE))
        for name, (port, leak, growth) in workloads.items():
            wl_unit = "kvpin-%s-%s.service" % (TAG, name)
            (tmp / wl_unit).write_text(
                "[Unit]\nDescription=kvpin watchdog test workload %s\n[Service]\n"
                "ExecStart=/usr/bin/python3 %s/workload.py %d %s %s\n" % (name, BASE, port, leak, growth))
            _podman("cp", str(tmp / wl_unit), "%s:/run/systemd/system/%s" % (NODE, wl_unit))
            units.append(wl_unit)
            target = "%s-%s" % (TAG, name)
            _podman("cp", str(tmp / ("%s-watchdog.json.j2" % target)), "%s:%s/%s.json" % (NODE, BASE, target))
            wd_unit = "kvpin-watchdog-%s.service" % target
            _podman("cp", str(tmp / ("%s-kvpin-watchdog.service.j2" % target)),
                    "%s:/run/systemd/system/%s" % (NODE, wd_unit))
            units.append(wd_unit)
        _sh("systemctl daemon-reload && systemctl start %s" % " ".join(units))
        yield {"units": units, "tag": TAG}
    finally:
        _sh("systemctl stop %s; rm -f %s; systemctl daemon-reload; systemctl reset-failed %s; rm -rf %s" % (
            " ".join(units), " ".join("/run/systemd/system/" + u for u in units), " ".join(units), BASE),
            check=False)


def test_leaking_workload_is_recycled_then_storm_guard_stops(lab):
    leaky = "kvpin-%s-leaky.service" % lab["tag"]
    watchdog = "kvpin-watchdog-%s-leaky.service" % lab["tag"]
    deadline = time.time() + 360
    storm = []
    while time.time() < deadline:
        records = _decisions(watchdog)
        storm = [r for r in records if r.get("suppressed_by") == "storm_guard"]
        if storm:
            break
        time.sleep(5)
    recycles = [r for r in _decisions(watchdog) if r.get("event") == "recycle"]
    print("leaky: %d recycles, first reason: %s" % (len(recycles), next(
        (r["reason"] for r in _decisions(watchdog) if r.get("action") == "recycle"), "-")[:300]))
    assert len(recycles) == SETTINGS["storm_max_recycles"], recycles
    assert all(r["ok"] for r in recycles), recycles
    assert storm, "storm guard never engaged"
    # systemctl restart keeps NRestarts at 0 but replaces the process: count start jobs instead.
    starts = _sh("journalctl -u %s --no-pager -o cat | grep -c '^Started '" % leaky, check=False).stdout
    assert int(starts.strip() or 0) == 1 + SETTINGS["storm_max_recycles"]


def test_steady_workload_is_not_recycled(lab):
    watchdog = "kvpin-watchdog-%s-steady.service" % lab["tag"]
    records = _decisions(watchdog)
    assert [r for r in records if r.get("event") == "decision" and r.get("phase") == "evaluating"]
    assert not [r for r in records if r.get("action") == "recycle" or r.get("event") == "recycle"]


def test_killed_or_hung_watchdog_is_restarted_by_systemd(lab):
    watchdog = "kvpin-watchdog-%s-steady.service" % lab["tag"]
    before = _show(watchdog, "MainPID", "NRestarts")
    _sh("kill -9 %s" % before["MainPID"])
    time.sleep(14)                      # RestartSec=10
    after_kill = _show(watchdog, "MainPID", "NRestarts", "ActiveState")
    assert after_kill["ActiveState"] == "active"
    assert int(after_kill["NRestarts"]) == int(before["NRestarts"]) + 1
    _sh("kill -STOP %s" % after_kill["MainPID"])   # hung: no WATCHDOG=1 for WatchdogSec=20
    time.sleep(36)
    after_hang = _show(watchdog, "MainPID", "NRestarts", "ActiveState")
    assert after_hang["ActiveState"] == "active"
    assert int(after_hang["NRestarts"]) == int(after_kill["NRestarts"]) + 1
    log = _sh("journalctl -u %s --no-pager -o cat" % watchdog).stdout
    assert "Failed with result 'watchdog'" in log


def test_security_exposure_printed(lab):
    watchdog = "kvpin-watchdog-%s-steady.service" % lab["tag"]
    out = _sh("systemd-analyze security --no-pager %s" % watchdog, check=False).stdout
    match = re.search(r"Overall exposure level for \S+: ([0-9.]+)", out)
    assert match, out[-2000:]
    print("systemd-analyze security (systemd 252 in %s, User=root for the lab): %s" % (NODE, match.group(1)))
