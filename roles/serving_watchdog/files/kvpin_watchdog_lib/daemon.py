# -*- coding: utf-8 -*-
# Copyright (c) 2026, kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The daemon: one target watched under systemd, and the switch-profile command."""

from __future__ import annotations

import json
import signal
import sys
import time
from typing import Dict, Optional, Set, Tuple

from .config import HOUR, tick_deadline
from .decision import Decision, DecisionEngine
from .httpio import HTTPFailure, redacted_config
from .sensors import LatencySensor, MemorySensor
from .gpustack import INSTANCE_STATES_RUNNING, DeploymentSensor, GPUStackAPI
from .actuators import Actuator, DeploymentActuator
from .profile_switch import ProfileSwitch, read_profile_marker, scrape_running_requests
from .outputs import render_metrics, sd_notify, write_textfile
from .measure import LOG_TAIL_LINES, MeasureError, TrafficRecorder, parse_engine_log_bytes

# An instance's log is read once per engine start, for its KV pool (the startup lines are at
# its start; a longer log, days of request lines, is not read).
ENGINE_LOG_READ_BYTES = 4 * 1024 * 1024


class Daemon:
    def __init__(self, cfg: Dict[str, object], out=None, clock=time.time, monotonic=time.monotonic):
        self.cfg = cfg
        self.out = out or sys.stdout
        self.clock = clock            # wall clock: log and metric timestamps only
        self.monotonic = monotonic    # every duration and the engine's time axis
        self.engine = DecisionEngine(cfg, auto_commit=False)
        self.memory = MemorySensor(cfg)
        self.latency = LatencySensor(cfg)
        self.traffic = TrafficRecorder(cfg, clock=clock)
        self.latency.page_hook = self.traffic.offer
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
        self.status_line = "starting"
        # Liveness: when a memory sample last reached the decision engine (time.monotonic), or
        # the deployment was seen to have no running instance here (nothing to watch).
        self.memory_seen_at = time.monotonic()
        self.blind_logged = False
        self.instance_start: Optional[Tuple[int, int, Optional[int]]] = None   # (id, restart_count, pid)
        # The engine start whose log was read for its KV pool, and the one waiting for its first
        # measured page (the engine is up, its startup lines are written) with the count then.
        self.engine_log_read: Optional[Tuple[int, int, Optional[int]]] = None
        self.engine_log_waiting: Tuple[Optional[Tuple[int, int, Optional[int]]], int] = (None, 0)
        # An engine without length histograms (llama-box): when its request log was last read,
        # and whether a failed read was logged (once per engine start).
        self.request_log_read_at: Optional[float] = None
        self.request_log_failed: Optional[Tuple[int, int, Optional[int]]] = None
        # Scraped families dropped as unsound and pages refused: counted per (family, reason) /
        # reason (fixed vocabularies: bounded), each logged the first time only.
        self.families_dropped: Dict[Tuple[str, str], int] = {}
        self.pages_refused: Dict[str, int] = {}
        self.drops_logged: Set[Tuple[str, str]] = set()
        self.state["families_dropped"] = self.families_dropped
        self.state["pages_refused"] = self.pages_refused

    def log(self, event: str, **fields: object) -> None:
        record = {"ts": round(self.clock(), 3), "target": self.cfg["name"], "event": event}
        record.update(fields)
        self.out.write(json.dumps(record, default=str, separators=(",", ":")) + "\n")
        self.out.flush()

    def _running_requests(self) -> Optional[float]:
        return scrape_running_requests(self.cfg, self.deployment.metrics_url() if self.deployment else None)

    def _sample_latency(self, now: float, deadline: float, url: Optional[str] = None) -> Dict[str, object]:
        """The latency signal; whatever goes wrong in it never stops the tick's memory sample
        from reaching the decision engine (the sensor itself does not raise on a hostile page)."""
        try:
            lat = self.latency.sample(now, metrics_url=url, deadline=deadline)
        except Exception as exc:  # noqa: BLE001 - memory is the signal that recycles: keep it
            return {"ttft_p95": None, "preemptions": None, "corroboration": {},
                    "status": "latency sensor failed: %s: %s" % (type(exc).__name__, str(exc)[:200])}
        self._count_unsound(lat)
        self._log_traffic_notes()
        return lat

    def _log_traffic_notes(self) -> None:
        for note in self.traffic.drain_notes():
            self.log("traffic", detail=note)

    def _count_unsound(self, lat: Dict[str, object]) -> None:
        for family, reason, detail in lat.get("dropped") or ():
            key = (str(family), str(reason))
            if key not in self.families_dropped and len(self.families_dropped) >= 512:
                continue
            self.families_dropped[key] = self.families_dropped.get(key, 0) + 1
            if key not in self.drops_logged:
                self.drops_logged.add(key)
                self.log("metric_family_dropped", family=key[0], reason=key[1], detail=detail,
                         note="logged once per family and reason; every drop is counted in "
                              "kvpin_watchdog_metric_families_dropped_total")
        refused = lat.get("refused")
        if refused:
            reason, detail = refused
            self.pages_refused[reason] = self.pages_refused.get(reason, 0) + 1
            if ("", reason) not in self.drops_logged:
                self.drops_logged.add(("", reason))
                self.log("metrics_page_refused", reason=reason, detail=detail,
                         note="logged once per reason; every refusal is counted in "
                              "kvpin_watchdog_metrics_pages_refused_total")

    def _engine_restarted(self, mem: Dict[str, object]) -> bool:
        """A new engine process: the memory sensor saw it (identity), or GPUStack's
        restart_count of the same instance moved (a container restarted in place)."""
        inst = mem.get("instance")
        restarted = bool(mem.get("restarted"))
        if inst is not None:
            start = (inst.id, inst.restart_count, inst.pid)
            if self.instance_start is not None and start != self.instance_start:
                restarted = True
            self.instance_start = start
        return restarted

    def _sample_deployment(self, now: float, deadline: float) -> Tuple[Dict[str, object], Dict[str, object]]:
        mem = self.deployment.sample(deadline)
        if self._engine_restarted(mem):
            mem["restarted"] = True       # the decision engine's trend restarts too
            self.latency.note_restart()
            self.traffic.note_restart("the engine restarted (new GPUStack instance, restart count or pid)")
        url = self.deployment.metrics_url() if mem.get("instance") is not None else None
        lat = self._sample_latency(now, deadline, url)
        if mem.get("instance") is not None and self.api is not None:   # the logs come through GPUStack's API
            self._read_engine_log(mem["instance"], deadline)
            self._read_request_log(mem["instance"], deadline)
        if mem.get("limit_source") and mem["limit_source"] != self.limit_source and mem["limit"]:
            self.log("limit", limit_bytes=mem["limit"], source=mem["limit_source"])
            self.limit_source = mem["limit_source"]
        return mem, lat

    def _read_engine_log(self, inst, deadline: float) -> None:
        """Once per engine start, after a page of that engine was measured: the KV pool (and the
        weights) its startup log states, through GPUStack's logs API (docs: measure.py)."""
        if not self.traffic.enabled:
            return
        start = (inst.id, inst.restart_count, inst.pid)
        if start == self.engine_log_read:
            return
        if start != self.engine_log_waiting[0]:
            self.engine_log_waiting = (start, self.traffic.pages_measured)
        if self.traffic.pages_measured <= self.engine_log_waiting[1]:
            return
        self.engine_log_read = start
        source = "GPUStack log of instance %d" % inst.id
        try:
            record = parse_engine_log_bytes(self.api.instance_log(inst.id, deadline, ENGINE_LOG_READ_BYTES), source)
        except (HTTPFailure, MeasureError) as exc:
            self.log("engine_log", instance=inst.id, detail=self.api.mask(str(exc))[:300],
                     note="the KV pool comes from the metrics page alone until the engine starts again")
            return
        self.traffic.offer_engine_log(record, source)
        self.log("engine_log", instance=inst.id, kv_cache_tokens=record.get("kv_cache_tokens"),
                 kv_cache_bytes=record.get("kv_cache_bytes"), weights_bytes=record.get("weights_bytes"),
                 engine_version=record.get("engine_version"))

    def _read_request_log(self, inst, deadline: float) -> None:
        """An engine whose page has no length histogram (llama-box): every traffic_scrape_seconds
        the last LOG_TAIL_LINES lines of its log through GPUStack's logs API, each finished
        request counted once (measure.TrafficRecorder.offer_request_log)."""
        if not (self.traffic.enabled and self.traffic.lengths_from_log):
            return
        now = float(self.clock())
        if self.request_log_read_at is not None and now - self.request_log_read_at < self.traffic.scrape_every:
            return
        self.request_log_read_at = now
        start = (inst.id, inst.restart_count, inst.pid)
        source = "GPUStack log of instance %d" % inst.id
        try:
            body = self.api.instance_log(inst.id, deadline, ENGINE_LOG_READ_BYTES, tail=LOG_TAIL_LINES)
        except HTTPFailure as exc:
            if self.request_log_failed != start:
                self.request_log_failed = start
                self.log("request_log", instance=inst.id, detail=self.api.mask(str(exc))[:300],
                         note="lengths not measured while the log cannot be read; logged once per engine start")
            return
        self.traffic.offer_request_log(body.decode("utf-8", "replace"), start, source)
        self._log_traffic_notes()

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
            if mem["restarted"]:
                self.latency.note_restart()
                self.traffic.note_restart("the engine restarted (new process)")
            lat = self._sample_latency(now, deadline)
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
            self._note_memory(mem)
            self._finish(decision)
            return decision
        restarted = bool(mem["restarted"]) or self.after_switch
        if self.after_switch:
            self.latency.reset()
            self.after_switch = False
        if mem["memory_bytes"] is None:
            decision = Decision(t=now, action="none", phase="collecting",
                                reason=str(mem.get("status") or "no memory reading (cgroup %s)" % mem["cgroup"]))
            record = json.loads(decision.to_json())
            record.setdefault("latency_status", lat.get("status"))
            self.log("decision", **record)
            self._note_memory(mem)
            self._check_blind(decision.reason)
            self._finish(decision)
            return decision
        decision = self.engine.feed(now, mem["memory_bytes"], ttft_p95=lat["ttft_p95"],
                                    preemptions=lat["preemptions"], restarted=restarted,
                                    corroboration=lat["corroboration"])
        self._note_memory(mem)
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

    def _note_memory(self, mem: Dict[str, object]) -> None:
        """Liveness bookkeeping: a memory reading, or a deployment the API says has no running
        instance on this worker (nothing to watch, so not blind), counts as sight."""
        inst = mem.get("instance")
        absent = self.deployment is not None and (
            (inst is None and not str(mem.get("status") or "").startswith("GPUStack API"))
            or (inst is not None and inst.state not in INSTANCE_STATES_RUNNING))
        if mem.get("memory_bytes") is not None or absent:
            self.memory_seen_at = time.monotonic()
            if mem.get("memory_bytes") is not None:
                self.state["last_memory_sample_timestamp"] = self.clock()
            if self.blind_logged:
                self.log("sight_restored", detail="a memory sample reached the decision engine again")
                self.blind_logged = False

    def blind_seconds(self) -> Optional[float]:
        """Seconds without a memory sample past memory_blind_seconds, else None (0: never blind)."""
        limit = float(self.cfg.get("memory_blind_seconds") or 0)
        gone = time.monotonic() - self.memory_seen_at
        return gone if limit and gone > limit else None

    def _check_blind(self, why: str) -> None:
        gone = self.blind_seconds()
        if gone is not None:
            self.status_line = "blind: no memory sample for %.0f s (%s)" % (gone, why[:150])
            if not self.blind_logged:
                self.blind_logged = True
                self.log("blind", seconds=round(gone, 1), limit_seconds=float(self.cfg["memory_blind_seconds"]),
                         detail="no memory sample reached the decision engine for %.0f s (last: %s): WATCHDOG=1 "
                                "is no longer sent, so systemd restarts this watchdog" % (gone, why[:200]))

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
        # The engine's time axis is monotonic: the episode's start on the wall clock for metrics.
        self.state["alert_episode_since_timestamp"] = (
            None if decision.alert_episode_since is None
            else self.clock() - (self.monotonic() - decision.alert_episode_since))
        if self.engine.state_note != self.state.get("state_note_logged"):
            if self.engine.state_note:
                self.log("state_file", detail=self.engine.state_note)
            self.state["state_note_logged"] = self.engine.state_note
        self.state["traffic"] = self.traffic.summary
        self.state["traffic_pages_unusable"] = self.traffic.unusable
        if decision.suppressed_by == "storm_guard" and not self.state.get("storm_logged"):
            self.log("storm_guard", detail="recycling stopped after %d recycles in %.1f h: alert only" % (
                len(self.engine.recycle_times), float(self.cfg["storm_window_seconds"]) / HOUR))
            self.state["storm_logged"] = True
        if self.cfg.get("textfile_dir"):
            write_textfile(str(self.cfg["textfile_dir"]), str(self.cfg["name"]),
                           render_metrics(str(self.cfg["name"]), decision, self.recycles_total, self.state))
        if self.blind_seconds() is None:
            self.status_line = "%s: %s" % (decision.action, decision.reason[:200])
        self.tick_deadline = None

    def _tick_safely(self) -> None:
        try:
            self.tick()
        except Exception as exc:  # noqa: BLE001 - one bad tick must not kill the watchdog
            self.log("error", error="%s: %s" % (type(exc).__name__, exc))
            self._check_blind("%s: %s" % (type(exc).__name__, exc))
        finally:
            self.tick_deadline = None

    def healthy(self) -> bool:
        """Feed systemd only while no tick runs, or the running one is within its deadline:
        a tick hung past it starves WATCHDOG=1 on purpose, so systemd restarts the daemon. So
        does a blind watchdog: no memory sample has reached the decision engine for longer
        than memory_blind_seconds (ticks that complete without one prove nothing)."""
        deadline = self.tick_deadline
        if deadline is not None and time.monotonic() >= deadline:
            return False
        return self.blind_seconds() is None

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
        if self.traffic.enabled and self.traffic.last_observed is not None:
            self.traffic.save()     # the newest hour is not lost with the watchdog
            self._log_traffic_notes()
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
