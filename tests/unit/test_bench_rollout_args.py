# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""benchmarks/bench_rollout.py's inputs and medians, without a lab: --pairs (and
KVPIN_BENCH_ROLLOUT_PAIRS) takes an odd count in 1..15 and names what it got otherwise; a
figure is the run of median seconds, so its counts belong to a run that happened."""

from __future__ import annotations

import argparse

import pytest
from benchmark_loader import load_benchmark  # pylint: disable=import-error

bench = load_benchmark('bench_rollout')


@pytest.mark.parametrize('text, pairs', [('1', 1), ('3', 3), ('15', 15)])
def test_an_odd_pair_count_in_range_is_taken(text, pairs):
    assert bench.pairs_arg(text) == pairs


@pytest.mark.parametrize('text', ['0', '2', '4', '17', '-3', '99999999999999999999', '3.0', 'three', '', ' ', '1e1', 'None'])
def test_a_pair_count_not_odd_or_out_of_range_or_not_a_number_is_refused_naming_it(text):
    with pytest.raises(argparse.ArgumentTypeError) as error:
        bench.pairs_arg(text)
    assert 'pairs must be an odd count in 1..15' in str(error.value)
    assert repr(text) in str(error.value)


def test_the_median_run_is_one_of_the_runs_with_its_own_counts():
    runs = [(11.5, {'a': 0}, [1]), (6.4, {'a': 0}, [1]), (30.0, {'a': 2}, [8])]
    assert bench.median_run(runs) == (11.5, {'a': 0}, [1])
    assert bench.median_run(runs[:1]) == runs[0]


@pytest.mark.parametrize('text, seconds', [('0', 0), ('180', 180), ('900', 900)])
def test_a_settle_time_in_range_is_taken(text, seconds):
    assert bench.settle_arg(text) == seconds


@pytest.mark.parametrize('text', ['-1', '901', '1.5', 'soon', '', '99999999999999999999'])
def test_a_settle_time_out_of_range_or_not_whole_seconds_is_refused_naming_it(text):
    with pytest.raises(argparse.ArgumentTypeError) as error:
        bench.settle_arg(text)
    assert 'settle must be whole seconds in 0..900' in str(error.value) and repr(text) in str(error.value)


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


def test_settle_waits_until_the_load_falls_to_the_core_count():
    clock = _Clock()
    loads = iter([20.0, 9.5, 4.1, 1.9, 0.5])
    waited, load = bench.settle(180, cores=2, loadavg=lambda: (next(loads), 0, 0), clock=clock, sleep=clock.sleep)
    assert (waited, load) == (15.0, 1.9)


def test_settle_gives_up_at_its_limit_and_says_the_load():
    clock = _Clock()
    waited, load = bench.settle(12, cores=2, loadavg=lambda: (30.0, 0, 0), clock=clock, sleep=clock.sleep)
    assert (waited, load) == (12.0, 30.0)


def test_settle_zero_does_not_wait():
    clock = _Clock()
    assert bench.settle(0, cores=2, loadavg=lambda: (30.0, 0, 0), clock=clock, sleep=clock.sleep) == (0.0, 30.0)
