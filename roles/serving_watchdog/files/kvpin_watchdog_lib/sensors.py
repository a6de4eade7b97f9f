# -*- coding: utf-8 -*-
# Copyright (c) 2026, kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Daemon sensors: memory (cgroup, /proc) and latency (metrics endpoint, probe)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from .exposition import (HistogramWindow, LATENCY_SAMPLE_NAMES, METRIC_NAMES, first_family, histogram_series,
                         parse_page, sum_family)
from .fsio import _read, _read_small
from .httpio import HTTPFailure, _connect_within, http_request


# ---------------------------------------------------------------------------
# Daemon: sensors.
# ---------------------------------------------------------------------------
def _kv(text: str) -> Dict[str, int]:
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            try:
                out[parts[0]] = int(parts[1])
            except ValueError:
                pass
    return out


def cgroup_memory(cgroup_dir: str) -> Optional[Tuple[int, str]]:
    """anon + swap of a cgroup (v2, else v1). Returns (bytes, source) or None."""
    stat = _read(os.path.join(cgroup_dir, "memory.stat"))
    if stat is None:
        return None
    values = _kv(stat)
    if "anon" in values:  # cgroup v2
        swap_text = _read(os.path.join(cgroup_dir, "memory.swap.current"))
        swap = int(swap_text.strip()) if swap_text and swap_text.strip().isdigit() else 0
        return values["anon"] + swap, "cgroup2 anon+swap"
    rss = values.get("total_rss", values.get("rss"))
    if rss is None:
        return None
    swap = values.get("total_swap", values.get("swap", 0))
    return rss + swap, "cgroup1 rss+swap"


def proc_anon_swap(proc_root: str, pid: int) -> Optional[int]:
    """RssAnon + VmSwap of one process, bytes."""
    text = _read_small(os.path.join(proc_root, str(pid), "status"))
    if text is None:
        return None
    total = 0
    found = False
    for line in text.splitlines():
        if line.startswith("RssAnon:") or line.startswith("VmSwap:"):
            parts = line.split()
            total += int(parts[1]) * 1024
            found = True
    return total if found else None


def proc_start_time(proc_root: str, pid: int) -> Optional[int]:
    text = _read_small(os.path.join(proc_root, str(pid), "stat"))
    if not text:
        return None
    try:
        return int(text[text.rindex(")") + 2:].split()[19])  # field 22: starttime
    except (ValueError, IndexError):
        return None


def cgroup_pids(cgroup_dir: str) -> List[int]:
    text = _read(os.path.join(cgroup_dir, "cgroup.procs")) or ""
    return [int(x) for x in text.split() if x.strip().isdigit()]


def _run(argv: List[str], timeout: float) -> Tuple[int, str]:
    try:
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 127, str(exc)
    return proc.returncode, proc.stdout.decode("utf-8", "replace").strip()


def cgroup_candidates(root: str, rel: str) -> List[str]:
    """Where a cgroup path lives: unified (v2), hybrid's unified mount, the v1 memory controller,
    or v1's name=systemd tree (process list only: then /proc RssAnon+VmSwap is the reading)."""
    rel = rel.lstrip("/")
    return [os.path.join(root, sub, rel) if sub else os.path.join(root, rel)
            for sub in ("", "unified", "memory", "systemd")]


def pick_cgroup_dir(candidates: Sequence[str]) -> Optional[str]:
    """The first candidate with memory accounting, else the first that exists (pids only)."""
    existing = [c for c in candidates if os.path.isdir(c)]
    for cand in existing:
        if os.path.exists(os.path.join(cand, "memory.stat")):
            return cand
    return existing[0] if existing else None


def resolve_cgroup(cfg: Dict[str, object]) -> Optional[str]:
    root = str(cfg["cgroup_root"])
    if cfg.get("cgroup_path"):
        path = str(cfg["cgroup_path"])
        return path if os.path.isabs(path) else pick_cgroup_dir(cgroup_candidates(root, path))
    if cfg.get("unit"):
        rc, out = _run(["systemctl", "show", "-p", "ControlGroup", "--value", str(cfg["unit"])], 10)
        if rc == 0 and out:
            return pick_cgroup_dir(cgroup_candidates(root, out))
        return None
    if cfg.get("container"):
        rc, out = _run([str(cfg["container_runtime"]), "inspect", "--format",
                        "{{.State.Pid}}", str(cfg["container"])], 10)
        if rc == 0 and out.isdigit() and int(out) > 0:
            text = _read(os.path.join(str(cfg["proc_root"]), out, "cgroup")) or ""
            candidates = []
            for line in text.splitlines():
                parts = line.split(":", 2)
                if len(parts) != 3:
                    continue
                if "memory" in parts[1].split(","):      # cgroup v1 memory controller
                    candidates.insert(0, os.path.join(root, "memory", parts[2].lstrip("/")))
                elif parts[0] == "0":                    # v2 / hybrid unified
                    candidates.extend(cgroup_candidates(root, parts[2])[:2])
            return pick_cgroup_dir(candidates)
    return None


