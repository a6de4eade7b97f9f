#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)


DOCUMENTATION = r'''
---
module: serving_plan
short_description: Budget a deployment's GPU memory before launch and pin the engine flags
version_added: 0.1.0
description:
  - Computes, per GPU, the memory a vLLM, llama-box or llama.cpp deployment will use
    (weights, activation peak, non-torch memory, CUDA graphs, KV cache, headroom), all in bytes,
    for the engine version given, and the engine arguments that keep it inside that budget.
  - Engine knobs the user sets are honoured and checked; knobs left unset are derived from the
    GPUs, the model and the declared traffic. Every derived value carries the rule that produced it.
  - Read-only. An infeasible plan fails with the terms that do not add up and what would fit,
    unless O(fail_on_infeasible=false).
  - Every input is type- and range-checked, and every figure read from a C(config.json), a
    safetensors header or GGUF metadata too; bad input fails the task with a message naming the
    field (result key C(field)) and the numbers, never a traceback. Errors never repeat what a
    file holds.
  - One central check refuses any plan with a negative or non-finite term, or a feasible plan
    whose resident terms exceed a GPU's total, naming the term and the GPU (C(field) is then
    C(plan.memory[i].<term>)); such a plan comes from input no real deployment has.
notes:
  - The plan is pure arithmetic over the GPU facts and the model, so for a catalog name,
    Hugging Face repo id or config dict the action plugin of the same name computes it on the
    controller, with the same argument validation and the same result, and nothing is copied
    to or run on the node. That keeps a rerun of the site playbook as cheap as gathering facts.
  - Only a model given as a path (a C(.gguf) file, an absolute path, or one starting with
    C(.) or C(~)) has to be read where the file is, so then the module runs on the node.
    Give a model directory that way (C(/srv/models/x) or C(./x)); a bare C(org/name) is
    taken for a catalog name.
author:
  - kvpin.fleet contributors (!UNKNOWN)
requirements:
  - gguf (Python package) only when O(model) is a C(.gguf) file.
attributes:
  action:
    support: full
    description:
      - Has an action plugin of the same name that computes the plan on the controller unless
        O(model) is a path (see notes).
  async:
    support: full
    description: With C(async) the module always runs on the node.
  check_mode:
    support: full
    description: Computes only; nothing on the host changes.
  diff_mode:
    support: none
    description: Nothing to diff.
options:
  backend:
    description: Serving engine.
    type: str
    required: true
    choices: [vllm, llama-box, llama.cpp]
  backend_version:
    description:
      - Engine version, for example C(0.10.1.1) for vLLM or a llama-box / llama.cpp release tag.
      - Flags, defaults and memory accounting are taken from this version's rules.
      - A vLLM series without its release (C(0.10), C(0.9)) is refused as ambiguous, since flags
        and accounting change within a series. Quote it in YAML - unquoted C(0.10) is the number 0.1.
      - vLLM C(0.6.1) and later (the oldest release a GPUStack release pinned); older releases are
        refused. 0.6.x and 0.7.x run the V0 engine, 0.34 and later the extensible KV cache; a release
        newer than the newest one read (0.34) is planned with its rules and a warning.
        See C(docs/vllm-versions.md).
    type: str
    required: true
  model:
    description:
      - A catalog name (Hugging Face repo id or alias such as C(llama-3.3-70b)), a dict in
        Hugging Face C(config.json) form (optional key C(weight_bytes)), a local model directory,
        or a path to a C(.gguf) file (first shard of a split file).
      - Refused, naming the key - geometry no real model has (for example more than 256 layers,
        a negative or zero C(sliding_window), C(context_length) 0, more KV heads than heads,
        floats or booleans where counts go, NaN or Infinity), unknown quantization fields, a
        C(config.json) over 4 MiB, GGUF headers claiming more tensors or keys than the file can
        hold, safetensors headers whose offsets or dtypes do not match the file, and a model
        directory missing shards unless its C(model.safetensors.index.json) gives C(total_size).
    type: raw
    required: true
  gpus:
    description:
      - The GPUs the deployment runs on, as in C(ansible_facts.kvpin_gpus.gpus).
      - At most 16 (llama.cpp's device limit). Each needs an integer C(index), a string C(name) and
        C(memory_total) in bytes between 256 MiB and 4 TiB; C(memory_used) / C(memory_free), when
        given, lie between 0 and the total; C(compute_capability) is a string like C(8.6).
      - For vLLM without O(gpu_indexes) the planner chooses among them (module_utils/gpu_choice.py) -
        per kind of card (name and memory), the lowest-indexed group of each tensor-parallel size
        (the one set, or with O(tensor_parallel_size) unset or C(auto) 1, 2, 4 and 8 - a single
        card is the group of 1); each is planned and the best is kept - feasible first, then the
        fewest GPUs, then the largest KV pool, then the lowest indexes. So a node of mixed cards
        serves a model that fits one card, or a group of identical cards. The choice and what it
        compared are returned in RV(plan.gpu_indexes) and RV(plan.gpu_choice); it is refused
        (an infeasible plan listing every candidate) only when no candidate fits.
    type: list
    elements: dict
    required: true
  gpu_indexes:
    description:
      - The deployment's pin - the NVML indexes (among O(gpus)) it must run on. The plan uses
        exactly these GPUs (never re-chosen; vLLM refuses a pinned group of mixed cards, naming them).
      - Each index must be one of O(gpus), listed once.
    type: list
    elements: int
  prompt_tokens_p99:
    description:
      - 99th percentile of prompt length in tokens, measured on real traffic.
      - Required, with O(max_output_tokens) and O(max_concurrency), unless O(traffic_classes) is given.
    type: int
  max_output_tokens:
    description: Largest number of tokens a response may generate (required unless O(traffic_classes) is given).
    type: int
  max_concurrency:
    description: Concurrent requests the deployment must hold at the p99 prompt size (required unless O(traffic_classes) is given).
    type: int
  traffic_classes:
    description:
      - Several kinds of traffic on one deployment, instead of O(prompt_tokens_p99), O(max_output_tokens) and
        O(max_concurrency) (giving both is refused). A list of 1 to 16 dicts with keys C(name) (unique; letters,
        digits, C(_), C(.), C(-)), C(prompt_tokens_p99), C(max_output_tokens), C(max_concurrency) (positive
        integers, as the single-class options) and optional C(hours), C("HH:MM-HH:MM") (a window may cross
        midnight, C("23:00-06:00"); left out = always active).
      - The day is cut at every window edge; classes active at the same minute add up (sequences and KV tokens).
        Three strategies are planned with the engine's planner - C(single), one pinned configuration for every
        class (max_model_len from the longest class, max_num_seqs and KV pool from the busiest window);
        C(scheduled), one profile per set of classes active together, same weights (tensor parallelism and
        quantization fixed), switched at the window edges; C(split), two deployments on disjoint halves of the
        GPUs, each holding the whole weights.
      - The cheapest feasible strategy is returned in C(plan.strategy) - fewest resident copies of the weights,
        then fewest engine restarts a day - C(single) if it holds every window, else C(scheduled) if every profile
        holds its window, else C(none) (infeasible). C(split) is only reported (C(plan.alternatives)), with its cost.
    type: list
    elements: dict
  tensor_parallel_size:
    description: vLLM tensor parallelism; an integer or C(auto) (the size of the GPU group chosen, see O(gpus)).
    type: raw
  gpu_memory_utilization:
    description: vLLM fraction of each GPU's total memory given to the engine.
    type: float
  max_model_len:
    description: vLLM maximum tokens per sequence (prompt + output).
    type: int
  max_num_seqs:
    description: vLLM maximum sequences scheduled at once.
    type: int
  max_num_batched_tokens:
    description: vLLM tokens per scheduler step (drives the activation peak).
    type: int
  kv_cache_dtype:
    description:
      - vLLM KV cache dtype (C(auto), C(fp8), ...). Set, it is always obeyed (also over O(allow_fp8_kv)).
    type: str
  allow_fp8_kv:
    description:
      - vLLM - the operator's consent to fp8 KV. A KV dtype below the model's changes the model's numerics
        (long-context retrieval degrades first), so without consent (the default) a plan never changes the
        KV dtype by itself - when the model dtype cannot hold the declared traffic it caps O(max_num_seqs) to
        what the pool holds (or refuses a plan whose pool holds no O(max_model_len) sequence) and says in
        C(plan.reasons.kv_cache_dtype), a warning and the suggestions what fp8 would buy in KV tokens and
        sequences.
      - V(true) - the plan switches to C(--kv-cache-dtype=fp8) where the model dtype is short of the declared
        traffic and the version accepts fp8, and warns. An explicit O(kv_cache_dtype) wins either way.
    type: bool
  block_size:
    description: vLLM KV cache block size in tokens.
    type: int
  enforce_eager:
    description: vLLM without CUDA graphs.
    type: bool
  pin_kv_cache_memory:
    description:
      - Pin the KV pool with C(--kv-cache-memory-bytes) where the vLLM version has it (0.10.2 and later).
      - Unset, the plan pins it where the version has the flag and sizes the pool from its profile
        (0.10.2 to 0.33), so a recycled instance (GPUStack recreates it from the same arguments) gets
        the planned pool even when its torch.compile runs cold; the pinned value is the pool the plan
        computed from the budget, never more. From 0.34, unset keeps the extensible KV cache on.
      - V(false), or a version without the flag, pins only C(--gpu-memory-utilization) and charges a
        cold-compile margin (C(terms.cold_compile_margin)) inside the budget; C(reasons.kv_cache_memory_bytes) says which.
    type: bool
  kv_cache_memory_bytes:
    description: vLLM KV pool per GPU in bytes (C(--kv-cache-memory-bytes), vLLM 0.10.2 and later); the budget is then exactly this.
    type: int
  cudagraph_memory_estimate:
    description:
      - vLLM 0.18 and 0.19 - charge the CUDA graph estimate to the budget
        (C(VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1), the default from 0.20).
    type: bool
  pipeline_parallel_size:
    description:
      - vLLM pipeline parallelism (C(--pipeline-parallel-size)), vLLM 0.9.1 and later (earlier
        releases run it on the V0 engine, not modelled). The GPUs are taken in order, O(tensor_parallel_size)
        per stage (default - the GPUs given divided by the stages); GPUs within a stage must be of one kind,
        stages may differ (an RTX A6000 and an RTX 4090).
      - Each stage is planned in bytes (C(plan.pipeline.stages)); the engine holds the smallest
        stage's KV block count. On GPUs of different kinds the planner proposes an uneven
        C(VLLM_PP_LAYER_PARTITION) and compares the plan with llama-box layer offload
        (C(plan.pipeline.offload_comparison)).
    type: int
  pp_layer_partition:
    description:
      - vLLM layers per pipeline stage (C(VLLM_PP_LAYER_PARTITION)), a list of integers or the
        C("40,24") form; one entry per stage, each at least 1, summing to the model's layers.
      - Left unset, the planner uses vLLM's own split on GPUs of one kind and a balanced uneven
        one across kinds; an uneven partition is returned in C(plan.settings.environment).
    type: raw
  vllm_sampler:
    description:
      - The top-k/top-p sampler the vLLM engine of this image runs; it sizes the sampler warm-up of
        vLLM's profile run (O(max_num_seqs) rows x the vocabulary), which is charged to the budget.
      - Unset, the plan charges the PyTorch sort path (a full-vocabulary C(logits.sort)), the larger one, because it cannot
        see whether the image ships FlashInfer; C(plan.reasons.vllm_sampler) says which path was charged.
      - V(flashinfer) - the image has FlashInfer and its engine log prints C(Using FlashInfer for top-p & top-k sampling.);
        the plan charges FlashInfer's warm-up (masked logits and probabilities, no sort, so less memory and more KV) and
        sets C(VLLM_USE_FLASHINFER_SAMPLER=1) (required from vLLM 0.12; 0.9.1 to 0.11 take FlashInfer by default
        when it is installed and fall back to the sort path without an error when it is not). vLLM 0.9.1 and later.
      - V(pytorch) - charge the sort path and set C(VLLM_USE_FLASHINFER_SAMPLER=0), so that the engine runs it.
      - From vLLM 0.17 the warm-up sorts on neither path; the charge does not change.
    type: str
    choices: [flashinfer, pytorch]
  vllm_image:
    description:
      - vLLM - the container image the engine runs (C(vllm/vllm-openai:v0.11.0), C(gpustack/runner:cuda12.8-vllm0.11.0-linux-amd64)).
        With O(vllm_sampler) unset it decides the sampler the plan charges where vLLM takes FlashInfer by itself when
        it is installed (0.9.1 to 0.11) - the FlashInfer warm-up for images whose build files install it (vllm/vllm-openai;
        gpustack/runner vLLM images on amd64, named in the tag), the sort path otherwise (gpustack/gpustack, unknown images).
      - C(plan.reasons.vllm_sampler) names the evidence used. O(vllm_sampler) set always wins.
    type: str
  gpu_layers:
    description: llama-box / llama.cpp layers resident on GPU (C(-ngl)).
    type: int
  ctx_size:
    description: llama-box / llama.cpp total context in tokens, shared by the slots.
    type: int
  parallel:
    description: llama-box / llama.cpp parallel slots; each gets ctx_size / parallel tokens.
    type: int
  flash_attn:
    description: llama-box / llama.cpp flash attention.
    type: bool
  cache_type_k:
    description: llama-box / llama.cpp K cache type (C(f16), C(q8_0), ...).
    type: str
  cache_type_v:
    description: llama-box / llama.cpp V cache type (C(f16), C(q8_0), ...).
    type: str
  ubatch_size:
    description: llama-box / llama.cpp physical batch size.
    type: int
  batch_size:
    description: llama-box / llama.cpp logical batch size.
    type: int
  tensor_split:
    description: llama-box / llama.cpp layer split proportions per GPU.
    type: list
    elements: float
  quantization:
    description: GGUF quantization type used to size a catalog model for llama-box / llama.cpp (for example C(Q4_K_M)).
    type: str
  no_kv_offload:
    description: llama-box / llama.cpp keep the whole KV cache in host memory (C(-nkvo)).
    type: bool
  vram_reserve_bytes:
    description: llama-box / llama.cpp VRAM per GPU the planner keeps free (default 1 GiB, the GPUStack 0.7 reserve and llama.cpp's fit margin).
    type: int
  traffic_source:
    description:
      - Which traffic the plan sizes for when O(measurement) is given. C(declared) (default) plans from
        O(prompt_tokens_p99), O(max_output_tokens) and O(max_concurrency) and only compares them with the
        measurement (printed, drift flagged). C(measured) replaces each declared figure by its measured bound
        (it may shrink the plan). C(larger) takes the larger of the two per figure (it only grows).
      - A measured figure is used only when it rests on at least 299 requests (distribution-free p99 bound at
        95 % confidence, 1 - 0.99^299 >= 0.95) and its p99 is not in the +Inf bucket, in the whole window or in any
        hour of day that has 299 requests itself (the bound is the largest over those); an output bound also
        not when more than 1 % of requests were cut at their length limit. Otherwise the declaration stays and
        the plan's reasons say why. C(measured) and C(larger) need O(measurement).
    type: str
    choices: [declared, measured, larger]
    default: declared
  measurement:
    description:
      - What the serving watchdog measured for this deployment (its C(measure) subcommand's output). Keys
        C(traffic) (the C(measure --metrics) summary - C(requests), C(prompt_tokens_p99_upper),
        C(prompt_tokens_p99_lower), C(prompt_tokens_p99_censored), the same for C(generation_tokens),
        C(max_concurrency), C(length_truncated), C(hours) keyed C("00") to C("23"), ...), C(kv_pool) (the
        C(measure --engine-log) output - C(kv_cache_tokens), C(kv_cache_bytes), C(weights_bytes)), C(gpu) (the
        card name), C(backend_version) and C(args) (the engine's argv) the KV read-back belongs to, and
        optional C(measured_at). Every figure is type- and range-checked; an unknown key is refused.
      - The plan prints declared vs measured (prompt p99 bound, output p99 bound, peak concurrency, per hour)
        and planned vs actual KV pool (drift over 5 % flagged), returned in C(plan.measured). When the vLLM
        engine got fewer KV tokens than planned on the same card, version and args (C(--max-num-seqs) and the
        histogram pin aside), max_num_seqs is sized on the pool it really has (unless set). Hours of day whose
        prompt bound or peak concurrency differ by 2x or more print a C(traffic_classes) proposal (never
        applied). Not with O(traffic_classes).
    type: dict
  fail_on_infeasible:
    description: Fail the task when the plan does not fit. With C(false) the plan is returned with C(feasible=false).
    type: bool
    default: true
'''

