# -*- coding: utf-8 -*-
# Copyright (c) 2026, kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""`python3 -m kvpin_watchdog_lib ...`: the same command as ../kvpin_watchdog.py."""

import sys

from .cli import main

sys.exit(main())
