# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Read the metadata and tensor table of GGUF files (one file or a split set).

Only the header is parsed: ``gguf.GGUFReader`` memory-maps the file and builds views,
no tensor data is read. Split models (``name-00001-of-00003.gguf``) are read shard by
shard; metadata comes from the first shard, tensors from all of them.
"""

from __future__ import annotations

import importlib.util
import os
import re
import stat
import struct
from dataclasses import dataclass, field
from typing import Dict, List

from ansible_collections.kvpin.fleet.plugins.module_utils.plan.model_spec import ModelSpecError

# gguf is optional, and imported on first use (require_gguf): it pulls numpy in (~150 ms), which
# every Ansible worker process that loads the planner or a filter would pay for, GGUF or not.
try:
    HAS_GGUF = importlib.util.find_spec('gguf') is not None
except (ImportError, ValueError):  # a broken or half-installed package
    HAS_GGUF = False
GGUF_IMPORT_ERROR = None if HAS_GGUF else ImportError("No module named 'gguf'")
gguf = None

GGUF_MAGIC = b'GGUF'
GGUF_VERSIONS = (2, 3)
# Arrays longer than this (token lists, merges) are summarised by their length only.
MAX_ARRAY_VALUES = 4096
# Counts no real model file has (the largest hold a few thousand tensors and a few dozen
# keys); they bound the reader's work before it starts.
MAX_TENSORS = 1 << 16
MAX_KV = 1 << 12
MAX_SPLITS = 1024
# The fewest bytes one header entry takes: a tensor info is a name (u64 length + >= 1 byte),
# n_dims (u32), >= 1 dimension (u64), type (u32) and offset (u64); a key/value is a key
# (u64 + >= 1 byte), a value type (u32) and >= 1 byte of value.
MIN_TENSOR_INFO_BYTES = 8 + 1 + 4 + 8 + 4 + 8
MIN_KV_BYTES = 8 + 1 + 4 + 1
HEADER_BYTES = 4 + 4 + 8 + 8
# What the parser raises on a malformed file (numpy's errors are ValueError/IndexError).
PARSE_ERRORS = (ValueError, OSError, KeyError, IndexError, TypeError, AttributeError,
                OverflowError, MemoryError, struct.error, RecursionError)
SPLIT_NAME_RE = re.compile(r'^(?P<stem>.*)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$')


@dataclass(frozen=True)
class GGUFTensorInfo:
    name: str
    type_name: str          # GGML type, e.g. 'Q8_0', 'F16'
    shape: List[int]        # GGUF order (fastest dimension first)
    n_elements: int
    n_bytes: int            # bytes as stored (quantized blocks)
    file: str


@dataclass
class GGUFSummary:
    """Metadata and tensor table of one GGUF model (all shards)."""
    path: str
    files: List[str]
    metadata: Dict[str, object]
    array_lengths: Dict[str, int]             # every array key -> its length
    tensors: List[GGUFTensorInfo] = field(default_factory=list)

    def get(self, key, default=None):
        return self.metadata.get(key, default)


def require_gguf():
    """The ``gguf`` package, imported now if not yet; a ModelSpecError that says what to install
    when it is missing or cannot be imported."""
    global gguf, HAS_GGUF, GGUF_IMPORT_ERROR  # pylint: disable=global-statement  # a lazy import
    if HAS_GGUF and gguf is None:
        try:
            import gguf as gguf_package  # pylint: disable=import-outside-toplevel
        except ImportError as exc:
            HAS_GGUF, GGUF_IMPORT_ERROR = False, exc
        else:
            gguf = gguf_package
    if not HAS_GGUF:
        raise ModelSpecError(
            'model', "reading GGUF files needs the Python package 'gguf' on the host that "
            "runs the planner (pip install gguf): %s" % (GGUF_IMPORT_ERROR,))
    return gguf


def check_regular_file(path):
    """ModelSpecError unless ``path`` (after symlinks) is a regular file: a FIFO or device
    would block or never end."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise ModelSpecError('model', 'cannot read %s: %s' % (path, exc.strerror or exc))
    if not stat.S_ISREG(mode):
        raise ModelSpecError('model', '%s is not a regular file' % path)


