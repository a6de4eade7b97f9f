#!/usr/bin/env bash
# -*- coding: utf-8 -*-
# Copyright (c) 2026 kvpin.fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
#
# One-time (and idempotent) setup of a fresh Debian/Ubuntu machine, as root:
#   - apt packages for the lab fleet (podman + runc + debootstrap), the NVML stub (gcc) and
#     promtool (package prometheus: the watchdog alert rules' unit tests), chromium (the HTML plan
#     report's browser test drives /usr/bin/chromium with Playwright)
#   - <repo>/.venv with the pinned controller toolchain (requirements.txt)
#   - <repo>/.venv-core-2.21: the newest maintained ansible-core on Python 3.12
#     (tests/requirements-core-2.21.txt), for the unit tests and sanity on that core too
#   - the NVML stub library (tests/nvml_stub/build.sh)
#   - <repo>/.cache/wheelhouse with nvidia-ml-py for the lab nodes (they cannot reach PyPI)
#   - <repo>/.cache/collections/ansible_collections/kvpin/fleet -> <repo> (ansible.cfg uses it)
#   - <repo>/.cache/gpustack071-venv: GPUStack 0.7.1 for the lab (scripts/lab.sh gpustack-venv;
#     ~1.1 GB, installed once and again only when tests/lab/requirements-gpustack071.txt changes)
# A second run changes nothing and takes a few seconds.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$REPO/.venv"
WHEELHOUSE="$REPO/.cache/wheelhouse"
COLLECTION_LINK="$REPO/.cache/collections/ansible_collections/kvpin/fleet"
# HOME for ansible-test (scripts/test.sh): its venvs and caches live under ~/.ansible/test, and a
# private one keeps parallel runs from other checkouts from rebuilding the same venvs under it.
ANSIBLE_TEST_HOME="$REPO/.cache/ansible-test-home"
PYTHON="${KVPIN_PYTHON:-python3}"
CORE_NEXT_VENV="$REPO/.venv-core-2.21"
CORE_NEXT_REQUIREMENTS="$REPO/tests/requirements-core-2.21.txt"
APT_PACKAGES=(podman runc debootstrap debian-archive-keyring gcc libc6-dev iproute2
              python3 python3-venv python3-pip git rsync ca-certificates shellcheck prometheus
              postgresql chromium)

log() { printf 'bootstrap: %s\n' "$*" >&2; }
die() { printf 'bootstrap: error: %s\n' "$*" >&2; exit 1; }

[[ $EUID -eq 0 ]] || die "run as root (apt-get, podman with systemd containers)"

apt_packages() {
    local missing=() p
    for p in "${APT_PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    if ((${#missing[@]} == 0)); then log "apt: all packages present"; return; fi
    log "apt: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends "${missing[@]}"
}

