# -*- coding: utf-8 -*-
# Copyright (c) 2026, kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Prometheus text exposition: parse, histogram windowing, quantile."""

from __future__ import annotations

import math
import re
from typing import Dict, Iterable, List, Optional, Tuple


# ---------------------------------------------------------------------------
# Prometheus text exposition: parse, histogram windowing, quantile.
# ---------------------------------------------------------------------------
# Metric families by role; the first name present wins. Old names keep old engines working.
METRIC_NAMES = {
    "ttft_histogram": (
        "vllm:time_to_first_token_seconds",
        "gpustack:time_to_first_token_seconds",
        "sglang:time_to_first_token_seconds",
    ),
    "preemptions": ("vllm:num_preemptions_total", "vllm:num_preemptions", "gpustack:request_preemptions"),
    "kv_cache_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc",
                       "gpustack:kv_cache_usage_ratio", "llamabox:kv_cache_usage_ratio"),
    "requests_waiting": ("vllm:num_requests_waiting", "gpustack:num_requests_waiting",
                         "llamacpp:requests_deferred"),
    # In-flight requests (drain waits for 0): vLLM's gauge; llama.cpp server --metrics
    # exports llamacpp:requests_processing (tools/server/server.cpp).
    "requests_running": ("vllm:num_requests_running", "llamacpp:requests_processing"),
}
# Every sample name LatencySensor.from_text looks up (the only lines it parses): the TTFT
# histograms' _bucket series and the preemption, KV-cache and waiting-request families.
LATENCY_SAMPLE_NAMES = frozenset(
    [base + "_bucket" for base in METRIC_NAMES["ttft_histogram"]]
    + [name for role in ("preemptions", "kv_cache_usage", "requests_waiting") for name in METRIC_NAMES[role]])

# Bounds on one scraped page. The daemon runs under its unit's MemoryMax=128M; the program
# itself takes ~25 MiB and the body (at most max_body_bytes, 8 MiB by default) is held once, as
# bytes: lines are found in it with a regex (C speed, one line object at a time), never split
# into a list. What the parser keeps is bounded by the MAX_KEPT_* figures (~10 MiB at most).
MAX_PAGE_LINES = 200000          # more lines: the page is refused whole (a vLLM page is ~200-3000)
MAX_LINE_BYTES = 4096            # a longer line of a wanted family is malformed
MAX_FAMILY_SAMPLES = 4096        # samples of one name; more: its family is dropped (too_many_series)
MAX_KEPT_SAMPLES = 8192          # samples kept from one page, every family together
MAX_KEPT_BYTES = 2 * 1024 * 1024  # bytes of the sample lines kept from one page

# Why a family is dropped (a fixed set: the label values of the dropped-families counter).
DROP_REASONS = ("malformed", "non_finite", "negative", "bad_le", "duplicate_series", "no_inf_bucket",
                "decreasing_buckets", "too_many_series")
PAGE_REFUSALS = ("too_many_lines",)

_NAME = rb"[a-zA-Z_:][a-zA-Z0-9_:]*"
_QUOTED = rb'"([^"\\\n]*(?:\\.[^"\\\n]*)*)"'        # a label value: escapes, no raw newline
_PAIR = rb'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*' + _QUOTED + rb'[ \t]*'
_PAIR_RE = re.compile(_PAIR)
_PAIR_NC = rb'[ \t]*[a-zA-Z_][a-zA-Z0-9_]*[ \t]*=[ \t]*"[^"\\\n]*(?:\\.[^"\\\n]*)*"[ \t]*'
# What follows a sample's name: {labels} (quoted values may hold , } and escapes), the value,
# an optional integer timestamp.
_REST_RE = re.compile(rb'(?:\{((?:' + _PAIR_NC + rb',)*(?:' + _PAIR_NC + rb')?[ \t]*)\})?'
                      rb'[ \t]+([^ \t\r\n]+)(?:[ \t]+-?[0-9]+)?[ \t\r]*')
_ANY_LINE_RE = re.compile(rb"^[ \t]*(" + _NAME + rb")([^\n]*)", re.M)
_FINDERS: Dict[frozenset, "re.Pattern[bytes]"] = {}
_UNESCAPE_RE = re.compile(r'\\(.)')
_UNESCAPES = {"n": "\n", "\\": "\\", '"': '"'}
_COUNTER_NAMES = frozenset(METRIC_NAMES["preemptions"])


def _parse_value(text: str) -> float:
    low = text.lower()
    if low in ("+inf", "inf"):
        return math.inf
    if low == "-inf":
        return -math.inf
    if low == "nan":
        return math.nan
    if "_" in text:
        raise ValueError("not a number: %r" % text[:40])
    return float(text)


