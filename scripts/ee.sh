#!/usr/bin/env bash
# -*- coding: utf-8 -*-
# Copyright (c) 2026 kvpin.fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
#
# kvpin.fleet's execution environment (ee/execution-environment.yml, ansible-builder v3):
#   scripts/ee.sh inputs    # ee/build/: the collection tarball + the wheelhouse (pip wheel, needs
#                           # PyPI once; then cached) -> prints the inputs' content hash
#   scripts/ee.sh create    # inputs + ansible-builder create -> ee/context/ (no image)
#   scripts/ee.sh build     # create + podman build with no network -> localhost/kvpin-fleet-ee:<hash>
#                           # (skipped when that tag exists: the hash covers every input)
# Prints the image reference (build) or the context directory (create) on stdout, last line.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV_BIN="${KVPIN_VENV_BIN:-$REPO/.venv/bin}"
EE="$REPO/ee"
BUILD="$EE/build"
CONTEXT="${KVPIN_EE_CONTEXT:-$EE/context}"
IMAGE="${KVPIN_EE_IMAGE:-localhost/kvpin-fleet-ee}"
# What ansible-builder's own stages pip-install besides the EE's dependencies (its builder stage
# installs bindep, pyyaml and packaging unpinned; the final stage dumb-init; the base stage pip).
BUILDER_EXTRA=(pip==24.2 dumb-init==1.2.5 bindep pyyaml packaging setuptools wheel)

log() { printf 'ee: %s\n' "$*" >&2; }

pin() { grep -E "^$1==" "$REPO/requirements.txt" | head -n1; }

collection() {
    local tmp out
    tmp="$(mktemp -d)"
    mkdir -p "$BUILD"
    # Build from the tree as git sees it (tracked + untracked-but-not-ignored): no .cache, no .lab.
    (cd "$REPO" && git ls-files -z --cached --others --exclude-standard \
        | rsync -a --from0 --files-from=- --ignore-missing-args "$REPO/" "$tmp/src/")
    out="$("$VENV_BIN/ansible-galaxy" collection build "$tmp/src" --output-path "$tmp" --force 2>&1)" \
        || { echo "$out" >&2; rm -rf "$tmp"; exit 1; }
    mv "$tmp"/kvpin-fleet-*.tar.gz "$BUILD/kvpin-fleet.tar.gz"
    rm -rf "$tmp"
}

wheelhouse() {
    local want stamp="$BUILD/wheelhouse/.requirements"
    want="$(printf '%s\n' "$(pin ansible-core)" "$(pin ansible-runner)" "${BUILDER_EXTRA[@]}";
            grep -vE '^\s*(#|$)' "$REPO/meta/ee-requirements.txt")"
    if [[ -r "$stamp" && "$(cat "$stamp")" == "$want" ]]; then return; fi
    log "wheelhouse: pip wheel (once; needs PyPI)"
    rm -rf "$BUILD/wheelhouse"
    mkdir -p "$BUILD/wheelhouse"
    # shellcheck disable=SC2086
    "$VENV_BIN/python" -m pip wheel -q -w "$BUILD/wheelhouse" $want >&2
    echo "$want" >"$stamp"
}

# sha256 over every input of the image: the EE definition, the wheel list, and the collection's
# FILES.json (the sha256 of every file in the tarball; the tarball's own bytes carry timestamps).
inputs_hash() {
    {
        cat "$EE/execution-environment.yml" "$EE/requirements.yml" "$BUILD/wheelhouse/.requirements"
        (cd "$BUILD/wheelhouse" && ls)
        tar -xzOf "$BUILD/kvpin-fleet.tar.gz" FILES.json
    } | sha256sum | cut -c1-16
}

create() {
    rm -rf "$CONTEXT"
    "$VENV_BIN/ansible-builder" create -f "$EE/execution-environment.yml" -c "$CONTEXT" --output-filename Containerfile >&2
}

case "${1:-}" in
    inputs) collection; wheelhouse; inputs_hash ;;
    create) collection; wheelhouse; create; echo "$CONTEXT" ;;
    build)
        collection; wheelhouse
        ref="$IMAGE:$(inputs_hash)"
        if podman image exists "$ref"; then log "$ref exists (same inputs)"; echo "$ref"; exit 0; fi
        create
        log "podman build $ref (no network)"
        # The lab's podman settings (docs/lab.md): runc, explicit ulimits; no network: every pip
        # install reads the wheelhouse.
        podman build --runtime runc --ulimit nofile=20000:20000 --ulimit nproc=20000:20000 --network none \
            -f "$CONTEXT/Containerfile" -t "$ref" "$CONTEXT" >&2
        echo "$ref" ;;
    *) echo "usage: $0 inputs|create|build" >&2; exit 2 ;;
esac
