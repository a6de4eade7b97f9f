# -*- coding: utf-8 -*-
# Copyright (c) 2026, kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Profile switch (serving_plan strategy 'scheduled')."""

from __future__ import annotations

import json
import math
import os
import time
from typing import Dict, List, Optional, Tuple

from .config import NAME_RE
from .exposition import METRIC_NAMES, parse_exposition, sum_family
from .fsio import _read_small, write_file_atomically
from .httpio import HTTPFailure, http_request
from .gpustack import DeploymentSensor, GPUStackAPI, INSTANCE_STATES_RUNNING, Instance, pick_instance
from .actuators import DeploymentActuator, GPULocks


# ---------------------------------------------------------------------------
# Profile switch (serving_plan strategy 'scheduled'): at every window edge a systemd timer runs
# `switch-profile --profile NAME`, which puts that profile's backend_parameters on the deployment
# through GPUStack's API. Order: read the model (no change: exit 0), take the GPU locks, drain
# the engine (bounded), re-read, write the marker, PUT the record, read it back, and make sure
# the instance restarts (GPUStack restarts it, or it is deleted and the controller recreates it
# with the new parameters, the route the recycle uses). Any failure before the PUT is answered
# leaves the deployment as it was, and says so.
# ---------------------------------------------------------------------------
PROFILE_MARKER_MAX_BYTES = 4096


def profile_marker_path(cfg: Dict[str, object]) -> str:
    """The one place the marker's path is made: the switch writes it, the daemon of the same
    target reads it (the lock directory: the watchdog user may write there; a tmpfs, so a reboot
    forgets it, and the switch caught up at boot writes a new one)."""
    directory = str(cfg.get("lock_dir") or os.path.dirname(str(cfg["lock_file"])))
    return os.path.join(directory, "profile-switch-%s.json" % cfg["name"])


def write_profile_marker(cfg: Dict[str, object], record: Dict[str, object]) -> str:
    path = profile_marker_path(cfg)
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    return write_file_atomically(path, json.dumps(record, sort_keys=True), ".profile-switch-")


def remove_profile_marker(cfg: Dict[str, object]) -> None:
    try:
        os.unlink(profile_marker_path(cfg))
    except FileNotFoundError:
        pass


def read_profile_marker(cfg: Dict[str, object], now: float) -> Optional[Dict[str, object]]:
    """The marker of a switch less than profile_switch_grace_seconds ago (wall clock), else None.
    A marker that is not small JSON with a finite time and a profile name, or that is dated more
    than a minute ahead, is ignored: a bad file cannot keep the watchdog quiet for ever."""
    text = _read_small(profile_marker_path(cfg), PROFILE_MARKER_MAX_BYTES + 1)
    if text is None or len(text) > PROFILE_MARKER_MAX_BYTES:
        return None
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    when, profile = data.get("time"), data.get("profile")
    if isinstance(when, bool) or not isinstance(when, (int, float)) or not math.isfinite(when):
        return None
    if not isinstance(profile, str) or not NAME_RE.match(profile):
        return None
    age = now - float(when)
    if age < -60 or age >= float(cfg["profile_switch_grace_seconds"]):
        return None
    return {"time": float(when), "profile": profile, "age_seconds": max(0.0, age)}


def scrape_running_requests(cfg: Dict[str, object], url: Optional[str]) -> Optional[float]:
    """Requests in flight on the engine (vLLM vllm:num_requests_running, llama-box's gauge), or
    None when the engine cannot tell."""
    if not url:
        return None
    try:
        _status, body, _h = http_request(url, timeout=float(cfg["http_timeout_seconds"]),
                                         max_bytes=int(cfg["max_body_bytes"]))
    except HTTPFailure:
        return None
    samples = parse_exposition(body.decode("utf-8", "replace"))
    for name in METRIC_NAMES["requests_running"]:
        value = sum_family(samples, name)
        if value is not None:
            return value
    return None


