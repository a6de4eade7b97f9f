# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Types shared by every planner: inputs (traffic, GPUs) and the plan they return.

GPU dicts are the entries of ``ansible_facts.kvpin_gpus.gpus`` as ``gpu_facts`` returns
them; planners read only: index, uuid, name, memory_total, memory_used, memory_free,
memory_reserved, memory_total_cuda and memory_total_cuda_source (bytes; the last three
through cuda_total.of_gpu, which gives the CUDA-visible total the budgets start from) and
compute_capability ("8.6").
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional


class PlanInputError(ValueError):
    """Bad input to a planner. ``field`` names the option at fault; the message carries
    the numbers."""

    def __init__(self, field_name, message):
        super().__init__('%s: %s' % (field_name, message))
        self.field = field_name


@dataclass(frozen=True)
class Traffic:
    """What the deployment must serve (from the inventory)."""
    prompt_tokens_p99: int
    max_output_tokens: int
    max_concurrency: int

    @property
    def tokens_per_sequence(self):
        return self.prompt_tokens_p99 + self.max_output_tokens


@dataclass
class GpuMemory:
    """One GPU's memory breakdown, every term in bytes.

    For vLLM: budget = total * gpu_memory_utilization (or kv-cache-memory-bytes + the rest);
    weights + activation + non_torch (+ cuda_graph where the version charges it) + kv_cache
    fill the budget; headroom = total - everything resident (must stay >= the margin).
    For llama.cpp / llama-box: weights = model buffer, activation = compute buffer + CUDA
    pool growth, non_torch = CUDA context/driver, kv_cache = KV buffer, budget = what the
    planner allows itself (total - reserve).
    """
    index: int
    name: str
    total: int
    budget: int
    weights: int
    activation: int
    non_torch: int
    cuda_graph: int
    kv_cache: int
    headroom: int
    terms: Dict[str, int] = field(default_factory=dict)        # finer terms (named, bytes)
    explain: Dict[str, str] = field(default_factory=dict)      # term -> how it was computed


@dataclass
class Plan:
    """The result of planning one deployment on its GPUs."""
    backend: str
    backend_version: str
    args: List[str]
    memory: List[GpuMemory]
    kv_cache_tokens: int
    max_concurrency_at_max_len: float
    feasible: bool
    settings: Dict[str, object]                 # the pinned values, by option name
    reasons: Dict[str, str]                     # option -> the rule that produced it
    warnings: List[str] = field(default_factory=list)
    not_fitting: List[str] = field(default_factory=list)   # terms that do not add up
    suggestions: List[str] = field(default_factory=list)   # what would fit instead
    rules: List[str] = field(default_factory=list)         # version rules applied
    # Per GPU: what the deployment really holds resident (budget + what lives outside it).
    # GPUStack's GPUSTACK_MODEL_VRAM_CLAIM is per replica and compared with total x util, so
    # the filter kvpin_gpustack_vram_claim converts (see plugins/filter/gpustack.py).
    vram_claim_bytes: Optional[int] = None
    system_reserved_bytes: Optional[int] = None  # per GPU, kept outside GPUStack's booking

    def to_dict(self):
        return asdict(self)
