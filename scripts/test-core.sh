#!/usr/bin/env bash
# -*- coding: utf-8 -*-
# Copyright (c) 2026 kvpin.fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
#
# On demand: scripts/test.sh's steps on another maintained ansible-core than the pinned one.
#   bash scripts/test-core.sh 2.20                  # unit + sanity on ansible-core 2.20
#   bash scripts/test-core.sh 2.21 molecule         # the lab scenario (rollout, rerun changed=0,
#                                                   # testinfra) with 2.21 as the controller
# CI already runs unit + sanity on 2.21 (steps unit-2.21, sanity-2.21); this covers the rest.
# The controller venv is <repo>/.venv-core-<X.Y>-full, built on Python 3.12 from
# tests/requirements-core-2.21.txt with that core's pin and, for the lab, molecule and the `ansible`
# bundle of that core (containers.podman: the lab's connection), rebuilt when a pin changes.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
die() { printf 'test-core: error: %s\n' "$*" >&2; exit 2; }

# One line per core: ansible-core pin, the `ansible` bundle built on it.
declare -A CORE_PIN=([2.20]="ansible-core==2.20.10" [2.21]="ansible-core==2.21.5")
declare -A BUNDLE_PIN=([2.20]="ansible==13.8.0" [2.21]="ansible==14.5.0")
# molecule's pin, read from requirements.txt (one version of the lab's scenario driver).
MOLECULE_PIN="$(grep -E '^molecule==' "$REPO/requirements.txt" | head -n1)"

core="${1:-}"
[[ -n "$core" ]] || die "usage: $0 X.Y [STEP ...]  (X.Y: ${!CORE_PIN[*]}; the pinned 2.19 is scripts/test.sh)"
shift
[[ -n "${CORE_PIN[$core]:-}" ]] || die "ansible-core '$core' is not one this script knows (${!CORE_PIN[*]})"
[[ -n "$MOLECULE_PIN" ]] || die "requirements.txt has no molecule==VERSION pin"
steps=("$@")
((${#steps[@]})) || steps=(unit sanity)

venv=".venv-core-$core-full"
requirements="$(mktemp "${TMPDIR:-/tmp}/kvpin-core-$core.XXXXXX.txt")"
trap 'rm -f "$requirements"' EXIT
grep -vE '^ansible-core==' "$REPO/tests/requirements-core-2.21.txt" >"$requirements"
printf '%s\n%s\n%s\n' "${CORE_PIN[$core]}" "${BUNDLE_PIN[$core]}" "$MOLECULE_PIN" >>"$requirements"

# The pinned toolchain first (the lab image, the NVML stub, the wheelhouse, the 3.12 interpreter).
bash "$REPO/scripts/bootstrap.sh"
stamp="$REPO/$venv/.kvpin-requirements.sha256"
want="$(sha256sum "$requirements" | cut -d' ' -f1)"
if ! [[ -x "$REPO/$venv/bin/python" && -r "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    python="$("$REPO/.venv-core-2.21/bin/python" -c 'import sys; print(sys._base_executable)')"
    [[ -x "$REPO/$venv/bin/python" ]] || "$python" -m venv "$REPO/$venv"
    "$REPO/$venv/bin/python" -m pip install -q --upgrade pip
    "$REPO/$venv/bin/python" -m pip install -q -r "$requirements"
    echo "$want" >"$stamp"
fi
"$REPO/$venv/bin/ansible" --version | head -n1
KVPIN_VENV="$venv" KVPIN_TEST_STEPS="${steps[*]}" exec bash "$REPO/scripts/test.sh"
