# -*- coding: utf-8 -*-
# Copyright (c) 2026, kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Prometheus exposition parsing, TTFT p95 windowing, counter resets, metric name table."""
from __future__ import annotations

import math

import pytest

# vLLM's TTFT bucket bounds (vllm/v1/metrics/loggers.py, PrometheusStatLogger), shortened.
BOUNDS = [0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0]


def exposition(counts_per_engine, name="vllm:time_to_first_token_seconds", preemptions=None,
               kv=None, waiting=None):
    """Render cumulative bucket counts for one or more `engine` label sets."""
    lines = ["# HELP %s Histogram of time to first token in seconds." % name,
             "# TYPE %s histogram" % name]
    for engine, counts in counts_per_engine.items():
        for le, c in zip(BOUNDS + [math.inf], counts):
            le_text = "+Inf" if le == math.inf else repr(le)
            lines.append('%s_bucket{engine="%s",le="%s",model_name="m, \\"x\\""} %s' % (
                name, engine, le_text, float(c)))
        lines.append('%s_count{engine="%s",model_name="m"} %s' % (name, engine, float(counts[-1])))
        lines.append('%s_sum{engine="%s",model_name="m"} 12.5' % (name, engine))
    if preemptions is not None:
        lines.append("# TYPE vllm:num_preemptions_total counter")
        lines.append('vllm:num_preemptions_total{engine="0",model_name="m"} %s' % preemptions)
    if kv is not None:
        lines.append('vllm:kv_cache_usage_perc{engine="0",model_name="m"} %s' % kv)
    if waiting is not None:
        lines.append('vllm:num_requests_waiting{engine="0",model_name="m"} %s' % waiting)
    return "\n".join(lines) + "\n"


def test_parse_exposition_labels_and_values(wd):
    text = exposition({"0": [1, 2, 3, 4, 5, 6, 7, 8]}, preemptions=3)
    samples = wd.parse_exposition(text)
    buckets = samples["vllm:time_to_first_token_seconds_bucket"]
    assert len(buckets) == 8
    labels, value = buckets[-1]
    assert labels["le"] == "+Inf" and value == 8.0
    assert labels["model_name"] == 'm, "x"'      # escaped quote and comma inside a label
    assert samples["vllm:num_preemptions_total"][0][1] == 3.0


def test_bucket_quantile_matches_promql(wd):
    # 100 observations: 50 in (0, 0.1], 40 in (0.1, 0.25], 10 in (0.25, 0.5].
    buckets = {0.1: 50, 0.25: 90, 0.5: 100, math.inf: 100}
    assert wd.bucket_quantile(0.5, buckets) == pytest.approx(0.1)
    assert wd.bucket_quantile(0.95, buckets) == pytest.approx(0.25 + 0.25 * 0.5)
    # Rank inside +Inf: PromQL returns the 2nd highest upper bound.
    assert wd.bucket_quantile(0.95, {0.1: 10, 0.25: 20, math.inf: 100}) == pytest.approx(0.25)
    assert wd.bucket_quantile(0.95, {0.1: 0, math.inf: 0}) is None
    assert wd.bucket_quantile(0.95, {0.1: 5, 0.25: 8}) is None   # no +Inf bucket


def test_window_uses_deltas_and_sums_engines(wd):
    win = wd.HistogramWindow(0.95, min_observations=20)
    first = {"0": [100, 200, 300, 300, 300, 300, 300, 300], "1": [0, 0, 0, 0, 0, 0, 0, 0]}
    assert win.update(0, wd.histogram_buckets(wd.parse_exposition(exposition(first)),
                                              "vllm:time_to_first_token_seconds")) is None
    # Next window: 40 new observations, all slow (1.0 < x <= 2.5), split over two engines.
    second = {"0": [100, 200, 300, 300, 300, 320, 320, 320], "1": [0, 0, 0, 0, 0, 20, 20, 20]}
    p95 = win.update(60, wd.histogram_buckets(wd.parse_exposition(exposition(second)),
                                              "vllm:time_to_first_token_seconds"))
    # Cumulative since start would say ~0.5 s; the window says the recent requests were slow.
    assert p95 == pytest.approx(1.0 + 1.5 * 0.95)


def test_counter_reset_counts_the_new_values_as_the_increase(wd):
    """As Prometheus' rate(): a count that falls was reset, its new value is the increase since."""
    win = wd.HistogramWindow(0.95, min_observations=5)
    win.update(0, {0.5: 50.0, math.inf: 60.0})
    assert win.update(60, {0.5: 3.0, math.inf: 4.0}) is None     # engine restarted: 4 observations
    assert "reset" in win.last_status and "accumulating (4 observations)" in win.last_status
    # 10 more after it: 14 in all, 13 of them <= 0.5 s (none lost, none counted twice).
    assert win.update(120, {0.5: 13.0, math.inf: 14.0}) == pytest.approx(
        wd.bucket_quantile(0.95, {0.5: 13.0, math.inf: 14.0}))
    assert win.last_status.startswith("ok (14 observations)")