def _unescape(match: "re.Match[str]") -> str:
    """One escape of a label value: \\n, \\\\ and \\" (others are kept as written)."""
    return _UNESCAPES.get(match.group(1), match.group(0))


def _finder(names: Optional[Iterable[str]]) -> "re.Pattern[bytes]":
    """The regex that finds the lines of these sample names (each line once, at C speed)."""
    if names is None:
        return _ANY_LINE_RE
    key = frozenset(names)
    found = _FINDERS.get(key)
    if found is None:
        alternatives = b"|".join(re.escape(n.encode("ascii")) for n in sorted(key, key=len, reverse=True))
        found = re.compile(rb"^[ \t]*(" + alternatives + rb")(?![a-zA-Z0-9_:])([^\n]*)", re.M)
        if len(_FINDERS) < 16:
            _FINDERS[key] = found
    return found


def family_of(name: str) -> str:
    """The family a sample name belongs to (a histogram's _bucket/_count/_sum share one)."""
    for suffix in ("_bucket", "_count", "_sum"):
        if name.endswith(suffix):
            return name[:-len(suffix)]
    return name


def _shown(raw: bytes) -> str:
    """A bit of a hostile line, fit for a log line: at most 80 characters, printable."""
    text = raw[:80].decode("utf-8", "replace")
    return "".join(ch if ch.isprintable() else "?" for ch in text)


class Page:
    """One parsed /metrics page: samples of the families judged sound ({sample name: [(labels,
    value), ...]}), the families dropped ([(family, reason, detail)], reason one of
    DROP_REASONS) and, when the page was refused whole, why (one of PAGE_REFUSALS) with a detail."""

    __slots__ = ("samples", "dropped", "refused", "detail", "lines")

    def __init__(self) -> None:
        self.samples: Dict[str, List[Tuple[Dict[str, str], float]]] = {}
        self.dropped: List[Tuple[str, str, str]] = []
        self.refused: Optional[str] = None
        self.detail = ""
        self.lines = 0


def _judge_histogram(samples: List[Tuple[Dict[str, str], float]]) -> Optional[Tuple[str, str]]:
    """(reason, detail) when a _bucket sample list is no histogram, else None: every bucket has
    a numeric `le`, each series (labels but le) has a +Inf bucket, no `le` twice, and counts
    that never fall as `le` grows (they are cumulative)."""
    series: Dict[Tuple[Tuple[str, str], ...], Dict[float, float]] = {}
    for labels, value in samples:
        if "le" not in labels:
            return "bad_le", "a bucket without an le label"
        try:
            le = _parse_value(labels["le"])
        except ValueError:
            return "bad_le", "le=%r is not a number" % labels["le"][:40]
        if math.isnan(le):
            return "bad_le", "le=NaN"
        key = tuple(sorted((k, v) for k, v in labels.items() if k != "le"))
        buckets = series.setdefault(key, {})
        if le in buckets:
            return "duplicate_series", "le=%s twice in one series" % labels["le"][:40]
        buckets[le] = value
    for buckets in series.values():
        if math.inf not in buckets:
            return "no_inf_bucket", "a series without its le=+Inf bucket"
        below, below_le = -1.0, None
        for le in sorted(buckets):
            if buckets[le] < below:
                return "decreasing_buckets", "le=%r holds %r, less than le=%r's %r (buckets are cumulative)" % (
                    le, buckets[le], below_le, below)
            below, below_le = buckets[le], le
    return None


