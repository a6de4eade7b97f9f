#!/usr/bin/env bash
# -*- coding: utf-8 -*-
# Copyright (c) 2026 kvpin.fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
#
# The whole test suite, as CI runs it (.ci/run) on a fresh machine, as root, with no input:
#   bootstrap -> unit (pytest) -> ansible-lint -> ansible-test sanity -> benchmarks
#   -> molecule (lab fleet) -> integration (pytest, lab fleet)
#   and the unit tests and sanity again on the newest ansible-core (unit-2.21, sanity-2.21:
#   .venv-core-2.21, Python 3.12), which run beside the lab steps (below, "beside the lab").
# Every step runs even when an earlier one failed (except bootstrap), so one run shows every
# failure; the exit status is non-zero when any step failed. Timing per step at the end, then a
# final "N passed, M failed" line over the steps.
# KVPIN_TEST_STEPS="unit lint" runs only the named steps (bootstrap always runs).
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO" || exit 2
# KVPIN_VENV: another controller venv for every step but unit-2.21/sanity-2.21 (scripts/test-core.sh
# runs the steps on another ansible-core that way); the default is the pinned toolchain.
VENV_BIN="$REPO/${KVPIN_VENV:-.venv}/bin"
CORE_NEXT_BIN="$REPO/.venv-core-2.21/bin"
ALL_STEPS=(unit lint sanity bench unit-2.21 sanity-2.21 molecule integration)
read -r -a STEPS <<<"${KVPIN_TEST_STEPS:-${ALL_STEPS[*]}}"

declare -a RESULT_NAMES=() RESULT_RCS=() RESULT_SECONDS=()

banner() { printf '\n===== %s =====\n' "$*"; }

run_step() {
    local name="$1" start rc
    shift
    banner "$name"
    start=$SECONDS
    "$@"
    rc=$?
    record_result "$name" "$rc" "$((SECONDS - start))"
    return "$rc"
}

# record_result NAME RC SECONDS [NOTE]: one step's line now, and its row in the final table.
record_result() {
    RESULT_NAMES+=("$1"); RESULT_RCS+=("$2"); RESULT_SECONDS+=("$3")
    printf -- '----- %s: %s in %ss%s\n' "$1" "$([[ $2 -eq 0 ]] && echo ok || echo "FAILED (rc=$2)")" "$3" "${4:+ ($4)}"
}

step_bootstrap() { bash "$REPO/scripts/bootstrap.sh"; }

# tests/adversarial: hostile inputs (HTTP servers on 127.0.0.1, model files, plan terms).
# --durations: the slowest tests are printed so that the next CI-time cut has figures.
# -n auto (pytest-xdist): one worker per core; the unit tests share no state but the checkout.
# $1: the venv's bin directory (the tests run every ansible tool from beside sys.executable).
unit_on() { "$1/pytest" tests/unit tests/adversarial -q -p no:cacheprovider -n auto --durations=15; }
step_unit() { unit_on "$VENV_BIN"; }
step_unit_2_21() { unit_on "$CORE_NEXT_BIN"; }

step_lint() { PATH="$VENV_BIN:$PATH" "$VENV_BIN/ansible-lint"; }

# ansible-test needs the tree at .../ansible_collections/kvpin/fleet. The copy holds what git
# would commit (tracked + untracked files that are not ignored), so it tests the working tree.
step_sanity() { sanity_on "$VENV_BIN"; }
step_sanity_2_21() { sanity_on "$CORE_NEXT_BIN"; }
sanity_on() {
    local bin="$1" tmp dest python rc
    tmp="$(mktemp -d "${TMPDIR:-/tmp}/kvpin-sanity.XXXXXX")"
    dest="$tmp/ansible_collections/kvpin/fleet"
    mkdir -p "$dest"
    if git -C "$REPO" rev-parse --git-dir >/dev/null 2>&1; then
        git -C "$REPO" ls-files -z --cached --others --exclude-standard \
            | rsync -a --from0 --files-from=- "$REPO/" "$dest/"
    else
        rsync -a --exclude=.git --exclude=.venv --exclude=.cache --exclude=.lab \
            --exclude=tests/output --exclude='*.tar.gz' --exclude=__pycache__ "$REPO/" "$dest/"
    fi
    python="$("$bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
    # --venv: ansible-test installs each sanity test's pinned requirements from PyPI into its own
    # venvs; HOME is private (see scripts/bootstrap.sh, ansible_test_get_pip) and keeps them cached.
    (cd "$dest" && HOME="$REPO/.cache/ansible-test-home" "$bin/ansible-test" sanity \
        --venv --python "$python" --color no)
    rc=$?
    rm -rf "$tmp"
    return "$rc"
}

