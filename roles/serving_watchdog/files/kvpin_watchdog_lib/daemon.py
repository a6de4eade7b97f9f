# -*- coding: utf-8 -*-
# Copyright (c) 2026, kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The daemon: one target watched under systemd, and the switch-profile command."""

from __future__ import annotations

import json
import signal
import sys
import time
from typing import Dict, Optional, Tuple

from .config import HOUR, tick_deadline
from .decision import Decision, DecisionEngine
from .httpio import redacted_config
from .sensors import LatencySensor, MemorySensor
from .gpustack import DeploymentSensor, GPUStackAPI
from .actuators import Actuator, DeploymentActuator
from .profile_switch import ProfileSwitch, read_profile_marker, scrape_running_requests
from .outputs import render_metrics, sd_notify, write_textfile


class Daemon:
    def __init__(self, cfg: Dict[str, object], out=None, clock=time.time, monotonic=time.monotonic):
        self.cfg = cfg
        self.out = out or sys.stdout
        self.clock = clock            # wall clock: log and metric timestamps only
        self.monotonic = monotonic    # every duration and the engine's time axis
        self.engine = DecisionEngine(cfg, auto_commit=False)
        self.memory = MemorySensor(cfg)
        self.latency = LatencySensor(cfg)
        self.actuator = Actuator(cfg, self.log)
        self.api = GPUStackAPI(cfg) if cfg.get("gpustack_deployment") else None
        self.deployment = DeploymentSensor(cfg, self.api) if self.api else None
        self.deployment_actuator = (DeploymentActuator(cfg, self.api, self.log, self._running_requests)
                                    if self.api else None)
        self.recycles_total = 0
        self.state: Dict[str, object] = {"recycle_failures_total": 0}
        self.stopping = False
        self.tick_deadline: Optional[float] = None   # monotonic; None = no tick in progress
        self.limit_source: Optional[str] = None
        self.after_switch = False     # a profile switch's grace period ended: the trend restarts

    def log(self, event: str, **fields: object) -> None:
        record = {"ts": round(self.clock(), 3), "target": self.cfg["name"], "event": event}
        record.update(fields)
        self.out.write(json.dumps(record, default=str, separators=(",", ":")) + "\n")
        self.out.flush()

    def _running_requests(self) -> Optional[float]:
        return scrape_running_requests(self.cfg, self.deployment.metrics_url() if self.deployment else None)

    def _sample_deployment(self, now: float, deadline: float) -> Tuple[Dict[str, object], Dict[str, object]]:
        mem = self.deployment.sample(deadline)
        if mem["restarted"]:
            self.latency.reset()
        url = self.deployment.metrics_url() if mem.get("instance") is not None else None
        lat = self.latency.sample(now, metrics_url=url, deadline=deadline)
        if mem.get("limit_source") and mem["limit_source"] != self.limit_source and mem["limit"]:
            self.log("limit", limit_bytes=mem["limit"], source=mem["limit_source"])
            self.limit_source = mem["limit_source"]
        return mem, lat

    def tick(self) -> Decision:
        # Network and liveness deadlines on the real monotonic clock; the engine's time axis on
        # self.monotonic (the same clock in production, a simulated one in benchmarks).
        deadline = time.monotonic() + tick_deadline(self.cfg)
        self.tick_deadline = deadline + 5.0
        now = self.monotonic()
        if self.deployment is not None:
            mem, lat = self._sample_deployment(now, deadline)
        else:
            mem = self.memory.sample()
            lat = self.latency.sample(now, deadline=deadline)
        if mem.get("limit"):
            self.engine.cfg["memory_limit_bytes"] = int(mem["limit"])
        switch = read_profile_marker(self.cfg, self.clock())
        if switch is not None:
            # A profile switch restarts the engine on purpose: its memory and latency are not a
            # trend, so no recycle and no alert until the grace period ends; the engine's trend
            # then starts anew (as after any restart).
            self.after_switch = True
            decision = Decision(t=now, action="none", phase="profile_switch", memory_bytes=mem["memory_bytes"],
                                reason="profile switch to %s %.0f s ago: no recycle or alert for %g s after it" % (
                                    switch["profile"], switch["age_seconds"],
                                    float(self.cfg["profile_switch_grace_seconds"])))
            self.log("decision", **json.loads(decision.to_json()))
            self._finish(decision)
            return decision
        restarted = bool(mem["restarted"]) or self.after_switch
        if self.after_switch:
            self.latency.reset()
            self.after_switch = False
        if mem["memory_bytes"] is None:
            decision = Decision(t=now, action="none", phase="collecting",
                                reason=str(mem.get("status") or "no memory reading (cgroup %s)" % mem["cgroup"]))
            self.log("decision", **json.loads(decision.to_json()))
            self._finish(decision)
            return decision
        decision = self.engine.feed(now, mem["memory_bytes"], ttft_p95=lat["ttft_p95"],
                                    preemptions=lat["preemptions"], restarted=restarted,
                                    corroboration=lat["corroboration"])
        record = json.loads(decision.to_json())
        record["memory_source"] = mem["source"]
        record["per_process_bytes"] = mem["per_process"]
        record["latency_status"] = lat.get("status")
        if mem.get("instance") is not None:
            inst = mem["instance"]
            record["instance"] = {"id": inst.id, "pid": inst.pid, "port": inst.port, "gpus": inst.gpu_indexes}
        if mem.get("limit_source"):
            record["limit_source"] = mem["limit_source"]
        self.log("decision", **record)
        if decision.action == "recycle":
            self._recycle(decision, mem)
        self.state["limit_source"] = mem.get("limit_source") or (
            "config memory_limit_bytes" if self.cfg.get("memory_limit_bytes") else None)
        self._finish(decision)
        return decision

    def _recycle(self, decision: Decision, mem: Dict[str, object]) -> None:
        if self.deployment_actuator is not None:
            self.tick_deadline = time.monotonic() + self.deployment_actuator.budget_seconds() + 10.0
            result = self.deployment_actuator.recycle(mem["instance"])
        else:
            self.tick_deadline = time.monotonic() + float(self.cfg["actuator_timeout_seconds"]) * 2 + 10.0
            result = self.actuator.recycle()
        self.state["last_recycle_timestamp"] = self.clock()
        self.state["last_recycle_ok"] = bool(result.get("ok"))
        if result.get("ok"):
            if not result.get("dry_run"):
                self.recycles_total += 1
            self.engine.commit_recycle(decision.t)
        else:
            # Not counted, trend kept: the next evaluation decides again (a retry).
            self.state["recycle_failures_total"] = int(self.state["recycle_failures_total"]) + 1
        self.log("recycle", **result)

    def _finish(self, decision: Decision) -> None:
        self.state["storm_guard_tripped"] = self.engine.storm_guard_tripped()
        self.state["last_tick_timestamp"] = self.clock()
        if decision.suppressed_by == "storm_guard" and not self.state.get("storm_logged"):
            self.log("storm_guard", detail="recycling stopped after %d recycles in %.1f h: alert only" % (
                len(self.engine.recycle_times), float(self.cfg["storm_window_seconds"]) / HOUR))
            self.state["storm_logged"] = True
        if self.cfg.get("textfile_dir"):
            write_textfile(str(self.cfg["textfile_dir"]), str(self.cfg["name"]),
                           render_metrics(str(self.cfg["name"]), decision, self.recycles_total, self.state))
        self.status_line = "%s: %s" % (decision.action, decision.reason[:200])
        self.tick_deadline = None

    def _tick_safely(self) -> None:
        try:
            self.tick()
        except Exception as exc:  # noqa: BLE001 - one bad tick must not kill the watchdog
            self.log("error", error="%s: %s" % (type(exc).__name__, exc))
        finally:
            self.tick_deadline = None

    def healthy(self) -> bool:
        """Feed systemd only while no tick runs, or the running one is within its deadline:
        a tick hung past it starves WATCHDOG=1 on purpose, so systemd restarts the daemon."""
        deadline = self.tick_deadline
        return deadline is None or time.monotonic() < deadline

    def run(self) -> int:
        import threading  # pylint: disable=import-outside-toplevel
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)
        self.log("start", config=redacted_config(self.cfg))
        sd_notify("READY=1\nSTATUS=watching %s" % self.cfg["name"])
        self.status_line = "starting"
        interval = float(self.cfg["interval_seconds"])
        worker: Optional[threading.Thread] = None
        next_tick = time.monotonic()
        while not self.stopping:
            if (worker is None or not worker.is_alive()) and time.monotonic() >= next_tick:
                next_tick = time.monotonic() + interval
                self.tick_deadline = time.monotonic() + tick_deadline(self.cfg) + 5.0
                worker = threading.Thread(target=self._tick_safely, name="tick", daemon=True)
                worker.start()
            # The scrape runs in the tick thread; this loop keeps WATCHDOG=1 fed meanwhile.
            if self.healthy():
                sd_notify("WATCHDOG=1\nSTATUS=%s" % self.status_line)
            time.sleep(min(1.0, interval))
        sd_notify("STOPPING=1")
        self.log("stop")
        return 0

    def _stop(self, *_args) -> None:
        self.stopping = True


def switch_profile(cfg: Dict[str, object], profile: str, out=None) -> int:
    """The switch-profile subcommand: JSON lines on stdout, the outcome on stderr too when it
    failed (the unit's journal shows it); exit 0 switched or nothing to do, 1 failed (the
    deployment keeps its profile unless the message says otherwise), 2 bad config or profile."""
    out = out or sys.stdout

    def log(event: str, **fields: object) -> None:
        record = {"ts": round(time.time(), 3), "target": cfg["name"], "event": event}
        record.update(fields)
        out.write(json.dumps(record, default=str, separators=(",", ":")) + "\n")
        out.flush()

    if not cfg.get("gpustack_deployment") or not cfg.get("profiles"):
        sys.stderr.write("kvpin_watchdog: switch-profile needs gpustack_deployment and profiles in the config\n")
        return 2
    status, message = ProfileSwitch(cfg, log).run(profile)
    log("profile_switch", ok=status == 0, profile=profile, detail=message)
    if status:
        sys.stderr.write("kvpin_watchdog: %s\n" % message)
    return status
