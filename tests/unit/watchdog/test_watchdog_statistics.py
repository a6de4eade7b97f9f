# -*- coding: utf-8 -*-
# Copyright (c) 2026, kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Theil-Sen slope, Sen's CI, Mann-Kendall (tie correction, Hamed-Rao) and downsampling."""
from __future__ import annotations

import math
import random

import pytest

MiB = 1024 * 1024


def _series(rng, n, slope, noise, step=60.0):
    xs = [i * step for i in range(n)]
    return xs, [slope * x + rng.gauss(0, noise) for x in xs]


def test_theil_sen_exact_on_a_line(wd):
    xs = [0, 1, 2, 3, 4, 5]
    tr = wd.trend(xs, [3 + 2 * x for x in xs])
    assert tr.slope == pytest.approx(2.0)
    assert tr.intercept == pytest.approx(3.0)
    assert tr.lower == pytest.approx(2.0) and tr.upper == pytest.approx(2.0)


def test_theil_sen_ignores_outliers_that_move_ols(wd):
    xs = list(range(40))
    ys = [5.0 * x for x in xs]
    for i in (3, 17, 31):      # GC drops / spikes: far from the line
        ys[i] += 10000 if i % 2 else -10000
    tr = wd.trend(xs, ys)
    assert tr.slope == pytest.approx(5.0)
    mean_x = sum(xs) / len(xs)
    mean_y = sum(ys) / len(ys)
    ols = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sum((x - mean_x) ** 2 for x in xs)
    assert abs(ols - 5.0) > 10     # the case Theil-Sen exists for


@pytest.mark.parametrize("slope_per_hour", [0.0, 50 * MiB, 200 * MiB, 2048 * MiB])
def test_sen_ci_covers_true_slope(wd, slope_per_hour):
    """95% CI must cover the true slope in (about) 95% of noisy independent series."""
    rng = random.Random(7)
    covered = 0
    runs = 60
    for _unused in range(runs):
        xs, ys = _series(rng, 120, slope_per_hour / 3600.0, 100 * MiB)
        tr = wd.trend(xs, ys, 0.95)
        if tr.lower <= slope_per_hour / 3600.0 <= tr.upper:
            covered += 1
    assert covered >= 0.88 * runs


def test_mann_kendall_monotonic_vs_random(wd):
    rng = random.Random(3)
    xs = list(range(100))
    rising = wd.trend(xs, [x + rng.gauss(0, 5) for x in xs])
    assert rising.p < 1e-6 and rising.s > 0
    falling = wd.trend(xs, [-x + rng.gauss(0, 5) for x in xs])
    assert falling.p < 1e-6 and falling.s < 0
    false_positives = 0
    for seed in range(40):
        r = random.Random(seed)
        tr = wd.trend(xs, [r.gauss(0, 1) for _unused in xs], autocorrelation=False)
        false_positives += tr.p < 0.05
    assert false_positives <= 6   # ~5% expected


def test_mann_kendall_tie_correction_reduces_variance(wd):
    xs = list(range(30))
    ys = [float(x // 5) for x in xs]      # heavy ties (quantised memory readings)
    tr = wd.trend(xs, ys, autocorrelation=False)
    n = 30
    untied = n * (n - 1) * (2 * n + 5) / 18.0
    assert tr.var_s < untied
    assert tr.var_s == pytest.approx((untied * 18 - wd._tie_term(ys)) / 18.0)


def test_hamed_rao_inflates_variance_for_autocorrelated_noise(wd):
    rng = random.Random(11)
    n = 150
    ar = [0.0]
    for _unused in range(n - 1):
        ar.append(0.85 * ar[-1] + rng.gauss(0, 1))    # AR(1), persistent over minutes
    white = [rng.gauss(0, 1) for _unused in range(n)]
    assert wd.hamed_rao_factor(wd.high_pass(ar, 15), max_lag=8) > 1.5
    assert wd.hamed_rao_factor(wd.high_pass(white, 15), max_lag=8) < 1.3
    xs = list(range(n))
    plain = wd.trend(xs, ar, autocorrelation=False)
    corrected = wd.trend(xs, ar)
    assert corrected.var_s > plain.var_s
    assert corrected.p >= plain.p


def test_leak_starting_mid_window_is_not_hidden_by_the_correction(wd):
    """A flat-then-ramp window must stay significant (bent residuals are not autocorrelation)."""
    rng = random.Random(5)
    xs = [i * 60.0 for i in range(180)]
    ys = [6e9 + (0 if x < 5400 else (x - 5400) * 2 * 1024 * MiB / 3600) + rng.gauss(0, 50 * MiB)
          for x in xs]
    tr = wd.trend(xs, ys)
    assert tr.p < 1e-4
    assert tr.variance_factor < 3


def test_downsample_bounds_points_and_keeps_the_slope(wd):
    pts = [(float(i), 3.0 * i) for i in range(1000)]
    ds = wd.downsample(pts, 150)
    assert len(ds) == 150
    tr = wd.trend([p[0] for p in ds], [p[1] for p in ds])
    assert tr.slope == pytest.approx(3.0)
    assert wd.downsample(pts[:10], 150) == pts[:10]


def test_trend_needs_three_points(wd):
    assert wd.trend([0, 1], [0, 1]) is None
    assert not math.isnan(wd.trend([0, 1, 2], [1, 1, 1]).p)
