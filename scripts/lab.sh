#!/usr/bin/env bash
# -*- coding: utf-8 -*-
# Copyright (c) 2026 kvpin.fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
#
# The lab fleet (four nodes by default, KVPIN_LAB_NODES=N for N): systemd containers (podman + runc) from a Debian 12 image built
# locally with debootstrap, each seeing its own GPUs through the NVML stub library (and, for
# GPUStack 0.7.1, a fake nvidia-smi) answering from the node's JSON fixture; plus a fifth
# container, lab-gpustack, running a real GPUStack 0.7.1 server (embedded SQLite) the nodes'
# real GPUStack workers register with. GPUStack is installed once on the host
# (.cache/gpustack071-venv) and bind-mounted read-only into every container; the engines it
# launches are the TEST-ONLY stand-in tests/lab/standins/kvpin-engine (tests/lab/prepare.py).
# Traffic stays on this machine: the server listens inside its container, on podman's bridge,
# reached by the nodes and the controller at the container's address. Recipe and traps
# (crun, ulimits, systemd >= 256): docs/lab.md.
#
# Usage: scripts/lab.sh up [NODE...] | down [NODE...] | status | stats | rebuild-image | image
#                       | set-fixture NODE FILE | nodes | gpustack-venv
# `up` without nodes starts KVPIN_LAB_NODES nodes (default 4), cycling the four card layouts
# (lab-a6000x4, lab-4090x4, lab-4090x2, lab-mixed, then lab-a6000x4-2, ...: the naming rule is
# inventory/lab/lab_nodes.py's), records the count for inventory/lab and removes this prefix's
# nodes beyond it. `stats` prints memory and CPU per container (podman stats).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LAB_DIR="${KVPIN_LAB_DIR:-$REPO/.lab}"
IMAGE="${KVPIN_LAB_IMAGE:-localhost/kvpin-node:bookworm}"
SUITE=bookworm   # systemd 252: newer systemd (>= 256) refuses to boot on this host's cgroup v1
# Containers are named PREFIX+node so two checkouts on one machine can each run a fleet;
# inventory/lab reads the same variable for ansible_host. Hostnames stay the node names.
PREFIX="${KVPIN_LAB_PREFIX:-}"
[[ "$PREFIX" =~ ^[a-zA-Z0-9_.-]*$ ]] || { echo "lab: error: KVPIN_LAB_PREFIX '$PREFIX' is not a valid container name prefix" >&2; exit 1; }
# The node names and their layouts come from the inventory script (one naming rule): node
# lab-<layout>[-<copy>] boots with tests/fixtures/nvml/lab-<layout>.json. NODES is the fleet
# `up` makes (KVPIN_LAB_NODES, default 4); the count `up` used is recorded in NODE_RECORD, which
# inventory/lab reads when KVPIN_LAB_NODES is not set.
LAB_NODES_PY="$REPO/inventory/lab/lab_nodes.py"
NODE_COUNT="${KVPIN_LAB_NODES:-4}"
mapfile -t NODES < <(python3 "$LAB_NODES_PY" --names "$NODE_COUNT" 2>/dev/null || true)
((${#NODES[@]})) || { echo "lab: error: KVPIN_LAB_NODES '$NODE_COUNT' is not a node count (1..64)" >&2; exit 1; }
NODE_RE='^lab-(a6000x4|4090x4|4090x2|mixed)(-[0-9]+)?$'
NODE_RECORD="$LAB_DIR/${PREFIX}nodes"
STUB_LIB="${KVPIN_NVML_STUB_LIB:-$REPO/tests/nvml_stub/build/libnvidia-ml.so.1}"
FIXTURE_DIR="${KVPIN_NVML_FIXTURE_DIR:-$REPO/tests/fixtures/nvml}"
# Where the stub reads its fixture by default (KVPIN_NVML_STUB_CONFIG overrides it in the stub).
NODE_FIXTURE_PATH=/etc/kvpin/nvml-stub.json
NODE_LIB_DIR=/usr/local/lib
# Limits below the host's hard limits; without them podman asks for more and the start is refused.
RUN_OPTS=(--runtime runc --ulimit nofile=20000:20000 --ulimit nproc=20000:20000 --systemd=always)
BOOT_TIMEOUT_S="${KVPIN_LAB_BOOT_TIMEOUT_S:-90}"
# GPUStack 0.7.1 (lab only): host venv, its path in the containers, the lab's model files and
# engine stand-ins (tests/lab/prepare.py), the server container, and the server's state:
# server_url, and the secrets (bootstrap password, registration token, API key) in 0600 files
# that inventory/lab reads with lookups; nothing prints them.
GS_VENV="${KVPIN_GPUSTACK_VENV:-$REPO/.cache/gpustack071-venv}"
NODE_GS_VENV=/opt/gpustack/venv
NODE_MODELS=/var/lib/kvpin-lab/models
NODE_ENGINES=/opt/kvpin-lab/engines
NODE_NVIDIA_SMI=/usr/local/bin/nvidia-smi
NVIDIA_SMI="$REPO/tests/lab/standins/nvidia-smi"
SERVER=lab-gpustack
SERVER_PORT=80
SERVER_CONFIG=/etc/kvpin-lab/gpustack-server.yaml
GS_STATE="$LAB_DIR/${PREFIX}gpustack"
SERVER_TIMEOUT_S="${KVPIN_LAB_SERVER_TIMEOUT_S:-120}"
# Containers made before the GPUStack layout lack its mounts: `up` recreates them.
LAYOUT=gpustack071
PY="${KVPIN_LAB_PYTHON:-$REPO/.venv/bin/python}"
PACKAGES=systemd,systemd-sysv,dbus,python3,python3-pip,iproute2,procps,ca-certificates

log() { printf 'lab: %s\n' "$*" >&2; }
die() { printf 'lab: error: %s\n' "$*" >&2; exit 1; }

# The Debian mirror apt already uses (deb822 .sources or one-line sources.list), so the build
# works behind the same mirror/proxy as the host; deb.debian.org when the host is not Debian.
debian_mirror() {
    if [[ -n "${KVPIN_DEBIAN_MIRROR:-}" ]]; then echo "$KVPIN_DEBIAN_MIRROR"; return; fi
    local uri
    uri="$( { cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '/^URIs:/ {for (i = 2; i <= NF; i++) print $i}';
              cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
                | awk '$1 == "deb" {for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) {print $i; break}}'; } \
            | grep -E '/debian/?$' | head -n1 || true)"
    echo "${uri:-http://deb.debian.org/debian}"
}

image_exists() { podman image exists "$IMAGE"; }

build_image() {
    local rootfs debs="$LAB_DIR/debs" mirror keyring=()
    mirror="$(debian_mirror)"
    mkdir -p "$debs"
    rootfs="$(mktemp -d "$LAB_DIR/rootfs.XXXXXX")"
    chmod 0755 "$rootfs"   # it becomes the image's /
    # Ubuntu hosts need Debian's keyring to verify a bookworm Release file.
    [[ -r /usr/share/keyrings/debian-archive-keyring.gpg ]] \
        && keyring=(--keyring=/usr/share/keyrings/debian-archive-keyring.gpg)
    log "debootstrap $SUITE from $mirror (debs cached in $debs)"
    debootstrap --variant=minbase --include="$PACKAGES" --cache-dir="$debs" "${keyring[@]}" \
        "$SUITE" "$rootfs" "$mirror" >"$LAB_DIR/debootstrap.log" 2>&1 \
        || { tail -n 20 "$LAB_DIR/debootstrap.log" >&2; rm -rf "$rootfs"; die "debootstrap failed (log: $LAB_DIR/debootstrap.log)"; }
    # Nodes never reach a package index (docs/lab.md: no TLS to the outside); keep the image small.
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    log "podman import $IMAGE"
    tar -C "$rootfs" -c . | podman import --quiet --change 'CMD ["/sbin/init"]' - "$IMAGE" >/dev/null
    rm -rf "$rootfs"
}

# One build at a time per machine: a second `up` waits for the first one's image.
with_image_lock() {
    local lock="${KVPIN_LAB_LOCK:-}"
    [[ -n "$lock" ]] || { [[ -d /run/lock ]] && lock=/run/lock/kvpin-lab-image.lock || lock=/tmp/kvpin-lab-image.lock; }
    (
        flock -w 900 9 || die "timed out waiting for $lock"
        "$@"
    ) 9>"$lock"
}

ensure_image_locked() {
    if image_exists; then log "image $IMAGE exists (reused)"; else build_image; fi
}

ensure_image() { with_image_lock ensure_image_locked; }

# Containers of ANY prefix (other checkouts, other sessions) that were made from the image.
image_users() { podman ps -a --filter ancestor="$IMAGE" --format '{{.Names}}' 2>/dev/null; }

known_node() {
    [[ "$1" =~ $NODE_RE ]] || die "unknown node '$1' (nodes: lab-<a6000x4|4090x4|4090x2|mixed>[-<copy>], e.g. ${NODES[*]})"
}

# A node's card layout (its NVML fixture's name): the node name without its copy number.
node_layout() { local n="$1"; [[ "$n" =~ -[0-9]+$ ]] && n="${n%-*}"; printf '%s' "$n"; }

# This prefix's lab nodes that exist (any count), from podman.
existing_nodes() {
    local name
    podman ps -a --filter label=kvpin.lab=1 --format '{{.Names}}' 2>/dev/null | while read -r name; do
        [[ "$name" == "$PREFIX"* ]] || continue
        name="${name#"$PREFIX"}"
        [[ "$name" =~ $NODE_RE ]] && printf '%s\n' "$name"
    done
}

container() { printf '%s%s' "$PREFIX" "$1"; }

# The lab's GPUStack venv (installed once, shared by every prefix: one writer at a time), the
# model files and the engine stand-ins.
prepare_gpustack_locked() {
    "$PY" "$REPO/tests/lab/prepare.py" venv "$GS_VENV" "$NODE_GS_VENV"
    "$PY" "$REPO/tests/lab/prepare.py" models "$LAB_DIR"
}

prepare_gpustack() {
    [[ -x "$PY" ]] || die "$PY missing: run scripts/bootstrap.sh"
    mkdir -p "$(dirname "$GS_VENV")"
    (
        flock -w 900 9 || die "timed out waiting for $GS_VENV.lock"
        prepare_gpustack_locked
    ) 9>"$GS_VENV.lock"
}

# A random secret in FILE (0600), made once and kept: reruns give the same config.
ensure_secret() {
    local file="$1"
    [[ -s "$file" ]] && return 0
    (umask 077; "$PY" -c 'import secrets; print(secrets.token_urlsafe(24), end="")' >"$file.tmp")
    mv "$file.tmp" "$file"
}

server_config() {
    mkdir -p "$GS_STATE"
    chmod 0700 "$GS_STATE"
    ensure_secret "$GS_STATE/bootstrap_password"
    ensure_secret "$GS_STATE/token"
    # The server reads its secrets from this file (mounted read-only), never from argv.
    (umask 077; {
        printf 'data_dir: /var/lib/gpustack\nport: %s\ndisable_worker: true\ndisable_update_check: true\n' "$SERVER_PORT"
        printf 'token: %s\nbootstrap_password: %s\n' "$(cat "$GS_STATE/token")" "$(cat "$GS_STATE/bootstrap_password")"
    } >"$GS_STATE/server.yaml.tmp")
    mv "$GS_STATE/server.yaml.tmp" "$GS_STATE/server.yaml"
}

container_ip() { podman container inspect --format '{{.NetworkSettings.IPAddress}}' "$(container "$1")"; }

has_layout() {
    [[ "$(podman container inspect --format '{{index .Config.Labels "kvpin.lab.layout"}}' "$(container "$1")" 2>/dev/null)" == "$LAYOUT" ]]
}

# podman rm -f races with a container that exits between SIGTERM and SIGKILL ("could not be
# stopped ... container state improper: stopped"): the container is stopped by then, so a second
# rm removes it. Give up (and fail) only when it is still there after a few tries.
remove_container() {
    local name tries
    name="$(container "$1")"
    for tries in 1 2 3 4 5; do
        podman rm -f -t 5 "$name" >/dev/null 2>&1 && return 0
        [[ "$(container_state "$1")" == absent ]] && return 0
        sleep "$tries"
    done
    podman rm -f -t 5 "$name" >/dev/null
}

start_server() {
    local state url
    server_config
    state="$(container_state "$SERVER")"
    if [[ "$state" != absent ]] && ! has_layout "$SERVER"; then
        remove_container "$SERVER"; state=absent
    fi
    case "$state" in
        running) log "$SERVER: already running" ;;
        absent)
            # The server sees the HF-style model dirs (its scheduler reads config.json) but not
            # the GGUF files: for a local path it cannot see, GPUStack 0.7.1 schedules without
            # gguf-parser (scheduler/calculator.py), as for files only on the workers' disks.
            podman run -d --name "$(container "$SERVER")" --hostname "$SERVER" --runtime runc \
                --ulimit nofile=20000:20000 --ulimit nproc=20000:20000 \
                --label kvpin.lab=1 --label kvpin.lab.layout="$LAYOUT" \
                -v "$GS_VENV:$NODE_GS_VENV:ro" -v "$LAB_DIR/models/hf:$NODE_MODELS/hf:ro" \
                -v "$GS_STATE/server.yaml:$SERVER_CONFIG:ro" \
                -e HF_HUB_OFFLINE=1 -e HF_HUB_DISABLE_TELEMETRY=1 \
                "$IMAGE" "$NODE_GS_VENV/bin/gpustack" start --config-file "$SERVER_CONFIG" >/dev/null
            log "$SERVER: started" ;;
        *)
            podman start "$(container "$SERVER")" >/dev/null
            log "$SERVER: restarted from state '$state'" ;;
    esac
    url="http://$(container_ip "$SERVER"):$SERVER_PORT"
    printf '%s\n' "$url" >"$GS_STATE/server_url.tmp"
    chmod 0644 "$GS_STATE/server_url.tmp"
    mv "$GS_STATE/server_url.tmp" "$GS_STATE/server_url"
    # Waits for /healthz, then makes (or checks) the API key the inventory uses.
    "$PY" "$REPO/tests/lab/prepare.py" server "$GS_STATE" "$SERVER_TIMEOUT_S" \
        || { podman logs --tail 30 "$(container "$SERVER")" >&2 || true; die "$SERVER: not ready"; }
}

