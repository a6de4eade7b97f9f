# -*- coding: utf-8 -*-
# Copyright (c) 2026, kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Statistics: Theil-Sen slope, Sen's CI, Mann-Kendall with Hamed-Rao correction."""

from __future__ import annotations

import bisect
import math
import statistics
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple


# ---------------------------------------------------------------------------
# Statistics: Theil-Sen slope, Sen's CI, Mann-Kendall with Hamed-Rao correction.
# ---------------------------------------------------------------------------
@dataclass
class Trend:
    n: int
    slope: float          # per second
    lower: float          # per second, lower CI bound
    upper: float
    intercept: float      # value at x = 0 (x as given)
    s: int                # Mann-Kendall S
    var_s: float          # corrected Var(S)
    z: float
    p: float              # two-sided p-value
    variance_factor: float  # Hamed-Rao n/n* (>= 1)


def _tie_term(values: Sequence[float]) -> float:
    counts: Dict[float, int] = {}
    for v in values:
        counts[v] = counts.get(v, 0) + 1
    return float(sum(c * (c - 1) * (2 * c + 5) for c in counts.values() if c > 1))


def _ranks(values: Sequence[float]) -> List[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        mean_rank = (i + j) / 2.0 + 1.0
        for k in range(i, j + 1):
            ranks[order[k]] = mean_rank
        i = j + 1
    return ranks


def high_pass(values: Sequence[float], half_width: int) -> List[float]:
    """values minus a centred running median: keeps short-scale noise, drops the slow shape."""
    n = len(values)
    out = []
    for i in range(n):
        lo, hi = max(0, i - half_width), min(n, i + half_width + 1)
        out.append(values[i] - statistics.median(values[lo:hi]))
    return out


def hamed_rao_factor(residuals: Sequence[float], z_crit: float = 1.96,
                     max_lag: Optional[int] = None) -> float:
    """Variance inflation n/n* of Hamed & Rao (1998) from the ranks of a detrended series.

    Only autocorrelations outside the +/- z/sqrt(n) band count. The factor is
    clamped to >= 1: negative correlations (a sawtooth's half period) must not
    make the test *more* confident than the independent case.
    """
    n = len(residuals)
    if n < 4:
        return 1.0
    ranks = _ranks(residuals)
    mean = sum(ranks) / n
    dev = [r - mean for r in ranks]
    denom = sum(d * d for d in dev)
    if denom <= 0:
        return 1.0
    band = z_crit / math.sqrt(n)
    acc = 0.0
    last_lag = n - 3 if max_lag is None else min(n - 3, max_lag)
    for lag in range(1, last_lag + 1):
        rho = sum(dev[i] * dev[i + lag] for i in range(n - lag)) / denom
        if abs(rho) > band:
            acc += (n - lag) * (n - lag - 1) * (n - lag - 2) * rho
    factor = 1.0 + 2.0 / (n * (n - 1) * (n - 2)) * acc
    return max(1.0, factor)


def trend(xs: Sequence[float], ys: Sequence[float], confidence: float = 0.95,
          autocorrelation: bool = True, noise_half_width: int = 15,
          max_lag: int = 8) -> Optional[Trend]:
    """Theil-Sen slope with Sen's (1968) CI, and the Mann-Kendall test on the same pairs.

    Autocorrelation (GC sawtooth, bursts) makes plain MK over-confident, so Var(S) gets
    the Hamed-Rao factor. Its autocorrelations come from high-passed values (minus a
    running median of 2*noise_half_width+1 points), not from residuals of one straight
    line: a leak that starts mid-window leaves a bent residual that would read as
    strong autocorrelation and hide the very trend being tested. Only lags up to
    max_lag count (the median's window cuts longer ones anyway). So the correction
    covers noise correlated over minutes (sawtooth, AR phi >= ~0.7 at 60 s samples);
    slower wander is left to the floor-ramp guard and confirm_seconds. The same corrected variance sets
    the width of Sen's CI, so the lower slope bound is honest too.
    xs must be strictly increasing. Returns None for fewer than 3 points.
    """
    n = len(xs)
    if n < 3 or n != len(ys):
        return None
    slopes: List[float] = []
    for i in range(n - 1):
        xi, yi = xs[i], ys[i]
        slopes.extend([(ys[j] - yi) / (xs[j] - xi) for j in range(i + 1, n)])
    slopes.sort()
    # MK's S from the same sorted pair slopes (dx > 0, so sign(dy) = sign(slope)).
    s = (len(slopes) - bisect.bisect_right(slopes, 0.0)) - bisect.bisect_left(slopes, 0.0)
    m = len(slopes)
    slope = statistics.median(slopes)
    intercept = statistics.median([ys[i] - slope * xs[i] for i in range(n)])
    var_s = (n * (n - 1) * (2 * n + 5) - _tie_term(ys)) / 18.0
    factor = 1.0
    if autocorrelation:
        factor = hamed_rao_factor(high_pass(ys, noise_half_width), max_lag=max_lag)
        var_s *= factor
    if var_s <= 0:
        return Trend(n, slope, slope, slope, intercept, s, 0.0, 0.0, 1.0, factor)
    # Continuity-corrected Z.
    if s > 0:
        z = (s - 1) / math.sqrt(var_s)
    elif s < 0:
        z = (s + 1) / math.sqrt(var_s)
    else:
        z = 0.0
    norm = statistics.NormalDist()
    p = 2.0 * (1.0 - norm.cdf(abs(z)))
    c = norm.inv_cdf(0.5 + confidence / 2.0) * math.sqrt(var_s)
    lo_rank = int(math.floor((m - c) / 2.0))
    hi_rank = int(math.ceil((m + c) / 2.0))
    lower = slopes[min(max(lo_rank, 0), m - 1)]
    upper = slopes[min(max(hi_rank, 0), m - 1)]
    return Trend(n, slope, lower, upper, intercept, s, var_s, z, p, factor)


def downsample(points: Sequence[Tuple[float, float]], max_points: int) -> List[Tuple[float, float]]:
    """Average consecutive samples into at most max_points buckets (keeps O(n^2) cheap)."""
    n = len(points)
    if n <= max_points:
        return list(points)
    out = []
    for b in range(max_points):
        lo = b * n // max_points
        hi = (b + 1) * n // max_points
        chunk = points[lo:hi]
        out.append((sum(p[0] for p in chunk) / len(chunk), sum(p[1] for p in chunk) / len(chunk)))
    return out