def check_magic(path):
    """ModelSpecError unless ``path`` is a regular file that starts like a GGUF file:
    magic, a known version, and tensor and key counts that a file of its size can hold.
    The error says what is wrong, never what the file holds (the path may be a symlink
    to any file)."""
    check_regular_file(path)
    try:
        size = os.path.getsize(path)
        with open(path, 'rb') as handle:
            head = handle.read(HEADER_BYTES)
    except OSError as exc:
        raise ModelSpecError('model', 'cannot read %s: %s' % (path, exc.strerror or exc))
    if head[:4] != GGUF_MAGIC:
        raise ModelSpecError('model', '%s is not a GGUF file (it does not start with the GGUF '
                             'magic)' % path)
    if len(head) < HEADER_BYTES:
        raise ModelSpecError('model', '%s is not a GGUF file: shorter than the %d-byte header'
                             % (path, HEADER_BYTES))
    version, n_tensors, n_kv = struct.unpack('<IQQ', head[4:])
    if version not in GGUF_VERSIONS:
        raise ModelSpecError('model', '%s: GGUF version is not one of %s (big-endian and old '
                             'files are not read)' % (path, GGUF_VERSIONS))
    room = size - HEADER_BYTES
    if (n_tensors > MAX_TENSORS or n_kv > MAX_KV
            or n_tensors * MIN_TENSOR_INFO_BYTES + n_kv * MIN_KV_BYTES > room):
        raise ModelSpecError('model', '%s: GGUF header cannot be parsed: it claims %d tensors and '
                             '%d keys; at most %d and %d are read, and a %d-byte file holds fewer '
                             '(truncated or not a model)'
                             % (path, n_tensors, n_kv, MAX_TENSORS, MAX_KV, size))


def split_files(path):
    """All shards of a split GGUF, in order, given any one of them (else ``[path]``)."""
    match = SPLIT_NAME_RE.match(os.path.basename(path))
    if not match:
        return [path]
    count = int(match.group('count'))
    if not 1 <= count <= MAX_SPLITS:
        raise ModelSpecError('model', 'split GGUF %s claims %d files (1..%d)' % (path, count, MAX_SPLITS))
    folder = os.path.dirname(path)
    files = [os.path.join(folder, '%s-%05d-of-%05d.gguf' % (match.group('stem'), i, count))
             for i in range(1, count + 1)]
    missing = [f for f in files if not os.path.isfile(f)]
    if missing:
        raise ModelSpecError('model', 'split GGUF %s needs %d files; missing: %s'
                             % (path, count, ', '.join(missing)))
    return files


def _field_value(reader_field, array_lengths):
    """Python value of one GGUF key; long arrays become ``None`` (length recorded)."""
    types = reader_field.types
    if types and types[0] == gguf.GGUFValueType.ARRAY:
        array_lengths[reader_field.name] = len(reader_field.data)
        if len(reader_field.data) > MAX_ARRAY_VALUES:
            return None
    return reader_field.contents()


def _read_one(path):
    check_magic(path)
    try:
        reader = gguf.GGUFReader(path, 'r')
        metadata = {}
        array_lengths = {}
        for name, reader_field in reader.fields.items():
            if name.startswith('GGUF.'):
                continue
            metadata[name] = _field_value(reader_field, array_lengths)
        tensors = [GGUFTensorInfo(name=str(t.name), type_name=t.tensor_type.name,
                                  shape=[int(d) for d in t.shape], n_elements=int(t.n_elements),
                                  n_bytes=int(t.n_bytes), file=path)
                   for t in reader.tensors]
    except PARSE_ERRORS as exc:
        # The parser's messages may quote the bytes it choked on: name the error class only.
        raise ModelSpecError('model', '%s: GGUF header cannot be parsed (%s: malformed or '
                             'truncated file)' % (path, type(exc).__name__))
    data = sum(t.n_bytes for t in tensors)
    if data > os.path.getsize(path):
        raise ModelSpecError('model', '%s: the tensor table claims %d B of tensor data, more than the '
                             '%d-byte file holds' % (path, data, os.path.getsize(path)))
    return metadata, array_lengths, tensors


def read_gguf(path):
    """Summary of the GGUF model at ``path`` (any shard of a split set names the set)."""
    require_gguf()
    if not os.path.lexists(path):
        raise ModelSpecError('model', 'GGUF file %s does not exist' % (path,))
    check_magic(path)
    files = split_files(path)
    metadata, array_lengths, tensors = _read_one(files[0])
    declared = metadata.get('split.count')
    if declared is not None and (isinstance(declared, bool) or not isinstance(declared, int)):
        raise ModelSpecError('model', '%s: GGUF key split.count must be an integer' % files[0])
    if declared is not None and int(declared) != len(files):
        raise ModelSpecError('model', '%s declares split.count=%s but %d file(s) were found'
                             % (files[0], declared, len(files)))
    for shard in files[1:]:
        _meta, _lengths, shard_tensors = _read_one(shard)
        tensors.extend(shard_tensors)
    return GGUFSummary(path=files[0], files=files, metadata=metadata,
                       array_lengths=array_lengths, tensors=tensors)