class ProfileSwitch:
    """One switch of a deployment to one profile; run() -> (exit status, message). The message
    never holds the API key (no header or key file content is ever put in one)."""

    def __init__(self, cfg: Dict[str, object], log, clock=time.time):
        self.cfg = cfg
        self.log = log
        self.clock = clock
        self.api = GPUStackAPI(cfg)

    def _deadline(self) -> float:
        return time.monotonic() + 2 * float(self.cfg["http_timeout_seconds"])

    def profile_of(self, params: object) -> str:
        for name, args in sorted((self.cfg.get("profiles") or {}).items()):
            if params == args:
                return name
        return "(parameters of no profile)"

    def _lock(self, locks: GPULocks) -> Optional[str]:
        """All GPU locks, waiting (bounded by drain_timeout_seconds) for a recycle or another
        switch on the same GPUs to finish."""
        end = time.monotonic() + float(self.cfg["drain_timeout_seconds"])
        while True:
            busy = locks.acquire()
            if busy is None or time.monotonic() >= end:
                return busy
            time.sleep(min(1.0, max(0.0, end - time.monotonic())))

    def run(self, profile: str) -> Tuple[int, str]:
        cfg = self.cfg
        profiles = cfg.get("profiles") or {}
        name = str(cfg.get("gpustack_deployment"))
        if profile not in profiles:
            return 2, "profile %r is not one of the profiles of %s (%s)" % (
                profile[:80], name, ", ".join(sorted(profiles)) or "none configured")
        wanted = list(profiles[profile])
        keeps = "; the deployment keeps its current backend parameters"
        try:
            model_id = self.api.find_model_id(self._deadline())
            record = self.api.get_model(model_id, self._deadline())
        except HTTPFailure as exc:
            return 1, "switch of %s to profile %s failed, nothing changed: %s%s" % (name, profile, exc, keeps)
        current = record.get("backend_parameters") or []
        if current == wanted:
            return 0, "%s already runs profile %s: nothing to do" % (name, profile)
        if not isinstance(current, list):
            return 1, "switch of %s to profile %s refused: its backend_parameters in GPUStack are not a list%s" % (
                name, profile, keeps)
        previous = self.profile_of(current)
        try:
            found = self.api.instances(self._deadline())
        except HTTPFailure as exc:
            return 1, "switch of %s to profile %s failed, nothing changed: %s; it keeps profile %s" % (
                name, profile, exc, previous)
        inst = pick_instance(found, cfg.get("gpu_indexes") or [])
        gpus = sorted(set(inst.gpu_indexes if inst else []) | set(cfg.get("gpu_indexes") or []))
        lock_dir = str(cfg.get("lock_dir") or os.path.dirname(str(cfg["lock_file"])))
        locks = GPULocks(lock_dir, gpus, str(cfg["lock_file"]))
        busy = self._lock(locks)
        if busy:
            return 1, "switch of %s to profile %s not done: another engine (re)start held %s for %g s; it keeps " \
                      "profile %s" % (name, profile, busy, float(cfg["drain_timeout_seconds"]), previous)
        try:
            return self._switch(model_id, profile, wanted, previous, inst)
        finally:
            locks.release()

    def _switch(self, model_id: int, profile: str, wanted: List[str], previous: str,
                inst: Optional[Instance]) -> Tuple[int, str]:
        cfg = self.cfg
        name = str(cfg.get("gpustack_deployment"))
        actuator = DeploymentActuator(cfg, self.api, self.log, lambda: scrape_running_requests(cfg, self._url(inst)))
        drained = actuator._drain() if inst is not None else "no instance on this worker: nothing to drain"  # pylint: disable=protected-access
        self.log("drain", detail=drained)
        try:
            record = self.api.get_model(model_id, self._deadline())
        except HTTPFailure as exc:
            return 1, "switch of %s to profile %s failed after the drain, nothing changed: %s; it keeps profile %s" % (
                name, profile, exc, previous)
        if (record.get("backend_parameters") or []) == wanted:
            return 0, "%s was switched to profile %s meanwhile (another node's timer): nothing to do" % (name, profile)
        write_profile_marker(cfg, {"time": self.clock(), "profile": profile, "previous": previous,
                                   "deployment": name})
        try:
            ok, detail = self.api.put_model(model_id, dict(record, backend_parameters=wanted), self._deadline())
        except HTTPFailure as exc:
            ok, detail = False, str(exc)
        try:
            back = self.api.get_model(model_id, self._deadline())
        except HTTPFailure as exc:
            if ok:
                return 1, "switch of %s to profile %s: %s accepted, but the read-back failed (%s): state unknown, " \
                          "check the deployment" % (name, profile, detail, exc)
            return 1, "switch of %s to profile %s failed (%s) and the read-back failed (%s): the update was most " \
                      "likely not applied; the next trigger retries (a no-op if it was)" % (name, profile, detail, exc)
        got = back.get("backend_parameters") or []
        if got != wanted:
            if got == (record.get("backend_parameters") or []):
                remove_profile_marker(cfg)
                return 1, "switch of %s to profile %s failed: %s; GPUStack still holds profile %s, which keeps " \
                          "running" % (name, profile, detail, previous)
            return 1, "switch of %s to profile %s: %s, but GPUStack reads back %s, neither profile: check the " \
                      "deployment" % (name, profile, detail, self.api.mask(json.dumps(got))[:300])
        restarted, restart = self._restart(actuator, inst) if inst is not None else (True, "no instance on this worker")
        if not restarted:
            return 1, "%s switched from profile %s to %s in GPUStack (%s; drain: %s), but its instance on this worker " \
                      "is not running the new profile: %s" % (name, previous, profile, detail, drained, restart)
        return 0, "%s switched from profile %s to %s (%s; drain: %s; restart: %s)" % (
            name, previous, profile, detail, drained, restart)

    def _url(self, inst: Optional[Instance]) -> Optional[str]:
        sensor = DeploymentSensor(self.cfg, self.api)
        sensor.instance = inst
        return sensor.metrics_url()

    def _restart(self, actuator: DeploymentActuator, old: Instance) -> Tuple[bool, str]:
        """GPUStack restarts the instance on an update, or (a version that does not) the
        instance is deleted so the controller recreates it from the updated record."""
        end = time.monotonic() + float(self.cfg["profile_settle_seconds"])
        while True:
            try:
                now = {i.id: i for i in self.api.instances(self._deadline())}
            except HTTPFailure:
                now = None
            if now is not None:
                same = now.get(old.id)
                if same is None or same.identity() != old.identity() or same.state not in INSTANCE_STATES_RUNNING:
                    break
            if time.monotonic() >= end:
                try:
                    ok, detail = self.api.delete_instance(old.id, self._deadline())
                except HTTPFailure as exc:
                    return False, "GPUStack did not restart instance %d and its delete failed (%s): it runs the " \
                                  "old parameters until it restarts" % (old.id, exc)
                if not ok:
                    return False, "GPUStack did not restart instance %d and %s: it runs the old parameters until " \
                                  "it restarts" % (old.id, detail)
                break
            time.sleep(min(1.0, max(0.0, end - time.monotonic())))
        waited = actuator._wait_for_replacement(old)  # pylint: disable=protected-access
        return waited.endswith(" running"), waited
