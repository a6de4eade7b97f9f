# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fit / held-out split of the validation rows in benchmarks/data/, for the accuracy
benchmarks (and tests/unit/test_validation_split.py, which checks the data against it).

Every row of benchmarks/data/*.json has an ``id`` and a ``split``: ``fit`` when a fitted
constant of the planner was read from it (``fit_for`` names the constants) or when an input
of its rebuild was read from its own answer (``answer_derived_inputs``), else ``held_out``.
Which rows a constant was read from is stated once, next to the constant, in a
``*_SOURCE_ROWS`` tuple that the module gathers in ``FITTED_SOURCE_ROWS``; this file only
collects those dicts. A row named there is scored as fit whatever its ``split`` says.
The name does not match ``bench_*.py``: scripts/test.sh does not run it as a benchmark.
"""

from __future__ import annotations

from ansible_collections.kvpin.fleet.plugins.module_utils.plan import cuda_total
from ansible_collections.kvpin.fleet.plugins.module_utils.plan import llamacpp_memory
from ansible_collections.kvpin.fleet.plugins.module_utils.plan import llamacpp_profile
from ansible_collections.kvpin.fleet.plugins.module_utils.plan import vllm_memory
from ansible_collections.kvpin.fleet.plugins.module_utils.plan import vllm_profile

FIT = 'fit'
HELD_OUT = 'held_out'
SPLITS = (FIT, HELD_OUT)
TOTAL = 'total'
TITLES = {
    FIT: 'FIT split (in-sample: a fitted constant was read from these rows, or an input from '
         'their own answer)',
    HELD_OUT: 'HELD-OUT split (nothing in the planner was derived from these rows)',
    TOTAL: 'ALL rows (fit + held-out)',
}

# The modules whose fitted constants were read from each data file.
VLLM_MODULES = (vllm_memory, vllm_profile, cuda_total)
LLAMACPP_MODULES = (llamacpp_memory, llamacpp_profile)


def fitted_source_rows(modules):
    """{'module.CONSTANT': (row id, ...)} over the given modules' FITTED_SOURCE_ROWS."""
    out = {}
    for module in modules:
        for name, rows in module.FITTED_SOURCE_ROWS.items():
            if name in out:
                raise ValueError('fitted constant %s declared twice' % name)
            out[name] = tuple(rows)
    return out


def constants_from(row_id, sources):
    """The fitted constants (sorted names) that ``sources`` says were read from the row."""
    return sorted(name for name, rows in sources.items() if row_id in rows)


def row_split(entry, sources):
    """(split, why) of one data row. Fit when a constant names it or an input of its rebuild
    came from its own answer, whatever its ``split`` field says (the unit test keeps the two
    equal); else the row's own ``split``."""
    why = []
    fed = constants_from(entry['id'], sources)
    if fed:
        why.append('source of ' + ', '.join(fed))
    if entry.get('answer_derived_inputs'):
        why.append('input from its own answer: ' + entry['answer_derived_inputs'])
    if why:
        return FIT, '; '.join(why)
    if entry.get('split') != HELD_OUT:
        return FIT, 'marked fit in the data'
    return HELD_OUT, 'no constant read from it'


def consistency_problems(entries, sources):
    """What is wrong with the split of one data file against the constants read from it:
    ids missing or repeated, a split that is neither fit nor held_out, a row's ``fit_for``
    that is not the constants naming it, a held-out row that gave a constant or an input,
    a fit row with no reason, a constant naming a row the file does not have. [] = none."""
    problems = []
    ids = [entry.get('id') for entry in entries]
    for number, entry in enumerate(entries):
        row_id = entry.get('id')
        if not isinstance(row_id, str) or not row_id:
            problems.append('entry #%d: no id' % number)
            continue
        if ids.count(row_id) > 1:
            problems.append('%s: id used %d times' % (row_id, ids.count(row_id)))
        split = entry.get('split')
        if split not in SPLITS:
            problems.append('%s: split %r is not one of %s' % (row_id, split, ', '.join(SPLITS)))
        fed = constants_from(row_id, sources)
        if sorted(entry.get('fit_for') or []) != fed:
            problems.append('%s: fit_for %s, but the constants naming it are %s' % (
                row_id, sorted(entry.get('fit_for') or []), fed))
        if split == HELD_OUT and fed:
            problems.append('%s: held-out, but a source of %s' % (row_id, ', '.join(fed)))
        if split == HELD_OUT and entry.get('answer_derived_inputs'):
            problems.append('%s: held-out, but an input came from its own answer (%s)' % (
                row_id, entry['answer_derived_inputs']))
        if split == FIT and not fed and not entry.get('answer_derived_inputs'):
            problems.append('%s: fit, but no constant names it and no input came from its answer' % row_id)
    for name, rows in sorted(sources.items()):
        if not rows:
            problems.append('%s: names no source row' % name)
        for row_id in rows:
            if row_id not in ids:
                problems.append('%s: source row %r is not in the data' % (name, row_id))
    return problems


def print_split_preamble(entries, sources, row_word):
    """What the splits mean, once for both benchmarks, then any inconsistency between the data's
    splits and the constants' source rows."""
    print('splits: a "fit" %s gave a fitted constant (each constant\'s *_SOURCE_ROWS) or an '
          'input from its own answer: in-sample. A "held_out" %s gave nothing '
          '(docs/data-sources.md). Targets are the same for every split.' % (row_word, row_word))
    for problem in consistency_problems(entries, sources):
        print('split problem (tests/unit/test_validation_split.py fails on it): ' + problem)


def verdict_line(split, what, hits, count, unit, target):
    """``accuracy: <split>: <what> h/n <unit> (p %; target >= t %): PASS|FAIL``; no rows is
    FAIL (a split without rows proves nothing)."""
    share = float(hits) / count if count else 0.0
    return 'accuracy: %s: %s %d/%d %s (%.0f %%; target >= %.0f %%): %s' % (
        split, what, hits, count, unit, 100.0 * share, 100.0 * target,
        'PASS' if count and share >= target else 'FAIL')


def share_text(hits, count):
    return '%d/%d (%.0f %%)' % (hits, count, 100.0 * hits / count) if count else '0/0 (no rows)'