def parse_page(body, names: Optional[Iterable[str]] = None) -> Page:
    """Prometheus text format 0.0.4 -> Page, each family parsed and judged on its own: a family
    with a malformed line, a non-finite value, a negative counter or bucket, a duplicate series,
    or (histograms) a bad `le`, a missing +Inf bucket or falling cumulative counts is dropped
    (listed in Page.dropped, its samples left out), the others kept. A page of more than
    MAX_PAGE_LINES lines is refused whole.

    body: bytes (what the scrape read) or str. names: keep only these sample names; the lines
    of every other name are never looked at (a vLLM page is ~200 lines, the latency signal needs
    ~25)."""
    page = Page()
    data = body.encode("utf-8", "replace") if isinstance(body, str) else body
    page.lines = data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)
    if page.lines > MAX_PAGE_LINES:
        page.refused = "too_many_lines"
        page.detail = "%d lines, more than the %d a page may hold" % (page.lines, MAX_PAGE_LINES)
        return page
    kept: Dict[str, List[Tuple[Dict[str, str], float]]] = {}
    bad: Dict[str, Tuple[str, str]] = {}
    seen: Dict[str, set] = {}
    kept_samples = kept_bytes = 0
    for match in _finder(names).finditer(data):
        name = match.group(1).decode("ascii")
        family = family_of(name)
        if family in bad:
            continue
        rest = match.group(2)
        if len(rest) + len(name) > MAX_LINE_BYTES:
            bad[family] = ("malformed", "%s: a line of %d bytes (at most %d)" % (
                name, len(rest) + len(name), MAX_LINE_BYTES))
            continue
        parsed = _REST_RE.fullmatch(rest)
        value_text = parsed.group(2).decode("ascii", "replace") if parsed else ""
        try:
            if not parsed:
                raise ValueError("not a sample line")
            value = _parse_value(value_text)
        except ValueError:
            bad[family] = ("malformed", "%s%s" % (name, _shown(rest)))
            continue
        labels: Dict[str, str] = {}
        duplicate_label = None
        if parsed.group(1):
            for pair in _PAIR_RE.finditer(parsed.group(1)):
                key = pair.group(1).decode("ascii")
                if key in labels:
                    duplicate_label = key
                text = pair.group(2).decode("utf-8", "replace")
                labels[key] = _UNESCAPE_RE.sub(_unescape, text) if "\\" in text else text
        if duplicate_label is not None:
            bad[family] = ("malformed", "%s: label %s given twice" % (name, duplicate_label))
            continue
        if math.isnan(value) or math.isinf(value):
            bad[family] = ("non_finite", "%s = %s" % (name, value_text[:40]))
            continue
        if value < 0 and (name.endswith(("_bucket", "_count", "_total")) or name in _COUNTER_NAMES):
            bad[family] = ("negative", "%s = %s: a counter" % (name, value_text[:40]))
            continue
        series_key = tuple(sorted(labels.items()))
        names_seen = seen.setdefault(name, set())
        if series_key in names_seen:
            bad[family] = ("duplicate_series", "%s: the same labels twice" % name)
            continue
        samples = kept.setdefault(name, [])
        if (len(samples) >= MAX_FAMILY_SAMPLES or kept_samples >= MAX_KEPT_SAMPLES
                or kept_bytes + len(rest) > MAX_KEPT_BYTES):
            reason = "%s: more than %d samples (at most %d of a name, %d and %d bytes of a page)" % (
                name, len(samples), MAX_FAMILY_SAMPLES, MAX_KEPT_SAMPLES, MAX_KEPT_BYTES)
            bad[family] = ("too_many_series", reason)
            continue
        names_seen.add(series_key)
        samples.append((labels, value))
        kept_samples += 1
        kept_bytes += len(rest)
    for name, samples in kept.items():
        family = family_of(name)
        if family not in bad and name.endswith("_bucket"):
            problem = _judge_histogram(samples)
            if problem is not None:
                bad[family] = (problem[0], "%s: %s" % (name, problem[1]))
    page.samples = {name: samples for name, samples in kept.items() if family_of(name) not in bad}
    page.dropped = sorted((family, reason, detail) for family, (reason, detail) in bad.items())
    return page


def parse_exposition(text, names: Optional[Iterable[str]] = None) -> Dict[str, List[Tuple[Dict[str, str], float]]]:
    """Prometheus text format 0.0.4 -> {sample name: [(labels, value), ...]}, the sound families
    only (parse_page has the dropped ones and the page's refusal)."""
    return parse_page(text, names).samples


def first_family(samples: Dict[str, list], role: str, suffix: str = "") -> Optional[str]:
    for base in METRIC_NAMES[role]:
        if base + suffix in samples:
            return base
    return None


def histogram_series(samples: Dict[str, list], base: str) -> Dict[Tuple[Tuple[str, str], ...], Dict[float, float]]:
    """Cumulative counts per `le` of each series (its labels but `le`) of a histogram."""
    series: Dict[Tuple[Tuple[str, str], ...], Dict[float, float]] = {}
    for labels, value in samples.get(base + "_bucket", []):
        if "le" not in labels:
            continue
        key = tuple(sorted((k, v) for k, v in labels.items() if k != "le"))
        series.setdefault(key, {})[_parse_value(labels["le"])] = value
    return series


def histogram_buckets(samples: Dict[str, list], base: str) -> Dict[float, float]:
    """Cumulative counts per `le`, summed over all other label sets (sum by (le))."""
    buckets: Dict[float, float] = {}
    for one in histogram_series(samples, base).values():
        for le, value in one.items():
            buckets[le] = buckets.get(le, 0.0) + value
    return buckets


def sum_family(samples: Dict[str, list], name: str) -> Optional[float]:
    values = [v for _unused, v in samples.get(name, []) if not math.isnan(v)]
    return sum(values) if values else None


