# -*- coding: utf-8 -*-
# Copyright (c) 2026, kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Decision engine (shared by replay and daemon)."""

from __future__ import annotations

import json
import math
import statistics
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from .config import DEFAULTS, GiB, HOUR, MiB
from .fsio import write_file_atomically
from .stats import downsample, trend

STATE_FILE_MAX_BYTES = 65536
# Diagnoses that say "memory is rising" (a confirmed one pages at once; see _episode).
MEMORY_DIAGNOSES = ("memory_rising", "leak_unconfirmed", "leak_with_latency", "leak_projected", "slow_decay")
# What a young engine's rise up to an earlier start's plateau is excused from (never
# leak_projected: the limit is in reach).
YOUNG_EXCUSED = ("memory_rising", "leak_unconfirmed", "leak_with_latency")


# ---------------------------------------------------------------------------
# Decision engine (shared by replay and daemon).
# ---------------------------------------------------------------------------
@dataclass
class Decision:
    t: float
    action: str                      # none | alert | recycle
    reason: str
    phase: str                       # warmup | collecting | settling | evaluating
    diagnosis: Optional[str] = None  # leak_with_latency | leak_projected | memory_rising | latency_only | ...
    memory_bytes: Optional[int] = None
    slope_bytes_per_hour: Optional[float] = None
    slope_lower_bytes_per_hour: Optional[float] = None
    slope_upper_bytes_per_hour: Optional[float] = None
    mk_p: Optional[float] = None
    mk_z: Optional[float] = None
    autocorrelation_factor: Optional[float] = None
    new_high: Optional[bool] = None
    window_points: int = 0
    window_seconds: float = 0.0
    ttft_p95: Optional[float] = None
    ttft_slope: Optional[float] = None          # seconds per hour
    ttft_slope_lower: Optional[float] = None
    ttft_mk_p: Optional[float] = None
    ttft_relative_rise: Optional[float] = None
    preemptions_in_window: Optional[float] = None
    projected_seconds_to_limit: Optional[float] = None
    memory_limit_bytes: Optional[int] = None
    rising_for_seconds: Optional[float] = None
    recycles_in_storm_window: int = 0
    suppressed_by: Optional[str] = None         # cooldown | storm_guard
    warmup_hold: bool = False                   # settling after a (re)start: memory rises excused
    memory_confirmed: Optional[bool] = None     # the rise held for confirm_needed_seconds()
    step_like: Optional[bool] = None            # the window is one step and a plateau, not a ramp
    alert_episode: Optional[str] = None         # the open alert episode's diagnosis
    alert_episode_since: Optional[float] = None
    alert_episodes_total: int = 0
    corroboration: Dict[str, float] = field(default_factory=dict)

    def to_json(self) -> str:
        data = asdict(self)
        for key, value in list(data.items()):
            if isinstance(value, float):
                data[key] = None if math.isnan(value) or math.isinf(value) else round(value, 6)
        return json.dumps(data, sort_keys=False, separators=(",", ":"))


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _bin_medians(points: Sequence[Tuple[float, float]], seconds: float = 600.0) -> List[Tuple[float, float]]:
    """Medians of consecutive `seconds`-long bins (the sawtooth and the noise averaged out)."""
    bins: Dict[int, List[float]] = {}
    for x, y in points:
        bins.setdefault(int(x // seconds), []).append(y)
    return [((k + 0.5) * seconds, statistics.median(v)) for k, v in sorted(bins.items())]


def _line_sse(points: Sequence[Tuple[float, float]]) -> float:
    n = len(points)
    mx = sum(p[0] for p in points) / n
    my = sum(p[1] for p in points) / n
    slope = _ls_slope(points)
    return sum((p[1] - my - slope * (p[0] - mx)) ** 2 for p in points)


def step_like(points: Sequence[Tuple[float, float]], ratio: float, seconds: float = 600.0) -> bool:
    """True when one step (a level, then a higher level) fits the `seconds`-bin medians better
    than a straight line by `ratio` (its squared residuals at most ratio x the line's) and
    neither level drifts by more than a quarter of the step: a cache that filled once, not a
    ramp (nor a ramp that began mid-window). ratio 0 turns the test off."""
    medians = _bin_medians(points, seconds)
    n = len(medians)
    if ratio <= 0 or n < 6:
        return False
    ys = [m[1] for m in medians]
    line = _line_sse(medians)
    best = None
    for cut in range(1, n):
        left, right = ys[:cut], ys[cut:]
        ml, mr = sum(left) / len(left), sum(right) / len(right)
        if mr <= ml:
            continue
        sse = sum((y - ml) ** 2 for y in left) + sum((y - mr) ** 2 for y in right)
        if best is None or sse < best[0]:
            best = (sse, cut, mr - ml)
    if best is None or best[0] > ratio * line:
        return False
    _sse, cut, height = best
    for part in (medians[:max(1, cut - 1)], medians[cut + 1:]):   # the bins beside the cut may hold the fill
        if len(part) >= 2 and abs(_ls_slope(part)) * (part[-1][0] - part[0][0]) > 0.25 * height:
            return False
    return True


def _ls_slope(points: Sequence[Tuple[float, float]]) -> float:
    n = len(points)
    mx = sum(p[0] for p in points) / n
    my = sum(p[1] for p in points) / n
    sxx = sum((p[0] - mx) ** 2 for p in points)
    return sum((p[0] - mx) * (p[1] - my) for p in points) / sxx if sxx > 0 else 0.0


def linear_rise(points: Sequence[Tuple[float, float]], settle: float, threshold: float,
                cfg: Dict[str, object]) -> bool:
    """A leak's steady pace while settling, over the settle window (`settle`: the settle window,
    or the trend window when shorter; once 0.9 x of it has been seen, shorter thirds are
    noise): in each third of it Sen's lower slope bound is above 2 x the threshold (bytes/s), the last third's
    slope is at least 0.85 x the first's (a warm-up decelerates; steps leave a third flat), and
    the whole is not one step."""
    if len(points) < 30 or points[-1][0] - points[0][0] < 0.9 * settle:
        return False
    size = len(points) // 3
    slopes = []
    for part in (points[:size], points[size:2 * size], points[2 * size:]):
        pts = downsample(part, int(cfg["max_points"]))
        found = trend([p[0] - pts[0][0] for p in pts], [p[1] for p in pts], float(cfg["confidence"]))
        if found is None or found.lower <= 2 * threshold:
            return False
        slopes.append(found.slope)
    return slopes[2] >= 0.85 * slopes[0] and not step_like(points, float(cfg["step_fit_ratio"]))


def _relative_rise(found, points: Sequence[Tuple[float, float]]) -> Optional[float]:
    """The rise of a fitted trend over `points`' span, relative to its start (None: no fit)."""
    if found is None or len(points) < 2:
        return None
    start = found.intercept + found.slope * points[0][0]
    end = found.intercept + found.slope * points[-1][0]
    return (end - start) / start if start > 0 else None


def trend_rise(points: Sequence[Tuple[float, float]], confidence: float) -> Optional[float]:
    """The relative rise of Sen's trend fitted to `points` (None: no fit)."""
    return _relative_rise(trend([p[0] for p in points], [p[1] for p in points], confidence), points)


def hourly_ttft_rise(rows: Sequence[Tuple[float, float, Optional[float]]], min_points: int,
                     cfg: Dict[str, object]) -> Tuple[bool, Optional[float], float]:
    """Whether TTFT p95's hourly medians in `rows` ((bucket end t, memory floor, TTFT median))
    rise as a leak lifts them (Mann-Kendall at long_window_ttft_alpha, Sen's fit rising by
    ttft_min_relative_rise, both halves rising), with that rise (None: no fit, or fewer than
    min_points readings) and the span of the readings (s). The long window asks this only of
    memory floors that passed its full test (Mann-Kendall at mk_alpha and more): TTFT confirms
    the latency impact there, and a burst's hour scatters its medians."""
    pts = [(r[0] - rows[0][0], r[2]) for r in rows if r[2] is not None]
    if not pts or len(pts) < min_points:
        return False, None, 0.0
    found = trend([p[0] for p in pts], [p[1] for p in pts], float(cfg["confidence"]))
    rise = _relative_rise(found, pts)
    up = (found is not None and found.p < float(cfg["long_window_ttft_alpha"]) and found.s > 0
          and rise is not None and rise >= float(cfg["ttft_min_relative_rise"])
          and rises_all_along(pts, float(cfg["confidence"])))
    return up, rise, pts[-1][0]


def rises_all_along(points: Sequence[Tuple[float, float]], confidence: float) -> bool:
    """Both halves of `points` rise, the smaller by at least 0.2 x the larger (relative to each
    half's start): a leak lifts TTFT all along, a load burst or a swell's rising side within a
    part of the window."""
    halves = [trend_rise(half, confidence) for half in (points[:len(points) // 2], points[len(points) // 2:])]
    return None not in halves and min(halves) > 0 and min(halves) >= 0.2 * max(halves)


def _fmt_bytes(n: float) -> str:
    if abs(n) >= GiB:
        return "%.2f GiB" % (n / GiB)
    return "%.1f MiB" % (n / MiB)


class DecisionEngine:
    """Fed samples one by one; returns a Decision per sample.

    Rules (the field report's slow decay, docs/architecture.md):
      memory rising + TTFT p95 rising          -> recycle (bookkeeping growth / fragmentation)
      memory rising, limit within horizon      -> recycle (before the projected crossing)
      memory rising, limit far                 -> alert
      TTFT p95 rising, memory flat             -> alert only (placement / preemption)
    "Memory rising" = Mann-Kendall significant AND Sen's lower slope bound above the
    threshold AND the newest sub-window set a new high (a capped cache that levelled
    off stops setting highs, so it is never recycled once flat).
    """

    def __init__(self, config: Optional[Dict[str, object]] = None, auto_commit: bool = True):
        # auto_commit: a recycle decision counts as done (replay). The daemon passes False and
        # calls commit_recycle() only when the actuator succeeded: a failed recycle (lock held,
        # API error) is not counted and does not reset the trend, so it is retried.
        self.auto_commit = auto_commit
        cfg = dict(DEFAULTS)
        if config:
            cfg.update({k: v for k, v in config.items() if v is not None})
        self.cfg = cfg
        self.mem: deque = deque()           # (t, bytes) since the last (re)start
        self.ttft: deque = deque()          # (t, p95)
        self.preempt: deque = deque()       # (t, counter)
        self.start_t: Optional[float] = None
        self.last_t: Optional[float] = None
        self.last_mem: Optional[float] = None
        self.last_eval_t: Optional[float] = None
        self.last_eval: Optional[Decision] = None
        self.floors: deque = deque()        # (t, floor of the newest sub-window) per evaluation
        self.floor_before_window: Optional[float] = None
        self.rising_since: Optional[float] = None
        self.recycle_times: deque = deque()
        self.last_recycle_t: Optional[float] = None
        self.season: deque = deque()        # (bucket end t, memory floor, TTFT p95 median) per hour
        self.bucket: List[Tuple[float, float, Optional[float]]] = []
        self.not_rising_since: Optional[float] = None
        self.rising_slopes: List[float] = []        # bytes/s at each evaluation since rising_since
        self.above_plateau_since: Optional[float] = None   # memory above the learned plateau + margin
        # Warm-up hold: on after each (re)start until memory settles (or a leak shows).
        self.hold = False
        self.long_from: Optional[float] = None    # hourly buckets from here make the long window
        self.settled = False                       # the hold ended with the memory settled
        # The plateau learned in this run and its value when learned: the run's hourly floors
        # lift it (a swell's peak, a late pool), a recycle puts it back (a leak is no plateau).
        self.run_plateau: Optional[Dict[str, float]] = None
        self.run_plateau_learned = 0.0
        self.plateaus: List[Dict[str, float]] = []   # learned post-start plateaus, oldest first
        self.state_note: Optional[str] = None        # why the state file was not read or written
        # Alert episodes (hysteresis and de-duplication).
        self.episode: Optional[str] = None
        self.episode_since: Optional[float] = None
        self.episode_last_t: Optional[float] = None
        self.episodes_total = 0
        self.pending: Optional[str] = None
        self.pending_since: Optional[float] = None
        self.pending_last_t: Optional[float] = None
        self._load_state()

    # -- state -------------------------------------------------------------
    def restart(self, t: float) -> None:
        """Forget the trend: a new process starts a new warm-up and window."""
        self.mem.clear()
        self.ttft.clear()
        self.preempt.clear()
        self.start_t = t
        self.last_eval_t = None
        self.last_eval = None
        self.floors.clear()
        self.floor_before_window = None
        self.rising_since = None
        self.not_rising_since = None
        self.above_plateau_since = None
        self.season.clear()
        self.bucket = []
        self.hold = float(self.cfg["warmup_hold_max_seconds"]) > 0
        self.run_plateau = None
        self.long_from = None if self.hold else t
        self.settled = not self.hold
        self._end_episode()

    def _drop_before(self, horizon: float) -> None:
        """Drop the window's samples (memory, TTFT, preemptions) older than horizon."""
        for series in (self.mem, self.ttft, self.preempt):
            while series and series[0][0] < horizon:
                series.popleft()

    def _trim(self, t: float) -> None:
        self._drop_before(t - float(self.cfg["window_seconds"]))
        storm_start = t - float(self.cfg["storm_window_seconds"])
        while self.recycle_times and self.recycle_times[0] < storm_start:
            self.recycle_times.popleft()

    # -- main entry --------------------------------------------------------
    def feed(self, t: float, mem_bytes: float, ttft_p95: Optional[float] = None,
             preemptions: Optional[float] = None, restarted: bool = False,
             corroboration: Optional[Dict[str, float]] = None) -> Decision:
        decision = self._feed(t, mem_bytes, ttft_p95, preemptions, restarted, corroboration)
        self._stamp(decision)
        return decision

    def _feed(self, t: float, mem_bytes: float, ttft_p95: Optional[float], preemptions: Optional[float],
              restarted: bool, corroboration: Optional[Dict[str, float]]) -> Decision:
        cfg = self.cfg
        drop = (self.last_mem is not None and self.last_mem > 0
                and mem_bytes < self.last_mem * (1.0 - float(cfg["restart_drop_fraction"])))
        if self.start_t is None or restarted or drop:
            self.restart(t)
        self.last_t, self.last_mem = t, mem_bytes
        base = dict(t=t, memory_bytes=int(mem_bytes), ttft_p95=ttft_p95,
                    memory_limit_bytes=cfg.get("memory_limit_bytes"),
                    corroboration=dict(corroboration or {}))
        age = t - self.start_t
        if age < float(cfg["warmup_seconds"]):
            reason = "warm-up after (re)start: %.0f of %.0f s" % (age, float(cfg["warmup_seconds"]))
            if drop or restarted:
                reason = "restart detected; " + reason
            return Decision(action="none", reason=reason, phase="warmup",
                            recycles_in_storm_window=len(self.recycle_times), **base)
        self.mem.append((t, float(mem_bytes)))
        self._season_add(t, float(mem_bytes), ttft_p95)
        if ttft_p95 is not None and not math.isnan(ttft_p95):
            self.ttft.append((t, float(ttft_p95)))
        if preemptions is not None:
            self.preempt.append((t, float(preemptions)))
        self._trim(t)
        span = self.mem[-1][0] - self.mem[0][0]
        if span < float(cfg["min_window_seconds"]) or len(self.mem) < int(cfg["min_points"]):
            return Decision(action="none", phase="collecting", window_points=len(self.mem),
                            window_seconds=span,
                            reason="collecting: %.0f of %.0f s clean history" % (
                                span, float(cfg["min_window_seconds"])),
                            recycles_in_storm_window=len(self.recycle_times), **base)
        if (self.last_eval is not None and self.last_eval_t is not None
                and t - self.last_eval_t < float(cfg["evaluate_every_seconds"])):
            return self._repeat(base)
        decision = self._evaluate(base)
        self._episode(decision, t)
        self.last_eval_t, self.last_eval = t, decision
        if decision.action == "recycle" and self.auto_commit:
            self.commit_recycle(t)
            decision.recycles_in_storm_window = len(self.recycle_times)
        return decision

    def commit_recycle(self, t: float) -> None:
        """A recycle happened: count it (cooldown, storm guard); a new trend starts here."""
        if self.run_plateau is not None and self.run_plateau["plateau"] != self.run_plateau_learned:
            self.run_plateau["plateau"] = self.run_plateau_learned
            self._save_state()
        self.recycle_times.append(t)
        self.last_recycle_t = t
        self.restart(t)

    def storm_guard_tripped(self) -> bool:
        return len(self.recycle_times) >= int(self.cfg["storm_max_recycles"])

    def _repeat(self, base: dict) -> Decision:
        """Between evaluations, carry the last statistics; never repeat an action."""
        prev = self.last_eval
        data = asdict(prev)
        data.update(base)
        data.update(action="none", suppressed_by=None, window_points=len(self.mem),
                    reason="between evaluations (every %ss); last: %s: %s" % (
                        self.cfg["evaluate_every_seconds"], prev.action, prev.reason),
                    recycles_in_storm_window=len(self.recycle_times))
        if prev.action == "alert":  # an alert condition persists until re-evaluated
            data["action"] = "alert"
            data["reason"] = prev.reason
        return Decision(**data)

    def _evaluate(self, base: dict) -> Decision:
        cfg = self.cfg
        t = base["t"]
        t0 = self.mem[0][0]
        pts = downsample([(x - t0, y) for x, y in self.mem], int(cfg["max_points"]))
        xs = [p[0] for p in pts]
        ys = [p[1] for p in pts]
        mt = trend(xs, ys, float(cfg["confidence"]))
        d = Decision(action="none", phase="evaluating", reason="", window_points=len(self.mem),
                     window_seconds=self.mem[-1][0] - t0, **base)
        d.recycles_in_storm_window = len(self.recycle_times)
        if mt is None:
            d.reason = "not enough points"
            return d
        d.slope_bytes_per_hour = mt.slope * HOUR
        d.slope_lower_bytes_per_hour = mt.lower * HOUR
        d.slope_upper_bytes_per_hour = mt.upper * HOUR
        d.mk_p, d.mk_z, d.autocorrelation_factor = mt.p, mt.z, mt.variance_factor

        # Capped-cache / burst guard on sub-window *floors* (25th percentiles): a leak is a ramp,
        # so every sub-window's floor sits above the one before, and the newest floor is above
        # every earlier floor since the (re)start by a margin. A cache that levelled off, a
        # burst (a step that lifts peaks and one floor) or a daily swing that repeats fails it.
        k = max(2, int(cfg["new_high_subwindows"]))
        size = max(1, len(ys) // k)
        floors = [_quantile(ys[len(ys) - (k - i) * size:len(ys) - (k - i - 1) * size], 0.25)
                  for i in range(k)]
        recent_floor = floors[-1]
        earlier_best = max(floors[:-1] + ([self.floor_before_window] if self.floor_before_window else []))
        margin = float(cfg["slope_threshold_bytes_per_hour"]) * (xs[-1] - xs[0]) / k / HOUR
        ramp = all(floors[i + 1] > floors[i] for i in range(k - 1))
        d.new_high = ramp and recent_floor > earlier_best + margin
        self.floors.append((t, recent_floor))
        while self.floors and self.floors[0][0] < t0:
            self.floor_before_window = max(self.floor_before_window or 0.0, self.floors.popleft()[1])
        recent_high = max(ys[-size:])

        threshold = float(cfg["slope_threshold_bytes_per_hour"]) / HOUR
        mem_trend = mt.p < float(cfg["mk_alpha"]) and mt.s > 0 and mt.lower > threshold
        # One step (a cache filling once) and a plateau passes the trend tests while the step
        # crosses the window; it is no ramp, so never a rising memory.
        d.step_like = mem_trend and step_like(pts, float(cfg["step_fit_ratio"]))
        mem_rising = mem_trend and d.new_high and not d.step_like

        limit = cfg.get("memory_limit_bytes")
        if limit and mt.slope > 0:
            d.projected_seconds_to_limit = max(0.0, (float(limit) - recent_high) / mt.slope)

        # TTFT trend over the same window.
        ttft_rising = ttft_spread = False
        ttft_note = "no TTFT signal"
        if len(self.ttft) >= int(cfg["ttft_min_points"]):
            tpts = downsample([(x - t0, y) for x, y in self.ttft], int(cfg["max_points"]))
            tt = trend([p[0] for p in tpts], [p[1] for p in tpts], float(cfg["confidence"]))
            if tt is not None:
                d.ttft_slope = tt.slope * HOUR
                d.ttft_slope_lower = tt.lower * HOUR
                d.ttft_mk_p = tt.p
                start_level = tt.intercept + tt.slope * tpts[0][0]
                end_level = tt.intercept + tt.slope * tpts[-1][0]
                if start_level > 0:
                    d.ttft_relative_rise = (end_level - start_level) / start_level
                ttft_rising = (tt.p < float(cfg["mk_alpha"]) and tt.s > 0
                               and tt.lower * HOUR > float(cfg["ttft_slope_threshold_seconds_per_hour"])
                               and (d.ttft_relative_rise or 0.0) >= float(cfg["ttft_min_relative_rise"]))
                ttft_note = "TTFT p95 slope %+.3f s/h (lower %+.3f, MK p=%.2g, rise %+.0f%%)" % (
                    d.ttft_slope, d.ttft_slope_lower, tt.p, 100.0 * (d.ttft_relative_rise or 0.0))
                older = [p for p in tpts if p[0] <= tpts[0][0] + (tpts[-1][0] - tpts[0][0]) * 2.0 / 3.0]
                ttft_spread = ttft_rising and (trend_rise(older, float(cfg["confidence"])) or 0.0) \
                    >= 0.25 * float(cfg["ttft_min_relative_rise"])
        if len(self.preempt) >= 2:
            d.preemptions_in_window = max(0.0, self.preempt[-1][1] - self.preempt[0][1])

        mem_note = "memory %s, slope %s/h (lower %s/h, MK p=%.2g, n/n*=%.2f, new high: %s)" % (
            _fmt_bytes(base["memory_bytes"]), _fmt_bytes(d.slope_bytes_per_hour),
            _fmt_bytes(d.slope_lower_bytes_per_hour), mt.p, mt.variance_factor,
            "yes" if d.new_high else "no")
        extra = []
        if d.projected_seconds_to_limit is not None:
            hours = d.projected_seconds_to_limit / HOUR
            extra.append("limit %s projected in %.1f h" % (_fmt_bytes(float(limit)), hours))
        if d.preemptions_in_window:
            extra.append("%d preemptions in window" % d.preemptions_in_window)
        for key, value in sorted(d.corroboration.items()):
            extra.append("%s=%g" % (key, value))
        tail = ("; " + "; ".join(extra)) if extra else ""

        horizon = float(cfg["recycle_horizon_seconds"])
        within = d.projected_seconds_to_limit is not None and d.projected_seconds_to_limit <= horizon
        # A recycle needs the rise to hold at every evaluation for confirm_seconds (Prometheus
        # `for:`): a burst or a short swing passes the test once, a leak keeps passing it.
        # Hysteresis: entering needs the full test; staying needs a significant-ish slope above
        # the threshold and a floor still setting highs, so a slow leak whose CI grazes the
        # threshold is not reset each time, while a burst that passed stops counting.
        # A lapse shorter than rising_grace_seconds (noise at one evaluation) keeps the clock.
        still_rising = (mt.p < 10 * float(cfg["mk_alpha"]) and mt.slope > threshold
                        and d.new_high and not d.step_like)
        if mem_rising and self.rising_since is None:
            self.rising_since, self.rising_slopes = t, []
        if self.rising_since is not None:
            self.rising_slopes.append(mt.slope)
        if still_rising or mem_rising:
            self.not_rising_since = None
        elif self.rising_since is not None:
            if self.not_rising_since is None:
                self.not_rising_since = t
            if t - self.not_rising_since >= float(cfg["rising_grace_seconds"]):
                self.rising_since = self.not_rising_since = None
        # At the median slope seen since the rise began: a burst at the window's end steepens
        # the slope for an evaluation or two and must not shorten the confirmation.
        needed = self.confirm_needed_seconds(
            statistics.median(self.rising_slopes) if self.rising_since is not None else mt.slope, within)
        held_long_enough = self.rising_since is not None and t - self.rising_since >= needed
        confirmed = mem_rising and held_long_enough
        d.memory_confirmed = confirmed
        d.rising_for_seconds = 0.0 if self.rising_since is None else t - self.rising_since
        held_by = None
        if self.hold:
            held_by = self._warmup_hold(d, t, recent_floor, within and confirmed)
            if self.rising_since is None:   # the hold ended here, its warm-up trimmed: unconfirmed
                confirmed = d.memory_confirmed = False
        evidence = Evidence(self, cfg, mem_trend=mem_trend, mem_rising=mem_rising, confirmed=confirmed,
                            ttft_rising=ttft_rising, ttft_spread=ttft_spread, within=within, horizon=horizon,
                            rising_for_seconds=d.rising_for_seconds, confirm_needed=needed,
                            mem_note=mem_note, ttft_note=ttft_note, tail=tail)
        for name, detect in DETECTORS:
            found = detect(evidence)
            if found is not None:
                d.diagnosis = name
                d.action, d.reason = found
                break
        if limit and d.projected_seconds_to_limit is None:
            # The window shows no rise (a swell's falling side), the long window may: project on it.
            found = evidence.long()
            if found is not None and found["slope"] > 0:
                d.projected_seconds_to_limit = max(0.0, (float(limit) - recent_high) / found["slope"])
        if held_by is not None and d.diagnosis in MEMORY_DIAGNOSES:
            d.action, d.diagnosis = "none", None
            d.reason = "settling after the (re)start, memory rise excused (%s): %s" % (held_by, d.reason)
        elif d.diagnosis in YOUNG_EXCUSED and not within and self._young_below_plateau(t, recent_floor):
            d.action, d.diagnosis = "none", None
            d.reason = ("young engine not above an earlier start's plateau (its warm-up climbing back "
                        "to it): %s" % d.reason)
        if (d.action == "recycle" and d.diagnosis == "leak_with_latency" and not within
                and t - self.start_t < float(self.cfg["warmup_hold_max_seconds"])):
            why = self._young_rise_not_linear()
            if why is not None:
                d.action = "alert"
                d.reason = ("young engine, recycle deferred until %.1f h after the start (%s; the limit is "
                            "not in reach): %s" % (float(self.cfg["warmup_hold_max_seconds"]) / HOUR, why, d.reason))
        if d.action == "recycle":
            self._apply_policy(d, t)
        return d

    def _young_below_plateau(self, t: float, recent_floor: float) -> bool:
        """Younger than warmup_hold_max_seconds and its memory floor not above the highest
        plateau an earlier start settled at (plus plateau_margin_bytes): a restart's warm-up
        climbing back to a level this deployment is known to hold, whatever ended the hold (a
        flat hour between two allocations, a leak-like pace for a while). This start's own
        plateau is no excuse (a leak after it is judged as before), nor is anything before a
        first start has settled."""
        earlier = [p["plateau"] for p in self.plateaus if p is not self.run_plateau]
        cap = float(self.cfg["warmup_hold_max_seconds"])
        return (bool(earlier) and t - self.start_t < cap
                and recent_floor <= max(earlier) + float(self.cfg["plateau_margin_bytes"]))

    def _young_rise_not_linear(self) -> Optional[str]:
        """Why this young engine's rise may still be its warm-up (a warm-up under the swell's
        rising side lifts memory and TTFT together for hours), None when its hourly memory
        floors since the start rise as a leak does: at least 4 of them, the later half rising at
        least half as much as the earlier half (a warm-up decelerates, a leak keeps its pace)."""
        floors = [row[1] for row in self.season]
        if len(floors) < 4:
            return "%d hourly memory floors since the start, 4 tell a leak from a warm-up" % len(floors)
        half = (len(floors) - 1) // 2
        earlier, later = floors[half] - floors[0], floors[-1] - floors[-1 - half]
        if later < 0.5 * earlier:
            return ("its hourly memory floors decelerate: %s over the first %d h, %s over the last %d h" % (
                _fmt_bytes(earlier), half, _fmt_bytes(later), half))
        return None

    def confirm_needed_seconds(self, slope_per_second: float, near_limit: bool = False) -> float:
        """How long a rise must hold before it is confirmed: confirm_seconds, or the time to add
        confirm_rise_bytes at this slope when longer, at most confirm_max_seconds. Without the
        limit in reach, the rise must also add as much as this run's load has lifted the hourly
        floors and taken back (undone_rise_bytes: load bursts that follow each other lift memory
        and TTFT p95 together for hours, as a leak does, then give it back; a leak never does)."""
        cfg = self.cfg
        needed = float(cfg["confirm_seconds"])
        rise = float(cfg["confirm_rise_bytes"])
        if not near_limit:
            rise = max(rise, self.undone_rise_bytes())
        if slope_per_second > 0:
            needed = max(needed, rise / slope_per_second)
        return min(needed, max(float(cfg["confirm_seconds"]), float(cfg["confirm_max_seconds"])))

    def undone_rise_bytes(self) -> float:
        """The largest rise of this run's hourly memory floors that came back down: over the
        kept hourly buckets, the most a floor stood above both the lowest floor before it and
        the lowest after it (its prominence). 0 while the floors only rose or stayed flat."""
        floors = [row[1] for row in self.season]
        best = 0.0
        low_before = float("inf")
        lows_after = [0.0] * len(floors)
        low = float("inf")
        for i in range(len(floors) - 1, -1, -1):
            lows_after[i] = low
            low = min(low, floors[i])
        for i, floor in enumerate(floors):
            if 0 < i < len(floors) - 1:
                best = max(best, floor - max(low_before, lows_after[i]))
            low_before = min(low_before, floor)
        return best

    # -- warm-up hold and the learned plateau ------------------------------
    def learned_plateau(self) -> Optional[float]:
        """The highest of the kept post-start plateaus (bytes), None before one was learned."""
        return max(p["plateau"] for p in self.plateaus) if self.plateaus else None

    def hold_max_seconds(self) -> float:
        """The hold's cap (age after a start): warmup_hold_max_seconds, shorter once this
        deployment is known to settle faster (1.5 x its slowest learned settling + 1 h)."""
        cap = float(self.cfg["warmup_hold_max_seconds"])
        if self.plateaus:
            cap = min(cap, 1.5 * max(p["settle_seconds"] for p in self.plateaus) + HOUR)
        return cap

    def _warmup_hold(self, d: Decision, t: float, recent_floor: float, projected_recycle: bool) -> Optional[str]:
        """While settling, return why a memory rise is excused; None once the hold ended here.
        It ends when the slope over settle_window_seconds is at the threshold (the level is
        learned as a plateau and the trend window starts there), when memory stays above the
        learned plateau by plateau_margin_bytes for an hour, keeps a leak's pace, would reach the limit within the
        horizon, or at hold_max_seconds()."""
        cfg = self.cfg
        settle = float(cfg["settle_window_seconds"])
        age = t - self.start_t
        recent = [(x, y) for x, y in self.mem if x >= t - settle]
        threshold = float(cfg["slope_threshold_bytes_per_hour"]) / HOUR
        if recent[-1][0] - recent[0][0] >= 0.45 * settle:
            pts = downsample(recent, int(cfg["max_points"]))
            st = trend([p[0] - recent[0][0] for p in pts], [p[1] for p in pts], float(cfg["confidence"]))
            if st is not None and st.slope <= threshold:
                plateau = statistics.median(p[1] for p in pts)
                self._learn_plateau(plateau, age)
                self._end_hold(t, trim_before=recent[0][0], settled=True)
                return None
        learned = self.learned_plateau()
        above = learned is not None and recent_floor > learned + float(cfg["plateau_margin_bytes"])
        self.above_plateau_since = (self.above_plateau_since or t) if above else None
        # Above it for an hour: a load burst (10..40 min and its decay) lifts the floor for less.
        if above and t - self.above_plateau_since >= HOUR:
            self._end_hold(t)
            return None
        if projected_recycle or linear_rise(recent, min(settle, float(cfg["window_seconds"])), threshold, cfg):
            self._end_hold(t)
            return None
        if age >= self.hold_max_seconds():
            self._end_hold(t, trim_before=t - settle)
            return None
        d.phase, d.warmup_hold = "settling", True
        return "settling %.1f of at most %.1f h%s" % (
            age / HOUR, self.hold_max_seconds() / HOUR,
            "" if learned is None else ", learned plateau %s" % _fmt_bytes(learned))

    def _end_hold(self, t: float, trim_before: Optional[float] = None, settled: bool = False) -> None:
        """The hold ends at t. With trim_before, the warm-up before it leaves the trend window
        and the rise clock starts anew (settled, or the cap reached); without, a leak that ended
        the hold keeps its history. The long window starts here once settled; else it keeps
        the whole run (memory that never settled may be a leak that began during the warm-up:
        with TTFT following it, that is the slow leak the long window is for)."""
        self.hold = False
        self.settled = settled
        self.long_from = t if settled else self.start_t
        if trim_before is None:
            return
        self._drop_before(trim_before)
        self.floors.clear()
        self.floor_before_window = None
        self.rising_since = self.not_rising_since = None

    def _learn_plateau(self, plateau: float, settle_seconds: float) -> None:
        self.run_plateau = {"plateau": float(int(plateau)), "settle_seconds": round(float(settle_seconds), 1)}
        self.run_plateau_learned = self.run_plateau["plateau"]
        self.plateaus.append(self.run_plateau)
        del self.plateaus[:-int(self.cfg["plateaus_kept"])]
        self._save_state()

    def _load_state(self) -> None:
        """Read the learned plateaus from state_file: at most STATE_FILE_MAX_BYTES, every value
        checked. A missing file is a first start; anything wrong is a note, never an error."""
        path = self.cfg.get("state_file")
        if not path:
            return
        try:
            with open(str(path), "rb") as handle:
                raw = handle.read(STATE_FILE_MAX_BYTES + 1)
        except FileNotFoundError:
            return
        except OSError as err:
            self.state_note = "state file %s not read (%s): no learned plateau" % (path, err.strerror or err)
            return
        if len(raw) > STATE_FILE_MAX_BYTES:
            self.state_note = "state file %s is larger than %d bytes: ignored, no learned plateau" % (
                path, STATE_FILE_MAX_BYTES)
            return
        try:
            data = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as err:
            self.state_note = "state file %s is not JSON (%s): ignored, no learned plateau" % (path, err)
            return
        entries = data.get("plateaus") if isinstance(data, dict) else None
        if not isinstance(entries, list):
            self.state_note = "state file %s has no list 'plateaus': ignored, no learned plateau" % path
            return
        kept = []
        for index, entry in enumerate(entries):
            for key in ("plateau", "settle_seconds"):
                value = entry.get(key) if isinstance(entry, dict) else None
                if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
                        or value <= 0 or value > 2 ** 62):
                    self.state_note = ("state file %s: plateaus[%d].%s is %r, not a finite and positive "
                                       "number: ignored, no learned plateau" % (path, index, key, value))
                    return
            kept.append({"plateau": float(entry["plateau"]), "settle_seconds": float(entry["settle_seconds"])})
        self.plateaus = kept[-int(self.cfg["plateaus_kept"]):]

    def _save_state(self) -> None:
        path = self.cfg.get("state_file")
        if not path:
            return
        try:
            write_file_atomically(str(path), json.dumps({"plateaus": self.plateaus}) + "\n", ".kvpin-watchdog-state-")
            self.state_note = None
        except OSError as err:
            self.state_note = "state file %s not written (%s): the learned plateaus last until the watchdog restarts" % (
                path, err.strerror or err)

    # -- alert episodes ----------------------------------------------------
    def _end_episode(self) -> None:
        self.episode = self.episode_since = self.episode_last_t = None
        self.pending = self.pending_since = self.pending_last_t = None

    def _episode(self, d: Decision, t: float) -> None:
        self._episode_update(d, t)
        self._stamp(d)

    def _episode_update(self, d: Decision, t: float) -> None:
        """One alert episode per condition, with hysteresis. A confirmed memory rise (or a
        recycle the policy held back) pages at once; any other condition only once it has been
        seen for alert_enter_seconds (sightings less than that apart are one condition), before
        which the decision says "alert pending" and does not page. An open episode keeps its
        diagnosis and pages until alert_clear_seconds pass without its condition; a recycle
        ends it."""
        cfg = self.cfg
        if d.action == "recycle":
            self._end_episode()
            return
        memory_episode = self.episode in MEMORY_DIAGNOSES
        seen = d.action == "alert" or (memory_episode and d.diagnosis in MEMORY_DIAGNOSES)
        if self.episode is not None:
            if seen:
                self.episode_last_t = t
                if d.diagnosis != self.episode:
                    d.reason = "alert episode %s continues: %s" % (self.episode, d.reason)
                d.action, d.diagnosis = "alert", self.episode
                return
            if t - self.episode_last_t < float(cfg["alert_clear_seconds"]):
                d.reason = "alert episode %s held: its condition last seen %.0f s ago, clears after %.0f s: %s" % (
                    self.episode, t - self.episode_last_t, float(cfg["alert_clear_seconds"]), d.reason)
                d.action, d.diagnosis = "alert", self.episode
                return
            self._end_episode()
            return
        if d.action != "alert":
            return
        at_once = d.diagnosis in MEMORY_DIAGNOSES and d.diagnosis != "leak_unconfirmed"
        if not at_once:
            if self.pending is None or t - self.pending_last_t >= float(cfg["alert_enter_seconds"]):
                self.pending, self.pending_since = d.diagnosis, t
            self.pending_last_t = t
            if t - self.pending_since < float(cfg["alert_enter_seconds"]):
                d.action = "none"
                d.reason = "alert pending (%s seen for %.0f of %.0f s): %s" % (
                    self.pending, t - self.pending_since, float(cfg["alert_enter_seconds"]), d.reason)
                return
            d.diagnosis = self.pending
        self.episode, self.episode_since, self.episode_last_t = d.diagnosis, t, t
        self.pending = self.pending_since = self.pending_last_t = None
        self.episodes_total += 1

    def _stamp(self, d: Decision) -> None:
        d.alert_episode, d.alert_episode_since = self.episode, self.episode_since
        d.alert_episodes_total = self.episodes_total

    # -- slow decay: same hour, one season apart ---------------------------
    def _season_add(self, t: float, mem: float, ttft: Optional[float]) -> None:
        self.bucket.append((t, mem, ttft if ttft is not None and not math.isnan(ttft) else None))
        if t - self.bucket[0][0] < float(self.cfg["season_bucket_seconds"]) - 1e-9:
            return
        mems = [b[1] for b in self.bucket]
        ttfts = [b[2] for b in self.bucket if b[2] is not None]
        floor = _quantile(mems, 0.25)
        self.season.append((t, floor,
                            statistics.median(ttfts) if len(ttfts) >= max(3, len(self.bucket) // 3) else None))
        if self.run_plateau is not None and floor > self.run_plateau["plateau"]:
            self.run_plateau["plateau"] = float(int(floor))
            self._save_state()
        self.bucket = []
        keep = max(int(float(self.cfg["season_seconds"]) / float(self.cfg["season_bucket_seconds"]))
                   + int(self.cfg["season_min_differences"]),
                   2 * int(float(self.cfg["long_window_seconds"]) / float(self.cfg["season_bucket_seconds"]))) + 2
        while len(self.season) > keep:
            self.season.popleft()

    def seasonal_differences(self) -> Tuple[List[float], List[float]]:
        """Memory-floor differences (bytes) and relative TTFT p95 differences between each of
        the newest hourly buckets and the bucket one season before it."""
        lag = int(round(float(self.cfg["season_seconds"]) / float(self.cfg["season_bucket_seconds"])))
        rows = list(self.season)
        mem_d, ttft_d = [], []
        for i in range(lag, len(rows)):
            old, new = rows[i - lag], rows[i]
            if abs((new[0] - old[0]) - float(self.cfg["season_seconds"])) > float(self.cfg["season_bucket_seconds"]):
                continue   # a gap in the history: not the same hour of the previous season
            mem_d.append(new[1] - old[1])
            if old[2] and new[2] is not None:
                ttft_d.append(new[2] / old[2] - 1.0)
        return mem_d, ttft_d

    def seasonal_evidence(self) -> Optional[Dict[str, object]]:
        """The slow-decay test (the same hours one season apart), or None with too few
        differences: mem_up, ttft_up, the texts the reasons quote, season_h and m."""
        cfg = self.cfg
        m = int(cfg["season_min_differences"])
        mem_d, ttft_d = self.seasonal_differences()
        if len(mem_d) < m:
            return None
        per_season = float(cfg["slope_threshold_bytes_per_hour"]) * float(cfg["season_seconds"]) / HOUR
        recent = mem_d[-m:]
        # Higher than a season ago is not enough: a cache that filled up and levelled off is
        # too, for a whole season. The newest hourly floor must still top the floors of 3 to 12
        # hours before it by the threshold's 3 h worth (a swell's hour-to-hour wiggle is smaller).
        rows = list(self.season)
        bucket_h = float(cfg["season_bucket_seconds"]) / HOUR
        near, far = max(1, int(round(3 / bucket_h))), max(2, int(round(12 / bucket_h)))
        still = (len(rows) > far and rows[-1][1] > max(r[1] for r in rows[-far - 1:-near])
                 + float(cfg["slope_threshold_bytes_per_hour"]) * 3)
        # One step (a cache filling once) stays above the same hours a season ago for a season:
        # the season's floors forming one step and a plateau are no decay.
        lag = int(round(float(cfg["season_seconds"]) / float(cfg["season_bucket_seconds"])))
        stepped = step_like([(r[0], r[1]) for r in rows[-lag - 1:]], float(cfg["step_fit_ratio"]),
                            float(cfg["season_bucket_seconds"]))
        mem_up = (still and not stepped and all(x > 0 for x in recent)
                  and statistics.median(recent) > per_season)
        ttft_up = False
        ttft_text = "TTFT p95 vs a season ago: too few readings"
        if len(ttft_d) >= m:
            recent_t = ttft_d[-m:]
            ttft_up = all(x > 0 for x in recent_t) and statistics.median(recent_t) >= float(cfg["season_ttft_min_rise"])
            ttft_text = "TTFT p95 %+.0f%% vs the same hours a season ago" % (100 * statistics.median(recent_t))
        mem_text = "memory floor %s vs the same hours a season ago (needs > %s)" % (
            _fmt_bytes(statistics.median(recent)), _fmt_bytes(per_season))
        season_h = float(cfg["season_seconds"]) / HOUR
        return {"mem_up": mem_up, "ttft_up": ttft_up, "mem_text": mem_text, "ttft_text": ttft_text,
                "season_h": season_h, "m": m}

    def long_rise(self) -> Optional[Dict[str, object]]:
        """The slow-leak test on the hourly buckets of the last long_window_seconds after the
        warm-up hold (a leak too slow for the trend window, under a daily swell): memory floors
        rising (Mann-Kendall, Sen's lower bound above the threshold and adding at least
        confirm_rise_bytes over the window, not one step) and whether TTFT p95 medians rise with
        them by ttft_min_relative_rise (hourly_ttft_rise). None before there are enough buckets."""
        cfg = self.cfg
        if self.hold or self.long_from is None:
            return None
        bucket = float(cfg["season_bucket_seconds"])
        long_window = float(cfg["long_window_seconds"])
        count = max(4, int(round(long_window / bucket)))
        since_hold = [r for r in self.season if r[0] - bucket >= self.long_from - 1e-6]
        rows = since_hold[-count:]
        if len(rows) < count or rows[-1][0] - rows[0][0] > 1.25 * long_window:
            return None
        t0 = rows[0][0]
        points = [(r[0] - t0, r[1]) for r in rows]
        mt = trend([p[0] for p in points], [p[1] for p in points], float(cfg["confidence"]))
        threshold = float(cfg["slope_threshold_bytes_per_hour"]) / HOUR
        span = points[-1][0]
        mem_up = (mt is not None and mt.p < float(cfg["mk_alpha"]) and mt.s > 0 and mt.lower > threshold
                  and mt.lower * span >= float(cfg["confirm_rise_bytes"])
                  and not step_like(points, float(cfg["step_fit_ratio"]), bucket))
        ttft_up, rise = hourly_ttft_rise(rows, 2 * count // 3, cfg)[:2]
        ttft_span = span
        longer = since_hold[-2 * count:]
        if mem_up and not ttft_up and len(longer) >= count + count // 2:
            # A slow leak lifts TTFT by less than ttft_min_relative_rise in 12 h: judge TTFT over
            # up to twice the window (at least 1.5 x) when the engine has been that long past
            # its hold, so that 30 MiB/h is recycled within 24 h of its start.
            longer_up, longer_rise, longer_span = hourly_ttft_rise(longer, 2 * len(longer) // 3, cfg)
            if longer_up:
                ttft_up, rise, ttft_span = True, longer_rise, longer_span
        text = "hourly memory floors over the last %.0f h: slope %s/h (lower %s/h, MK p=%.2g); TTFT p95 %s%s" % (
            span / HOUR, _fmt_bytes(mt.slope * HOUR) if mt else "-", _fmt_bytes(mt.lower * HOUR) if mt else "-",
            mt.p if mt else 1.0, "%+.0f%%" % (100 * rise) if rise is not None else "too few readings",
            " over the last %.0f h" % (ttft_span / HOUR) if ttft_span != span else "")
        return {"mem_up": mem_up, "ttft_up": ttft_up, "text": text, "slope": mt.slope if mt else 0.0,
                "settled": self.settled}

    def _apply_policy(self, d: Decision, t: float) -> None:
        cfg = self.cfg
        if (self.last_recycle_t is not None
                and t - self.last_recycle_t < float(cfg["cooldown_seconds"])):
            d.action, d.suppressed_by = "alert", "cooldown"
            d.reason = "recycle suppressed (cooldown %.0f s since last recycle): %s" % (
                float(cfg["cooldown_seconds"]), d.reason)
        elif len(self.recycle_times) >= int(cfg["storm_max_recycles"]):
            d.action, d.suppressed_by = "alert", "storm_guard"
            d.reason = "recycle suppressed (storm guard: %d recycles in %.1f h, alerting only): %s" % (
                len(self.recycle_times), float(cfg["storm_window_seconds"]) / HOUR, d.reason)


# ---------------------------------------------------------------------------
# Detectors: one per diagnosis. Each reads what one evaluation found (Evidence) and answers
# (action, reason) when its diagnosis applies, else None. DecisionEngine._evaluate tries them
# in DETECTORS' order and the first answer is the diagnosis (a recycle then goes through the
# cooldown and the storm guard).
# ---------------------------------------------------------------------------
class Evidence:
    """What one evaluation found, as the detectors read it. "Memory rising" (mem_rising) is
    the full test (Mann-Kendall, Sen's lower bound, a new floor high), mem_trend the slope test
    without the new high; confirmed: rising for confirm_seconds; within: the limit is projected
    within the horizon. season() is the slow-decay test, computed the first time a detector
    asks (after the two recycles that need no season: as before, when neither applies)."""

    _UNSET = object()

    def __init__(self, engine: "DecisionEngine", cfg: Dict[str, object], **found: object):
        self.engine = engine
        self.cfg = cfg
        self.mem_trend = bool(found["mem_trend"])
        self.mem_rising = bool(found["mem_rising"])
        self.confirmed = bool(found["confirmed"])
        self.ttft_rising = bool(found["ttft_rising"])
        # TTFT rising already in the window's older two thirds, not only in a burst at its end.
        self.ttft_spread = bool(found["ttft_spread"])
        self.within = bool(found["within"])
        self.horizon = float(found["horizon"])
        self.rising_for_seconds = found["rising_for_seconds"]
        self.confirm_needed = float(found["confirm_needed"])
        self.mem_note = str(found["mem_note"])
        self.ttft_note = str(found["ttft_note"])
        self.tail = str(found["tail"])
        self._season = self._UNSET
        self._long = self._UNSET

    def season(self) -> Optional[Dict[str, object]]:
        if self._season is self._UNSET:
            self._season = self.engine.seasonal_evidence()
        return self._season

    def long(self) -> Optional[Dict[str, object]]:
        if self._long is self._UNSET:
            self._long = self.engine.long_rise()
        return self._long


Found = Optional[Tuple[str, str]]


def detect_leak_with_latency(e: Evidence) -> Found:
    if e.mem_rising and e.confirmed and e.ttft_rising and e.ttft_spread:
        return "recycle", ("memory and TTFT p95 rising together (host bookkeeping growth / "
                           "fragmentation): %s; %s%s" % (e.mem_note, e.ttft_note, e.tail))
    return None


def detect_leak_projected(e: Evidence) -> Found:
    if e.mem_rising and e.confirmed and e.within:
        return "recycle", "memory rising, limit crossed within the %.1f h horizon: %s; %s%s" % (
            e.horizon / HOUR, e.mem_note, e.ttft_note, e.tail)
    return None


def detect_slow_decay(e: Evidence) -> Found:
    season = e.season()
    if season is not None and season["mem_up"] and season["ttft_up"]:
        return "recycle", ("slow decay: memory and TTFT p95 both above the same hours %.0f h ago for the "
                           "last %d hours (a daily swell repeats, this does not): %s; %s; %s%s" % (
                               season["season_h"], season["m"], season["mem_text"], season["ttft_text"],
                               e.mem_note, e.tail))
    return None


def detect_long_leak_with_latency(e: Evidence) -> Found:
    found = e.long()
    if found is not None and found["mem_up"] and found["ttft_up"]:
        return "recycle", ("memory and TTFT p95 rising together over the long window (a leak too slow "
                           "for the trend window): %s; %s%s" % (found["text"], e.mem_note, e.tail))
    return None


def detect_long_memory_rising(e: Evidence) -> Found:
    found = e.long()
    if found is not None and found["mem_up"] and found["settled"]:   # a slow warm-up is no alert
        return "alert", ("memory rising over the long window, TTFT p95 not with it: no recycle "
                         "without a limit in reach: %s; %s%s" % (found["text"], e.mem_note, e.tail))
    return None


def detect_leak_unconfirmed(e: Evidence) -> Found:
    if e.mem_rising and not e.confirmed and (e.ttft_rising or e.within):
        return "alert", "memory rising for %.0f of %.0f s needed before a recycle: %s; %s%s" % (
            e.rising_for_seconds, e.confirm_needed, e.mem_note, e.ttft_note, e.tail)
    return None


def detect_memory_rising(e: Evidence) -> Found:
    """A confirmed rise alerts; one not yet confirmed is diagnosed but does not page (a burst
    or a swell passes the window tests for a while; a leak keeps passing them)."""
    if e.mem_rising and e.confirmed:
        return "alert", "memory rising without latency impact, limit not within %.1f h: %s; %s%s" % (
            e.horizon / HOUR, e.mem_note, e.ttft_note, e.tail)
    if e.mem_rising:
        return "none", "memory rising for %.0f of %.0f s needed to confirm it (no alert yet): %s; %s%s" % (
            e.rising_for_seconds, e.confirm_needed, e.mem_note, e.ttft_note, e.tail)
    return None


def detect_latency_with_memory_bump(e: Evidence) -> Found:
    if e.ttft_rising and e.mem_trend:
        return "alert", ("TTFT p95 and memory up, but the memory floor is not ramping (a burst or "
                         "a plateau, not a leak): no recycle: %s; %s%s" % (e.ttft_note, e.mem_note, e.tail))
    return None


def detect_latency_only(e: Evidence) -> Found:
    if e.ttft_rising:
        return "alert", ("TTFT p95 rising with flat memory: placement or preemption, "
                         "a recycle would not help: %s; %s%s" % (e.ttft_note, e.mem_note, e.tail))
    return None


def detect_memory_rising_over_season(e: Evidence) -> Found:
    season = e.season()
    if season is not None and season["mem_up"]:
        return "alert", ("memory above the same hours %.0f h ago for the last %d hours, TTFT p95 not: "
                         "no recycle without a limit in reach: %s; %s; %s%s" % (
                             season["season_h"], season["m"], season["mem_text"], season["ttft_text"],
                             e.mem_note, e.tail))
    return None


def detect_latency_over_season(e: Evidence) -> Found:
    season = e.season()
    if season is not None and season["ttft_up"]:
        return "alert", ("TTFT p95 above the same hours %.0f h ago for the last %d hours with flat memory: "
                         "placement or preemption, a recycle would not help: %s; %s%s" % (
                             season["season_h"], season["m"], season["ttft_text"], season["mem_text"], e.tail))
    return None


def detect_steady(e: Evidence) -> Found:
    return "none", "no sustained trend: %s; %s%s" % (e.mem_note, e.ttft_note, e.tail)


# The detectors in priority order: the first that answers gives the diagnosis. The order is the
# rule: a confirmed leak recycles (with latency first: its reason says more); the slow decay
# (memory and TTFT both above the same hours a season ago) recycles too, and so outranks every
# alert; a rise not yet confirmed only alerts; then memory alone, latency with a memory bump
# that is no ramp, latency alone; then the season's memory or latency alone; else steady, which
# always answers. A name may come twice (the same diagnosis from the window or from the season).
DETECTORS = (
    ("leak_with_latency", detect_leak_with_latency),
    ("leak_projected", detect_leak_projected),
    ("slow_decay", detect_slow_decay),
    ("leak_with_latency", detect_long_leak_with_latency),
    ("leak_unconfirmed", detect_leak_unconfirmed),
    ("memory_rising", detect_long_memory_rising),
    ("memory_rising", detect_memory_rising),
    ("latency_with_memory_bump", detect_latency_with_memory_bump),
    ("latency_only", detect_latency_only),
    ("memory_rising", detect_memory_rising_over_season),
    ("latency_only", detect_latency_over_season),
    ("steady", detect_steady),
)
# Every diagnosis the engine gives (the alerting rules match on these names), in priority order.
DIAGNOSES = tuple(dict.fromkeys(name for name, _detect in DETECTORS))