# The lab scenario. Other scenarios (hardware_change, bad_node) run from their own pytest
# wrappers in tests/integration, so they are not repeated here.
# When the integration step follows, the scenario leaves its converged fleet up (--destroy=never)
# for the integration suite, whose first module would otherwise roll out cold onto fresh
# containers again; main() takes the fleet down once the last step is done.
LAB_LEFT_UP=0
step_molecule() {
    local destroy=always
    if [[ " ${STEPS[*]} " == *" integration "* ]]; then destroy=never; LAB_LEFT_UP=1; fi
    # --destroy=never also skips the sequence's first destroy, and molecule's create then trusts
    # the state file a run before this one may have left in ~/.ansible/tmp ("instances already
    # created") and converges onto no lab at all. Destroy first, which resets that state.
    if [[ $destroy == never ]]; then
        PATH="$VENV_BIN:$PATH" "$VENV_BIN/molecule" destroy -s default || return
    fi
    PATH="$VENV_BIN:$PATH" "$VENV_BIN/molecule" test -s default --destroy="$destroy"
}

# Benchmarks that build the lab image or roll out onto fresh lab fleets (bench_lab,
# bench_rollout: 4 nodes cold, then 8 and 16 on request) are the long scale runs, and
# bench_measure_vllm_cpu needs a scratch venv with vLLM's CPU build (about 5 minutes): they run on
# demand (KVPIN_BENCH_ON_DEMAND=1, or `.venv/bin/python benchmarks/<name>.py`), not in every CI
# run. Every other benchmark runs here, each timed.
ON_DEMAND_BENCHES=(bench_lab bench_rollout bench_measure_vllm_cpu)
step_bench() {
    local bench name rc=0 start i
    local -a names=() seconds=()
    for bench in benchmarks/bench_*.py; do
        [[ -e "$bench" ]] || continue
        name="$(basename "$bench" .py)"
        if [[ " ${ON_DEMAND_BENCHES[*]} " == *" $name "* && "${KVPIN_BENCH_ON_DEMAND:-0}" != 1 ]]; then
            banner "benchmark $bench: on demand (KVPIN_BENCH_ON_DEMAND=1 runs it)"
            continue
        fi
        banner "benchmark $bench"
        start=$SECONDS
        PATH="$VENV_BIN:$PATH" "$VENV_BIN/python" "$bench" || rc=$?
        names+=("$name"); seconds+=("$((SECONDS - start))")
    done
    printf '\n%-28s %8s\n' benchmark seconds
    for i in "${!names[@]}"; do printf '%-28s %8s\n' "${names[$i]}" "${seconds[$i]}"; done
    return "$rc"
}

step_integration() { PATH="$VENV_BIN:$PATH" "$VENV_BIN/pytest" tests/integration -q -p no:cacheprovider --durations=25; }

# Beside the lab: the lab steps (molecule, integration: ~33 of CI's ~40 minutes) spend much of
# their time waiting on containers, systemd and the watchdog's settle times, not on the CPU. When
# a lab step is in this run, the second core's unit tests and sanity do not queue behind it but
# run beside it, in one background job at the lowest CPU and I/O priority (the lab's processes
# keep the CPU whenever they want it), and their output and results are printed after the last
# step. KVPIN_BESIDE_LAB=0 runs them in order like every other step.
BESIDE_LAB_STEPS=(unit-2.21 sanity-2.21)
BESIDE_LAB_PID=""
BESIDE_LAB_LOG=""
BESIDE_LAB_RESULTS=""

step_function() { echo "step_${1//[-.]/_}"; }