container_state() { podman container inspect --format '{{.State.Status}}' "$(container "$1")" 2>/dev/null || echo absent; }

wait_booted() {
    local node="$1" deadline=$((SECONDS + BOOT_TIMEOUT_S)) state
    while :; do
        state="$(podman exec "$(container "$node")" systemctl is-system-running 2>/dev/null || true)"
        case "$state" in
            running|degraded) log "$node: systemd $state"; return 0 ;;
        esac
        ((SECONDS < deadline)) || die "$node: systemd not up after ${BOOT_TIMEOUT_S}s (state '${state:-none}')"
        sleep 1
    done
}

# Copy FILE in as the node's NVML fixture (what the stub answers). Used by `up` and by tests that
# swap a node's cards; the next gpu_facts run reads the new file (the stub reads it at nvmlInit).
set_fixture() {
    local node="$1" file="$2"
    known_node "$node"
    [[ -r "$file" ]] || die "fixture '$file' not readable"
    podman exec "$(container "$node")" mkdir -p "$(dirname "$NODE_FIXTURE_PATH")"
    podman cp "$file" "$(container "$node"):$NODE_FIXTURE_PATH"
    podman exec "$(container "$node")" chmod 0644 "$NODE_FIXTURE_PATH"
}

install_stub() {
    local node="$1"
    [[ -r "$STUB_LIB" ]] || die "NVML stub library $STUB_LIB missing: run tests/nvml_stub/build.sh (scripts/bootstrap.sh does)"
    podman cp "$STUB_LIB" "$(container "$node"):$NODE_LIB_DIR/libnvidia-ml.so.1"
    podman exec "$(container "$node")" ldconfig
    # GPUStack 0.7.1 detects GPUs with the nvidia-smi CLI: the fake answers from the same fixture.
    podman cp "$NVIDIA_SMI" "$(container "$node"):$NODE_NVIDIA_SMI"
    podman exec "$(container "$node")" chmod 0755 "$NODE_NVIDIA_SMI"
}

