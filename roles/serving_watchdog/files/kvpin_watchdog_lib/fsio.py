# -*- coding: utf-8 -*-
# Copyright (c) 2026, kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Small file reads (kernel files, the key file, the profile marker) and atomic writes."""

from __future__ import annotations

import os
import tempfile
from typing import Optional


def _read(path: str) -> Optional[str]:
    try:
        with open(path, "r", encoding="utf-8") as handle:
            return handle.read()
    except OSError:
        return None


def _read_small(path: str, limit: int = 65536) -> Optional[str]:
    """A small kernel file (/proc/PID/stat, status) read without the text-layer objects open()
    builds: the process-tree walk reads one per process of the node every tick. At most `limit`
    bytes; bytes that are not UTF-8 (a process name is any bytes) are replaced, not an error."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        chunks, size = [], 0
        while size < limit:
            chunk = os.read(fd, min(8192, limit - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError:
        return None
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8", "replace")


def write_file_atomically(path: str, text: str, prefix: str) -> str:
    """Write ``text`` to ``path`` (mode 0644) through a temporary file in its directory, so a
    reader sees the old file or the new one, never half of one; returns ``path``."""
    fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=os.path.dirname(path))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path
