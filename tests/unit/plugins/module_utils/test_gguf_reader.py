# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""GGUF reading: small GGUF files written with gguf.GGUFWriter in tmp_path."""

from __future__ import annotations

import os

import pytest

from ansible_collections.kvpin.fleet.plugins.module_utils.plan import gguf_reader
from ansible_collections.kvpin.fleet.plugins.module_utils.plan import model_loaders as ml
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.model_spec import (
    LAYER_FULL, LAYER_SLIDING, ModelSpecError)

gguf = pytest.importorskip('gguf')
Q8_0 = gguf.GGMLQuantizationType.Q8_0

N_EMBD, N_FF, N_HEAD, N_HEAD_KV, N_VOCAB, N_LAYER = 64, 128, 4, 2, 32, 3
HEAD_DIM = N_EMBD // N_HEAD


def q8_bytes(rows, cols):
    # Q8_0 stores 32 values in 34 bytes (fp16 scale + 32 int8)
    return rows * cols // 32 * 34


def _q8(rows, cols):
    import numpy as np
    return np.zeros((rows, cols // 32 * 34), dtype=np.uint8)


def _f16(*shape):
    import numpy as np
    return np.zeros(shape, dtype=np.float16)


def _f32(*shape):
    import numpy as np
    return np.zeros(shape, dtype=np.float32)


# Expected bytes of one block as written by _write_llama (exact, from GGML type sizes).
BLOCK_BYTES = (
    q8_bytes(N_EMBD, N_EMBD)                       # attn_q   Q8_0
    + 2 * (N_HEAD_KV * HEAD_DIM * N_EMBD * 2)      # attn_k, attn_v  F16
    + q8_bytes(N_EMBD, N_EMBD)                     # attn_output Q8_0
    + 2 * q8_bytes(N_FF, N_EMBD)                   # ffn_gate, ffn_up Q8_0
    + q8_bytes(N_EMBD, N_FF)                       # ffn_down Q8_0
    + 2 * N_EMBD * 4                               # attn_norm, ffn_norm F32
)
INPUT_BYTES = q8_bytes(N_VOCAB, N_EMBD)
OUTPUT_NORM_BYTES = N_EMBD * 4
OUTPUT_BYTES = N_VOCAB * N_EMBD * 2 + OUTPUT_NORM_BYTES  # output.weight F16 + norm


def _write_llama(path, with_output=True, split_max_tensors=0, arch='llama', extra=None,
                 kv_heads=N_HEAD_KV):
    writer = gguf.GGUFWriter(path, arch, split_max_tensors=split_max_tensors)
    writer.add_name('tiny-test')
    writer.add_block_count(N_LAYER)
    writer.add_context_length(4096)
    writer.add_embedding_length(N_EMBD)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(kv_heads)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    writer.add_token_list(['t%d' % i for i in range(N_VOCAB)])
    for key, value in (extra or {}).items():
        getattr(writer, key)(value)
    writer.add_tensor('token_embd.weight', _q8(N_VOCAB, N_EMBD), raw_dtype=Q8_0)
    for i in range(N_LAYER):
        p = 'blk.%d.' % i
        writer.add_tensor(p + 'attn_norm.weight', _f32(N_EMBD))
        writer.add_tensor(p + 'attn_q.weight', _q8(N_EMBD, N_EMBD), raw_dtype=Q8_0)
        writer.add_tensor(p + 'attn_k.weight', _f16(N_HEAD_KV * HEAD_DIM, N_EMBD))
        writer.add_tensor(p + 'attn_v.weight', _f16(N_HEAD_KV * HEAD_DIM, N_EMBD))
        writer.add_tensor(p + 'attn_output.weight', _q8(N_EMBD, N_EMBD), raw_dtype=Q8_0)
        writer.add_tensor(p + 'ffn_norm.weight', _f32(N_EMBD))
        writer.add_tensor(p + 'ffn_gate.weight', _q8(N_FF, N_EMBD), raw_dtype=Q8_0)
        writer.add_tensor(p + 'ffn_up.weight', _q8(N_FF, N_EMBD), raw_dtype=Q8_0)
        writer.add_tensor(p + 'ffn_down.weight', _q8(N_EMBD, N_FF), raw_dtype=Q8_0)
    writer.add_tensor('output_norm.weight', _f32(N_EMBD))
    if with_output:
        writer.add_tensor('output.weight', _f16(N_VOCAB, N_EMBD))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture
def llama_gguf(tmp_path):
    path = str(tmp_path / 'tiny-q8_0.gguf')
    _write_llama(path)
    return path


def test_llama_gguf_layout_exact(llama_gguf):
    spec = ml.resolve_model(llama_gguf)
    layout = spec.gguf
    assert spec.source == 'gguf' and spec.quantization == 'gguf'
    assert spec.architecture == 'llama' and spec.name == 'tiny-test'
    assert (spec.num_layers, spec.hidden_size, spec.intermediate_size) == (N_LAYER, N_EMBD, N_FF)
    assert (spec.num_attention_heads, spec.num_kv_heads, spec.head_dim) == (N_HEAD, N_HEAD_KV,
                                                                            HEAD_DIM)
    assert spec.vocab_size == N_VOCAB
    assert spec.max_position_embeddings == 4096
    assert layout.block_bytes == [BLOCK_BYTES] * N_LAYER
    assert layout.input_bytes == INPUT_BYTES
    assert layout.output_bytes == OUTPUT_BYTES
    assert layout.output_tied is False and spec.tie_word_embeddings is False
    assert (layout.key_length, layout.value_length) == (HEAD_DIM, HEAD_DIM)
    assert layout.kv_heads_per_layer == [N_HEAD_KV] * N_LAYER
    assert layout.file_type == 'MOSTLY_Q8_0'
    assert layout.n_tensors == 1 + 9 * N_LAYER + 2
    assert layout.split_files == []
    assert spec.weight_bytes == N_LAYER * BLOCK_BYTES + INPUT_BYTES + OUTPUT_BYTES
    assert spec.weight_bytes_exact is True
    assert spec.layer_kinds == [LAYER_FULL] * N_LAYER


def test_tied_output_when_no_output_weight(tmp_path):
    path = str(tmp_path / 'tied.gguf')
    _write_llama(path, with_output=False)
    spec = ml.spec_from_gguf(path)
    assert spec.gguf.output_tied is True and spec.tie_word_embeddings is True
    assert spec.gguf.output_bytes == OUTPUT_NORM_BYTES


def test_split_gguf_sums_every_shard(tmp_path):
    _write_llama(str(tmp_path / 'big.gguf'), split_max_tensors=12)
    files = sorted(os.listdir(str(tmp_path)))
    assert files == ['big-00001-of-00003.gguf', 'big-00002-of-00003.gguf',
                     'big-00003-of-00003.gguf']
    # any shard names the whole set
    spec = ml.resolve_model(str(tmp_path / files[1]))
    assert spec.gguf.block_bytes == [BLOCK_BYTES] * N_LAYER
    assert spec.weight_bytes == N_LAYER * BLOCK_BYTES + INPUT_BYTES + OUTPUT_BYTES
    assert [os.path.basename(f) for f in spec.gguf.split_files] == files


def test_split_gguf_missing_shard(tmp_path):
    _write_llama(str(tmp_path / 'big.gguf'), split_max_tensors=12)
    os.remove(str(tmp_path / 'big-00003-of-00003.gguf'))
    with pytest.raises(ModelSpecError, match='missing: .*big-00003-of-00003.gguf'):
        ml.resolve_model(str(tmp_path / 'big-00001-of-00003.gguf'))


def test_per_layer_kv_heads_and_gemma2_sliding(tmp_path):
    path = str(tmp_path / 'g2.gguf')
    _write_llama(path, arch='gemma2', kv_heads=[2, 1, 2],
                 extra={'add_sliding_window': 4096})
    spec = ml.spec_from_gguf(path)
    assert spec.gguf.kv_heads_per_layer == [2, 1, 2]
    assert spec.num_kv_heads == 2
    # llama.cpp gemma2: every other layer slides, starting with layer 0
    assert spec.layer_kinds == [LAYER_SLIDING, LAYER_FULL, LAYER_SLIDING]
    assert spec.sliding_window == 4096


def test_not_a_gguf_file_names_model(tmp_path):
    path = tmp_path / 'fake.gguf'
    path.write_bytes(b'PK\x03\x04 not a gguf')
    with pytest.raises(ModelSpecError) as err:
        ml.resolve_model(str(path))
    assert err.value.field == 'model'
    assert 'is not a GGUF file' in str(err.value)
    # what the file holds is not repeated (the path may be a symlink to any file)
    assert 'PK' not in str(err.value) and 'not a gguf' not in str(err.value)


def test_truncated_gguf_header(tmp_path, llama_gguf):
    path = tmp_path / 'cut.gguf'
    with open(llama_gguf, 'rb') as handle:
        path.write_bytes(handle.read(40))
    with pytest.raises(ModelSpecError) as err:
        ml.resolve_model(str(path))
    assert err.value.field == 'model' and 'cannot be parsed' in str(err.value)


def test_missing_gguf_file(tmp_path):
    with pytest.raises(ModelSpecError, match='does not exist'):
        ml.resolve_model(str(tmp_path / 'nope.gguf'))


def test_missing_gguf_package_says_what_to_install(llama_gguf, monkeypatch):
    monkeypatch.setattr(gguf_reader, 'HAS_GGUF', False)
    monkeypatch.setattr(gguf_reader, 'GGUF_IMPORT_ERROR', ImportError("No module named 'gguf'"))
    with pytest.raises(ModelSpecError) as err:
        ml.resolve_model(llama_gguf)
    assert err.value.field == 'model'
    assert "pip install gguf" in str(err.value)


def test_summary_keeps_long_arrays_as_lengths(llama_gguf, monkeypatch):
    monkeypatch.setattr(gguf_reader, 'MAX_ARRAY_VALUES', 8)
    summary = gguf_reader.read_gguf(llama_gguf)
    assert summary.metadata['tokenizer.ggml.tokens'] is None
    assert summary.array_lengths['tokenizer.ggml.tokens'] == N_VOCAB
    assert summary.get('llama.block_count') == N_LAYER