EXAMPLES = r'''
- name: Probe the GPUs
  kvpin.fleet.gpu_facts:

- name: Plan Llama-3.3-70B on four 48 GB cards (the field report's deployment)
  kvpin.fleet.serving_plan:
    backend: vllm
    backend_version: 0.10.1.1
    model: meta-llama/Llama-3.3-70B-Instruct
    gpus: "{{ ansible_facts.kvpin_gpus.gpus }}"
    prompt_tokens_p99: 11000
    max_output_tokens: 1024
    max_concurrency: 32
    tensor_parallel_size: 4
  register: llama_plan

- name: Show the pinned arguments
  ansible.builtin.debug:
    var: llama_plan.plan.args

- name: Qwen2.5-32B over an RTX A6000 and an RTX 4090 with vLLM pipeline parallelism
  kvpin.fleet.serving_plan:
    backend: vllm
    backend_version: 0.11.0
    model: Qwen/Qwen2.5-32B-Instruct
    gpus: "{{ ansible_facts.kvpin_gpus.gpus }}"
    prompt_tokens_p99: 3000
    max_output_tokens: 1000
    max_concurrency: 1
    max_model_len: 4096
    pipeline_parallel_size: 2
  register: pp_plan

- name: Show the stages and the llama-box layer-offload alternative
  ansible.builtin.debug:
    var: pp_plan.plan.pipeline

- name: One endpoint for daytime chat and a nightly batch of 30k-token prompts (the field report's dilemma)
  kvpin.fleet.serving_plan:
    backend: vllm
    backend_version: 0.10.1.1
    model: meta-llama/Llama-3.3-70B-Instruct
    gpus: "{{ ansible_facts.kvpin_gpus.gpus }}"
    tensor_parallel_size: 4
    traffic_classes:
      - {name: chat, prompt_tokens_p99: 2048, max_output_tokens: 512, max_concurrency: 64, hours: "07:00-23:00"}
      - {name: batch, prompt_tokens_p99: 30000, max_output_tokens: 2048, max_concurrency: 4, hours: "00:00-06:00"}
  register: mixed_plan

- name: Show the strategy, its profiles and what a split into two deployments would cost
  ansible.builtin.debug:
    msg: "{{ mixed_plan.plan_report }}"

- name: Layer offload on one card with llama-box
  kvpin.fleet.serving_plan:
    backend: llama-box
    backend_version: v0.0.171
    model: /srv/models/Llama-3.3-70B-Instruct-Q4_K_M.gguf
    gpus: "{{ ansible_facts.kvpin_gpus.gpus[:1] }}"
    prompt_tokens_p99: 4096
    max_output_tokens: 512
    max_concurrency: 1
    fail_on_infeasible: false
'''

