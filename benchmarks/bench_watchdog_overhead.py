# -*- coding: utf-8 -*-
# Copyright (c) 2026, kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""CPU and memory cost of the watchdog per hour of watching, against an idle Python process.

A child process runs the daemon's real per-tick code (Daemon.tick: cgroup + /proc reads,
a /metrics scrape from a local server on 127.0.0.1, the decision engine with a full 3 h
window, the textfile write, sd_notify to a socket) N times on a simulated clock advancing
by interval_seconds, against a synthetic cgroup dir whose memory.stat changes every tick.
CPU per tick is scaled to one hour at the configured interval. Own memory = VmHWM of that
child. Baseline = the same measurements for a child that only starts Python.
Targets: < 0.1 % of one core, < 30 MB. Prints a table; no asserts.

Run: .venv/bin/python benchmarks/bench_watchdog_overhead.py [--hours 24]
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAM = os.path.join(ROOT, "roles", "serving_watchdog", "files", "kvpin_watchdog.py")
GiB = 1024 ** 3
MiB = 1024 ** 2


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
    for gauge, value in (("vllm:num_requests_running", 12), ("vllm:num_requests_waiting", 1),
                         ("vllm:kv_cache_usage_perc", 0.42)):
        lines.append('%s{engine="0",model_name="llama"} %s' % (gauge, value))
    lines.append('vllm:num_preemptions_total{engine="0",model_name="llama"} 3')
    for i in range(60):
        lines.append('python_gc_objects_collected_total{generation="%d"} %d' % (i, i * 100))
    return "\n".join(lines) + "\n"


def child(ticks: int, interval: float) -> dict:
    spec = importlib.util.spec_from_file_location("kvpin_watchdog", PROGRAM)
    wd = importlib.util.module_from_spec(spec)
    sys.modules["kvpin_watchdog"] = wd
    spec.loader.exec_module(wd)
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
                   lock_file=os.path.join(work, "lock"))
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


def baseline() -> dict:
    return {"tick_cpu": time.process_time(), "ticks": 0, "hwm_kib": vm_hwm_kib()}


def run_child(args):
    out = subprocess.run([sys.executable, os.path.abspath(__file__)] + args, capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        print(json.dumps(child(int(argv[1]), float(argv[2]))))
        return 0
    if argv and argv[0] == "--baseline":
        print(json.dumps(baseline()))
        return 0
    hours = 24.0
    if "--hours" in argv:
        hours = float(argv[argv.index("--hours") + 1])
    spec = importlib.util.spec_from_file_location("kvpin_watchdog", PROGRAM)
    wd = importlib.util.module_from_spec(spec)
    sys.modules["kvpin_watchdog"] = wd
    spec.loader.exec_module(wd)
    interval = float(wd.DEFAULTS["interval_seconds"])
    ticks = int(hours * 3600 / interval)
    base = run_child(["--baseline"])
    res = run_child(["--child", str(ticks), str(interval)])
    per_tick = res["tick_cpu"] / res["ticks"]
    per_hour = per_tick * 3600.0 / interval
    core_pct = 100.0 * per_hour / 3600.0
    print("watchdog overhead: interval %.0f s, %d ticks = %.0f simulated hours, evaluation every %s s, "
          "window %s s (max %s points)" % (interval, ticks, hours, wd.DEFAULTS["evaluate_every_seconds"],
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
