# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Hostile model directories (issue 11 items 6, 7, 9): incomplete shard sets, indexes that
name missing or outside files, safetensors headers with absurd lengths, offsets past the
file, unknown dtypes and spans that do not match their shapes."""

from __future__ import annotations

import json
import os
import struct

import pytest

from model_files import TINY_LLAMA, params, safetensors_bytes

from ansible_collections.kvpin.fleet.plugins.module_utils.plan import model_loaders as ml
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.model_spec import ModelSpecError
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.serving_plan import serving_plan_result


def model_dir(tmp_path, files=None, index=None, config=None):
    (tmp_path / 'config.json').write_text(json.dumps(config or TINY_LLAMA))
    for name, raw in (files or {}).items():
        (tmp_path / name).write_bytes(raw)
    if index is not None:
        (tmp_path / 'model.safetensors.index.json').write_text(
            index if isinstance(index, str) else json.dumps(index))
    return str(tmp_path)


def shard(size=64):
    return safetensors_bytes({'w': {'dtype': 'BF16', 'shape': [size // 2], 'data_offsets': [0, size]}}, size)


def refused(path, *fragments):
    with pytest.raises(ModelSpecError) as err:
        ml.resolve_model(path)
    assert err.value.field == 'model'
    for fragment in fragments:
        assert fragment in str(err.value), str(err.value)
    result = serving_plan_result(params(model=path))
    assert result['failed'] and result['field'] == 'model'
    return str(err.value)


def test_one_shard_of_four_without_an_index_is_refused(tmp_path):
    # the example: sized from the one shard present, with no warning
    path = model_dir(tmp_path, {'model-00001-of-00004.safetensors': shard()})
    refused(path, 'is incomplete: 3 shard(s) missing', 'model-00002-of-00004.safetensors')


def test_index_naming_missing_files_without_total_size_is_refused(tmp_path):
    path = model_dir(tmp_path, {'model-00001-of-00002.safetensors': shard()}, index={
        'weight_map': {'a': 'model-00001-of-00002.safetensors', 'b': 'model-00002-of-00002.safetensors'}})
    refused(path, '1 shard(s) missing (model-00002-of-00002.safetensors)')


def test_index_naming_missing_files_with_a_total_size_is_refused_too(tmp_path):
    # issue 39: the index's total_size beside a partial download is no longer taken on its word
    path = model_dir(tmp_path, {'model-00001-of-00002.safetensors': shard()}, index={
        'metadata': {'total_size': 2704},
        'weight_map': {'a': 'model-00001-of-00002.safetensors', 'b': 'model-00002-of-00002.safetensors'}})
    refused(path, '1 shard(s) missing (model-00002-of-00002.safetensors)', 'metadata.total_size 2704 B')


@pytest.mark.parametrize('target', ['../../etc/passwd', '/etc/shadow', 'sub/x.safetensors', 'x.bin',
                                    7, None])
def test_index_naming_files_outside_the_directory_is_refused(tmp_path, target):
    path = model_dir(tmp_path, index={'metadata': {'total_size': 2704}, 'weight_map': {'a': target}})
    refused(path, 'weight_map must name .safetensors files in the model directory')


@pytest.mark.parametrize('total, fragment', [
    (-5, 'metadata.total_size = -5 is out of range'),
    (1 << 60, 'metadata.total_size = 1152921504606846976 is out of range'),
    ('2704', 'metadata.total_size must be an integer'),
    (True, 'metadata.total_size must be an integer'),
    (2704.0, 'metadata.total_size must be an integer'),
])
def test_index_total_size_is_range_checked(tmp_path, total, fragment):
    refused(model_dir(tmp_path, index={'metadata': {'total_size': total}, 'weight_map': {}}), fragment)


@pytest.mark.parametrize('index, fragment', [
    ('{"metadata": {"total_size": NaN}}', 'NaN is not a JSON number'),
    ('[]', 'must hold a JSON object'),
    ('{"metadata": [1], "weight_map": {}}', 'metadata and weight_map must be objects'),
    ('{"weight_map": "model.safetensors"}', 'metadata and weight_map must be objects'),
    ('{"weight_map": {' + ', '.join('"t%d": "s%d.safetensors"' % (i, i) for i in range(5000)) + '}}',
     'names 5000 files'),
])
def test_malformed_index_is_refused(tmp_path, index, fragment):
    refused(model_dir(tmp_path, index=index), fragment)


def test_absurd_header_length_is_refused_without_echoing_it(tmp_path):
    # the first 8 bytes of an arbitrary file, read as a length: never repeated
    raw = b'SECRETXX' + b'\0' * 64
    message = refused(model_dir(tmp_path, {'model.safetensors': raw}), 'not a safetensors file',
                      'header length exceeds the file size')
    assert str(struct.unpack('<Q', raw[:8])[0]) not in message and 'SECRET' not in message


def test_header_length_over_the_format_cap_is_refused(tmp_path):
    path = model_dir(tmp_path)
    with open(os.path.join(path, 'model.safetensors'), 'wb') as handle:
        handle.write(struct.pack('<Q', 200 * 1000 * 1000))
        handle.seek(200 * 1000 * 1000 + 100)   # sparse: no disk used
        handle.write(b'\0')
    refused(path, "exceeds the file size")


@pytest.mark.parametrize('entry, payload, fragment', [
    ({'dtype': 'BF16', 'shape': [32], 'data_offsets': [0, 1 << 40]}, 64, 'lie outside the 64-byte payload'),
    ({'dtype': 'BF16', 'shape': [32], 'data_offsets': [100, 164]}, 64, 'lie outside'),
    ({'dtype': 'BF16', 'shape': [32], 'data_offsets': [64, 0]}, 64, 'lie outside'),
    ({'dtype': 'BF16', 'shape': [32], 'data_offsets': [-64, 0]}, 64, 'lie outside'),
    ({'dtype': 'Q4_K', 'shape': [32], 'data_offsets': [0, 64]}, 64, 'has an unknown dtype'),
    ({'dtype': 7, 'shape': [32], 'data_offsets': [0, 64]}, 64, 'has an unknown dtype'),
    ({'dtype': 'BF16', 'shape': [1000], 'data_offsets': [0, 64]}, 64, 'shape [1000] x 2 B (BF16) = 2000 B'),
    ({'dtype': 'BF16', 'shape': '32', 'data_offsets': [0, 64]}, 64, 'shape that is not a list of sizes'),
    ({'dtype': 'BF16', 'shape': [-32], 'data_offsets': [0, 64]}, 64, 'shape that is not a list of sizes'),
    ({'dtype': 'BF16', 'shape': [32], 'data_offsets': [0]}, 64, 'data_offsets must be [begin, end]'),
    ({'dtype': 'BF16', 'shape': [32], 'data_offsets': [0.0, 64.0]}, 64, 'data_offsets must be [begin, end]'),
    ({'dtype': 'BF16', 'shape': [32], 'data_offsets': None}, 64, 'data_offsets must be [begin, end]'),
    ('tensor', 64, 'entry is not an object'),
])
def test_bad_header_entries_are_refused(tmp_path, entry, payload, fragment):
    raw = safetensors_bytes({'__metadata__': {'format': 'pt'}, 'w': entry}, payload)
    message = refused(model_dir(tmp_path, {'model.safetensors': raw}), fragment)
    # tensors are named by position, not by the (file-supplied) name
    assert 'safetensors tensor #1' in message


@pytest.mark.parametrize('header, fragment', [
    (b'{"w": {"dtype": "BF16", "shape": [NaN], "data_offsets": [0, 2]}}', 'NaN is not a JSON number'),
    (b'[1, 2, 3]', 'not a JSON object'),
    (b'\xff\xfe{}', 'not a JSON object'),
    (b'{\xff\xfe}', 'not UTF-8'),
    (b'{"w": ' + b'[' * 50000 + b']' * 50000 + b'}', 'nested too deeply'),
])
def test_unparseable_headers_are_refused(tmp_path, header, fragment):
    refused(model_dir(tmp_path, {'model.safetensors': safetensors_bytes(header, 0)}),
            'safetensors header cannot be parsed', fragment)


def test_shard_name_claiming_absurd_count_is_refused(tmp_path):
    refused(model_dir(tmp_path, {'model-00001-of-99999.safetensors': shard()}), 'claims 99999 shards')


def test_consistent_header_still_sizes_the_model(tmp_path):
    # the checks above refuse lies, not real files: a correct header sums as before
    raw = safetensors_bytes({'__metadata__': {'format': 'pt'},
                             'a': {'dtype': 'F32', 'shape': [4, 4], 'data_offsets': [0, 64]},
                             'b': {'dtype': 'F4', 'shape': [10], 'data_offsets': [64, 69]},
                             'c': {'dtype': 'BF16', 'shape': [1317], 'data_offsets': [69, 2703]}}, 2703)
    spec = ml.resolve_model(model_dir(tmp_path, {'model.safetensors': raw}))
    assert spec.weight_bytes == 2703 and spec.weight_bytes_exact
