# -*- coding: utf-8 -*-
# Copyright (c) 2026, kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Role serving_watchdog: argument_specs mirror defaults; templates render (real ansible-playbook,
local connection, files into tmp_path only) into a config the program accepts, a unit whose
`systemd-analyze security --offline` exposure is <= 2.0, and a polkit rule for one unit."""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import yaml

from role_plays import desired_state_play  # pylint: disable=import-error
from watchdog_program import PROGRAM, ROOT, load_watchdog_program  # pylint: disable=import-error

ROLE = os.path.join(ROOT, "roles", "serving_watchdog")
PLAYBOOK = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")


@pytest.fixture(scope="module")
def wd():
    return load_watchdog_program()


def _yaml(rel):
    with open(os.path.join(ROLE, rel), encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def test_argument_specs_mirror_defaults():
    defaults = _yaml("defaults/main.yml")
    options = _yaml("meta/argument_specs.yml")["argument_specs"]["main"]["options"]
    assert set(defaults) == set(options)
    for name, value in defaults.items():
        assert options[name].get("default") == value, name
        assert name.startswith("serving_watchdog_")


def test_every_template_starts_with_ansible_managed():
    for name in os.listdir(os.path.join(ROLE, "templates")):
        with open(os.path.join(ROLE, "templates", name), encoding="utf-8") as handle:
            assert handle.readline().startswith("{{ ansible_managed | comment"), name


def test_target_keys_passed_through_exist_in_the_program(wd):
    passthrough = _yaml("vars/main.yml")["_serving_watchdog_passthrough_keys"]
    assert set(passthrough) <= set(wd.DEFAULTS)
    spec = _yaml("meta/argument_specs.yml")["argument_specs"]["main"]["options"]
    target_opts = spec["serving_watchdog_targets"]["options"]
    assert set(passthrough) <= set(target_opts)


# vars_files outrank play vars, so the test's own values come in as extra vars (EXTRA).
PLAY = """
- hosts: localhost
  gather_facts: false
  vars_files:
    - {role}/defaults/main.yml
    - {role}/vars/main.yml
  tasks:
    - name: Render
      ansible.builtin.template:
        src: "{role}/templates/{{{{ item.1 }}}}"
        dest: "{out}/{{{{ item.0.name }}}}-{{{{ item.1 }}}}"
        mode: "0644"
      # The role writes a polkit rule only for systemd-actuated targets (the first one here).
      loop: "{{{{ serving_watchdog_targets | product(['watchdog.json.j2', 'kvpin-watchdog.service.j2']) | list
                 + [[serving_watchdog_targets[0], 'polkit.rules.j2']] }}}}"
      loop_control:
        label: "{{{{ item.0.name }}}} {{{{ item.1 }}}}"
      vars:
        serving_watchdog_target: "{{{{ item.0 }}}}"