start_node() {
    local node="$1" state
    state="$(container_state "$node")"
    if [[ "$state" != absent ]] && ! has_layout "$node"; then
        log "$node: made before the GPUStack lab layout: recreating it"
        remove_container "$node"; state=absent
    fi
    case "$state" in
        running) log "$node: already running" ;;
        absent)
            # GPUStack's venv, the lab's models and the engine stand-ins, read-only.
            podman run -d --name "$(container "$node")" --hostname "$node" "${RUN_OPTS[@]}" \
                --label kvpin.lab=1 --label kvpin.lab.layout="$LAYOUT" \
                -v "$GS_VENV:$NODE_GS_VENV:ro" -v "$LAB_DIR/models:$NODE_MODELS:ro" \
                -v "$LAB_DIR/engines:$NODE_ENGINES:ro" \
                "$IMAGE" /sbin/init >/dev/null
            log "$node: started" ;;
        *)
            # Stopped/exited/created: start the same container (keeps what converge installed).
            podman start "$(container "$node")" >/dev/null
            log "$node: restarted from state '$state'" ;;
    esac
    wait_booted "$node"
    install_stub "$node"
    set_fixture "$node" "$FIXTURE_DIR/$(node_layout "$node").json"
}

cmd_up() {
    local nodes=("$@") n whole=0
    ((${#nodes[@]})) || { nodes=("${NODES[@]}"); whole=1; }
    for n in "${nodes[@]}"; do known_node "$n"; done
    [[ -r "$STUB_LIB" ]] || die "NVML stub library $STUB_LIB missing: run tests/nvml_stub/build.sh (scripts/bootstrap.sh does)"
    for n in "${nodes[@]}"; do
        [[ -r "$FIXTURE_DIR/$(node_layout "$n").json" ]] || die "fixture $FIXTURE_DIR/$(node_layout "$n").json missing"
    done
    ensure_image
    prepare_gpustack
    start_server
    if ((whole)); then
        # The whole fleet at this size: nodes of a larger earlier `up` go, the count is recorded.
        for n in $(existing_nodes); do
            [[ " ${NODES[*]} " == *" $n "* ]] || { remove_container "$n"; log "$n: removed (beyond $NODE_COUNT nodes)"; }
        done
        printf '%s\n' "${#NODES[@]}" >"$NODE_RECORD.tmp" && mv "$NODE_RECORD.tmp" "$NODE_RECORD"
    fi
    for n in "${nodes[@]}"; do start_node "$n"; done
}

cmd_down() {
    local nodes=("$@") n
    # Without nodes: every node of this prefix, whatever count `up` made.
    ((${#nodes[@]})) || mapfile -t nodes < <(existing_nodes)
    for n in "${nodes[@]}"; do
        known_node "$n"
        if [[ "$(container_state "$n")" != absent ]]; then
            remove_container "$n"
            log "$n: removed"
        fi
    done
    # The server goes with the whole fleet; its secrets stay (the next server gets the same).
    if (($# == 0)) && [[ "$(container_state "$SERVER")" != absent ]]; then
        remove_container "$SERVER"
        rm -f "$GS_STATE/api_key" "$GS_STATE/server_url" "$NODE_RECORD"
        log "$SERVER: removed"
    fi
}

cmd_status() {
    local n state boot rc=0 nodes
    if image_exists; then echo "image   $IMAGE present"; else echo "image   $IMAGE absent"; fi
    state="$(container_state "$SERVER")"
    printf '%-14s %-10s url=%-24s container=%s\n' "$SERVER" "$state" "$(cat "$GS_STATE/server_url" 2>/dev/null || echo -)" "$(container "$SERVER")"
    [[ "$state" == running ]] || rc=3
    # The fleet inventory/lab sees (KVPIN_LAB_NODES, else the count `up` recorded, else 4).
    mapfile -t nodes < <(KVPIN_LAB_DIR="$LAB_DIR" python3 "$LAB_NODES_PY" --names)
    for n in "${nodes[@]}"; do
        state="$(container_state "$n")"
        boot=-
        [[ "$state" == running ]] && boot="$(podman exec "$(container "$n")" systemctl is-system-running 2>/dev/null || true)"
        printf '%-14s %-10s systemd=%-8s container=%s\n' "$n" "$state" "${boot:--}" "$(container "$n")"
        [[ "$state" == running ]] || rc=3
    done
    return "$rc"
}

# Memory and CPU per container of this prefix's lab (server and nodes), one podman stats sample,
# then the nodes' total and mean. CPU % is of one core, over podman's sampling interval.
cmd_stats() {
    local names=("$(container "$SERVER")") n
    for n in $(existing_nodes); do names+=("$(container "$n")"); done
    podman stats --no-stream --format '{{.Name}}\t{{.ContainerStats.MemUsage}}\t{{.ContainerStats.CPUNano}}\t{{.ContainerStats.CPU}}' \
        "${names[@]}" | "$PY" -c "$STATS_PY" "$(container "$SERVER")"
}

# podman stats (name, memory bytes, CPU ns since start, CPU % of one core) -> a table in MiB,
# CPU seconds and % (podman's last sample), then the nodes' sum and mean per node.
STATS_PY='
import sys
server = sys.argv[1]
rows = []
for line in sys.stdin:
    name, mem, cpu_ns, cpu = line.rstrip("\n").split("\t")
    rows.append((name, int(mem) / 2**20, int(cpu_ns) / 1e9, float(cpu)))
print("%-28s %10s %10s %8s" % ("container", "mem MiB", "CPU s", "CPU %"))
for row in sorted(rows):
    print("%-28s %10.1f %10.1f %8.2f" % row)
nodes = [r for r in rows if r[0] != server]
if nodes:
    sums = [sum(r[i] for r in nodes) for i in (1, 2, 3)]
    print("%-28s %10.1f %10.1f %8.2f" % tuple(["nodes: %d, sum" % len(nodes)] + sums))
    print("%-28s %10.1f %10.1f %8.2f" % tuple(["nodes: mean per node"] + [v / len(nodes) for v in sums]))
'


rebuild_image_locked() {
    local users
    users="$(image_users | tr '\n' ' ')"
    # Never force: removing an image in use would remove those containers with it.
    [[ -z "${users// /}" ]] || die "image $IMAGE is in use by: $users(run '$0 down'; other prefixes are other runs)"
    if image_exists; then podman rmi "$IMAGE" >/dev/null || die "podman rmi $IMAGE failed"; fi
    build_image
}

cmd_rebuild_image() { with_image_lock rebuild_image_locked; }

main() {
    [[ $EUID -eq 0 ]] || die "run as root (podman + runc with systemd containers)"
    mkdir -p "$LAB_DIR"
    local cmd="${1:-}"
    shift || true
    case "$cmd" in
        up) cmd_up "$@" ;;
        down) cmd_down "$@" ;;
        status) cmd_status ;;
        stats) cmd_stats ;;
        image) ensure_image ;;
        rebuild-image) cmd_rebuild_image ;;
        set-fixture) (($# == 2)) || die "usage: $0 set-fixture NODE FILE"; set_fixture "$1" "$2" ;;
        nodes) printf '%s\n' "${NODES[@]}" ;;
        gpustack-venv) prepare_gpustack ;;
        *) die "usage: $0 up [NODE...] | down [NODE...] | status | stats | image | rebuild-image | set-fixture NODE FILE | nodes | gpustack-venv" ;;
    esac
}

main "$@"
