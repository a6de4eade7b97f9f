# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Hostile Prometheus /metrics pages for the serving watchdog (issue 39): families that made a
tick raise before the memory sample reached the decision engine, and pages that stay under the
8 MiB body cap yet blow up a parser's memory. Shared by tests/adversarial/ and
benchmarks/bench_hostile_inputs.py (which puts tests/adversarial/ on sys.path)."""
from __future__ import annotations

TTFT = "vllm:time_to_first_token_seconds"
BOUNDS = ("0.1", "0.5", "1.0", "2.5", "+Inf")
BODY_CAP = 8 * 1024 * 1024   # the program's max_body_bytes default


def ttft_lines(counts, labels='model_name="m"', name=TTFT):
    """One TTFT histogram series: cumulative counts per BOUNDS (strings or numbers)."""
    sep = "," if labels else ""
    return ["%s_bucket{%s%sle=\"%s\"} %s" % (name, labels, sep, le, count) for le, count in zip(BOUNDS, counts)]


def good_page(total, extra=()):
    """A sane vLLM page: a TTFT histogram with `total` observations, preemptions, KV usage."""
    counts = [int(total * f) for f in (0.5, 0.8, 0.9, 0.95)] + [total]
    lines = ["# HELP %s_bucket TTFT" % TTFT, "# TYPE %s histogram" % TTFT]
    lines += ttft_lines(counts)
    lines += ["vllm:num_preemptions_total{model_name=\"m\"} 3", "vllm:kv_cache_usage_perc{model_name=\"m\"} 0.5"]
    lines += list(extra)
    return ("\n".join(lines) + "\n").encode()


def _ttft_with(last_count=None, le_label=None, counts=None, garbage=None, without_inf=False):
    """A TTFT histogram made bad one way, next to a sound KV-cache gauge."""
    counts = list(counts or [10, 20, 30, 40, 50])
    if last_count is not None:
        counts[-1] = last_count
    lines = ttft_lines(counts)
    if le_label is not None:
        lines[1] = '%s_bucket{model_name="m",le="%s"} 20' % (TTFT, le_label)
    if without_inf:
        lines = lines[:-1]
    if garbage is not None:
        lines.append(garbage)
    return ("\n".join(lines + ['vllm:kv_cache_usage_perc{model_name="m"} 0.5']) + "\n").encode()


# A bad TTFT family each (the rest of the page is sane): name -> (page, reason the parser gives).
BAD_FAMILIES = {
    "NaN count on the +Inf bucket": (_ttft_with(last_count="NaN"), "non_finite"),
    "+Inf count on the +Inf bucket": (_ttft_with(last_count="+Inf"), "non_finite"),
    "escaped quote in an le label": (_ttft_with(le_label='0.5\\"'), "bad_le"),
    "decreasing cumulative buckets": (_ttft_with(counts=[10, 20, 5, 40, 50]), "decreasing_buckets"),
    "negative count": (_ttft_with(counts=[-10, 20, 30, 40, 50]), "negative"),
    "garbage sample line": (_ttft_with(garbage=TTFT + '_bucket{le="1.0" 7 x y'), "malformed"),
    "no +Inf bucket": (_ttft_with(without_inf=True), "no_inf_bucket"),
}


def tiny_samples(count=2000000, cap=BODY_CAP):
    """`count` samples of one letter and a value, 4 bytes a line: 2 million under the 8 MiB cap."""
    body = b"a 1\n" * count
    assert len(body) <= cap
    return body


def distinct_series(count=1000000, cap=BODY_CAP):
    """`count` distinct series (4-letter names, base 26), 7 bytes a line."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    out = bytearray()
    for i in range(count):
        name = letters[i // 17576 % 26] + letters[i // 676 % 26] + letters[i // 26 % 26] + letters[i % 26]
        out += name.encode() + b" 1\n"
    assert len(out) <= cap
    return bytes(out)


def ttft_series_flood(cap=BODY_CAP):
    """As many distinct TTFT bucket series (a label per series) as fit under the cap: every
    line is one the latency sensor must look at."""
    out, i = bytearray(), 0
    while True:
        line = ('%s_bucket{le="+Inf",s="%x"} 1\n' % (TTFT, i)).encode()
        if len(out) + len(line) > cap:
            return bytes(out)
        out += line
        i += 1


def kept_bound_page(per_name=4096, label_bytes=200):
    """The most a page may make the parser keep: two sound families of `per_name` series each
    (the per-name bound), labels of `label_bytes` (8,192 samples, ~1.9 MiB: the page bounds)."""
    pad = "x" * label_bytes
    names = ("vllm:kv_cache_usage_perc", "vllm:num_requests_waiting")
    return "".join('%s{a="%s%05d"} 1\n' % (name, pad, i) for name in names for i in range(per_name)).encode()


# The pages under the cap that used to drive the daemon past its unit's MemoryMax.
BIG_PAGES = {
    "2,000,000 tiny samples": tiny_samples,
    "1,000,000 distinct series": distinct_series,
    "TTFT bucket series to the cap": ttft_series_flood,
}
