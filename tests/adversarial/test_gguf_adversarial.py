# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Hostile GGUF files (issue 11 items 6, 7, 9): lying counts, wrong types, out-of-range
geometry, truncation, symlinks and special files. Every one is refused with a message that
names what is wrong, never with a traceback, a hang, or the bytes of the file."""

from __future__ import annotations

import os
import signal
import struct

import pytest

from model_files import (ARRAY, BOOL, FLOAT32, INT32, STRING, UINT32, UINT64, gguf_bytes, gstr,
                         llama_kvs, params, write)

from ansible_collections.kvpin.fleet.plugins.module_utils.plan import model_loaders as ml
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.model_spec import ModelSpecError
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.serving_plan import serving_plan_result

pytest.importorskip('gguf')


@pytest.fixture(autouse=True)
def hang_guard():
    """A hostile file must never keep the reader busy: fail the test instead of hanging CI
    (a guard against hangs, not a speed assertion)."""
    def _alarm(signum, frame):
        raise AssertionError('the GGUF reader or the planner was still busy after 60 s')
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def refused(path, *fragments):
    with pytest.raises(ModelSpecError) as err:
        ml.resolve_model(str(path))
    assert err.value.field == 'model'
    for fragment in fragments:
        assert fragment in str(err.value), str(err.value)
    return str(err.value)


def test_a_valid_raw_file_is_read(tmp_path):
    # the builder itself is right: a well-formed file plans, so the refusals below are the
    # lies in them and nothing else
    spec = ml.resolve_model(write(tmp_path / 'ok.gguf', gguf_bytes(llama_kvs())))
    assert spec.num_layers == 2 and spec.num_kv_heads == 2 and spec.weight_bytes == 2 * 64 * 4


def test_42_kb_file_claiming_a_million_blocks_is_refused(tmp_path):
    path = write(tmp_path / 'million.gguf', gguf_bytes(
        llama_kvs(overrides={'llama.block_count': (UINT32, 1000000)}), pad_to=42 * 1024))
    assert os.path.getsize(path) == 42 * 1024
    refused(path, 'llama.block_count = 1000000 is out of range (1..256)')
    # and through the task entry point, as a normal failure naming the field
    result = serving_plan_result(params(model=path, backend='llama.cpp', backend_version='b6327'))
    assert result['failed'] and result['field'] == 'model' and 'block_count' in result['msg']


@pytest.mark.parametrize('n_tensors, n_kv', [(1 << 40, 10), (10, 1 << 40), (1 << 63, 1 << 63),
                                             (3000, 10)])
def test_header_counts_no_file_can_hold_are_refused_before_parsing(tmp_path, n_tensors, n_kv):
    path = write(tmp_path / 'counts.gguf', gguf_bytes(llama_kvs(), n_tensors=n_tensors, n_kv=n_kv))
    refused(path, 'GGUF header cannot be parsed', 'claims %d tensors and %d keys' % (n_tensors, n_kv))


@pytest.mark.parametrize('key, vtype, value, fragment', [
    ('llama.context_length', UINT32, 0, 'llama.context_length = 0 is out of range'),
    ('llama.attention.head_count_kv', UINT32, 8, 'has 8 KV heads for 4 attention heads'),
    ('llama.attention.head_count_kv', UINT32, 3, 'KV heads must divide the heads'),
    ('llama.attention.sliding_window', INT32, -5, 'llama.attention.sliding_window = -5 is out of range'),
    ('llama.attention.head_count', UINT32, 0, 'head_count is 0 on every layer'),
    ('llama.embedding_length', UINT32, 0, 'llama.embedding_length = 0 is out of range'),
    ('llama.embedding_length', UINT64, 1 << 40, 'out of range'),
    ('llama.block_count', INT32, -1, 'llama.block_count = -1 is out of range'),
    ('llama.block_count', STRING, '2', 'llama.block_count must be an integer'),
    ('llama.block_count', FLOAT32, 2.0, 'llama.block_count must be an integer'),
    ('llama.block_count', BOOL, True, 'llama.block_count must be an integer'),
    ('llama.block_count', ARRAY, (UINT32, [2, 2]), 'block_count must be one integer'),
    ('llama.attention.head_count_kv', ARRAY, (UINT32, [2, 2, 2]), 'has 3 entries for 2 layers'),
    ('llama.attention.head_count_kv', ARRAY, (UINT32, [2] * 5000), 'array of 5000 entries'),
    ('llama.attention.key_length', UINT32, 0, 'key_length = 0 is out of range'),
    ('llama.vocab_size', UINT32, 1 << 30, 'llama.vocab_size = 1073741824 is out of range'),
    ('llama.expert_count', UINT32, 1 << 20, 'expert_count'),
    ('llama.expert_used_count', UINT32, 4, 'num_experts_per_tok'),
    ('general.file_type', STRING, 'Q4_K_M', 'general.file_type must be a small integer'),
    ('general.architecture', UINT32, 7, 'general.architecture is not an architecture name'),
    ('general.architecture', STRING, '../../etc', 'general.architecture is not an architecture name'),
])
def test_metadata_out_of_type_or_range_is_refused_by_name(tmp_path, key, vtype, value, fragment):
    path = write(tmp_path / 'bad.gguf', gguf_bytes(llama_kvs(overrides={key: (vtype, value)})))
    refused(path, fragment)


def test_truncated_string_is_refused(tmp_path):
    raw = gguf_bytes(llama_kvs())
    # cut inside general.name's text: the string claims more bytes than remain
    cut = raw.index(b'tiny-adversarial') + 4
    path = write(tmp_path / 'cut.gguf', raw[:cut] + b'\0' * 200)
    refused(path, 'cannot be parsed')


def test_string_length_past_the_file_is_refused(tmp_path):
    raw = bytearray(gguf_bytes(llama_kvs()))
    at = raw.index(b'tiny-adversarial') - 8
    raw[at:at + 8] = struct.pack('<Q', 1 << 50)
    refused(write(tmp_path / 'long.gguf', bytes(raw)), 'cannot be parsed')


def test_huge_array_length_is_refused(tmp_path):
    entries = llama_kvs() + [('tokenizer.ggml.tokens', ARRAY, (STRING, ['a', 'b']))]
    raw = bytearray(gguf_bytes(entries))
    at = raw.index(gstr('tokenizer.ggml.tokens')) + len(gstr('tokenizer.ggml.tokens')) + 4 + 4
    raw[at:at + 8] = struct.pack('<Q', 1 << 60)
    refused(write(tmp_path / 'array.gguf', bytes(raw)), 'cannot be parsed')


def test_unknown_value_type_is_refused(tmp_path):
    raw = bytearray(gguf_bytes(llama_kvs()))
    at = raw.index(gstr('llama.block_count')) + len(gstr('llama.block_count'))
    raw[at:at + 4] = struct.pack('<I', 99)
    refused(write(tmp_path / 'type.gguf', bytes(raw)), 'cannot be parsed')


def test_tensor_data_past_the_end_is_refused(tmp_path):
    # the second tensor claims 4 GiB of data in a file of a few hundred bytes
    raw = gguf_bytes(llama_kvs(), tensors=[('blk.0.attn_norm.weight', [64]),
                                           ('blk.1.attn_norm.weight', [1 << 30])], data=False)
    refused(write(tmp_path / 'data.gguf', raw + b'\0' * 256), 'cannot be parsed')


def test_unknown_version_is_refused(tmp_path):
    refused(write(tmp_path / 'v9.gguf', gguf_bytes(llama_kvs(), version=9)), 'GGUF version')


def test_missing_geometry_key_is_named(tmp_path):
    path = write(tmp_path / 'nokey.gguf', gguf_bytes(llama_kvs(drop=('llama.block_count',))))
    refused(path, 'GGUF key llama.block_count is missing')


SECRET = b'root:$6$kvpinSECRETsalt$hashhashhash:19000:0:99999:7:::\n'


def test_symlink_to_another_file_never_echoes_its_bytes(tmp_path):
    target = tmp_path / 'shadow'
    target.write_bytes(SECRET)
    link = tmp_path / 'model.gguf'
    os.symlink(str(target), str(link))
    message = refused(link, 'is not a GGUF file').replace(str(tmp_path), '')
    for fragment in ('root', 'SECRET', '$6$', 'hash', repr(SECRET[:4])[2:-1]):
        assert fragment not in message
    result = serving_plan_result(params(model=str(link), backend='llama-box', backend_version='v0.0.171'))
    assert result['failed'] and result['field'] == 'model'
    assert 'root' not in result['msg'].replace(str(tmp_path), '') and 'SECRET' not in result['msg']


def test_symlink_to_a_file_starting_with_the_magic_never_echoes_the_rest(tmp_path):
    target = tmp_path / 'looks-like-gguf'
    target.write_bytes(b'GGUF' + SECRET * 4)
    link = tmp_path / 'm.gguf'
    os.symlink(str(target), str(link))
    message = refused(link).replace(str(tmp_path), '')
    for fragment in ('root', 'SECRET', '$6$', 'hash'):
        assert fragment not in message


def test_fifo_is_refused_without_blocking(tmp_path):
    path = tmp_path / 'pipe.gguf'
    os.mkfifo(str(path))
    refused(path, 'is not a regular file')


def test_directory_named_gguf_is_refused(tmp_path):
    path = tmp_path / 'dir.gguf'
    path.mkdir()
    refused(path, 'is not a regular file')


def test_split_name_claiming_absurd_shard_count_is_refused(tmp_path):
    path = write(tmp_path / 'm-00001-of-99999.gguf', gguf_bytes(llama_kvs()))
    refused(path, 'claims 99999 files')


def test_split_count_of_the_wrong_type_is_refused(tmp_path):
    path = write(tmp_path / 'split.gguf', gguf_bytes(llama_kvs(overrides={'split.count': (STRING, '2')})))
    refused(path, 'split.count must be an integer')
