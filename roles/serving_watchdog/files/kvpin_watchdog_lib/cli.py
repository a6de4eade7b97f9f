# -*- coding: utf-8 -*-
# Copyright (c) 2026, kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Command line: the subcommands of kvpin_watchdog (the package docstring says what each does)."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Iterable, Optional

from . import __doc__ as PROGRAM_DOC
from .config import due_profile, load_config, validate_config
from .trace_replay import replay
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
    c = sub.add_parser("check-config", help="validate a daemon config file and exit")
    c.add_argument("--config", required=True)
    p = sub.add_parser("switch-profile", help="switch the deployment to one of its profiles through GPUStack")
    p.add_argument("--config", required=True)
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--profile", help="this profile")
    which.add_argument("--due", action="store_true", help="the profile profile_schedule gives for now (local time)")
    args = parser.parse_args(list(argv) if argv is not None else None)
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
