# -*- coding: utf-8 -*-
# Copyright (c) 2026, kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Role serving_watchdog, scheduled traffic-class profiles: a target with a profile_schedule
renders (real ansible-playbook, files into tmp_path only) a config the program accepts with its
profiles and schedule, a oneshot switch service running `switch-profile --due` hardened like the
watchdog, and one timer with an OnCalendar per window edge and Persistent=true; its desired
state declares both files and the timer enabled and active; the key stays out of all of it."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from role_plays import desired_state_play  # pylint: disable=import-error
from watchdog_program import PROGRAM, ROOT  # pylint: disable=import-error

ROLE = os.path.join(ROOT, "roles", "serving_watchdog")
PLAYBOOK = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
SECRET = "gpustack_switch_verysecret"

DAY = ["--max-num-seqs=64", "--max-model-len=4096"]
NIGHT = ["--max-num-seqs=4", "--max-model-len=32768", "--enable-chunked-prefill"]
TARGET = {"name": "llama-70b", "gpustack_deployment": "llama-70b", "gpustack_server": "http://127.0.0.1:9",
          "gpustack_api_key": SECRET, "gpustack_api_version": "v1", "gpustack_worker_name": "lab-a6000x4",
          "engine_runtime": "native", "gpu_indexes": [0, 1, 2, 3], "metrics_path": "/metrics",
          "profiles": {"chat": DAY, "batch": NIGHT},
          # plan.schedule of the dilemma: batch from midnight, chat from 07:00 (unsorted on purpose).
          "profile_schedule": [{"at": "07:00", "profile": "chat"}, {"at": "00:00", "profile": "batch"}]}
PLAIN = {"name": "small", "gpustack_deployment": "small", "gpustack_server": "http://127.0.0.1:9",
         "gpustack_worker_name": "lab-a6000x4"}

RENDER_PLAY = """
# vars_files outrank play vars, so the targets come in as extra vars (as in test_watchdog_role.py).
- hosts: localhost
  gather_facts: false
  vars_files:
    - {role}/defaults/main.yml
    - {role}/vars/main.yml
  tasks:
    - name: Render what the role writes for the scheduled target
      ansible.builtin.template:
        src: "{role}/templates/{{{{ item.0 }}}}"
        dest: "{out}/{{{{ item.1 }}}}"
        mode: "0600"
      loop:
        - [watchdog.json.j2, llama-70b.json]
        - [kvpin-profile-switch.service.j2, kvpin-profile-switch-llama-70b.service]
        - [kvpin-profile-switch.timer.j2, kvpin-profile-switch-llama-70b.timer]
      vars:
        serving_watchdog_target: "{{{{ _serving_watchdog_targets[0] }}}}"
"""


def _run(tmp_path, targets):
    if not os.path.exists(PLAYBOOK):
        pytest.skip("ansible-playbook not beside sys.executable (the controller venv)")
    (tmp_path / "play.yml").write_text(
        desired_state_play(ROLE, tmp_path, "serving_watchdog_desired_state | to_json", validate=True)
        + RENDER_PLAY.format(role=ROLE, out=tmp_path))
    (tmp_path / "extra.json").write_text(json.dumps({"ansible_managed": "Ansible managed",
                                                     "serving_watchdog_targets": targets}))
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_PYTHON_INTERPRETER=sys.executable,
               ANSIBLE_ROLES_PATH=os.path.dirname(ROLE))
    return subprocess.run([PLAYBOOK, "-vvv", "-i", "localhost,", "-c", "local", "-e", "@%s" % (tmp_path / "extra.json"),
                           str(tmp_path / "play.yml")], env=env, capture_output=True, text=True, timeout=300, check=False)


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    out = tmp_path_factory.mktemp("switch")
    proc = _run(out, [TARGET, PLAIN])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert SECRET not in proc.stdout + proc.stderr
    return out


