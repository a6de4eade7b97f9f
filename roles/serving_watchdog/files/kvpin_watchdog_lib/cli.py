# -*- coding: utf-8 -*-
# Copyright (c) 2026, kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Command line: the subcommands of kvpin_watchdog (the package docstring says what each does)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Iterable, Optional

from . import __doc__ as PROGRAM_DOC
from .config import due_profile, load_config, validate_config
from .trace_replay import replay
from .measure import MeasureError, measure_pages, parse_engine_log, read_state_file
from .daemon import Daemon, switch_profile


# ---------------------------------------------------------------------------
# CLI.
# ---------------------------------------------------------------------------
def main(argv: Optional[Iterable[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="kvpin_watchdog", description=PROGRAM_DOC.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("daemon", help="watch one target")
    d.add_argument("--config", required=True)
    d.add_argument("--once", action="store_true", help="run one tick and exit")
    r = sub.add_parser("replay", help="replay a CSV trace through the decision engine")
    r.add_argument("--trace", required=True)
    r.add_argument("--config")
    r.add_argument("--actions-only", action="store_true", help="print only alert/recycle lines")
    m = sub.add_parser("measure", help="measured traffic from /metrics pages, or the KV pool from a startup log; "
                                       "prints one JSON object")
    source = m.add_mutually_exclusive_group(required=True)
    source.add_argument("--metrics", nargs="+", metavar="PAGE",
                        help="successive /metrics pages of one engine, oldest first")
    source.add_argument("--engine-log", metavar="FILE", help="the engine's startup log")
    source.add_argument("--state", metavar="FILE",
                        help="a watchdog's saved traffic state (traffic_state_file): its rolling window")
    m.add_argument("--hour", type=int, choices=range(24), metavar="0..23",
                   help="hour of day the pages' traffic is counted in (default: now, local time)")
    m.add_argument("--block-size", type=int, metavar="N",
                   help="tokens per block, for a V0 log that states blocks only (vLLM's CUDA default: 16)")
    c = sub.add_parser("check-config", help="validate a daemon config file and exit")
    c.add_argument("--config", required=True)
    p = sub.add_parser("switch-profile", help="switch the deployment to one of its profiles through GPUStack")
    p.add_argument("--config", required=True)
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--profile", help="this profile")
    which.add_argument("--due", action="store_true", help="the profile profile_schedule gives for now (local time)")
    args = parser.parse_args(list(argv) if argv is not None else None)
    if args.command == "measure":
        return _measure(args)
    try:
        cfg = load_config(args.config)
    except (OSError, ValueError) as exc:
        sys.stderr.write("kvpin_watchdog: %s\n" % exc)
        return 2
    if args.command == "replay":
        try:
            replay(args.trace, cfg, actions_only=args.actions_only)
        except (OSError, ValueError, KeyError) as exc:
            sys.stderr.write("kvpin_watchdog: %s\n" % exc)
            return 2
        return 0
    errors = validate_config(cfg)
    if args.command == "check-config" or errors:
        for error in errors:
            sys.stderr.write("kvpin_watchdog: %s: %s\n" % (args.config, error))
        return 2 if errors else 0
    if args.command == "switch-profile":
        if args.due:
            if not cfg.get("profile_schedule"):
                sys.stderr.write("kvpin_watchdog: %s: --due needs profile_schedule\n" % args.config)
                return 2
            now = time.localtime()
            return switch_profile(cfg, due_profile(cfg["profile_schedule"], now.tm_hour * 60 + now.tm_min))
        return switch_profile(cfg, args.profile)
    daemon = Daemon(cfg)
    if args.once:
        daemon.tick()
        return 0
    return daemon.run()


def _measure(args: argparse.Namespace) -> int:
    """measure: one JSON object on stdout; a page or log it cannot use is one line on stderr, exit 2."""
    if args.block_size is not None and not 1 <= args.block_size <= 4096:
        sys.stderr.write("kvpin_watchdog: measure: --block-size must be 1..4096, got %d\n" % args.block_size)
        return 2
    try:
        if args.metrics:
            result = measure_pages(args.metrics, hour_of_day=args.hour)
        elif args.state:
            result = read_state_file(args.state)
        else:
            result = parse_engine_log(args.engine_log, block_size=args.block_size)
    except (OSError, MeasureError) as exc:
        sys.stderr.write("kvpin_watchdog: measure: %s\n" % exc)
        return 2
    sys.stdout.write(json.dumps(result, sort_keys=True) + "\n")
    return 0
