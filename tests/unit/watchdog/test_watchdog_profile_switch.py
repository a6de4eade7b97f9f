# -*- coding: utf-8 -*-
# Copyright (c) 2026, kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Scheduled traffic-class profiles: `kvpin_watchdog.py switch-profile` puts a profile's
backend_parameters on the deployment through GPUStack's API (drain bounded, record read back,
instance restarted), a second run is a no-op, a server that is down or refuses leaves the
previous profile running and says so without the key, a redirect to another origin is not
followed, and the daemon neither recycles nor alerts during a switch's grace period. GPUStack is
a loopback stand-in (tests/unit/watchdog/gpustack_fake.py)."""
from __future__ import annotations

import http.server
import io
import json
import math
import socket
import subprocess
import sys
import threading

import pytest

from watchdog_program import PROGRAM  # pylint: disable=import-error
from gpustack_fake import FakeGPUStack  # pylint: disable=import-error
from ansible_collections.kvpin.fleet.plugins.module_utils.gpustack import records as gpustack_records

DAY = ["--max-num-seqs=64", "--max-model-len=4096", "--gpu-memory-utilization=0.92"]
NIGHT = ["--max-num-seqs=4", "--max-model-len=32768", "--gpu-memory-utilization=0.92",
         "--enable-chunked-prefill", "--max-num-batched-tokens=8192"]


@pytest.fixture
def fake():
    server = FakeGPUStack(token="tok-secret-4711")
    server.models = [{"id": 3, "name": "llama", "backend": "vllm", "replicas": 1, "backend_parameters": list(DAY),
                      "source": "huggingface", "huggingface_repo_id": "meta-llama/Llama-3.3-70B-Instruct"},
                     {"id": 4, "name": "llama-big", "backend_parameters": []}]
    server.instances = [server.instance(7, 500, gpus=(0, 1))]
    server.next_id = 100

    def recreate(gone):
        server.next_id += 1
        return dict(gone, id=server.next_id, name="llama-%d" % server.next_id, pid=900 + server.next_id)
    server.on_delete = recreate
    yield server
    server.close()


def _cfg(wd, tmp_path, fake, **over):
    key = tmp_path / "key"
    key.write_text(fake.token + "\n")
    cfg = dict(wd.DEFAULTS, name="llama", gpustack_deployment="llama", gpustack_server=fake.url,
               gpustack_worker_name="node-a", gpustack_token_file=str(key), actuator="gpustack",
               gpu_indexes=[0, 1], lock_file=str(tmp_path / "locks" / "recycle.lock"),
               lock_dir=str(tmp_path / "locks"), drain_timeout_seconds=2, restart_wait_seconds=5,
               http_timeout_seconds=2, profile_settle_seconds=0.5, profiles={"day": DAY, "night": NIGHT})
    cfg.update(over)
    return cfg


def _switch(wd, cfg, profile):
    out = io.StringIO()
    status = wd.switch_profile(cfg, profile, out=out)
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    return status, records[-1]["detail"], out.getvalue()


def _puts(fake):
    return [r for r in fake.requests if r[0] == "PUT"]


def _deletes(fake):
    return [r for r in fake.requests if r[0] == "DELETE"]


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_switch_puts_the_profile_drains_and_restarts_the_instance(wd, tmp_path, fake, version):
    fake.version = version
    cfg = _cfg(wd, tmp_path, fake)
    assert not wd.validate_config(cfg)
    status, detail, log = _switch(wd, cfg, "night")
    assert status == 0, detail
    assert fake.models[0]["backend_parameters"] == NIGHT
    assert "from profile day to night" in detail and "drain: idle" in detail
    # The whole record went back (PUT replaces it), less the server-owned status fields.
    (_m, path, body), = fake.bodies
    assert path == "/%s/models/3" % version
    assert body["name"] == "llama" and body["replicas"] == 1 and body["source"] == "huggingface"
    assert not set(body) & set(wd.SERVER_OWNED_MODEL_FIELDS)
    # This stand-in does not restart on an update: the instance is deleted after the settle time
    # and its replacement (recreated from the updated record) is waited for.
    assert [r[1] for r in _deletes(fake)] == ["/%s/model-instances/7" % version]
    assert "instance 101 running" in detail
    marker = json.loads((tmp_path / "locks" / "profile-switch-llama.json").read_text())
    assert marker["profile"] == "night" and marker["previous"] == "day"
    assert fake.token not in log


def test_an_instance_gpustack_restarts_itself_is_not_deleted_again(wd, tmp_path, fake):
    def restart(_model):
        fake.instances = [dict(fake.instances[0], id=55, name="llama-55", pid=955)]
    fake.on_put = restart
    status, detail, _log = _switch(wd, _cfg(wd, tmp_path, fake, profile_settle_seconds=30), "night")
    assert status == 0, detail
    assert not _deletes(fake) and "instance 55 running" in detail


def test_a_replacement_that_never_runs_is_a_failure_that_says_so(wd, tmp_path, fake):
    fake.on_delete = lambda gone: dict(gone, id=101, name="llama-101", pid=1001, state="error")
    status, detail, _log = _switch(wd, _cfg(wd, tmp_path, fake, restart_wait_seconds=2), "night")
    assert status == 1
    assert "switched from profile day to night in GPUStack" in detail
    assert "is not running the new profile: no running replacement within 2 s" in detail


def test_a_second_trigger_is_a_no_op(wd, tmp_path, fake):
    cfg = _cfg(wd, tmp_path, fake)
    assert _switch(wd, cfg, "night")[0] == 0
    before = len(fake.requests)
    status, detail, _log = _switch(wd, cfg, "night")
    assert status == 0 and "already runs profile night: nothing to do" in detail
    assert not [r for r in fake.requests[before:] if r[0] in ("PUT", "DELETE")]
    assert [r[1] for r in fake.requests[before:] if "/metrics" in r[1]] == []   # no drain either


def test_server_down_fails_cleanly_and_keeps_the_profile(wd, tmp_path, fake):
    with socket.socket() as sock:                        # a loopback port nobody listens on
        sock.bind(("127.0.0.1", 0))
        closed = "http://127.0.0.1:%d" % sock.getsockname()[1]
    cfg = _cfg(wd, tmp_path, fake, gpustack_server=closed)
    config = tmp_path / "switch.json"
    config.write_text(json.dumps({k: v for k, v in cfg.items() if v is not None and k in wd.DEFAULTS}))
    run = subprocess.run([sys.executable, PROGRAM, "switch-profile", "--config", str(config), "--profile", "night"],
                         capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 1
    assert "failed, nothing changed" in run.stderr and "keeps its current backend parameters" in run.stderr
    assert fake.token not in run.stdout + run.stderr
    assert "Traceback" not in run.stderr
    assert fake.models[0]["backend_parameters"] == DAY
    assert not (tmp_path / "locks" / "profile-switch-llama.json").exists()


def test_a_refused_update_leaves_the_previous_profile_running(wd, tmp_path, fake):
    fake.put_status = 500
    status, detail, log = _switch(wd, _cfg(wd, tmp_path, fake), "night")
    assert status == 1
    assert "-> 500: refused by the stand-in" in detail and "still holds profile day, which keeps running" in detail
    assert fake.models[0]["backend_parameters"] == DAY and not _deletes(fake)
    assert not (tmp_path / "locks" / "profile-switch-llama.json").exists()   # the daemon is not muted
    assert fake.token not in log


def test_a_redirect_to_another_origin_is_not_followed(wd, tmp_path, fake):
    seen = []

    class Redirect(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            seen.append((self.path, self.headers.get("Authorization")))
            self.send_response(307)
            self.send_header("Location", fake.url + self.path)    # another port: another origin
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_PUT = do_GET

        def log_message(self, *_args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        cfg = _cfg(wd, tmp_path, fake, gpustack_server="http://127.0.0.1:%d" % server.server_address[1],
                   gpustack_api_version="v1")
        status, detail, log = _switch(wd, cfg, "night")
    finally:
        server.shutdown()
        server.server_close()
    assert status == 1 and "redirect" in detail and "not followed" in detail and "nothing changed" in detail
    assert seen and not fake.requests                    # the stand-in behind the Location saw nothing
    assert fake.token not in log


def test_the_drain_is_bounded_and_says_so(wd, tmp_path, fake):
    fake.metrics = "vllm:num_requests_running{model_name=\"llama\"} 3\n"
    status, detail, log = _switch(wd, _cfg(wd, tmp_path, fake, drain_timeout_seconds=1), "night")
    assert status == 0, detail
    assert "timed out after 1 s with 3 requests in flight" in detail
    assert '"event":"drain"' in log
    assert fake.models[0]["backend_parameters"] == NIGHT


def test_an_unknown_profile_is_refused_without_a_request(wd, tmp_path, fake):
    status, detail, _log = _switch(wd, _cfg(wd, tmp_path, fake), "weekend")
    assert status == 2 and "not one of the profiles of llama (day, night)" in detail
    assert not fake.requests


@pytest.mark.parametrize("profiles,message", [
    ({}, "profiles must be a mapping"),
    (["day"], "profiles must be a mapping"),
    ({"da y": []}, "profiles: name"),
    ({"day": "--max-num-seqs=4"}, "profiles.day must be a list"),
    ({"day": ["--a\n--b"]}, "profiles.day: every backend parameter"),
    ({"day": [4]}, "profiles.day: every backend parameter"),
    ({"day": ["x" * 5000]}, "profiles.day: every backend parameter"),
])
def test_bad_profiles_are_refused_by_check_config(wd, tmp_path, fake, profiles, message):
    errors = wd.validate_config(_cfg(wd, tmp_path, fake, profiles=profiles))
    assert any(message in e for e in errors), errors


@pytest.mark.parametrize("content", [
    "not json", "[]", '{"time": "soon", "profile": "night"}', '{"time": 1000, "profile": "../x"}',
    '{"time": NaN, "profile": "night"}', '{"time": true, "profile": "night"}',
    '{"time": 99999999999, "profile": "night"}',             # far in the future
    '{"time": 1000, "profile": "night", "pad": "%s"}' % ("x" * 5000),
])
def test_a_bad_marker_mutes_nothing(wd, tmp_path, fake, content):
    cfg = _cfg(wd, tmp_path, fake)
    (tmp_path / "locks").mkdir()
    (tmp_path / "locks" / "profile-switch-llama.json").write_text(content)
    assert wd.read_profile_marker(cfg, 1100.0) is None


def test_the_marker_holds_for_the_grace_period_only(wd, tmp_path, fake):
    cfg = _cfg(wd, tmp_path, fake, profile_switch_grace_seconds=600)
    wd.write_profile_marker(cfg, {"time": 1000.0, "profile": "night"})
    assert wd.read_profile_marker(cfg, 1000.0)["profile"] == "night"
    assert math.isclose(wd.read_profile_marker(cfg, 1599.0)["age_seconds"], 599.0)
    assert wd.read_profile_marker(cfg, 1600.0) is None


def test_the_daemon_neither_recycles_nor_alerts_during_a_switch(wd, tmp_path, fake):
    """A switch restarts the engine on purpose: while its marker is fresh every decision is
    'none' (phase profile_switch); after the grace the trend starts anew, as after a restart."""
    proc = tmp_path / "proc"
    (proc / "500").mkdir(parents=True)
    (proc / "500" / "status").write_text("Name:\tx\nRssAnon:\t1048576 kB\nVmSwap:\t0 kB\n")
    (proc / "500" / "stat").write_text("500 (vllm) S 1 " + " ".join(["0"] * 17 + ["7"] + ["0"] * 10) + "\n")
    (proc / "meminfo").write_text("MemTotal:       67108864 kB\nMemAvailable:   33554432 kB\n")
    (tmp_path / "cgroup").mkdir()
    wall = [5000.0]
    out = io.StringIO()
    cfg = _cfg(wd, tmp_path, fake, proc_root=str(proc), cgroup_root=str(tmp_path / "cgroup"),
               profile_switch_grace_seconds=600, textfile_dir=str(tmp_path / "tf"))
    daemon = wd.Daemon(cfg, out=out, clock=lambda: wall[0])
    fed = []
    real_feed = daemon.engine.feed

    def feed(*args, **kwargs):
        fed.append(kwargs.get("restarted"))
        return real_feed(*args, **kwargs)
    daemon.engine.feed = feed
    wd.write_profile_marker(cfg, {"time": 4900.0, "profile": "night"})
    decision = daemon.tick()
    assert decision.action == "none" and decision.phase == "profile_switch"
    assert "profile switch to night 100 s ago" in decision.reason and not fed
    prom = (tmp_path / "tf" / "kvpin_watchdog_llama.prom").read_text()
    assert 'diagnosis="profile_switch"' in prom and 'kvpin_watchdog_decision{target="llama"} 0' in prom
    wall[0] = 5600.0                                        # the grace is over
    daemon.tick()
    assert fed == [True]                                    # the trend restarts after a switch
    daemon.tick()
    assert fed == [True, False]


def test_server_owned_fields_agree_with_the_module_utils(wd):
    assert wd.SERVER_OWNED_MODEL_FIELDS == gpustack_records.SERVER_OWNED_MODEL_FIELDS


SCHEDULE = [{"at": "07:00", "profile": "day"}, {"at": "00:00", "profile": "night"}]


@pytest.mark.parametrize("minute,profile", [
    (0, "night"), (6 * 60 + 59, "night"), (7 * 60, "day"), (23 * 60 + 59, "day"),
])
def test_the_due_profile_is_the_latest_edge_at_or_before_now(wd, minute, profile):
    assert wd.due_profile(SCHEDULE, minute) == profile
    # Before the first edge of the day: the previous day's last edge.
    assert wd.due_profile([{"at": "07:00", "profile": "day"}, {"at": "23:00", "profile": "night"}], 60) == "night"


@pytest.mark.parametrize("schedule,message", [
    ([], "profile_schedule must be a list of 1..48"),
    ({"at": "07:00"}, "profile_schedule must be a list"),
    ([{"at": "7:00", "profile": "day"}], "profile_schedule[0].at must be HH:MM"),
    ([{"at": "24:00", "profile": "day"}], "profile_schedule[0].at must be HH:MM"),
    ([{"at": 700, "profile": "day"}], "profile_schedule[0].at must be HH:MM"),
    ([{"at": "07:00", "profile": "day"}, {"at": "07:00", "profile": "night"}], "profile_schedule[1].at 07:00 is given twice"),
    ([{"at": "07:00", "profile": "weekend"}], "profile_schedule[0].profile 'weekend' is not one of profiles (day, night)"),
    ([{"at": "07:00", "profile": ["day"]}], "profile_schedule[0].profile"),
    ([{"at": "07:00"}], "profile_schedule[0] must be {at: HH:MM, profile: NAME}"),
])
def test_a_bad_schedule_is_refused_by_check_config(wd, tmp_path, fake, schedule, message):
    errors = wd.validate_config(_cfg(wd, tmp_path, fake, profile_schedule=schedule))
    assert any(message in e for e in errors), errors


def test_due_switches_to_the_profile_of_the_current_window(wd, tmp_path, fake):
    """What the timer runs: the CLI with --due, at every edge and once at boot after a missed one."""
    import time  # pylint: disable=import-outside-toplevel
    now = time.localtime()
    minute = now.tm_hour * 60 + now.tm_min
    # Edges chosen around the current minute (local time, as systemd's OnCalendar): 'night' is due
    # now and for the next 12 hours, so a minute turning during the test changes nothing.
    night_at = "%02d:%02d" % divmod(minute, 60)
    day_at = "%02d:%02d" % divmod((minute + 720) % 1440, 60)
    cfg = _cfg(wd, tmp_path, fake, profile_schedule=[{"at": day_at, "profile": "day"}, {"at": night_at, "profile": "night"}])
    config = tmp_path / "switch.json"
    config.write_text("# ansible managed\n" + json.dumps({k: v for k, v in cfg.items() if v is not None}))
    argv = [sys.executable, PROGRAM, "switch-profile", "--config", str(config), "--due"]
    first = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert first.returncode == 0, first.stderr
    assert fake.models[0]["backend_parameters"] == NIGHT
    second = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert second.returncode == 0 and "already runs profile night: nothing to do" in second.stdout
    assert fake.token not in first.stdout + first.stderr + second.stdout + second.stderr