start_beside_lab() {
    local -a steps=("$@")
    BESIDE_LAB_LOG="$(mktemp "${TMPDIR:-/tmp}/kvpin-beside-lab.XXXXXX")"
    BESIDE_LAB_RESULTS="$(mktemp "${TMPDIR:-/tmp}/kvpin-beside-lab-results.XXXXXX")"
    banner "${steps[*]}: started beside the lab steps (output after the last step)"
    (
        renice -n 19 -p "$BASHPID" >/dev/null 2>&1 || true
        ionice -c 3 -p "$BASHPID" >/dev/null 2>&1 || true
        for step in "${steps[@]}"; do
            start=$SECONDS
            banner "$step"
            "$(step_function "$step")"
            echo "$step $? $((SECONDS - start))" >>"$BESIDE_LAB_RESULTS"
        done
    ) >"$BESIDE_LAB_LOG" 2>&1 &
    BESIDE_LAB_PID=$!
}

finish_beside_lab() {
    local name rc seconds waited=$SECONDS
    [[ -n $BESIDE_LAB_PID ]] || return 0
    wait "$BESIDE_LAB_PID"
    banner "beside the lab steps (waited $((SECONDS - waited))s for them after the last step)"
    cat "$BESIDE_LAB_LOG"
    while read -r name rc seconds; do
        record_result "$name" "$rc" "$seconds" "beside the lab"
    done <"$BESIDE_LAB_RESULTS"
    rm -f "$BESIDE_LAB_LOG" "$BESIDE_LAB_RESULTS"
}

main() {
    local total_start=$SECONDS step i passed=0 failed=0 lab=0
    local -a beside=()
    [[ $EUID -eq 0 ]] || { echo "test.sh: run as root (the lab fleet needs podman + runc)" >&2; exit 2; }
    if ! run_step bootstrap step_bootstrap; then
        echo "0 passed, 1 failed (bootstrap failed; nothing else ran)"
        exit 1
    fi
    for step in "${STEPS[@]}"; do
        declare -F "$(step_function "$step")" >/dev/null || { echo "test.sh: unknown step '$step' (steps: ${ALL_STEPS[*]})" >&2; exit 2; }
        [[ $step == molecule || $step == integration ]] && lab=1
    done
    for step in "${STEPS[@]}"; do
        if ((lab)) && [[ "${KVPIN_BESIDE_LAB:-1}" != 0 && " ${BESIDE_LAB_STEPS[*]} " == *" $step "* ]]; then
            beside+=("$step"); continue
        fi
        if [[ ($step == molecule || $step == integration) && ${#beside[@]} -gt 0 && -z $BESIDE_LAB_PID ]]; then
            start_beside_lab "${beside[@]}"
        fi
        run_step "$step" "$(step_function "$step")"
    done
    # (Named after the last lab step: they run now, alone.)
    if ((${#beside[@]})) && [[ -z $BESIDE_LAB_PID ]]; then start_beside_lab "${beside[@]}"; fi
    finish_beside_lab
    if ((LAB_LEFT_UP)); then
        banner "lab down (left up by the molecule step for the integration step)"
        # Through molecule, so its state file says "not created" again for the next run.
        PATH="$VENV_BIN:$PATH" "$VENV_BIN/molecule" destroy -s default || bash "$REPO/scripts/lab.sh" down || true
    fi
    banner "timing"
    printf '%-12s %-8s %8s\n' step result seconds
    for i in "${!RESULT_NAMES[@]}"; do
        if [[ ${RESULT_RCS[$i]} -eq 0 ]]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
        printf '%-12s %-8s %8s\n' "${RESULT_NAMES[$i]}" "$([[ ${RESULT_RCS[$i]} -eq 0 ]] && echo ok || echo FAILED)" "${RESULT_SECONDS[$i]}"
    done
    printf '%-12s %-8s %8s\n' total '' "$((SECONDS - total_start))"
    echo "test.sh took $((SECONDS - total_start))s"
    # The closing line CI reads: "word: N passed, N failed".
    echo "steps: $passed passed, $failed failed"
    ((failed == 0))
}

main "$@"
