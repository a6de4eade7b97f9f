# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Hostile model inputs for the planner's adversarial tests: raw GGUF bytes (built field by
field, so a test can lie in any count or type), safetensors files, config dicts, GPU facts,
and a runner for the serving_plan module as Ansible runs it."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(os.path.dirname(HERE))
MODULE = os.path.join(REPO_ROOT, 'plugins', 'modules', 'serving_plan.py')
GiB = 1 << 30

# GGUF value types (gguf-py constants.GGUFValueType)
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)
_SCALAR = {UINT8: '<B', INT8: '<b', UINT16: '<H', INT16: '<h', UINT32: '<I', INT32: '<i',
           FLOAT32: '<f', BOOL: '<?', UINT64: '<Q', INT64: '<q', FLOAT64: '<d'}
F32_TYPE = 0   # GGML_TYPE_F32


def gstr(text):
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack('<Q', len(raw)) + raw


def value_bytes(vtype, value):
    if vtype == STRING:
        return gstr(value)
    if vtype == ARRAY:
        etype, items = value
        return struct.pack('<IQ', etype, len(items)) + b''.join(value_bytes(etype, v) for v in items)
    return struct.pack(_SCALAR[vtype], value)


def kv(key, vtype, value):
    """One key/value entry: key string, value type, value."""
    return gstr(key) + struct.pack('<I', vtype) + value_bytes(vtype, value)


def tensor_info(name, shape, offset, ggml_type=F32_TYPE):
    return (gstr(name) + struct.pack('<I', len(shape)) + b''.join(struct.pack('<Q', d) for d in shape)
            + struct.pack('<IQ', ggml_type, offset))


def llama_kvs(n_layer=2, n_embd=64, n_head=4, n_head_kv=2, ctx=4096, overrides=None, drop=()):
    """Metadata of a tiny llama GGUF as (key, type, value) triples; ``overrides`` replaces
    entries by key (type and value), ``drop`` leaves keys out."""
    entries = [
        ('general.architecture', STRING, 'llama'),
        ('general.name', STRING, 'tiny-adversarial'),
        ('llama.block_count', UINT32, n_layer),
        ('llama.context_length', UINT32, ctx),
        ('llama.embedding_length', UINT32, n_embd),
        ('llama.feed_forward_length', UINT32, 2 * n_embd),
        ('llama.attention.head_count', UINT32, n_head),
        ('llama.attention.head_count_kv', UINT32, n_head_kv),
        ('llama.vocab_size', UINT32, 32),
        ('general.file_type', UINT32, 0),
    ]
    overrides = dict(overrides or {})
    out = []
    for key, vtype, value in entries:
        if key in drop:
            continue
        if key in overrides:
            vtype, value = overrides.pop(key)
        out.append((key, vtype, value))
    out.extend((key, vtype, value) for key, (vtype, value) in overrides.items())
    return out


def gguf_bytes(kvs, tensors=None, n_tensors=None, n_kv=None, version=3, pad_to=0, data=True):
    """A GGUF file: header (counts may lie), key/values, tensor infos (F32, given shapes),
    alignment padding and zeroed tensor data (left out with ``data=False``); ``pad_to``
    appends zeros up to that size."""
    tensors = tensors if tensors is not None else [('blk.%d.attn_norm.weight' % i, [64])
                                                   for i in range(2)]
    body = b''.join(kv(k, t, v) for k, t, v in kvs)
    offset, infos = 0, b''
    for name, shape in tensors:
        infos += tensor_info(name, shape, offset)
        size = 4
        for dim in shape:
            size *= dim
        offset += (size + 31) // 32 * 32
    head = b'GGUF' + struct.pack('<IQQ', version, len(tensors) if n_tensors is None else n_tensors,
                                 len(kvs) if n_kv is None else n_kv)
    raw = head + body + infos
    raw += b'\0' * ((32 - len(raw) % 32) % 32) + (b'\0' * offset if data else b'')
    if len(raw) < pad_to:
        raw += b'\0' * (pad_to - len(raw))
    return raw


def write(path, raw):
    with open(str(path), 'wb') as handle:
        handle.write(raw)
    return str(path)


def safetensors_bytes(header, payload):
    raw = json.dumps(header).encode() if not isinstance(header, bytes) else header
    return struct.pack('<Q', len(raw)) + raw + b'\0' * payload


TINY_LLAMA = {
    'architectures': ['LlamaForCausalLM'], 'model_type': 'llama', 'torch_dtype': 'bfloat16',
    'num_hidden_layers': 2, 'hidden_size': 8, 'intermediate_size': 16,
    'num_attention_heads': 2, 'num_key_value_heads': 1, 'head_dim': 4, 'vocab_size': 10,
    'max_position_embeddings': 256, 'tie_word_embeddings': False,
}
SMALL_LLAMA = dict(TINY_LLAMA, num_hidden_layers=4, hidden_size=512, intermediate_size=1024,
                   num_attention_heads=8, num_key_value_heads=2, head_dim=64, vocab_size=1000,
                   max_position_embeddings=4096)


def gpu(index=0, total=48 * GiB, name='NVIDIA RTX A6000', **extra):
    entry = dict(index=index, uuid='GPU-%s' % (index,), name=name, memory_total=total, memory_used=0,
                 memory_free=total, compute_capability='8.6')
    entry.update(extra)
    return entry


def params(**overrides):
    """serving_plan arguments of a small feasible vLLM plan."""
    base = dict(backend='vllm', backend_version='0.10.1.1', model=dict(SMALL_LLAMA), gpus=[gpu()],
                prompt_tokens_p99=128, max_output_tokens=64, max_concurrency=1)
    base.update(overrides)
    return base


def run_module(tmp_path, args):
    """The serving_plan module run as Ansible runs it (an ANSIBLE_MODULE_ARGS file, its own
    Python process); returns (result dict, stderr)."""
    args_file = os.path.join(str(tmp_path), 'module-args.json')
    with open(args_file, 'w', encoding='utf-8') as handle:
        json.dump({'ANSIBLE_MODULE_ARGS': args}, handle)
    collections_root = next(p for p in sys.path
                            if os.path.isdir(os.path.join(p, 'ansible_collections', 'kvpin', 'fleet')))
    env = {'PATH': os.environ.get('PATH', '/usr/bin:/bin'), 'PYTHONPATH': collections_root,
           'HOME': str(tmp_path), 'LC_ALL': 'C.UTF-8'}
    proc = subprocess.run([sys.executable, MODULE, args_file], env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    return json.loads(proc.stdout), proc.stderr