def test_minimum_observations_accumulate_then_expire(wd):
    win = wd.HistogramWindow(0.95, min_observations=20, max_window_seconds=300)
    win.update(0, {1.0: 0.0, math.inf: 0.0})
    assert win.update(60, {1.0: 10.0, math.inf: 10.0}) is None            # 10 < 20: keep waiting
    assert "accumulating" in win.last_status
    assert win.update(120, {1.0: 25.0, math.inf: 25.0}) == pytest.approx(0.95)  # 25 since t=0
    win.update(180, {1.0: 26.0, math.inf: 26.0})
    assert win.update(600, {1.0: 27.0, math.inf: 27.0}) is None           # too few, window expired
    assert "too few" in win.last_status


def test_latency_sensor_reads_old_and_new_names(wd):
    cfg = dict(wd.DEFAULTS, ttft_min_observations=1)
    sensor = wd.LatencySensor(cfg)
    old = exposition({"0": [0, 0, 0, 0, 0, 0, 0, 0]}, name="gpustack:time_to_first_token_seconds",
                     preemptions=7, kv=0.5, waiting=3)
    first = sensor.from_text(0, old)
    assert first["preemptions"] == 7.0
    assert first["corroboration"] == {"kv_cache_usage": 0.5, "requests_waiting": 3.0}
    assert "gpustack:time_to_first_token_seconds" in first["status"]
    second = sensor.from_text(60, exposition({"0": [0, 0, 0, 0, 4, 4, 4, 4]},
                                             name="gpustack:time_to_first_token_seconds"))
    assert second["ttft_p95"] == pytest.approx(0.75 + 0.25 * 0.95)
    none = sensor.from_text(120, "llamacpp:requests_deferred 2\n")
    assert none["ttft_p95"] is None and none["corroboration"] == {"requests_waiting": 2.0}


def test_latency_lines_only_parse_keeps_every_sample_the_sensor_reads(wd, monkeypatch):
    """from_text parses only LATENCY_SAMPLE_NAMES: every one of those samples is kept exactly as
    the full parse has it (a longer name sharing the prefix, indented lines and comments
    included), nothing else is, and the sensor's result equals that of the full parse."""
    text = exposition({"0": [1, 2, 3, 4, 5, 6, 7, 8], "1": [0, 1, 1, 2, 2, 3, 3, 4]}, preemptions=3,
                      kv=0.42, waiting=2)
    text += ('  gpustack:time_to_first_token_seconds_bucket{le="+Inf"} 9\n'
             'vllm:num_preemptions_total_created{engine="0"} 1.7e9\n'
             'vllm:kv_cache_usage_perc_max 0.9\n'
             '# vllm:num_requests_waiting 99\n'
             'vllm:e2e_request_latency_seconds_bucket{le="+Inf"} 5\n'
             'python_gc_objects_collected_total{generation="0"} 10\n')
    full = wd.parse_exposition(text)
    only = wd.parse_exposition(text, wd.LATENCY_SAMPLE_NAMES)
    assert only == {name: samples for name, samples in full.items() if name in wd.LATENCY_SAMPLE_NAMES}
    assert set(only) == {"vllm:time_to_first_token_seconds_bucket", "gpustack:time_to_first_token_seconds_bucket",
                         "vllm:num_preemptions_total", "vllm:kv_cache_usage_perc", "vllm:num_requests_waiting"}
    assert len(only["vllm:time_to_first_token_seconds_bucket"]) == 16
    # Every name the sensor looks up is in the set (one place: METRIC_NAMES).
    for role in ("preemptions", "kv_cache_usage", "requests_waiting"):
        assert set(wd.METRIC_NAMES[role]) <= wd.LATENCY_SAMPLE_NAMES
    assert {b + "_bucket" for b in wd.METRIC_NAMES["ttft_histogram"]} <= wd.LATENCY_SAMPLE_NAMES
    cfg = dict(wd.DEFAULTS, ttft_min_observations=1)
    sensor = wd.LatencySensor(cfg)
    sensor.from_text(0.0, text)
    got = sensor.from_text(60.0, text.replace("} 8.0\n", "} 30.0\n"))

    reference = wd.LatencySensor(cfg)
    original = wd.exposition.parse_page
    # parse everything (LatencySensor, in the package's sensors module, looks the parser up there)
    monkeypatch.setattr(wd.sensors, "parse_page", lambda body, names=None: original(body))
    reference.from_text(0.0, text)
    expected = reference.from_text(60.0, text.replace("} 8.0\n", "} 30.0\n"))
    assert got == expected and got["ttft_p95"] is not None
    assert (got["preemptions"], got["corroboration"]) == (3.0, {"kv_cache_usage": 0.42, "requests_waiting": 2.0})