"""

EXTRA = {
    "ansible_managed": "Ansible managed",
    "serving_watchdog_settings": {"slope_threshold_bytes_per_hour": 20971520},
    "serving_watchdog_targets": [
        {"name": "gpustack", "unit": "gpustack.service", "metrics_url": "http://127.0.0.1:8000/metrics",
         "memory_limit_bytes": 68719476736, "settings": {"cooldown_seconds": 7200}},
        {"name": "vllm-llama", "container": "gpustack-vllm-llama", "container_runtime": "docker",
         "actuator": "gpustack", "gpustack_server": "http://127.0.0.1:9", "gpustack_model_id": 3,
         "gpustack_api_key": "gpustack_abc_verysecret"},
        # What site.yml derives for a deployment (kvpin.fleet.kvpin_watchdog_targets).
        {"name": "llama-3.1-8b", "gpustack_deployment": "llama-3.1-8b", "gpustack_server": "http://127.0.0.1:9",
         "gpustack_api_key": "gpustack_abc_verysecret", "gpustack_api_version": "v1",
         "gpustack_worker_name": "lab-4090x2", "engine_runtime": "native", "gpu_indexes": [0, 1],
         "metrics_path": "/metrics",
         "measurement_context": {"gpu": "NVIDIA GeForce RTX 4090", "backend_version": "0.32.0",
                                 "args": ["--max-model-len=16384", "--max-num-seqs=8"]}},
    ],
}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    if not os.path.exists(PLAYBOOK):
        pytest.skip("ansible-playbook not beside sys.executable (the controller venv)")
    out = tmp_path_factory.mktemp("render")
    play = out / "play.yml"
    play.write_text(PLAY.format(role=ROLE, out=out))
    extra = out / "extra.json"
    extra.write_text(json.dumps(EXTRA))
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_PYTHON_INTERPRETER=sys.executable)
    proc = subprocess.run([PLAYBOOK, "-i", "localhost,", "-c", "local", "-e", "@%s" % extra, str(play)], env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "verysecret" not in proc.stdout
    return out


def test_rendered_configs_pass_the_program_check(rendered):
    for name in ("gpustack", "vllm-llama"):
        path = str(rendered / ("%s-watchdog.json.j2" % name))
        proc = subprocess.run([sys.executable, PROGRAM, "check-config", "--config", path],
                              capture_output=True, text=True, check=False)
        assert proc.returncode == 0, proc.stderr
    text = (rendered / "gpustack-watchdog.json.j2").read_text()
    cfg = json.loads("".join(line for line in text.splitlines(True) if not line.startswith("#")))
    assert cfg["actuator"] == "systemd" and cfg["cooldown_seconds"] == 7200
    assert cfg["slope_threshold_bytes_per_hour"] == 20971520
    other = (rendered / "vllm-llama-watchdog.json.j2").read_text()
    assert "verysecret" not in other and '"gpustack_token_file": "/etc/kvpin-watchdog/vllm-llama.token"' in other


def test_a_derived_deployment_target_renders_a_runnable_gpustack_watchdog(rendered, wd):
    path = str(rendered / "llama-3.1-8b-watchdog.json.j2")
    proc = subprocess.run([sys.executable, PROGRAM, "check-config", "--config", path],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    text = (rendered / "llama-3.1-8b-watchdog.json.j2").read_text()
    cfg = json.loads("".join(line for line in text.splitlines(True) if not line.startswith("#")))
    assert cfg["actuator"] == "gpustack" and cfg["gpustack_deployment"] == "llama-3.1-8b"
    assert cfg["gpustack_worker_name"] == "lab-4090x2" and cfg["engine_runtime"] == "native"
    assert cfg["gpu_indexes"] == [0, 1] and cfg["lock_dir"] == "/run/kvpin-watchdog"
    assert cfg["watchdog_sec"] == 180 and cfg["gpustack_token_file"] == "/etc/kvpin-watchdog/llama-3.1-8b.token"
    assert cfg["memory_blind_seconds"] == 900       # the role's liveness option reaches the program
    # both state files live in the unit's StateDirectory (the only writable place for them)
    assert cfg["state_file"] == "/var/lib/kvpin-watchdog/llama-3.1-8b/state.json"
    assert cfg["traffic_state_file"] == "/var/lib/kvpin-watchdog/llama-3.1-8b/traffic.json"
    # the measurement site.yml's probe reads back, and what the plan told the engine
    assert cfg["measurement_file"] == "/var/lib/kvpin-watchdog/llama-3.1-8b/measurement.json"
    assert cfg["measurement_context"] == EXTRA["serving_watchdog_targets"][2]["measurement_context"]
    assert "verysecret" not in text
    unit = (rendered / "llama-3.1-8b-kvpin-watchdog.service.j2").read_text()
    assert "GPUStack deployment llama-3.1-8b on worker lab-4090x2" in unit
    assert "StateDirectory=kvpin-watchdog/llama-3.1-8b\n" in unit


def test_rendered_unit_is_hardened(rendered):
    unit = (rendered / "gpustack-kvpin-watchdog.service.j2").read_text()
    for line in ("Type=notify", "WatchdogSec=180", "Restart=on-failure", "NoNewPrivileges=yes",
                 "ProtectSystem=strict", "CapabilityBoundingSet=\n", "SystemCallFilter=@system-service",
                 "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6", "MemoryDenyWriteExecute=yes",
                 "ReadWritePaths=/var/lib/prometheus/node-exporter /run/kvpin-watchdog",
                 "User=kvpin-watchdog"):
        assert line in unit, line
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze not installed")
    unit_dir = rendered / "units"
    unit_dir.mkdir(exist_ok=True)
    (unit_dir / "kvpin-watchdog-gpustack.service").write_text(unit)
    proc = subprocess.run([analyze, "security", "--offline=true", "--no-pager",
                           "kvpin-watchdog-gpustack.service"], cwd=str(unit_dir),
                          capture_output=True, text=True, check=False)
    match = re.search(r"Overall exposure level for \S+: ([0-9.]+)", proc.stdout)
    assert match, proc.stdout + proc.stderr
    print("systemd-analyze security exposure: %s" % match.group(1))
    assert float(match.group(1)) <= 2.0


def test_polkit_rule_allows_only_restart_of_one_unit(rendered):
    rule = (rendered / "gpustack-polkit.rules.j2").read_text()
    assert rule.startswith("//")          # JavaScript: a '#' header would break polkit
    assert 'action.lookup("unit") == "gpustack.service"' in rule
    assert 'action.lookup("verb") == "restart"' in rule
    assert 'subject.user == "kvpin-watchdog"' in rule
    assert 'action.id == "org.freedesktop.systemd1.manage-units"' in rule


# The role's own validation and desired-state tasks, as site.yml and main.yml run them (no node
# is touched: both only compute on the controller), at -vvv with a target that holds an API key.


def test_desired_state_hashes_the_key_file_and_never_prints_the_key(tmp_path, rendered):
    if not os.path.exists(PLAYBOOK):
        pytest.skip("ansible-playbook not beside sys.executable (the controller venv)")
    play = tmp_path / "play.yml"
    play.write_text(desired_state_play(ROLE, tmp_path, "serving_watchdog_desired_state | to_json", validate=True))
    extra = tmp_path / "extra.json"
    extra.write_text(json.dumps(EXTRA))
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_PYTHON_INTERPRETER=sys.executable)
    proc = subprocess.run([PLAYBOOK, "-vvv", "-i", "localhost,", "-c", "local", "-e", "@%s" % extra, str(play)],
                          env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "verysecret" not in proc.stdout + proc.stderr
    desired = json.loads((tmp_path / "desired.json").read_text())
    files = {spec["path"]: spec for spec in desired["files"]}
    token_file = files["/etc/kvpin-watchdog/vllm-llama.token"]
    assert token_file["sha1"] == hashlib.sha1(b"gpustack_abc_verysecret\n").hexdigest()
    assert (token_file["mode"], token_file["owner"]) == ("0600", "kvpin-watchdog")
    # Only the systemd-actuated target gets a polkit rule; both get a config and a unit.
    assert "/etc/polkit-1/rules.d/60-kvpin-watchdog-gpustack.rules" in files
    assert "/etc/polkit-1/rules.d/60-kvpin-watchdog-vllm-llama.rules" not in files
    unit_names = [unit["name"] for unit in desired["units"]]
    assert unit_names == ["kvpin-watchdog-gpustack.service", "kvpin-watchdog-vllm-llama.service",
                          "kvpin-watchdog-llama-3.1-8b.service"]
    # The config directory must hold exactly these: anything else is a removed target's leftover.
    assert sorted(files["/etc/kvpin-watchdog"]["entries"]) == [
        "gpustack.json", "llama-3.1-8b.json", "llama-3.1-8b.token", "vllm-llama.json", "vllm-llama.token"]
    # The config the role hashes (from the masked targets) is the config the template gives
    # for the real target: it names the key file, never the key.
    config_sha1 = files["/etc/kvpin-watchdog/vllm-llama.json"]["sha1"]
    assert config_sha1 == hashlib.sha1((rendered / "vllm-llama-watchdog.json.j2").read_bytes()).hexdigest()


def test_the_program_is_its_launcher_and_every_file_of_its_package(tmp_path):
    """The role's table ships the launcher and one row per file of the package (its modules and
    the two files it shares with the collection, from plugins/module_utils), each declared with
    the sha1 of its source here; the package directory's row names exactly those files, and an
    entry node_state saw beyond them (a dropped module, a __pycache__) is what configure.yml
    removes."""
    if not os.path.exists(PLAYBOOK):
        pytest.skip("ansible-playbook not beside sys.executable (the controller venv)")
    files_dir = os.path.join(ROLE, "files")
    package = "/usr/local/lib/kvpin/kvpin_watchdog_lib"
    sources = {"/usr/local/lib/kvpin/kvpin_watchdog.py": os.path.join(files_dir, "kvpin_watchdog.py"),
               package + "/http_deadline.py": os.path.join(ROOT, "plugins", "module_utils", "http_deadline.py"),
               package + "/gpustack_api.py": os.path.join(ROOT, "plugins", "module_utils", "gpustack", "api.py")}
    for name in os.listdir(os.path.join(files_dir, "kvpin_watchdog_lib")):
        if name.endswith(".py"):
            sources["%s/%s" % (package, name)] = os.path.join(files_dir, "kvpin_watchdog_lib", name)
    seen = ["__init__.py", "config.py", "old_module.py", "__pycache__"]
    observed = {"in_sync": False, "drift": ["%s: unexpected entries __pycache__, old_module.py" % package],
                "drift_items": [{"object": package, "field": "entries", "want": ["__init__.py"], "got": seen},
                                {"object": "/etc/kvpin-watchdog", "field": "entries", "want": [], "got": ["x.json"]}]}
    play = tmp_path / "play.yml"
    play.write_text(desired_state_play(
        ROLE, tmp_path, "{'files': serving_watchdog_desired_state.files, 'leftovers': _serving_watchdog_package_leftovers}"
        " | to_json", public=True))
    extra = tmp_path / "extra.json"
    extra.write_text(json.dumps(dict(EXTRA, serving_watchdog_observed_state=observed)))
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_PYTHON_INTERPRETER=sys.executable)
    proc = subprocess.run([PLAYBOOK, "-i", "localhost,", "-c", "local", "-e", "@%s" % extra, str(play)],
                          env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    got = json.loads((tmp_path / "desired.json").read_text())
    files = {spec["path"]: spec for spec in got["files"]}
    program = {path: spec for path, spec in files.items() if path.startswith("/usr/local/lib/kvpin/kvpin_watchdog")}
    assert sorted(program) == sorted(list(sources) + [package])
    for path, source in sources.items():
        with open(source, "rb") as handle:
            assert program[path]["sha1"] == hashlib.sha1(handle.read()).hexdigest(), path
        assert (program[path]["owner"], program[path]["mode"]) == ("root", "0644"), path
    assert sorted(program[package]["entries"]) == sorted(os.path.basename(p) for p in sources if p.startswith(package))
    assert sorted(got["leftovers"]) == ["__pycache__", "old_module.py"]
