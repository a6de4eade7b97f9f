# -*- coding: utf-8 -*-
# Copyright (c) 2026, kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""CPU and memory cost of the watchdog per hour of watching, against an idle Python process.

Two measurements, both by default (--mode cgroup | node | both):

cgroup: one child process runs the daemon's real per-tick code (Daemon.tick: cgroup + /proc
reads, a /metrics scrape from a local server on 127.0.0.1, the decision engine with a full 3 h
window, the textfile write) N times on a simulated clock advancing by interval_seconds, against
a synthetic cgroup dir whose memory.stat changes every tick.

node: one simulated node with FOUR watched GPUStack deployments, the way site.yml installs them
(one daemon per deployment, target gpustack_deployment, engine_runtime native, API version
auto, actuator gpustack in dry run, so a recycle decision is logged, never executed).
  - a loopback fake GPUStack API (tests/unit/watchdog/gpustack_fake.py, its own process)
    answering GET /{v2|v1}/models?search= and /model-instances?model_id= with the four
    deployments' instances on this worker and on another one (filtered out by the daemon);
  - four fake engines, each a real process tree (API server -> EngineCore -> 2 workers, like
    vLLM TP=2) whose root serves a vLLM-sized /metrics with a TTFT histogram on 127.0.0.1 and
    holds a ballast of anon memory (4-6 MiB) that changes size on every scrape;
  - four watchdog processes at once, each loading its config file with the program's own
    load_config/validate_config and running Daemon.tick N times on a simulated clock: every
    tick resolves the instance through the API, walks the real /proc for the engine's tree
    (RssAnon + VmSwap), reads its cgroup and /proc/meminfo for the default limit, scrapes
    /metrics, runs the decision engine, writes the textfile. Between ticks it feeds
    WATCHDOG=1 as Daemon.run does (healthy() + sd_notify once per second of the interval) to
    a notify socket per watchdog, drained by the parent as systemd would.
The fake API and engines run in processes of their own, so their CPU is not counted.
The node runs twice by default (--engine-runtime both): engine_runtime native as above, then
engine_runtime container (GPUStack 2.x, the role's default) where each instance's engine is a
container: `podman` on the watchdogs' PATH is a test double
(tests/unit/watchdog/fake_container_runtime.sh, shell builtins only) answering
`inspect --format {{.State.Pid}} NAME` with the engine's pid; a synthetic proc root maps that
pid to the engine's synthetic container cgroup (machine.slice/libpod-ID.scope/container under
a synthetic cgroup root, memory.max 16 GiB), whose memory.stat the engine rewrites on every
scrape (anon 6 GiB + its ballast). The daemon caches the resolved cgroup per instance, so
the table's note counts the runtime calls per watchdog (1 for the whole run). The double
starts no process of its own, so a call costs far less than a real `podman inspect` (one
watchdog that ran a failing real inspect every tick measured 58.9 ms CPU per tick).

