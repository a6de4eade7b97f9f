# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A plan trusts no checkpoint's own word (issue 39 item 2): the weights a model directory's
safetensors headers or index claim are checked against the parameters its own config.json
describes, a shard shorter than its header says is refused, and so is an index whose total_size
disagrees with its shards. Real checkpoints (every catalog entry, a full-size Llama-3.1-8B
directory written as sparse files) still plan."""

from __future__ import annotations

import json
import struct

import pytest

from model_files import gpu, params

from ansible_collections.kvpin.fleet.plugins.module_utils.plan import model_loaders as ml
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.model_catalog import CATALOG
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.model_spec import ModelSpecError
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.serving_plan import serving_plan_result

LLAMA_8B = dict((k, v) for k, v in CATALOG['meta-llama/Llama-3.1-8B'].items() if not k.startswith('_'))
LLAMA_8B_BYTES = 16060522496      # its model.safetensors.index.json metadata.total_size
LLAMA_8B_PARAMS = 8030261248


def header_bytes(tensors):
    """A safetensors header ({name: (dtype, shape, size)} back to back) and its payload size."""
    header, offset = {'__metadata__': {'format': 'pt'}}, 0
    for name, (dtype, shape, size) in tensors.items():
        header[name] = {'dtype': dtype, 'shape': shape, 'data_offsets': [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    return struct.pack('<Q', len(raw)) + raw, offset


def write_shard(path, tensors, cut=0):
    """A safetensors file whose payload is a hole (sparse: no disk used), ``cut`` bytes short."""
    head, payload = header_bytes(tensors)
    with open(str(path), 'wb') as handle:
        handle.write(head)
        handle.truncate(len(head) + payload - cut)
    return len(head) + payload


def real_tensors(config):
    """Every tensor of ``config`` as its checkpoint stores it (BF16), one entry per tensor."""
    tensors = {}
    for group in ml.weight_tensor_groups(ml.arch_dims(config)):
        shape = [group.out_features] if group.in_features == 1 else [group.out_features, group.in_features]
        for i in range(group.count):
            tensors['%s.%d.weight' % (group.name, i)] = ('BF16', shape, 2 * group.out_features * group.in_features)
    return tensors


def model_dir(tmp_path, config, index=None):
    (tmp_path / 'config.json').write_text(json.dumps(config))
    if index is not None:
        (tmp_path / 'model.safetensors.index.json').write_text(json.dumps(index))
    return str(tmp_path)


def refused(path, *fragments):
    with pytest.raises(ModelSpecError) as err:
        ml.resolve_model(path)
    message = str(err.value)
    assert err.value.field == 'model'
    for fragment in fragments:
        assert fragment in message, message
    result = serving_plan_result(params(model=path, gpus=[gpu()]))
    assert result['failed'] and result['field'] == 'model', result
    assert 'Traceback' not in result['msg']
    return message


def test_index_total_size_1000_with_no_shards_is_refused(tmp_path):
    # the first case: "total_size: 1000" and the shards it names nowhere
    path = model_dir(tmp_path, LLAMA_8B, index={'metadata': {'total_size': 1000}, 'weight_map': dict(
        ('t%d' % i, 'model-%05d-of-00004.safetensors' % (i + 1)) for i in range(4))})
    refused(path, 'model.safetensors.index.json', '1000 B', str(LLAMA_8B_PARAMS), str(LLAMA_8B_BYTES))


def test_index_total_size_1000_with_most_shards_missing_is_refused(tmp_path):
    path = model_dir(tmp_path, LLAMA_8B, index={'metadata': {'total_size': 1000}, 'weight_map': dict(
        ('t%d' % i, 'model-%05d-of-00004.safetensors' % (i + 1)) for i in range(4))})
    write_shard(tmp_path / 'model-00001-of-00004.safetensors', {'t0': ('BF16', [250], 500)})
    refused(path, 'is incomplete: 3 shard(s) missing', 'model-00002-of-00004.safetensors')


def test_one_64x64_tensor_for_an_8b_config_is_refused(tmp_path):
    # the second case: a complete, well-formed model.safetensors of 8 KiB
    path = model_dir(tmp_path, LLAMA_8B)
    write_shard(tmp_path / 'model.safetensors', {'w': ('BF16', [64, 64], 8192)})
    message = refused(path, 'model.safetensors', '8192 B', str(LLAMA_8B_PARAMS), str(LLAMA_8B_BYTES))
    assert 'config.json' in message


def test_a_truncated_shard_is_refused_naming_both_sizes(tmp_path):
    tensors = real_tensors(LLAMA_8B)
    names = sorted(tensors)
    half = len(names) // 2
    first = dict((n, tensors[n]) for n in names[:half])
    second = dict((n, tensors[n]) for n in names[half:])
    write_shard(tmp_path / 'model-00001-of-00002.safetensors', first)
    claimed = write_shard(tmp_path / 'model-00002-of-00002.safetensors', second, cut=4096)
    path = model_dir(tmp_path, LLAMA_8B)
    refused(path, 'model-00002-of-00002.safetensors', 'is truncated', '%d B' % (claimed - 4096), '%d B' % claimed)


def test_an_index_total_that_disagrees_with_its_shards_is_refused(tmp_path):
    tensors = real_tensors(LLAMA_8B)
    write_shard(tmp_path / 'model.safetensors', tensors)
    path = model_dir(tmp_path, LLAMA_8B, index={
        'metadata': {'total_size': LLAMA_8B_BYTES // 2},
        'weight_map': dict((name, 'model.safetensors') for name in tensors)})
    refused(path, 'model.safetensors.index.json', 'metadata.total_size %d B' % (LLAMA_8B_BYTES // 2),
            '%d B' % LLAMA_8B_BYTES)


def test_a_full_size_llama_8b_directory_still_plans(tmp_path):
    # what a real download looks like, header for header (payload sparse): exact bytes, feasible
    tensors = real_tensors(LLAMA_8B)
    names = sorted(tensors)
    shards = [names[i::4] for i in range(4)]
    weight_map = {}
    for number, shard in enumerate(shards, 1):
        file_name = 'model-%05d-of-00004.safetensors' % number
        write_shard(tmp_path / file_name, dict((n, tensors[n]) for n in shard))
        weight_map.update((n, file_name) for n in shard)
    path = model_dir(tmp_path, LLAMA_8B, index={'metadata': {'total_size': LLAMA_8B_BYTES},
                                                'weight_map': weight_map})
    spec = ml.resolve_model(path)
    assert spec.weight_bytes == LLAMA_8B_BYTES and spec.weight_bytes_exact
    result = serving_plan_result(params(model=path, gpus=[gpu()]))
    assert not result.get('failed'), result.get('msg')
    assert result['plan']['feasible']


def test_an_index_only_directory_of_a_real_model_still_plans(tmp_path):
    # config.json + the index (the hub's metadata) and no shards yet: sized from total_size
    path = model_dir(tmp_path, LLAMA_8B, index={'metadata': {'total_size': LLAMA_8B_BYTES}, 'weight_map': {
        'model.embed_tokens.weight': 'model-00001-of-00004.safetensors'}})
    spec = ml.resolve_model(path)
    assert spec.weight_bytes == LLAMA_8B_BYTES


@pytest.mark.parametrize('name', sorted(CATALOG))
def test_every_catalog_entry_passes_the_check(name):
    spec = ml.resolve_model(name)
    ml.check_weights_against_config(spec, 'catalog entry %s' % name)