def test_the_timer_has_one_oncalendar_per_edge_and_is_persistent(rendered):
    timer = (rendered / "kvpin-profile-switch-llama-70b.timer").read_text()
    assert timer.startswith("#") and "# Ansible managed" in timer.splitlines()[:3]
    assert re.findall(r"^OnCalendar=(.*)$", timer, re.M) == ["*-*-* 00:00:00", "*-*-* 07:00:00"]
    assert "\nPersistent=true\n" in timer
    assert "\nUnit=kvpin-profile-switch-llama-70b.service\n" in timer
    assert "WantedBy=timers.target" in timer


def test_the_switch_service_is_a_hardened_oneshot_of_the_due_profile(rendered):
    service = (rendered / "kvpin-profile-switch-llama-70b.service").read_text()
    assert "Type=oneshot" in service
    assert ("ExecStart=/usr/bin/python3 /usr/local/lib/kvpin/kvpin_watchdog.py switch-profile "
            "--config /etc/kvpin-watchdog/llama-70b.json --due") in service
    # 2 x 60 s (locks, drain) + 600 s restart wait + 30 s settle + 12 x 5 s of API calls + 60 s.
    assert "TimeoutStartSec=870\n" in service
    for line in ("User=kvpin-watchdog", "NoNewPrivileges=yes", "ProtectSystem=strict", "CapabilityBoundingSet=\n",
                 "ReadWritePaths=/run/kvpin-watchdog\n"):
        assert line in service, line
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze not installed")
    units = rendered / "units"
    units.mkdir(exist_ok=True)
    (units / "kvpin-profile-switch-llama-70b.service").write_text(service)
    proc = subprocess.run([analyze, "security", "--offline=true", "--no-pager", "kvpin-profile-switch-llama-70b.service"],
                          cwd=str(units), capture_output=True, text=True, check=False)
    match = re.search(r"Overall exposure level for \S+: ([0-9.]+)", proc.stdout)
    assert match, proc.stdout + proc.stderr
    assert float(match.group(1)) <= 2.0


def test_the_config_carries_the_profiles_and_passes_the_program_check(rendered):
    path = rendered / "llama-70b.json"
    proc = subprocess.run([sys.executable, PROGRAM, "check-config", "--config", str(path)],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    text = path.read_text()
    cfg = json.loads("".join(line for line in text.splitlines(True) if not line.startswith("#")))
    assert cfg["profiles"] == {"chat": DAY, "batch": NIGHT}
    assert sorted(e["at"] for e in cfg["profile_schedule"]) == ["00:00", "07:00"]
    assert cfg["gpustack_token_file"] == "/etc/kvpin-watchdog/llama-70b.token" and SECRET not in text


def test_the_desired_state_declares_the_switch_units_and_the_timer(rendered):
    desired = json.loads((rendered / "desired.json").read_text())
    files = {spec["path"]: spec for spec in desired["files"]}
    for path in ("/etc/systemd/system/kvpin-profile-switch-llama-70b.service",
                 "/etc/systemd/system/kvpin-profile-switch-llama-70b.timer"):
        assert (files[path]["mode"], files[path]["owner"]) == ("0644", "root")
    assert files["/etc/kvpin-watchdog/llama-70b.token"]["mode"] == "0600"
    assert not [p for p in files if "profile-switch-small" in p]      # no schedule, no switch units
    units = {u["name"]: u for u in desired["units"]}
    assert units["kvpin-profile-switch-llama-70b.timer"] == {
        "name": "kvpin-profile-switch-llama-70b.timer", "enabled": True, "active": True}
    assert "kvpin-profile-switch-small.timer" not in units


def test_a_schedule_without_a_deployment_or_profiles_is_refused(tmp_path):
    bad = dict(TARGET)
    del bad["profiles"]
    proc = _run(tmp_path, [bad])
    assert proc.returncode != 0
    assert "a profile_schedule needs gpustack_deployment and profiles" in proc.stdout
    assert SECRET not in proc.stdout + proc.stderr