def bucket_quantile(q: float, buckets: Dict[float, float]) -> Optional[float]:
    """PromQL histogram_quantile for classic buckets (promql/quantile.go bucketQuantile)."""
    if not buckets or math.inf not in buckets or len(buckets) < 2:
        return None
    bounds = sorted(buckets)
    counts = [buckets[b] for b in bounds]
    for i in range(1, len(counts)):  # ensureMonotonic
        if counts[i] < counts[i - 1]:
            counts[i] = counts[i - 1]
    total = counts[-1]
    if total <= 0 or math.isnan(total):
        return None
    rank = q * total
    idx = next(i for i, c in enumerate(counts) if c >= rank)
    if idx == len(bounds) - 1:
        return bounds[-2]  # rank in +Inf bucket: upper bound of the 2nd highest
    if idx == 0 and bounds[0] <= 0:
        return bounds[0]
    bucket_start = 0.0 if idx == 0 else bounds[idx - 1]
    count_before = 0.0 if idx == 0 else counts[idx - 1]
    in_bucket = counts[idx] - count_before
    if in_bucket <= 0:
        return bounds[idx]
    return bucket_start + (bounds[idx] - bucket_start) * (rank - count_before) / in_bucket


SeriesKey = Tuple[object, ...]


class HistogramWindow:
    """p95 over the interval since the window started, from per-`le` increases between scrapes.

    Increases are taken per series (a histogram's label set but `le`) and summed, as PromQL's
    sum by (le) (rate(...)) does: a series whose count falls, or whose buckets change, was
    reset, and its new counts are its increase since the restart (Prometheus' rate()); a series
    first seen only sets its baseline. A restart the watchdog confirmed itself (note_restart:
    a new engine process, pid or GPUStack restart_count) makes every series' new counts the
    increase, even those that did not fall; a confirmation that arrives one scrape after the
    counts already fell is that same restart, not a second one. So a restart mid-window loses
    none of the counts seen and doubles none. Too few observations: keep accumulating, up to
    max_window seconds.
    """

    def __init__(self, quantile: float = 0.95, min_observations: int = 20,
                 max_window_seconds: float = 900.0):
        self.quantile = quantile
        self.min_observations = min_observations
        self.max_window_seconds = max_window_seconds
        self.prev: Optional[Dict[SeriesKey, Dict[float, float]]] = None   # last counts per series
        self.acc: Dict[float, float] = {}      # increases per le since the window started
        self.base_t: Optional[float] = None    # when the window started
        self.restart_pending = False
        self.last_reset_unconfirmed = False     # the last update saw counts fall, unconfirmed
        self.last_status = "no data"

    def note_restart(self) -> None:
        """The watched engine restarted: its counters start again from 0."""
        self.restart_pending = True

    @staticmethod
    def _as_series(buckets) -> Dict[SeriesKey, Dict[float, float]]:
        """{le: count} (one series) or {series key: {le: count}} -> the latter."""
        if buckets and not isinstance(next(iter(buckets.values())), dict):
            return {(): dict(buckets)}
        return {key: dict(value) for key, value in buckets.items()}

    def update(self, t: float, buckets) -> Optional[float]:
        """buckets: {le: count} (one series) or {series key: {le: count}}, cumulative counts."""
        if not buckets:
            self.last_status = "no histogram"
            return None
        series = self._as_series(buckets)
        if self.prev is None:
            self.prev, self.base_t, self.acc = series, t, {}
            self.restart_pending = self.last_reset_unconfirmed = False
            self.last_status = "baseline"
            return None
        forced = self.restart_pending and not self.last_reset_unconfirmed
        self.restart_pending = False
        fell = []
        for key, counts in series.items():
            before = self.prev.get(key)
            if forced:
                increase = counts
            elif before is None:
                continue                      # a new series: its baseline
            elif set(before) != set(counts) or any(counts[le] < before[le] for le in counts):
                fell.append(key)
                increase = counts
            else:
                increase = {le: counts[le] - before[le] for le in counts}
            for le, value in increase.items():
                self.acc[le] = self.acc.get(le, 0.0) + value
        self.last_reset_unconfirmed = bool(fell)
        if forced or len(self.prev) > 4 * len(series) + 64:
            self.prev = series                # series gone with the old process are forgotten
        else:
            self.prev.update(series)          # a series missing from one scrape keeps its counts
        reset = " (engine restarted: its counts since the restart taken as the increase)" if forced else (
            " (counter reset in %d series: counted since the restart)" % len(fell) if fell else "")
        observations = self.acc.get(math.inf, 0.0)
        if observations < self.min_observations:
            if self.base_t is not None and t - self.base_t > self.max_window_seconds:
                self.acc, self.base_t = {}, t
                self.last_status = "too few observations (%.0f) in window%s" % (observations, reset)
            else:
                self.last_status = "accumulating (%.0f observations)%s" % (observations, reset)
            return None
        value = bucket_quantile(self.quantile, self.acc)
        self.acc, self.base_t = {}, t
        self.last_status = "ok (%.0f observations)%s" % (observations, reset)
        return value