# A venv is rebuilt only when its requirements file changed (stamp = its sha256).
venv_from() {
    local venv="$1" python="$2" requirements="$3" stamp want
    stamp="$venv/.kvpin-requirements.sha256"
    want="$(sha256sum "$requirements" | cut -d' ' -f1)"
    if [[ -x "$venv/bin/python" && -r "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
        log "venv: $venv up to date"; return
    fi
    [[ -x "$venv/bin/python" ]] || { log "venv: creating $venv with $python"; "$python" -m venv "$venv"; }
    log "venv: installing ${requirements#"$REPO"/}"
    "$venv/bin/python" -m pip install -q --upgrade pip
    "$venv/bin/python" -m pip install -q -r "$requirements"
    echo "$want" >"$stamp"
}

venv() { venv_from "$VENV" "$PYTHON" "$REPO/requirements.txt"; }

# ansible-core 2.20+ needs Python >= 3.12; Debian 12 ships 3.11, the machine image carries 3.12
# under pyenv. KVPIN_PYTHON_3_12 names another interpreter.
python_3_12() {
    local candidate
    for candidate in "${KVPIN_PYTHON_3_12:-}" python3.12 /root/.pyenv/versions/3.12*/bin/python3.12 \
                     /usr/local/bin/python3.12 /usr/bin/python3.12; do
        [[ -n "$candidate" ]] || continue
        candidate="$(command -v "$candidate" 2>/dev/null)" || continue
        "$candidate" -c 'import sys, venv; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null && { echo "$candidate"; return; }
    done
    return 1
}

venv_core_next() {
    local python
    python="$(python_3_12)" || die "no Python 3.12 for $CORE_NEXT_VENV (ansible-core 2.21 needs >= 3.12): install one (pyenv install 3.12) or set KVPIN_PYTHON_3_12"
    venv_from "$CORE_NEXT_VENV" "$python" "$CORE_NEXT_REQUIREMENTS"
}

nvml_stub() {
    local build="$REPO/tests/nvml_stub/build.sh"
    [[ -r "$build" ]] || die "$build missing (the NVML stub is part of the repository)"
    log "nvml stub: tests/nvml_stub/build.sh"
    bash "$build"
    [[ -r "$REPO/tests/nvml_stub/build/libnvidia-ml.so.1" ]] || die "stub build did not produce tests/nvml_stub/build/libnvidia-ml.so.1"
}

# The node-side version comes from the one pin in requirements.txt.
wheelhouse() {
    local pin
    pin="$(grep -E '^nvidia-ml-py==' "$REPO/requirements.txt" | head -n1)"
    [[ -n "$pin" ]] || die "requirements.txt has no nvidia-ml-py==VERSION pin"
    mkdir -p "$WHEELHOUSE"
    if compgen -G "$WHEELHOUSE/nvidia_ml_py-${pin#*==}-*.whl" >/dev/null; then
        log "wheelhouse: $pin present"; return
    fi
    log "wheelhouse: pip download $pin"
    # Drop other versions so the node installs exactly the pinned one.
    rm -f "$WHEELHOUSE"/nvidia_ml_py-*.whl
    "$VENV/bin/python" -m pip download -q --no-deps --only-binary=:all: -d "$WHEELHOUSE" "$pin"
}

# ansible-test bootstraps pip into each sanity venv with a get-pip script from
# ci-files.testing.ansible.com, which is unreachable here (PyPI is). Its documented fallback is a
# script at ~/.ansible/test/cache/get_pip_<ver>.py: ours runs pip from the same pip version's wheel.
# ~ is ANSIBLE_TEST_HOME, the HOME scripts/test.sh gives ansible-test.
ansible_test_get_pip() {
    local venv="$1" ver cache wheel
    ver="$(grep -oE "pip='[0-9.]+'" "$venv"/lib/python3*/site-packages/ansible_test/_internal/python_requirements.py \
           | head -n1 | tr -dc '0-9.')"
    [[ -n "$ver" ]] || die "cannot find ansible-test's pip version"
    cache="$ANSIBLE_TEST_HOME/.ansible/test/cache/get_pip_${ver//./_}.py"
    wheel="$WHEELHOUSE/pip-$ver-py3-none-any.whl"
    [[ -r "$wheel" ]] || "$VENV/bin/python" -m pip download -q --no-deps --only-binary=:all: -d "$WHEELHOUSE" "pip==$ver"
    [[ -r "$cache" ]] && grep -q "$wheel" "$cache" && { log "ansible-test: pip $ver bootstrap present"; return; }
    mkdir -p "$(dirname "$cache")"
    cat >"$cache" <<PY
# Written by kvpin.fleet scripts/bootstrap.sh: stands in for ansible-test's get-pip-$ver.py
# (unreachable) and installs pip from $wheel, taking ansible-test's arguments.
import sys
sys.path.insert(0, "$wheel")
from pip._internal.cli.main import main
# --no-setuptools/--no-wheel are get-pip options, not pip's: without them pip adds nothing anyway.
args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
sys.exit(main(["install", "--upgrade", "--force-reinstall", "$wheel"] + [a for a in args if not a.startswith("pip==")]))
PY
    log "ansible-test: pip $ver bootstrap written to $cache"
}

collection_link() {
    if [[ "$(readlink "$COLLECTION_LINK" 2>/dev/null)" == "$REPO" ]]; then return; fi
    mkdir -p "$(dirname "$COLLECTION_LINK")"
    ln -sfn "$REPO" "$COLLECTION_LINK"
    log "collection: $COLLECTION_LINK -> $REPO"
}

apt_packages
venv
venv_core_next
nvml_stub
wheelhouse
ansible_test_get_pip "$VENV"
ansible_test_get_pip "$CORE_NEXT_VENV"
collection_link
# After the collection link: the lab's model files are written from the collection's catalog.
bash "$REPO/scripts/lab.sh" gpustack-venv
log "done"