Default hours: 24 (cgroup), 3 (each node run, after its untimed warm-up + window fill); about
30-60 s in all on 2 busy cores. --hours sets all.
CPU per tick (the process's own, plus any child it ran) is scaled to one hour at the
configured interval. Own memory = VmHWM of the watchdog process (it includes this harness's
own imports, so it errs high; every child imports this file from its bytecode cache rather than
compiling it, so this file's size does not count). Baseline = the same
measurements for a child that only starts Python (and imports this file), in the same run.
Targets (issue 10): < 0.1 % of one core, < 30 MB per watchdog. Prints tables; no asserts.

Run: .venv/bin/python benchmarks/bench_watchdog_overhead.py [--hours H] [--mode node]
     [--watchdogs 4] [--api-version v2|v1] [--engine-runtime native|container|both]
"""

from __future__ import annotations

import importlib.util
import json
import math
import mmap
import os
import random
import resource
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Dict

# First: makes ansible_collections.kvpin.fleet importable (benchmarks/_setup.py): the watchdog
# package (load_daemon) imports two of the collection's modules from there in a checkout.
from _setup import ROOT  # noqa: E402  pylint: disable=wrong-import-position

HERE = os.path.dirname(os.path.abspath(__file__))
PROGRAM = os.path.join(ROOT, "roles", "serving_watchdog", "files", "kvpin_watchdog.py")
GiB = 1024 ** 3
MiB = 1024 ** 2


def self_argv(*args: str):
    """argv of a child running this file's main(args). The child IMPORTS this file (its cached
    bytecode, written by prepare_children) instead of running it as a script, which would compile
    it: that compile's peak would count in every child's VmHWM and grow with this file."""
    code = ("import sys; sys.path.insert(0, %r); import bench_watchdog_overhead as b; "
            "sys.exit(b.main(sys.argv[1:]))" % HERE)
    return [sys.executable, "-c", code] + list(args)


def prepare_children() -> None:
    """Write this file's bytecode cache once, before any child starts (so no child compiles it);
    where the directory is not writable every child compiles it alike."""
    import py_compile  # pylint: disable=import-outside-toplevel
    try:
        py_compile.compile(os.path.abspath(__file__), doraise=True)
    except (OSError, py_compile.PyCompileError):
        pass


def vm_hwm_kib() -> int:
    with open("/proc/self/status", encoding="utf-8") as handle:
        for line in handle:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def vllm_metrics(requests: int) -> str:
    """A vLLM-sized /metrics page (~200 lines) with a TTFT histogram that keeps counting."""
    bounds = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
              7.5, 10, 20, 40, 80, 160, 640, 2560]
    lines = []
    for family in ("vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds",
                   "vllm:inter_token_latency_seconds", "vllm:request_queue_time_seconds"):
        lines.append("# HELP %s x\n# TYPE %s histogram" % (family, family))
        for le in bounds:
            frac = min(1.0, le / 0.6)
            lines.append('%s_bucket{engine="0",le="%s",model_name="llama"} %d' % (family, le, int(requests * frac)))
        lines.append('%s_bucket{engine="0",le="+Inf",model_name="llama"} %d' % (family, requests))
        lines.append('%s_count{engine="0",model_name="llama"} %d' % (family, requests))
        lines.append('%s_sum{engine="0",model_name="llama"} %f' % (family, requests * 0.3))
    # The length histograms traffic measurement reads (vLLM's 1-2-5 layout up to 32768 tokens,
    # as 0.32 writes it without --custom-histogram-buckets), and the finished-requests counter.
    length_bounds = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000]
    for family, typical in (("vllm:request_prompt_tokens", 1800.0), ("vllm:request_generation_tokens", 300.0)):
        lines.append("# HELP %s x\n# TYPE %s histogram" % (family, family))
        for le in length_bounds:
            lines.append('%s_bucket{engine="0",le="%s",model_name="llama"} %d' % (
                family, float(le), int(requests * min(1.0, le / (2 * typical)))))
        lines.append('%s_bucket{engine="0",le="+Inf",model_name="llama"} %d' % (family, requests))
        lines.append('%s_count{engine="0",model_name="llama"} %d' % (family, requests))
        lines.append('%s_sum{engine="0",model_name="llama"} %f' % (family, requests * typical))
    lines.append('vllm:request_success_total{engine="0",finished_reason="stop",model_name="llama"} %d' % requests)
    for gauge, value in (("vllm:num_requests_running", 12), ("vllm:num_requests_waiting", 1),
                         ("vllm:kv_cache_usage_perc", 0.42)):
        lines.append('%s{engine="0",model_name="llama"} %s' % (gauge, value))
    lines.append('vllm:num_preemptions_total{engine="0",model_name="llama"} 3')
    for i in range(60):
        lines.append('python_gc_objects_collected_total{generation="%d"} %d' % (i, i * 100))
    return "\n".join(lines) + "\n"


def child(ticks: int, interval: float) -> dict:
    wd = load_daemon()
    work = tempfile.mkdtemp(prefix="kvpin-overhead-")
    server = None
    notify = None
    try:
        cg = os.path.join(work, "cgroup", "system.slice", "vllm.service")
        os.makedirs(cg)
        proc_root = os.path.join(work, "proc")
        pids = [100, 101, 102, 103, 104, 105]     # TP=4: API server, EngineCore, 4 workers
        for pid in pids:
            os.makedirs(os.path.join(proc_root, str(pid)))
            with open(os.path.join(proc_root, str(pid), "status"), "w", encoding="utf-8") as h:
                h.write("Name:\tpython3\nVmRSS:\t9000000 kB\nRssAnon:\t1500000 kB\nVmSwap:\t0 kB\n" * 1)
            with open(os.path.join(proc_root, str(pid), "stat"), "w", encoding="utf-8") as h:
                h.write("%d (python3) %s\n" % (pid, " ".join(["S"] + ["0"] * 18 + [str(1000 + pid)])))
        with open(os.path.join(cg, "cgroup.procs"), "w", encoding="utf-8") as h:
            h.write("".join("%d\n" % p for p in pids))
        metrics_dir = os.path.join(work, "www")
        os.makedirs(metrics_dir)
        # The scrape target runs in its own process so its CPU is not counted here.
        server = subprocess.Popen([sys.executable, "-m", "http.server", "0", "--bind", "127.0.0.1",
                                   "--directory", metrics_dir], stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, text=True)
        port = int(server.stdout.readline().split("port ")[1].split()[0])
        notify_path = os.path.join(work, "notify.sock")
        notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        notify.bind(notify_path)
        notify.setblocking(False)
        os.environ["NOTIFY_SOCKET"] = notify_path
        cfg = dict(wd.DEFAULTS, name="vllm-a", cgroup_path="system.slice/vllm.service",
                   cgroup_root=os.path.join(work, "cgroup"), proc_root=proc_root,
                   metrics_url="http://127.0.0.1:%d/metrics" % port,
                   textfile_dir=os.path.join(work, "textfile"), interval_seconds=interval,
                   lock_file=os.path.join(work, "lock"), traffic_state_file=os.path.join(work, "traffic.json"))
        clock_t = [0.0]
        daemon = wd.Daemon(cfg, out=open(os.devnull, "w", encoding="utf-8"), clock=lambda: clock_t[0],
                           monotonic=lambda: clock_t[0])
        rng = random.Random(1)

        def step(i):
            with open(os.path.join(cg, "memory.stat"), "w", encoding="utf-8") as h:
                h.write("anon %d\nfile %d\n" % (6 * GiB + i * 50 * MiB / 60 + rng.gauss(0, 100 * MiB), 40 * GiB))
            with open(os.path.join(cg, "memory.swap.current"), "w", encoding="utf-8") as h:
                h.write("0\n")
            with open(os.path.join(metrics_dir, "metrics"), "w", encoding="utf-8") as h:
                h.write(vllm_metrics(100 * i))
            clock_t[0] = i * interval

        # Fill the window first (warm-up + 3 h), untimed, so every timed evaluation is full size.
        warm = int((cfg["warmup_seconds"] + cfg["window_seconds"]) / interval) + 1
        for i in range(warm):
            step(i)
            daemon.tick()
            while True:
                try:
                    notify.recv(4096)
                except BlockingIOError:
                    break
        fixture_cpu = 0.0
        tick_cpu = 0.0
        for i in range(warm, warm + ticks):
            c0 = time.process_time()
            step(i)                       # writing the synthetic cgroup: not the watchdog's cost
            c1 = time.process_time()
            daemon.tick()
            c2 = time.process_time()
            fixture_cpu += c1 - c0
            tick_cpu += c2 - c1
            try:
                notify.recv(4096)
            except BlockingIOError:
                pass
        return {"tick_cpu": tick_cpu, "ticks": ticks, "hwm_kib": vm_hwm_kib(), "fixture_cpu": fixture_cpu}
    finally:
        if server is not None:
            server.terminate()
            server.wait()
        if notify is not None:
            notify.close()
        shutil.rmtree(work, ignore_errors=True)


# ---------------------------------------------------------------------------
# node mode: four deployment watchdogs, a fake GPUStack API, four fake engine trees.
# ---------------------------------------------------------------------------
FAKE_GPUSTACK = os.path.join(ROOT, "tests", "unit", "watchdog", "gpustack_fake.py")
# engine_runtime container: `podman` on the watchdogs' PATH is this test double (shell builtins
# only); it answers `inspect --format {{.State.Pid}} NAME` from a NAME -> pid file and logs each
# call. The pid's /proc/PID/cgroup (a synthetic proc root) names the engine's synthetic
# container cgroup (libpod-<id>.scope/container under a synthetic cgroup root, memory.max set).
FAKE_RUNTIME = os.path.join(ROOT, "tests", "unit", "watchdog", "fake_container_runtime.sh")
CONTAINER_ANON = 6 * GiB
CONTAINER_MAX = 16 * GiB
TOKEN = "kvpin-bench-token"
WORKER = "node-a"
DEPLOYMENTS = ("llama-3.1-8b", "qwen3-8b", "gpt-oss-20b", "mistral-small-24b")
ENGINE_TREE = "API server -> EngineCore -> 2 workers"


def load_daemon():
    """The watchdog program as a module (the tests' loader, tests/watchdog_program.py)."""
    tests_dir = os.path.join(ROOT, "tests")
    if tests_dir not in sys.path:
        sys.path.insert(0, tests_dir)
    from watchdog_program import load_watchdog_program  # pylint: disable=import-error,import-outside-toplevel
    return load_watchdog_program()


def write_memory_stat(cgroup_dir: str, anon: int) -> None:
    """A cgroup v2 memory.stat (the lines the daemon reads, plus file), replaced atomically."""
    tmp = os.path.join(cgroup_dir, ".memory.stat.tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write("anon %d\nfile %d\nkernel %d\nshmem 0\n" % (anon, 40 * GiB, 64 * MiB))
    os.replace(tmp, os.path.join(cgroup_dir, "memory.stat"))


def container_node(work: str, engines) -> Dict[str, str]:
    """The container side of a node for engine_runtime container: one synthetic cgroup per
    engine (created before the engines start, see run_node), /proc/PID/cgroup for each engine
    root pid and /proc/meminfo in a synthetic proc root, the fake runtime as `podman` on PATH.
    Returns the daemon config keys and the environment the watchdogs need."""
    proc_root = os.path.join(work, "proc")
    for i, proc in enumerate(engines):
        os.makedirs(os.path.join(proc_root, str(proc.pid)))
        with open(os.path.join(proc_root, str(proc.pid), "cgroup"), "w", encoding="utf-8") as handle:
            handle.write("0::/%s\n" % container_scope(i))
    shutil.copyfile("/proc/meminfo", os.path.join(proc_root, "meminfo"))
    pids = os.path.join(work, "runtime.pids")
    with open(pids, "w", encoding="utf-8") as handle:
        # GPUStack's fake names instance ID "<deployment>-ID" (gpustack_fake.instance: llama-ID).
        handle.write("".join("llama-%d %d\n" % (100 + i, proc.pid) for i, proc in enumerate(engines)))
    bindir = os.path.join(work, "bin")
    os.makedirs(bindir)
    os.symlink(FAKE_RUNTIME, os.path.join(bindir, "podman"))
    return {"cgroup_root": os.path.join(work, "cgroup"), "proc_root": proc_root, "pids": pids,
            "path": bindir + os.pathsep + os.environ.get("PATH", "")}


def container_scope(i: int) -> str:
    return "machine.slice/libpod-%064x.scope/container" % (0xC0DE0 + i)


def _idle_until_orphaned(parent: int) -> None:
    """A fake engine process: sleeps until its parent is gone (or its group is killed)."""
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(0)


def engine_main(seed: int, cgroup_dir: str = "") -> int:
    """A fake engine: fork the tree first (no threads yet), then serve /metrics on loopback.
    Every scrape counts 100 more requests into the histograms and replaces an anon ballast of
    random size (touched pages, 4-6 MiB) so the engine's RssAnon moves without a trend (and
    never drops by restart_drop_fraction, which the daemon would read as a restart).
    cgroup_dir (container mode): the engine's synthetic container cgroup, whose memory.stat it
    rewrites on every scrape (anon = CONTAINER_ANON + the ballast), replaced atomically."""
    import http.server  # pylint: disable=import-outside-toplevel
    import threading  # pylint: disable=import-outside-toplevel
    root, parent = os.getpid(), os.getppid()
    core = os.fork()
    if core == 0:
        for _worker in range(2):
            if os.fork() == 0:
                _idle_until_orphaned(os.getppid())
        _idle_until_orphaned(root)
    rng = random.Random(seed)
    private = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
    state = {"requests": 0, "ballast": mmap.mmap(-1, mmap.PAGESIZE, flags=private)}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            if self.path != "/metrics":
                self.send_error(404)
                return
            state["requests"] += 100
            # A private anonymous mapping of its own (a shared one is RssShmem, which the daemon
            # rightly ignores; malloc would keep and reuse a freed block), every page touched;
            # the old one unmapped first, so there is no transient double.
            state["ballast"].close()
            size = 4 * MiB + rng.randrange(0, 2 * MiB)
            state["ballast"] = mmap.mmap(-1, size, flags=private)
            for offset in range(0, size, mmap.PAGESIZE):
                state["ballast"][offset] = 1
            if cgroup_dir:
                write_memory_stat(cgroup_dir, CONTAINER_ANON + size)
            body = vllm_metrics(state["requests"]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    print(server.server_address[1], flush=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    while os.getppid() == parent:
        time.sleep(0.5)
    return 0


def gpustack_main() -> int:
    """The fake GPUStack API (the unit tests' loopback stand-in), spec as JSON on stdin."""
    spec_in = json.loads(sys.stdin.readline())
    mod_spec = importlib.util.spec_from_file_location("gpustack_fake", FAKE_GPUSTACK)
    fake_mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(fake_mod)
    parent = os.getppid()
    fake = fake_mod.FakeGPUStack(version=spec_in["version"], token=spec_in["token"])
    fake.models = spec_in["models"]
    fake.instances = [fake.instance(i["id"], i["pid"], worker=i["worker"], model_id=i["model_id"],
                                    gpus=i["gpus"], port=i["port"]) for i in spec_in["instances"]]
    fake.requests = _Dropped()       # the test helper's request log would grow for hours
    print(fake.port, flush=True)
    while os.getppid() == parent:
        time.sleep(0.5)
    fake.close()
    return 0


class _Dropped(list):
    def append(self, _item):
        pass


class _LastLine:
    """stdout of the daemon (journald in production): keeps only the last record."""
    def __init__(self):
        self.last = ""

    def write(self, text):
        self.last = text

    def flush(self):
        pass


def deployment_child(config_path: str, ticks: int) -> dict:
    """One watchdog process: the program's own config loading and validation, then warm-up
    (untimed, fills warm-up + window) and N timed ticks, each followed by the liveness feeds
    Daemon.run sends during one interval."""
    wd = load_daemon()
    cfg = wd.load_config(config_path)
    errors = wd.validate_config(cfg)
    if errors:
        raise SystemExit("config %s: %s" % (config_path, "; ".join(errors)))
    interval = float(cfg["interval_seconds"])
    feeds = int(math.ceil(interval / min(1.0, interval)))   # Daemon.run sleeps min(1, interval)
    clock_t = [0.0]
    out = _LastLine()
    daemon = wd.Daemon(cfg, out=out, clock=lambda: 1.7e9 + clock_t[0], monotonic=lambda: clock_t[0])
    daemon.status_line = "starting"

    def feed():
        for _second in range(feeds):
            if daemon.healthy():
                wd.sd_notify("WATCHDOG=1\nSTATUS=%s" % daemon.status_line)

    warm = int((float(cfg["warmup_seconds"]) + float(cfg["window_seconds"])) / interval) + 1
    for i in range(warm):
        clock_t[0] = i * interval
        daemon.tick()
        feed()
    tick_cpu = feed_cpu = wall = 0.0
    no_reading = restarts = 0
    seen = []
    actions: Dict[str, int] = {}
    calls_warm = _runtime_calls()
    kids0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    decision = None
    for i in range(warm, warm + ticks):
        clock_t[0] = i * interval
        w0, c0 = time.monotonic(), time.process_time()
        decision = daemon.tick()
        c1, w1 = time.process_time(), time.monotonic()
        feed()
        c2 = time.process_time()
        tick_cpu += c1 - c0
        feed_cpu += c2 - c1
        wall += w1 - w0
        if decision.memory_bytes is None:
            no_reading += 1
        else:
            seen.append(decision.memory_bytes)
        if decision.phase == "warmup":
            restarts += 1
        actions[decision.action] = actions.get(decision.action, 0) + 1
    kids1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    calls_all = _runtime_calls()
    last = json.loads(out.last) if out.last else {}
    return {"tick_cpu": tick_cpu, "feed_cpu": feed_cpu, "feeds_per_tick": feeds, "ticks": ticks,
            "children_cpu": (kids1.ru_utime + kids1.ru_stime) - (kids0.ru_utime + kids0.ru_stime),
            "wall_per_tick": wall / max(1, ticks), "warmup_ticks": restarts,
            "memory_range": [min(seen), max(seen)] if seen else None, "hwm_kib": vm_hwm_kib(),
            "no_reading": no_reading,
            "actions": actions, "phase": decision.phase if decision else None,
            "window_points": decision.window_points if decision else 0,
            "memory_bytes": decision.memory_bytes if decision else None,
            "ttft_p95": decision.ttft_p95 if decision else None,
            "memory_source": last.get("memory_source") or last.get("reason"),
            "latency_status": last.get("latency_status"), "api_version": daemon.api.version,
            "warm_ticks": warm, "runtime_calls": calls_all, "runtime_calls_timed": (calls_all - calls_warm)
            if calls_all is not None and calls_warm is not None else None}


def _runtime_calls():
    """Calls of the fake container runtime so far (its log, one line a call); None = native."""
    path = os.environ.get("KVPIN_FAKE_RUNTIME_LOG")
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            return sum(1 for _line in handle)
    except FileNotFoundError:
        return 0


def _read_port(proc) -> int:
    line = proc.stdout.readline()
    if not line.strip().isdigit():
        raise RuntimeError("helper process did not report a port (got %r)" % line)
    return int(line)


def _stop(proc, group: bool = False) -> None:
    if proc is None or proc.poll() is not None:
        return
    try:
        if group:
            os.killpg(proc.pid, signal.SIGTERM)     # the fake engine's own tree, by its group id
        else:
            proc.terminate()
    except ProcessLookupError:
        pass
    proc.wait()


def run_node(watchdogs: int, ticks: int, api_version: str, runtime: str) -> dict:
    """Start the fake API, the engines and the watchdogs; return each watchdog's figures."""
    wd = load_daemon()
    work = tempfile.mkdtemp(prefix="kvpin-node-")
    engines, api, kids, socks = [], None, [], []
    try:
        for i in range(watchdogs):
            argv = self_argv("--engine", str(i))
            if runtime == "container":
                cgroup_dir = os.path.join(work, "cgroup", container_scope(i))
                os.makedirs(cgroup_dir)
                write_memory_stat(cgroup_dir, CONTAINER_ANON + 4 * MiB)
                for name, value in (("memory.max", CONTAINER_MAX), ("memory.swap.current", 0)):
                    with open(os.path.join(cgroup_dir, name), "w", encoding="utf-8") as handle:
                        handle.write("%d\n" % value)
                argv.append(cgroup_dir)
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, start_new_session=True)
            engines.append(proc)
        ports = [_read_port(proc) for proc in engines]
        names = [DEPLOYMENTS[i % len(DEPLOYMENTS)] + ("" if i < len(DEPLOYMENTS) else "-%d" % i)
                 for i in range(watchdogs)]
        models = [{"id": 11 + i, "name": name} for i, name in enumerate(names)]
        instances = []
        for i, name in enumerate(names):
            instances.append({"id": 100 + i, "pid": engines[i].pid, "worker": WORKER, "model_id": 11 + i,
                              "gpus": [i], "port": ports[i]})
            # The replica on another worker: listed by the API, not this node's to watch.
            instances.append({"id": 200 + i, "pid": 4000 + i, "worker": "node-b", "model_id": 11 + i,
                              "gpus": [i], "port": 40000 + i})
        api = subprocess.Popen(self_argv("--gpustack-api"),
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        api.stdin.write(json.dumps({"version": api_version, "token": TOKEN, "models": models,
                                    "instances": instances}) + "\n")
        api.stdin.flush()
        api_port = _read_port(api)
        containers = container_node(work, engines) if runtime == "container" else None
        token_file = os.path.join(work, "gpustack.token")
        fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(TOKEN + "\n")
        for i, name in enumerate(names):
            # What the role's watchdog.json.j2 renders for a deployment target (site.yml).
            cfg = {"name": name, "actuator": "gpustack", "dry_run": True,
                   "interval_seconds": wd.DEFAULTS["interval_seconds"],
                   "textfile_dir": os.path.join(work, "textfile"), "lock_dir": os.path.join(work, "lock"),
                   "traffic_state_file": os.path.join(work, "traffic-%d.json" % i),
                   "lock_file": os.path.join(work, "lock", "recycle.lock"), "watchdog_sec": 180,
                   "gpustack_deployment": name, "gpustack_server": "http://127.0.0.1:%d" % api_port,
                   "gpustack_token_file": token_file, "gpustack_api_version": "auto",
                   "gpustack_worker_name": WORKER, "engine_runtime": runtime, "gpu_indexes": [i],
                   "metrics_path": "/metrics"}
            if containers:
                cfg.update(container_runtime="podman", cgroup_root=containers["cgroup_root"],
                           proc_root=containers["proc_root"])
            path = os.path.join(work, "%s.json" % name)
            with open(path, "w", encoding="utf-8") as handle:
                handle.write("# kvpin watchdog for %s (benchmark)\n%s\n" % (name, json.dumps(cfg, indent=2)))
            notify_path = os.path.join(work, "notify-%d.sock" % i)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            sock.bind(notify_path)
            sock.setblocking(False)
            socks.append(sock)
            env = dict(os.environ, NOTIFY_SOCKET=notify_path)
            if containers:
                env.update(PATH=containers["path"], KVPIN_FAKE_RUNTIME_PIDS=containers["pids"],
                           KVPIN_FAKE_RUNTIME_LOG=os.path.join(work, "runtime-%d.log" % i))
            kids.append(subprocess.Popen(self_argv("--deployment-child", path, str(ticks)), stdout=subprocess.PIPE,
                                         env=env, text=True))
        notified = [0] * watchdogs
        # systemd's side of NOTIFY_SOCKET: drain every datagram while the watchdogs run.
        while any(k.poll() is None for k in kids):
            ready, _w, _x = select.select(socks, [], [], 0.2)
            for sock in ready:
                while True:
                    try:
                        data = sock.recv(4096)
                    except BlockingIOError:
                        break
                    if data.startswith(b"WATCHDOG=1"):
                        notified[socks.index(sock)] += 1
        results = []
        for i, kid in enumerate(kids):
            text = kid.stdout.read()
            if kid.wait() != 0:
                raise RuntimeError("watchdog %s failed (rc %d)" % (names[i], kid.returncode))
            res = json.loads(text.strip().splitlines()[-1])
            res.update(name=names[i], notified=notified[i])
            results.append(res)
        procs = len([p for p in os.listdir("/proc") if p.isdigit()])
        return {"watchdogs": results, "node_processes": procs, "api_version": api_version, "runtime": runtime}
    finally:
        for kid in kids:
            _stop(kid)
        _stop(api)
        for proc in engines:
            _stop(proc, group=True)
        for sock in socks:
            sock.close()
        shutil.rmtree(work, ignore_errors=True)


def _mb(kib: float) -> float:
    return kib * 1024 / 1e6


def print_node(node: dict, base: dict, interval: float, hours: float, runtime: str) -> None:
    rows = node["watchdogs"]
    print()
    found = sorted({str(r["api_version"]) for r in rows})
    print("node with %d watched GPUStack deployments (one daemon each, target gpustack_deployment, "
          "engine_runtime %s; fake API %s, the daemons' auto detection found %s): interval %.0f s, %d timed "
          "ticks = %.0f simulated hours after the warm-up + window fill; each engine a tree of 4 processes (%s); "
          "%d processes on this node" % (
              len(rows), runtime, node["api_version"], "/".join(found), interval, rows[0]["ticks"], hours,
              ENGINE_TREE, node["node_processes"]))
    head = "%-20s %9s %9s %9s %9s %8s %9s %8s %7s %7s  %s" % (
        "watchdog", "tick ms", "feed ms", "CPU s/h", "% core", "x start", "VmHWM MB", "x base", "CPU", "RSS",
        "last reading (MiB, TTFT p95 s, window points, actions)")
    print(head)
    base_cpu = base["tick_cpu"]
    print("%-20s %9s %9s %9s %9s %8s %9.1f %8s %7s %7s  %s" % (
        "python only (base)", "-", "-", "%.3f*" % base_cpu, "-", "1.00", _mb(base["hwm_kib"]), "1.00", "", "",
        "* startup CPU, once"))
    tot_h = tot_mb = 0.0
    met_all = True
    for r in rows:
        per_tick = (r["tick_cpu"] + r["children_cpu"]) / r["ticks"]
        feed = r["feed_cpu"] / r["ticks"]
        per_hour = (per_tick + feed) * 3600.0 / interval
        pct = 100.0 * per_hour / 3600.0
        mb = _mb(r["hwm_kib"])
        cpu_ok, mem_ok = pct < 0.1, mb < 30.0
        met_all = met_all and cpu_ok and mem_ok
        tot_h += per_hour
        tot_mb += mb
        reading = "%s, %s, %d, %s" % (
            "%.0f" % (r["memory_bytes"] / MiB) if r["memory_bytes"] is not None else "none",
            "%.3f" % r["ttft_p95"] if r["ttft_p95"] is not None else "none", r["window_points"],
            " ".join("%s=%d" % kv for kv in sorted(r["actions"].items())))
        print("%-20s %9.2f %9.2f %9.3f %9.4f %8.1f %9.1f %8.2f %7s %7s  %s" % (
            r["name"], per_tick * 1000, feed * 1000, per_hour, pct, per_hour / base_cpu if base_cpu else 0.0,
            mb, r["hwm_kib"] / float(base["hwm_kib"]), "met" if cpu_ok else "MISSED",
            "met" if mem_ok else "MISSED", reading))
    node_pct = 100.0 * tot_h / 3600.0
    print("%-20s %9s %9s %9.3f %9.4f %8.1f %9.1f %8.2f %7s %7s  %s" % (
        "node total", "", "", tot_h, node_pct, tot_h / base_cpu if base_cpu else 0.0, tot_mb,
        tot_mb / _mb(base["hwm_kib"]), "met" if node_pct < 0.1 else "MISSED", "", "sum of peaks"))
    print("tick ms = CPU per tick (own + children, e.g. a container runtime); feed ms = CPU of the %d WATCHDOG=1 "
          "feeds per interval; x start = CPU s per hour / the baseline's Python startup CPU; x base = VmHWM / "
          "the baseline's. Targets: < 0.1 %% of one core and < 30 MB per watchdog; node total CPU also against "
          "0.1 %% (the strict reading). Every target met: %s" % (rows[0]["feeds_per_tick"],
                                                                 "yes" if met_all and node_pct < 0.1 else "NO"))
    for r in rows:
        problems = []
        if r["no_reading"]:
            problems.append("%d timed ticks without a memory reading (%s)" % (r["no_reading"], r["memory_source"]))
        if r["warmup_ticks"]:
            problems.append("%d timed ticks in a warm-up (a restart was detected: evaluations were not full "
                            "size; memory range %s bytes)" % (r["warmup_ticks"], r["memory_range"]))
        if r["ttft_p95"] is None:
            problems.append("no TTFT p95 (%s)" % r["latency_status"])
        if r["notified"] == 0:
            problems.append("no WATCHDOG=1 reached the notify socket")
        if problems:
            print("WARNING %s: %s" % (r["name"], "; ".join(problems)))
    print("wall per tick (%d watchdogs + API + engines sharing the cores): %s ms; memory source: %s" % (
        len(rows), ", ".join("%.1f" % (r["wall_per_tick"] * 1000) for r in rows), rows[0]["memory_source"]))
    if runtime == "container":
        print("container runtime (`podman inspect`, a test double on PATH) calls per watchdog: %s in the whole run "
              "(%d warm-up + %d timed ticks), %s in the timed ticks (the double is far cheaper per call than a "
              "real podman inspect)" % (
                  ", ".join(str(r["runtime_calls"]) for r in rows), rows[0]["warm_ticks"], rows[0]["ticks"],
                  ", ".join(str(r["runtime_calls_timed"]) for r in rows)))


def baseline() -> dict:
    return {"tick_cpu": time.process_time(), "ticks": 0, "hwm_kib": vm_hwm_kib()}


def run_child(args):
    out = subprocess.run(self_argv(*args), capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _flag(argv, name, default, choices=None):
    if name not in argv:
        return default
    value = argv[argv.index(name) + 1]
    if choices and value not in choices:
        raise SystemExit("%s must be one of %s, got %r" % (name, ", ".join(choices), value))
    return value


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        print(json.dumps(child(int(argv[1]), float(argv[2]))))
        return 0
    if argv and argv[0] == "--baseline":
        print(json.dumps(baseline()))
        return 0
    if argv and argv[0] == "--engine":
        return engine_main(int(argv[1]), argv[2] if len(argv) > 2 else "")
    if argv and argv[0] == "--gpustack-api":
        return gpustack_main()
    if argv and argv[0] == "--deployment-child":
        print(json.dumps(deployment_child(argv[1], int(argv[2]))))
        return 0
    mode = _flag(argv, "--mode", "both", ("cgroup", "node", "both"))
    watchdogs = int(_flag(argv, "--watchdogs", "4"))
    api_version = _flag(argv, "--api-version", "v2", ("v1", "v2"))
    runtimes = _flag(argv, "--engine-runtime", "both", ("native", "container", "both"))
    wd = load_daemon()
    interval = float(wd.DEFAULTS["interval_seconds"])
    prepare_children()
    base = run_child(["--baseline"])
    if mode in ("cgroup", "both"):
        hours = float(_flag(argv, "--hours", "24"))
        print_cgroup(run_child(["--child", str(int(hours * 3600 / interval)), str(interval)]), base, wd,
                     interval, hours)
    if mode in ("node", "both"):
        # Default 3 h: four watchdogs (each also filling warm-up + window first, 241 ticks), the
        # fake API and four engines share CI's 2 cores; the figure is per tick, so more hours
        # only add samples (36 full-window evaluations per watchdog at 3 h).
        # engine_runtime both (the default): native (GPUStack 0.7.x), then container (2.x, the
        # role's default), each its own node run.
        hours = float(_flag(argv, "--hours", "3"))
        for runtime in ("native", "container") if runtimes == "both" else (runtimes,):
            node = run_node(watchdogs, int(hours * 3600 / interval), api_version, runtime)
            print_node(node, base, interval, hours, runtime)
    return 0


def print_cgroup(res, base, wd, interval, hours):
    ticks = res["ticks"]
    per_tick = res["tick_cpu"] / res["ticks"]
    per_hour = per_tick * 3600.0 / interval
    core_pct = 100.0 * per_hour / 3600.0
    print("watchdog overhead (cgroup target): interval %.0f s, %d ticks = %.0f simulated hours, evaluation every "
          "%s s, window %s s (max %s points)" % (interval, ticks, hours, wd.DEFAULTS["evaluate_every_seconds"],
                                                 wd.DEFAULTS["window_seconds"], wd.DEFAULTS["max_points"]))
    print("%-34s %14s %14s %12s" % ("process", "CPU s / hour", "% of one core", "VmHWM MiB"))
    print("%-34s %14s %14s %12.1f" % ("idle python (baseline)", "0 (startup %.3f s)" % base["tick_cpu"],
                                      "-", base["hwm_kib"] / 1024.0))
    print("%-34s %14.3f %14.4f %12.1f" % ("watchdog per-tick path", per_hour, core_pct, res["hwm_kib"] / 1024.0))
    print("%-34s %14s %14s %12.1f" % ("watchdog minus baseline", "", "", (res["hwm_kib"] - base["hwm_kib"]) / 1024.0))
    print("ratio vs baseline memory: %.2fx; CPU per tick %.2f ms; targets: < 0.1 %% of one core (%s), "
          "< 30 MB (%s)" % (res["hwm_kib"] / float(base["hwm_kib"]), per_tick * 1000.0,
                            "met" if core_pct < 0.1 else "MISSED",
                            "met" if res["hwm_kib"] * 1024 < 30e6 else "MISSED"))


if __name__ == "__main__":
    sys.exit(main())
