# -*- coding: utf-8 -*-
# Copyright (c) 2026, kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Daemon actuators: recycle a unit, a container or a GPUStack instance."""

from __future__ import annotations

import errno
import fcntl
import os
import time
from typing import Dict, List, Optional, Sequence, Tuple

from .httpio import HTTPFailure, _mask_secret, _redact_url, http_request, read_api_key
from .sensors import _run
from .gpustack import INSTANCE_STATES_RUNNING


# ---------------------------------------------------------------------------
# Daemon: actuators.
# ---------------------------------------------------------------------------
class RecycleLock:
    """fcntl lock so two recycles never overlap on a node (all watchdogs share the file)."""

    def __init__(self, path: str):
        self.path = path
        self.handle = None

    def acquire(self) -> bool:
        directory = os.path.dirname(self.path)
        if directory:
            os.makedirs(directory, exist_ok=True)
        self.handle = open(self.path, "a+", encoding="utf-8")
        try:
            fcntl.flock(self.handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            self.handle.close()
            self.handle = None
            if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                return False
            raise
        return True

    def release(self) -> None:
        if self.handle is not None:
            fcntl.flock(self.handle.fileno(), fcntl.LOCK_UN)
            self.handle.close()
            self.handle = None


def recycle_command(cfg: Dict[str, object]) -> Optional[List[str]]:
    """argv that restarts the target, for the command-line actuators."""
    kind = cfg.get("actuator")
    if kind == "systemd":
        return ["systemctl", "restart", str(cfg["unit"])]
    if kind in ("podman", "docker"):
        return [str(kind), "restart", str(cfg["container"])]
    return None


def gpustack_request(cfg: Dict[str, object]) -> Tuple[str, str]:
    """(method, url) of the legacy single-instance / whole-model GPUStack actuator."""
    server = str(cfg["gpustack_server"]).rstrip("/")
    if cfg.get("gpustack_mode") == "delete_instance":
        return "DELETE", "%s/v2/model-instances/%s" % (server, cfg["gpustack_instance_id"])
    return "POST", "%s/v2/models/%s/restart" % (server, cfg["gpustack_model_id"])


class GPULocks:
    """One lock file per GPU index under lock_dir, all of an instance's GPUs, taken in sorted
    order (no deadlock between two watchdogs sharing GPUs), non-blocking: a held lock means
    another engine on that GPU is (re)starting now, so this recycle waits for a later tick."""

    def __init__(self, lock_dir: str, gpu_indexes: Sequence[int], fallback: str):
        names = ["gpu-%d.lock" % g for g in sorted(set(gpu_indexes))]
        self.paths = [os.path.join(lock_dir, n) for n in names] if names else [fallback]
        self.held: List[RecycleLock] = []

    def acquire(self) -> Optional[str]:
        """None when all are held, else the path that was busy (nothing is kept then)."""
        for path in self.paths:
            lock = RecycleLock(path)
            if not lock.acquire():
                self.release()
                return path
            self.held.append(lock)
        return None

    def release(self) -> None:
        for lock in reversed(self.held):
            lock.release()
        self.held = []


class Actuator:
    def __init__(self, cfg: Dict[str, object], log):
        self.cfg = cfg
        self.log = log

    def recycle(self) -> Dict[str, object]:
        cfg = self.cfg
        kind = cfg.get("actuator")
        if kind in (None, "none"):
            return {"ok": False, "detail": "no actuator configured (alert only)"}
        if cfg.get("dry_run"):
            return {"ok": True, "dry_run": True, "detail": "dry run: %s" % self.describe()}
        lock = RecycleLock(str(cfg["lock_file"]))
        if not lock.acquire():
            return {"ok": False, "detail": "another recycle holds %s" % cfg["lock_file"]}
        try:
            self._drain()
            if kind == "gpustack":
                return self._gpustack()
            argv = recycle_command(cfg)
            if argv is None:
                return {"ok": False, "detail": "unknown actuator %r" % kind}
            rc, out = _run(argv, float(cfg["actuator_timeout_seconds"]))
            return {"ok": rc == 0, "detail": "%s -> rc %d %s" % (" ".join(argv), rc, out[-200:])}
        finally:
            lock.release()

    def describe(self) -> str:
        if self.cfg.get("actuator") == "gpustack":
            method, url = gpustack_request(self.cfg)
            return "%s %s" % (method, _redact_url(url))
        return " ".join(recycle_command(self.cfg) or ["?"])

    def _drain(self) -> None:
        cfg = self.cfg
        if cfg.get("pre_recycle_command"):
            argv = [str(a) for a in cfg["pre_recycle_command"]]
            rc, out = _run(argv, float(cfg["actuator_timeout_seconds"]))
            self.log("drain", command=argv, rc=rc, output=out[-200:])
        if cfg.get("drain_url"):
            try:
                status, _body, _headers = http_request(str(cfg["drain_url"]), "POST", b"{}",
                                                       {"Content-Type": "application/json"},
                                                       timeout=float(cfg["http_timeout_seconds"]),
                                                       max_bytes=int(cfg["max_body_bytes"]))
                self.log("drain", url=_redact_url(str(cfg["drain_url"])), status=status)
            except HTTPFailure as exc:
                self.log("drain", url=_redact_url(str(cfg["drain_url"])), error=str(exc))
        grace = float(cfg.get("drain_grace_seconds") or 0)
        if grace > 0:
            time.sleep(grace)

    def _gpustack(self) -> Dict[str, object]:
        method, url = gpustack_request(self.cfg)
        key = None
        try:
            key = read_api_key(self.cfg.get("gpustack_token_file"))
            headers = {"Content-Type": "application/json"}
            if key:
                headers["Authorization"] = "Bearer " + key
            status, _body, resp_headers = http_request(
                url, method, b"{}" if method == "POST" else None, headers,
                timeout=float(self.cfg["http_timeout_seconds"]), max_bytes=int(self.cfg["max_body_bytes"]))
        except HTTPFailure as exc:
            return {"ok": False, "detail": str(exc)}
        if 300 <= status < 400:
            return {"ok": False, "detail": "%s %s -> %d redirect to %s: not followed" % (
                method, _redact_url(url), status, _redact_url(_mask_secret(resp_headers.get("location", "?"), key))[:200])}
        return {"ok": 200 <= status < 300, "detail": "%s %s -> %d" % (method, _redact_url(url), status)}


class DeploymentActuator:
    """Recycle ONE GPUStack instance: per-GPU locks, bounded drain, DELETE the instance, and
    hold the locks until the controller's replacement runs (bounded), so two engines never
    (re)start on one GPU at once. The worker unit and other deployments keep running."""

    def __init__(self, cfg: Dict[str, object], api: "GPUStackAPI", log, scrape_running):
        self.cfg = cfg
        self.api = api
        self.log = log
        self.scrape_running = scrape_running   # () -> in-flight requests of the engine, or None

    def budget_seconds(self) -> float:
        cfg = self.cfg
        return (float(cfg["drain_timeout_seconds"]) + float(cfg["restart_wait_seconds"])
                + 4 * float(cfg["http_timeout_seconds"]))

    def recycle(self, instance: "Instance") -> Dict[str, object]:
        cfg = self.cfg
        if cfg.get("actuator") in (None, "none"):
            return {"ok": False, "detail": "no actuator configured (alert only)"}
        if cfg.get("dry_run"):
            return {"ok": True, "dry_run": True,
                    "detail": "dry run: DELETE model-instances/%d (%s)" % (instance.id, self.api.mask(instance.name))}
        gpus = sorted(set(instance.gpu_indexes) | set(cfg.get("gpu_indexes") or []))
        lock_dir = str(cfg.get("lock_dir") or os.path.dirname(str(cfg["lock_file"])))
        locks = GPULocks(lock_dir, gpus, str(cfg["lock_file"]))
        busy = locks.acquire()
        if busy:
            return {"ok": False, "lock_held": True,
                    "detail": "another engine (re)start holds %s: retry later" % busy}
        try:
            drained = self._drain()
            deadline = time.monotonic() + 2 * float(cfg["http_timeout_seconds"])
            try:
                ok, detail = self.api.delete_instance(instance.id, deadline)
            except HTTPFailure as exc:
                return {"ok": False, "detail": str(exc), "drain": drained}
            if not ok:
                return {"ok": False, "detail": detail, "drain": drained}
            waited = self._wait_for_replacement(instance)
            return {"ok": True, "detail": detail, "drain": drained, "replacement": waited,
                    "gpus_locked": gpus}
        finally:
            locks.release()

    def _drain(self) -> str:
        """Wait (bounded) until the engine reports no request in flight. GPUStack 0.7.1 has no
        per-instance drain route, so this is the engine's own gauge; the time bound wins."""
        limit = float(self.cfg["drain_timeout_seconds"])
        end = time.monotonic() + limit
        while True:
            running = self.scrape_running()
            if running is None:
                return "no in-flight gauge: not drained"
            if running <= 0:
                return "idle"
            if time.monotonic() >= end:
                return "timed out after %.0f s with %g requests in flight" % (limit, running)
            time.sleep(min(1.0, max(0.0, end - time.monotonic())))

    def _wait_for_replacement(self, old: "Instance") -> str:
        end = time.monotonic() + float(self.cfg["restart_wait_seconds"])
        while time.monotonic() < end:
            time.sleep(min(2.0, max(0.0, end - time.monotonic())))
            try:
                found = self.api.instances(time.monotonic() + float(self.cfg["http_timeout_seconds"]))
            except HTTPFailure:
                continue
            fresh = [i for i in found if i.identity() != old.identity() and i.state in INSTANCE_STATES_RUNNING]
            if fresh:
                return "instance %d running" % fresh[0].id
        return "no running replacement within %.0f s" % float(self.cfg["restart_wait_seconds"])