class MemorySensor:
    """Samples anon+swap of the target; remembers the process identity to spot restarts."""

    def __init__(self, cfg: Dict[str, object]):
        self.cfg = cfg
        self.cgroup_dir: Optional[str] = None
        self.identity: Optional[Tuple[int, int]] = None

    def sample(self) -> Dict[str, object]:
        proc_root = str(self.cfg["proc_root"])
        if self.cgroup_dir is None or not os.path.isdir(self.cgroup_dir):
            self.cgroup_dir = resolve_cgroup(self.cfg)
        pids: List[int] = []
        total: Optional[int] = None
        source = "none"
        if self.cgroup_dir:
            got = cgroup_memory(self.cgroup_dir)
            pids = cgroup_pids(self.cgroup_dir)
            if got is not None:
                total, source = got
        if self.cfg.get("pid"):
            pids = pids or [int(self.cfg["pid"])]
        per_process = {}
        for pid in pids[:64]:
            value = proc_anon_swap(proc_root, pid)
            if value is not None:
                per_process[pid] = value
        if total is None and per_process:
            total, source = sum(per_process.values()), "proc RssAnon+VmSwap"
        # Identity = the oldest process: a restart replaces it.
        identity = None
        starts = [(proc_start_time(proc_root, pid), pid) for pid in pids[:64]]
        starts = [s for s in starts if s[0] is not None]
        if starts:
            start, pid = min(starts)
            identity = (pid, start)
        restarted = self.identity is not None and identity is not None and identity != self.identity
        if identity is not None:
            self.identity = identity
        return {"memory_bytes": total, "source": source, "restarted": restarted,
                "per_process": per_process, "cgroup": self.cgroup_dir}


