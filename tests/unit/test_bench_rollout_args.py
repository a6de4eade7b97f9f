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
