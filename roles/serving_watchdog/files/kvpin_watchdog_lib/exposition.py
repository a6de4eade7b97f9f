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

_SAMPLE_RE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\S+)?\s*$')
_LABEL_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?\s*')


def _parse_value(text: str) -> float:
    low = text.lower()
    if low in ("+inf", "inf"):
        return math.inf
    if low == "-inf":
        return -math.inf
    if low == "nan":
        return math.nan
    return float(text)


def parse_exposition(text: str, names: Optional[Iterable[str]] = None) -> Dict[str, List[Tuple[Dict[str, str], float]]]:
    """Prometheus text format 0.0.4 -> {sample name: [(labels, value), ...]}.

    names: keep only these sample names; every other line is skipped by a prefix test before
    the regex and label parsing (a vLLM page is ~200 lines, the latency signal needs ~25)."""
    out: Dict[str, List[Tuple[Dict[str, str], float]]] = {}
    wanted = frozenset(names) if names is not None else None
    prefixes = tuple(sorted(wanted)) if wanted is not None else None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if prefixes is not None and not line.startswith(prefixes):
            continue
        match = _SAMPLE_RE.match(line)
        if not match:
            continue
        name, _unused, label_text, value_text = match.group(1), match.group(2), match.group(3), match.group(4)
        if wanted is not None and name not in wanted:
            continue
        labels: Dict[str, str] = {}
        if label_text:
            for lm in _LABEL_RE.finditer(label_text):
                labels[lm.group(1)] = (lm.group(2).replace('\\"', '"')
                                       .replace("\\n", "\n").replace("\\\\", "\\"))
        try:
            value = _parse_value(value_text)
        except ValueError:
            continue
        out.setdefault(name, []).append((labels, value))
    return out


def first_family(samples: Dict[str, list], role: str, suffix: str = "") -> Optional[str]:
    for base in METRIC_NAMES[role]:
        if base + suffix in samples:
            return base
    return None


def histogram_buckets(samples: Dict[str, list], base: str) -> Dict[float, float]:
    """Cumulative counts per `le`, summed over all other label sets (sum by (le))."""
    buckets: Dict[float, float] = {}
    for labels, value in samples.get(base + "_bucket", []):
        if "le" not in labels:
            continue
        le = _parse_value(labels["le"])
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


class HistogramWindow:
    """p95 over the interval since a baseline scrape, from per-`le` deltas.

    A counter reset (any bucket falling) drops the interval and re-baselines.
    Too few observations: keep the baseline and wait, up to max_window seconds.
    """

    def __init__(self, quantile: float = 0.95, min_observations: int = 20,
                 max_window_seconds: float = 900.0):
        self.quantile = quantile
        self.min_observations = min_observations
        self.max_window_seconds = max_window_seconds
        self.base: Optional[Dict[float, float]] = None
        self.base_t: Optional[float] = None
        self.last_status = "no data"

    def update(self, t: float, buckets: Dict[float, float]) -> Optional[float]:
        if not buckets:
            self.last_status = "no histogram"
            return None
        if self.base is None:
            self.base, self.base_t = dict(buckets), t
            self.last_status = "baseline"
            return None
        delta = {}
        for le, count in buckets.items():
            prev = self.base.get(le)
            if prev is None:
                continue
            delta[le] = count - prev
        if any(d < 0 for d in delta.values()) or set(self.base) - set(buckets):
            self.base, self.base_t = dict(buckets), t
            self.last_status = "counter reset: interval dropped"
            return None
        observations = delta.get(math.inf, 0.0)
        if observations < self.min_observations:
            if self.base_t is not None and t - self.base_t > self.max_window_seconds:
                self.base, self.base_t = dict(buckets), t
                self.last_status = "too few observations (%d) in window" % observations
            else:
                self.last_status = "accumulating (%d observations)" % observations
            return None
        value = bucket_quantile(self.quantile, delta)
        self.base, self.base_t = dict(buckets), t
        self.last_status = "ok (%d observations)" % observations
        return value