class LatencySensor:
    """TTFT p95 from the engine's histogram, or from an active streaming probe.

    The page is parsed family by family (exposition.parse_page): a family that is no sound
    metric (NaN or +Inf counts, a bad `le`, falling buckets, garbage, too many series) is left
    out and reported in the result's `dropped`, a page over the bounds is refused whole
    (`refused`); neither ever raises, so the tick's memory sample still reaches the decision
    engine. Counters that reset (an engine restart) count their new value as the increase since
    the restart, as Prometheus' rate() does: the TTFT histogram window and the preemptions
    counter, which is reported as a running total that never falls."""

    def __init__(self, cfg: Dict[str, object]):
        self.cfg = cfg
        self.window = self._new_window()
        self.preempt_last: Optional[float] = None     # the engine's counter at the last scrape
        self.preempt_total: Optional[float] = None    # increases summed across restarts
        self.preempt_restart = False
        self.preempt_fell = False
        # Called with (page body, url) for every page scraped (the daemon's traffic recorder):
        # measurement reads the page this scrape fetched anyway, never a second request.
        self.page_hook: Optional[Callable[[object, str], None]] = None

    def _new_window(self) -> HistogramWindow:
        return HistogramWindow(float(self.cfg["ttft_quantile"]), int(self.cfg["ttft_min_observations"]),
                               float(self.cfg["ttft_max_window_seconds"]))

    def reset(self) -> None:
        """A profile switch: latency before it is no baseline for after it. The window starts
        anew; the preemption total carries on (the switch restarted the engine)."""
        self.window = self._new_window()
        self.preempt_restart = True

    def note_restart(self) -> None:
        """The engine restarted (a new process, pid or GPUStack restart_count): its counters
        start again from 0, so their next values are increases since the restart."""
        self.window.note_restart()
        self.preempt_restart = True

    def sample(self, t: float, metrics_url: Optional[str] = None,
               deadline: Optional[float] = None) -> Dict[str, object]:
        out: Dict[str, object] = {"ttft_p95": None, "preemptions": None, "corroboration": {},
                                  "status": "no latency source", "dropped": [], "refused": None}
        url = metrics_url or self.cfg.get("metrics_url")
        if url:
            try:
                status, body, _headers = http_request(str(url), deadline=deadline,
                                                      timeout=float(self.cfg["http_timeout_seconds"]),
                                                      max_bytes=int(self.cfg["max_body_bytes"]))
            except HTTPFailure as exc:
                out["status"] = "metrics scrape failed: %s" % exc
                return out
            if status != 200:
                out["status"] = "metrics scrape failed: status %d" % status
                return out
            out.update(self.from_text(t, body))
            if self.page_hook is not None:
                try:
                    self.page_hook(body, str(url))
                except Exception as exc:  # noqa: BLE001 - measurement must not cost the latency signal
                    out["traffic_error"] = "%s: %s" % (type(exc).__name__, str(exc)[:200])
            del body
            if out["ttft_p95"] is not None or not self.cfg.get("probe_url"):
                return out
        if self.cfg.get("probe_url"):
            timeout = float(self.cfg["probe_timeout_seconds"])
            if deadline is not None:
                timeout = min(timeout, max(0.0, deadline - time.monotonic()))
            value = probe_ttft(str(self.cfg["probe_url"]), self.cfg.get("probe_model"), timeout) if timeout > 0 else None
            out["ttft_p95"] = value
            out["status"] = "probe ok" if value is not None else "probe failed"
        return out

    def _preemptions(self, raw: float) -> float:
        if self.preempt_last is None or self.preempt_total is None:
            self.preempt_total = raw
            self.preempt_fell = False
        elif raw < self.preempt_last or (self.preempt_restart and not self.preempt_fell):
            self.preempt_fell = raw < self.preempt_last and not self.preempt_restart
            self.preempt_total += raw
        else:
            self.preempt_fell = False
            self.preempt_total += raw - self.preempt_last
        self.preempt_last, self.preempt_restart = raw, False
        return self.preempt_total

    def from_text(self, t: float, text) -> Dict[str, object]:
        """One page (bytes or str) -> ttft_p95, preemptions, corroboration, status, and the
        families dropped / the page's refusal."""
        page = parse_page(text, LATENCY_SAMPLE_NAMES)
        samples = page.samples
        result: Dict[str, object] = {"ttft_p95": None, "preemptions": None, "corroboration": {},
                                     "dropped": page.dropped, "refused": None}
        if page.refused is not None:
            result["refused"] = (page.refused, page.detail)
            result["status"] = "metrics page refused (%s): %s" % (page.refused, page.detail)
            return result
        base = first_family(samples, "ttft_histogram", "_bucket")
        dropped_ttft = [d for d in page.dropped if d[0] in METRIC_NAMES["ttft_histogram"]]
        if base:
            series = {(base,) + key: counts for key, counts in histogram_series(samples, base).items()}
            result["ttft_p95"] = self.window.update(t, series)
            result["status"] = "%s: %s" % (base, self.window.last_status)
        elif dropped_ttft:
            family, reason, detail = dropped_ttft[0]
            result["status"] = "%s dropped (%s): %s" % (family, reason, detail)
        else:
            result["status"] = "no TTFT histogram in metrics"
        for name in METRIC_NAMES["preemptions"]:
            value = sum_family(samples, name)
            if value is not None:
                result["preemptions"] = self._preemptions(value)
                break
        for role, key in (("kv_cache_usage", "kv_cache_usage"), ("requests_waiting", "requests_waiting")):
            for name in METRIC_NAMES[role]:
                value = sum_family(samples, name)
                if value is not None:
                    result["corroboration"][key] = value
                    break
        return result


PROBE_MAX_LINE = 4096           # bytes of one streamed line that are looked at
PROBE_MAX_BYTES = 64 * 1024     # bytes read before the first data: line, at most


def probe_ttft(url: str, model: Optional[object], timeout: float) -> Optional[float]:
    """Seconds until the first streamed data chunk of a tiny /v1/completions request.

    One probe is one observation, not a p95: the trend of many probes stands in for it.
    Bounded like http_request: one deadline (start + timeout) on every socket operation, at most
    PROBE_MAX_BYTES read, no redirect followed (a 3xx, like any non-2xx, is None), no proxy.
    """
    import http.client  # pylint: disable=import-outside-toplevel
    import urllib.parse  # pylint: disable=import-outside-toplevel
    body = {"prompt": "Hello", "max_tokens": 1, "stream": True}
    if model:
        body["model"] = model
    start = time.monotonic()
    deadline = start + timeout
    conn = resp = None
    try:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname or timeout <= 0:
            return None
        conn_cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        conn = conn_cls(parts.hostname, parts.port, timeout=timeout)
        _connect_within(conn, deadline)
        conn.request("POST", (parts.path or "/") + ("?" + parts.query if parts.query else ""),
                     body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if not 200 <= resp.status < 300:
            return None
        seen, line_start = 0, True
        while seen < PROBE_MAX_BYTES:
            line = resp.readline(PROBE_MAX_LINE)
            if not line:
                return None
            seen += len(line)
            if line_start and line.strip().startswith(b"data:"):
                return time.monotonic() - start
            line_start = line.endswith(b"\n")   # the rest of an over-long line is no new line
    except (OSError, http.client.HTTPException, ValueError):
        return None
    finally:
        if resp is not None:
            resp.close()
        if conn is not None:
            conn.close()
    return None
