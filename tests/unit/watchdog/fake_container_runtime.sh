#!/bin/sh
# Copyright (c) 2026, kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
#
# Test double of `podman` / `docker` (tests and benchmarks only; linked into a bin dir on PATH
# under the runtime's name). It answers the one call the watchdog makes,
#   <runtime> inspect --format {{.State.Pid}} NAME
# with the PID given for NAME in $KVPIN_FAKE_RUNTIME_PIDS (lines "NAME PID"), and fails like
# podman ("Error: no such object", exit 125) for a NAME it does not know or any other call.
# Every call appends "<runtime> <argv>" to $KVPIN_FAKE_RUNTIME_LOG when that is set, so a
# test counts the calls. Shell builtins only: no process is started per call.
if [ -n "${KVPIN_FAKE_RUNTIME_LOG:-}" ]; then
    printf '%s %s\n' "${0##*/}" "$*" >> "$KVPIN_FAKE_RUNTIME_LOG"
fi
if [ "$#" -eq 4 ] && [ "$1" = "inspect" ] && [ "$2" = "--format" ] && [ "$3" = "{{.State.Pid}}" ]; then
    if [ -n "${KVPIN_FAKE_RUNTIME_PIDS:-}" ] && [ -r "$KVPIN_FAKE_RUNTIME_PIDS" ]; then
        while read -r name pid; do
            if [ "$name" = "$4" ]; then
                printf '%s\n' "$pid"
                exit 0
            fi
        done < "$KVPIN_FAKE_RUNTIME_PIDS"
    fi
    printf 'Error: no such object: "%s"\n' "$4" >&2
    exit 125
fi
printf 'fake container runtime: unsupported call: %s\n' "$*" >&2
exit 125
