# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Structurally valid safetensors files for the loader tests (importable from any test: pytest
puts tests/ on sys.path for tests/conftest.py)."""

from __future__ import annotations

import json
import struct


def write_safetensors(path, tensors, dtype='BF16'):
    """Write ``tensors`` ({name: bytes}) as a safetensors file at ``path``: u64 header length,
    JSON header (each tensor 2-byte elements of ``dtype``, back to back), zero payload."""
    header, offset = {'__metadata__': {'format': 'pt'}}, 0
    for name, size in tensors.items():
        header[name] = {'dtype': dtype, 'shape': [size // 2], 'data_offsets': [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    with open(path, 'wb') as handle:
        handle.write(struct.pack('<Q', len(raw)))
        handle.write(raw)
        handle.write(b'\0' * offset)