RETURN = r'''
plan:
  description: The plan (all memory figures in bytes).
  returned: success, and failure of an infeasible plan
  type: dict
  contains:
    backend:
      description: Engine planned for.
      type: str
      returned: always
    backend_version:
      description: Engine version whose rules were applied.
      type: str
      returned: always
    args:
      description: Engine arguments (argv list) for that engine version.
      type: list
      elements: str
      returned: always
      sample: ["--tensor-parallel-size=4", "--max-model-len=16384", "--gpu-memory-utilization=0.88"]
    memory:
      description:
        - One entry per planned GPU, in the order of the GPUs the plan uses. Every figure is
          in bytes; the ten headline terms are the same for every backend, C(terms) holds the
          finer terms they are built from and C(explain) how each was computed.
        - vLLM - C(budget) = ceil(C(total) x gpu_memory_utilization) (or the pinned
          C(--kv-cache-memory-bytes) + the charged terms); C(weights) + C(activation) +
          C(non_torch) (+ C(cuda_graph) from vLLM 0.20) + C(kv_cache) fill it; what vLLM holds
          outside it (CUDA context, NCCL, the graph pool up to 0.19) must fit in
          C(total) - C(budget) with vLLM's profiler buffer and a safety margin to spare.
        - llama-box / llama.cpp - C(budget) = C(total) - the per-GPU reserve;
          C(weights) + C(kv_cache) + C(activation) + C(non_torch) must fit in it.
        - The memory model is described in docs/architecture.md of the collection.
      type: list
      elements: dict
      returned: always
      contains:
        index:
          description: NVML index of the GPU (from C(gpus)).
          type: int
          returned: always
          sample: 0
        name:
          description: GPU name as NVML reports it.
          type: str
          returned: always
          sample: NVIDIA RTX A6000
        total:
          description:
            - The CUDA-visible total the budgets start from - the NVML C(memory_total) less what
              the driver and firmware keep (C(terms.driver_reserved); C(explain.total) names its source).
          type: int
          returned: always
          sample: 50990153728
        budget:
          description:
            - vLLM - the memory vLLM lets itself use on this GPU, total x
              gpu_memory_utilization (rounded up), or with a pinned KV size the charged terms
              + that size.
            - llama-box / llama.cpp - what the plan allows itself, total - reserve
              (C(settings.vram_reserve_bytes)).
          type: int
          returned: always
          sample: 45859051930
        weights:
          description:
            - vLLM - this GPU's share of the weights (sharded / TP + replicated parts),
              see the C(weights_*) terms.
            - llama-box / llama.cpp - the model buffer, the GGUF tensor bytes of the blocks
              (and output layer) placed on this GPU.
          type: int
          returned: always
        activation:
          description:
            - vLLM - the peak of the profile run (max of sampler warm-up + hidden states and
              the forward pass), see the C(activation_*) terms.
            - llama-box / llama.cpp - compute buffer + CUDA pool growth.
          type: int
          returned: always
        non_torch:
          description:
            - vLLM - non-torch memory charged inside the budget (cuBLAS / attention
              workspaces, TP workspaces, and NCCL buffers where the version allocates them
              after its memory snapshot).
            - llama-box / llama.cpp - the CUDA context and driver.
          type: int
          returned: always
        cuda_graph:
          description:
            - vLLM - the CUDA-graph pool (0 with C(enforce_eager)); inside the budget from
              0.20, outside it before (C(explain.cuda_graph) says which).
            - llama-box / llama.cpp - always 0 (graphs are captured only for single-token
              batches).
          type: int
          returned: always
        kv_cache:
          description:
            - vLLM - the KV cache vLLM allocates, whole blocks of C(terms.kv_bytes_per_block).
            - llama-box / llama.cpp - the KV buffer of the blocks on this GPU.
          type: int
          returned: always
        headroom:
          description:
            - vLLM - total - budget - what vLLM holds outside the budget; the plan is
              infeasible when it is below the profiler buffer + safety margin.
            - llama-box / llama.cpp - budget - everything resident after the first long
              prompt; negative means it does not fit.
          type: int
          returned: always
        terms:
          description:
            - The finer terms, by name, in bytes. Which keys appear depends on the backend
              (listed below); a term that does not apply is 0 or absent.
            - The llama.cpp buffer terms keep llama.cpp's own dotted names (C(compute.*), C(pool.*)),
              so Jinja reads them by key, C(terms['compute.ffn_peak']), not by attribute; being no
              identifiers, they are listed here rather than below (llama-box / llama.cpp only).
            - C(compute.attention_peak) - live tensors while attention runs (masks, KQ scores, hidden
              states).
            - C(compute.ffn_peak) - live tensors while the FFN runs.
            - C(compute.output_peak) - live tensors at the output layer (logits). Returned when the output
              layer is computed on this GPU.
            - C(compute.pipeline_input_copies) - extra copies of the inputs kept for pipeline parallelism.
              Returned with pipeline parallelism over several GPUs.
            - C(pool.kq_f16_copy) - F16 copy of the attention probabilities (no flash attention). Returned
              without flash attention.
            - C(pool.activations_q8_1) - q8_1 copy of the activations for quantized matrix kernels (MMQ).
              Returned with quantized weights.
            - C(pool.weight_f16_dequant) - F16 dequantized copy of the largest weight matrix, on GPUs without
              int8 tensor cores. Returned on compute capability below 7.5.
          type: dict
          returned: always
          contains:
            weights_sharded:
              description: vLLM - stored weights divided by the tensor-parallel size.
              type: int
              returned: backend vllm
            weights_replicated:
              description: vLLM - the extra each TP rank holds for the parts vLLM keeps whole on every rank (their bytes x (TP - 1) / TP).
              type: int
              returned: backend vllm
            weights_kv_proj_replication:
              description: vLLM - k/v projections replicated when the model has fewer KV heads than TP ranks.
              type: int
              returned: backend vllm
            weights_mxfp4_expert_padding:
              description: vLLM - padding vLLM adds to MXFP4 expert weights.
              type: int
              returned: backend vllm
            activation_sampler_warmup:
              description:
                - vLLM - the profile run's sampler warm-up, from the shapes vLLM allocates (logits in the model dtype and fp32,
                  then the full-vocab sort or, from 0.27, the no-sort top-k/top-p buffers).
                - A small per-logit sort residual is fitted (vllm_memory.SAMPLER_SORT_RESIDUAL).
              type: int
              returned: backend vllm
            activation_hidden_states:
              description: vLLM - hidden states live during the sampler warm-up ([max_num_batched_tokens + 2 x rows, hidden], shapes).
              type: int
              returned: backend vllm
            activation_unexplained_reserve:
              description:
                - vLLM >= 0.17 - a policy guard, not physics - the bytes the pre-0.17 full-vocab sort would hold beyond the
                  no-sort warm-up, kept until the memory logs of 0.19 - 0.28 show above the model is explained (0 before 0.17).
              type: int
              returned: backend vllm
            activation_forward_pass:
              description: vLLM - the forward pass of the profile run (residual, norms, FFN; physical).
              type: int
              returned: backend vllm
            cuda_graph_nodes:
              description: vLLM - graph nodes and bookkeeping, per layer and captured size (fitted).
              type: int
              returned: backend vllm
            cuda_graph_intermediates:
              description: vLLM - intermediates of the largest captured graph (physical).
              type: int
              returned: backend vllm
            cuda_graph_collectives:
              description: vLLM - NCCL collectives captured in graphs at TP > 1 without custom all-reduce (fitted).
              type: int
              returned: backend vllm
            weights_pp_layers:
              description: vLLM pipeline parallelism - the decoder layers of this GPU's stage (per-rank layer bytes x layers).
              type: int
              returned: backend vllm, with pipeline_parallel_size > 1
            weights_pp_embedding:
              description: vLLM pipeline parallelism - the token embedding / TP, on the first stage (0 elsewhere).
              type: int
              returned: backend vllm, with pipeline_parallel_size > 1
            weights_pp_lm_head:
              description: vLLM pipeline parallelism - lm_head / TP (the embedding when tied) + final norm, on the last stage (0 elsewhere).
              type: int
              returned: backend vllm, with pipeline_parallel_size > 1
            activation_pp_intermediate_tensors:
              description: vLLM pipeline parallelism - hidden states + residual received from the previous stage (0 on the first).
              type: int
              returned: backend vllm, with pipeline_parallel_size > 1
            pp_nccl_buffers:
              description: vLLM pipeline parallelism - NCCL buffers of the pipeline group.
              type: int
              returned: backend vllm, with pipeline_parallel_size > 1
            outside_pp_nccl_buffers:
              description: vLLM 0.11 and later with pipeline parallelism - the pipeline group's NCCL buffers, held outside the budget.
              type: int
              returned: backend vllm, with pipeline_parallel_size > 1
            kv_blocks_stage:
              description: vLLM pipeline parallelism - KV blocks this stage's budget fits (the engine takes the smallest).
              type: int
              returned: backend vllm, with pipeline_parallel_size > 1
            pp_stage:
              description: vLLM pipeline parallelism - the stage this GPU runs (0 = first).
              type: int
              returned: backend vllm, with pipeline_parallel_size > 1
            pp_stage_layers:
              description: vLLM pipeline parallelism - decoder layers of this GPU's stage.
              type: int
              returned: backend vllm, with pipeline_parallel_size > 1
            non_torch_growth:
              description: vLLM - cuBLAS / attention-backend workspaces the profiler sees (fitted).
              type: int
              returned: backend vllm
            tp_workspaces:
              description: vLLM - custom all-reduce / pynccl workspaces at TP > 1 (fitted).
              type: int
              returned: backend vllm
            nccl_buffers:
              description: vLLM - NCCL channel buffers per GPU (ring connections x channels x bytes per channel).
              type: int
              returned: backend vllm
            cuda_context:
              description: CUDA context and driver reservations of the engine process (vLLM and llama-box / llama.cpp).
              type: int
              returned: always
            profiler_underestimate_buffer:
              description: vLLM - the buffer vLLM itself keeps for its profiler's underestimate.
              type: int
              returned: backend vllm
            safety_margin:
              description: vLLM - VRAM kept free beyond everything modelled, 3 % of the card and at least 512 MiB.
              type: int
              returned: backend vllm
            kv_budget:
              description: vLLM - the KV memory the budget leaves (before rounding to whole blocks).
              type: int
              returned: backend vllm
            cold_compile_margin:
              description:
                - vLLM - KV memory a cold torch.compile costs a pool that is not pinned in bytes, charged inside the
                  budget (V1 runner - 5 % of the warm KV budget, vllm#54383; Model Runner V2 -
                  C(cold_compile_transient) + C(cold_compile_pinned_segments)); 0 when C(--kv-cache-memory-bytes) pins the pool.
              type: int
              returned: backend vllm
            kv_budget_warm:
              description:
                - vLLM - the KV budget of a warm start (the compile cache present), one of the plan's two named start
                  cases; for a pool pinned in bytes, the pinned pool. C(plan.reasons.cold_start) compares the two.
              type: int
              returned: backend vllm
            kv_budget_cold:
              description:
                - vLLM - the KV budget of a cold start (no compile cache - the first start of this shape or a start after
                  the cache is wiped), the case C(max_num_seqs) and the headroom are sized for; for a pinned pool, the pool.
              type: int
              returned: backend vllm
            v2_runner_buffers:
              description:
                - vLLM 0.27 and later, Model Runner V2 - its persistent penalties state ([max_num_seqs, vocab] int32 bin
                  counts and a bit mask), counted by the budget formula (C(total_consumed)) and charged inside it.
              type: int
              returned: backend vllm
            cold_compile_transient:
              description:
                - vLLM, Model Runner V2 - what a cold torch.compile adds to the profiled transient peak (copies of the
                  per-rank embedding table made by Inductor's compile-time benchmarking, above the warm peak; fitted).
              type: int
              returned: backend vllm
            cold_compile_pinned_segments:
              description:
                - vLLM 0.27 to 0.30, Model Runner V2 - allocator segments the cold compile leaves pinned, counted as
                  consumed; they stay beside a pinned KV pool and are planned inside the budget (fitted).
              type: int
              returned: backend vllm
            weights_v2_load_residual:
              description:
                - vLLM, Model Runner V2 - what C(load_model) allocates beyond the checkpoint's bytes (fitted on
                  0.27 / 0.28 logs, not identified).
              type: int
              returned: backend vllm
            nvml_total:
              description: The GPU's physical memory as NVML reports it (gpu_facts C(memory_total)).
              type: int
              returned: always
            driver_reserved:
              description:
                - What the driver and firmware keep of C(nvml_total), so CUDA never sees it - NVML v2
                  C(reserved), the card's row in the sourced gap table, or the default margin (the largest applies).
              type: int
              returned: always
            kv_bytes_per_token:
              description: vLLM - KV bytes one token takes on this GPU.
              type: int
              returned: backend vllm
            kv_bytes_per_block:
              description: vLLM - KV bytes of one block (block_size tokens) on this GPU.
              type: int
              returned: backend vllm
            extensible_margin:
              description:
                - vLLM 0.34 and later with the extensible KV cache on - the margin vLLM keeps free when
                  it sizes the KV cache after warm-up, max(1 GiB, 0.75 x extensible_transient_peak).
              type: int
              returned: backend vllm, when the extensible KV cache is on
            extensible_transient_peak:
              description:
                - vLLM 0.34 and later with the extensible KV cache on - the transient peak vLLM keeps
                  free in full (activation peak, plus the CUDA graph estimate while
                  C(VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1)).
              type: int
              returned: backend vllm, when the extensible KV cache is on
            outside_resident:
              description: vLLM - what vLLM holds outside the budget while serving (sum of the C(outside_*) parts).
              type: int
              returned: backend vllm
            outside_required:
              description: vLLM - outside_resident + profiler buffer + safety margin; total - budget must be at least this.
              type: int
              returned: backend vllm
            outside_cuda_context:
              description: vLLM - the CUDA context, held outside the budget.
              type: int
              returned: backend vllm
            outside_nccl_buffers:
              description: vLLM 0.11 and later at TP > 1 - NCCL buffers held outside the budget.
              type: int
              returned: backend vllm, when the version holds them outside the budget
            outside_cublas_workspaces:
              description: vLLM 0.33 and later - cuBLAS workspaces, created before the memory snapshot and so held outside the budget.
              type: int
              returned: backend vllm, when the version holds them outside the budget
            outside_cuda_graph_pool:
              description: vLLM up to 0.19 - the CUDA-graph pool, captured after the KV allocation.
              type: int
              returned: backend vllm, when graphs are captured outside the budget
            model_buffer:
              description: llama-box / llama.cpp - GGUF tensor bytes of the units on this GPU (= C(weights)).
              type: int
              returned: backend llama-box or llama.cpp
            kv_buffer:
              description: llama-box / llama.cpp - KV cells x per-cell K and V bytes of the blocks on this GPU (= C(kv_cache)).
              type: int
              returned: backend llama-box or llama.cpp
            compute_buffer:
              description: llama-box / llama.cpp - the worst-case graph's buffer reserved at load, the largest C(compute.*) peak.
              type: int
              returned: backend llama-box or llama.cpp
            cuda_pool_growth:
              description: llama-box / llama.cpp - CUDA pool memory the first long prompt allocates, the largest C(pool.*) term.
              type: int
              returned: backend llama-box or llama.cpp
        explain:
          description:
            - How each headline term was computed (the rule, the fitted constants and their
              source), by term name - total, budget, weights, activation, non_torch,
              nccl_buffers, cuda_context, cuda_graph, kv_cache, headroom for vLLM;
              model_buffer, kv_buffer, compute_buffer, cuda_pool_growth, cuda_context,
              cuda_graph for llama-box / llama.cpp.
          type: dict
          returned: always
          sample:
            total: CUDA-visible total of GPU 0 (NVIDIA RTX A6000)
            budget: ceil(total x gpu_memory_utilization 0.89)
        term_kinds:
          description:
            - What kind of figure each term is, by name - the headline terms and every key of
              C(terms) - so that physics and guesses read apart.
            - C(shapes) tensor shapes x dtype bytes as the engine allocates them; C(engine) a
              constant or rule copied from the engine's source; C(measured) read off the device
              (NVML) or a logged figure for the card; C(fitted) a constant fitted on logs (the
              explanation prints what it was fitted on), a guess; C(shapes+fitted) shapes plus a
              fitted part; C(policy) a margin or guard the planner chooses; C(derived) arithmetic
              on the other terms.
          type: dict
          returned: always
          sample:
            weights: shapes+fitted
            cuda_context: fitted
            safety_margin: policy
    kv_cache_tokens:
      description: Tokens the KV cache holds (per GPU group, minimum over GPUs).
      type: int
      returned: always
    max_concurrency_at_max_len:
      description: Sequences of the maximum length the KV cache holds at once.
      type: float
      returned: always
    feasible:
      description: Whether everything fits.
      type: bool
      returned: always
    settings:
      description: The pinned value of every engine knob, by option name.
      type: dict
      returned: always
    reasons:
      description: For each knob, the rule that produced its value (or that it was user-set and checked).
      type: dict
      returned: always
    warnings:
      description: Things that fit but need attention.
      type: list
      elements: str
      returned: always
    not_fitting:
      description: Terms that do not add up (empty when feasible).
      type: list
      elements: str
      returned: always
    suggestions:
      description: Changes that would fit.
      type: list
      elements: str
      returned: always
    rules:
      description: The engine-version rules applied.
      type: list
      elements: str
      returned: always
    vram_claim_bytes:
      description: VRAM per GPU the deployment really holds (for GPUStack's scheduler).
      type: int
      returned: always
    system_reserved_bytes:
      description: VRAM per GPU to keep outside GPUStack's booking.
      type: int
      returned: always
    pipeline:
      description:
        - vLLM with O(pipeline_parallel_size) > 1 - the stages, null otherwise. C(partition) is the
          layers per stage; C(environment) the engine environment it needs (C(VLLM_PP_LAYER_PARTITION)
          when uneven, C(CUDA_DEVICE_ORDER=PCI_BUS_ID) when stages differ; also in C(settings.environment));
          each of C(stages) gives its GPUs, C(layers) [start, end), weights, activation, non-torch,
          CUDA-graph and KV budget bytes, KV bytes per token, the blocks it fits and C(explain);
          C(engine_kv_tokens) is what the smallest stage (C(bounding_stage)) allows.
        - On GPUs of different kinds C(offload_comparison) holds llama-box's layer-offload plan of
          the same model on the same GPUs (layers, weights and KV bytes per GPU, KV tokens) next to
          the vLLM stages (C(offload_comparison.vllm)).
      type: dict
      returned: always
    strategy:
      description:
        - With O(traffic_classes) - C(single), C(scheduled) or C(none) (nothing fits). The other top-level keys
          are then those of the chosen profile with the largest VRAM claim (what GPUStack must book), C(feasible)
          is the strategy's and C(reasons.strategy) says why it was chosen.
      type: str
      returned: with traffic_classes
      sample: single
    profiles:
      description:
        - With O(traffic_classes) - the chosen strategy's pinned configurations (with C(none), those of
          C(single) and C(scheduled), each with its reasons). Each has C(name), C(classes), C(hours) (the windows
          it serves), C(feasible), C(args), C(settings), C(memory_per_gpu) (per GPU C(index), C(name), C(total),
          C(budget), C(weights), C(activation), C(non_torch), C(cuda_graph), C(kv_cache), C(headroom), C(resident),
          bytes), C(kv_cache_tokens), C(demand_tokens) and C(demand_sequences) (the busiest window's need),
          for vLLM also C(kv_cache_blocks) and C(demand_blocks) (the usable KV blocks and the blocks the busiest
          window's requests hold, each class at its concurrency - the comparison that decides C(feasible)),
          C(vram_claim_bytes), C(reasons), C(warnings), C(not_fitting) and C(suggestions).
      type: list
      elements: dict
      returned: with traffic_classes
    schedule:
      description: With O(traffic_classes) and strategy C(scheduled) - when each profile takes over (C(at) "HH:MM", C(profile)); empty otherwise.
      type: list
      elements: dict
      returned: with traffic_classes
      sample: [{"at": "00:00", "profile": "batch"}, {"at": "07:00", "profile": "chat"}]
    alternatives:
      description:
        - With O(traffic_classes) - every strategy with its numbers - C(strategy), C(feasible), C(profiles),
          C(weight_copies), C(weights_bytes) (weights over all GPUs and copies), C(resident_bytes) (the largest
          profile's, both deployments' for C(split)), C(profile_args) (each profile's engine arguments, by name)
          and C(reason); C(switches_per_day) for C(scheduled),
          C(deployments) (the two profiles with their C(gpus)) for C(split).
      type: list
      elements: dict
      returned: with traffic_classes
    traffic_classes:
      description: With O(traffic_classes) - the classes as checked (C(hours) C(always) when left out).
      type: list
      elements: dict
      returned: with traffic_classes
    measured:
      description:
        - With O(measurement) - C(traffic), declared vs measured per figure (C(figures), each with C(declared),
          C(measured), C(used), C(reason) and C(drift) C(above) / C(below) / null), per hour of day
          (C(hours)) and a C(traffic_classes_proposal) when hours differ (never applied); C(kv_pool), planned vs
          actual KV tokens (C(planned_kv_cache_tokens), C(actual_kv_cache_tokens), C(drift), C(flagged),
          C(same_config), C(mismatch), C(short), C(action)), null without a KV read-back.
      type: dict
      returned: with measurement
    gpu_indexes:
      description:
        - The GPUs (NVML indexes) GPUStack's GPU selector pins the deployment to - O(gpu_indexes)
          when given, else for vLLM the planner's choice (RV(plan.gpu_choice)); null when
          GPUStack places it (llama-box / llama.cpp without O(gpu_indexes)).
      type: list
      elements: int
      returned: always
      sample: [1]
    gpu_choice:
      description:
        - vLLM without O(gpu_indexes) - what the planner compared to choose RV(plan.gpu_indexes);
          null otherwise.
      type: dict
      returned: always
      contains:
        gpu_indexes:
          description: The chosen GPUs.
          type: list
          elements: int
        reason:
          description: Why these, and the line of every candidate compared.
          type: str
        candidates:
          description:
            - Every candidate, best first - C(gpu_indexes), C(gpu_name), C(tensor_parallel_size),
              C(feasible), C(verdict) (starting with C(fits), C(does not fit) or C(refused)),
              C(kv_cache_bytes) and C(kv_cache_tokens) (its KV pool), and C(kv_headroom_bytes) - the
              pool less what the declared traffic needs (C(max_concurrency) sequences of
              prompt + output tokens, capped at max_model_len), negative when short.
          type: list
          elements: dict
plan_report:
  description: The plan for people - verdict, arguments, per-GPU memory table in GiB, and the rule behind each value.
  returned: success, and failure of an infeasible plan
  type: list
  elements: str
'''

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.kvpin.fleet.plugins.module_utils.plan.serving_plan import (
    SERVING_PLAN_ARGUMENT_SPEC, serving_plan_result,
)


def main():
    module = AnsibleModule(argument_spec=SERVING_PLAN_ARGUMENT_SPEC, supports_check_mode=True)
    result = serving_plan_result(module.params)
    if result.get('failed'):
        module.fail_json(**result)
    module.exit_json(**result)


if __name__ == '__main__':
    main()
