# -*- coding: utf-8 -*-
# Copyright (c) 2026, kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""GPUStack: the deployment's instance on this worker, found every tick."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from .fsio import _read, _read_small
from .shared import gpustack_api
from .httpio import HTTPFailure, _mask_secret, _redact_url, http_request, read_api_key
from .sensors import cgroup_candidates, cgroup_memory, pick_cgroup_dir, proc_anon_swap, resolve_cgroup


# ---------------------------------------------------------------------------
# GPUStack: the deployment's instance on this worker, found every tick.
# Routes and fields checked in GPUStack's source:
#   0.7.1: management routes under /v1, admin only (gpustack/routes/routes.py v1_admin_router:
#          /v1/models, /v1/model-instances); GET /v1/models?search=<name> is a fuzzy name match
#          (routes/models.py get_models), GET /v1/model-instances?model_id=&worker_id= filters
#          (routes/model_instances.py get_model_instances); answers are PaginatedList
#          {items, pagination} (schemas/common.py). ModelInstance fields (schemas/models.py
#          ModelInstanceBase): id, name, worker_id, worker_name, worker_ip, pid, port, ports,
#          state (running, ...), gpu_indexes, model_id, model_name, restart_count.
#   2.x:   the same routes under /v2 (routes/routes.py versioned_prefix = "/v2"), same fields.
#   Restart of ONE instance: DELETE /{v}/model-instances/{id} in both. The model controller
#          then recreates the missing replica (0.7.1 server/controllers.py ModelInstanceController
#          ._reconcile: on EventType.DELETED -> sync_replicas, which creates
#          model.replicas - len(instances) new instances). POST /v2/models/{id}/restart (2.3)
#          restarts every replica of the model on every worker, so it is not used here.
#   2.x engine containers are named after the instance (worker/serve_manager.py:
#          get_workload(model_instance.name)).
# ---------------------------------------------------------------------------
# The instance states that serve, and the server-owned status on a model read back from the API
# (left out of a full-record PUT): the collection's gpustack/api.py, shipped as gpustack_api.
INSTANCE_STATES_RUNNING = gpustack_api.INSTANCE_STATES_RUNNING
SERVER_OWNED_MODEL_FIELDS = gpustack_api.SERVER_OWNED_MODEL_FIELDS


@dataclass
class Instance:
    id: int
    name: str
    state: str
    pid: Optional[int]
    port: Optional[int]
    gpu_indexes: List[int]
    worker_ip: Optional[str]
    restart_count: int = 0

    def identity(self) -> Tuple[object, ...]:
        return (self.id, self.pid, self.port, self.name)


def _int_field(item: Dict[str, object], key: str, low: int = 0, high: int = 2 ** 62) -> Optional[int]:
    value = item.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        return None
    return value


def parse_instance(item: object) -> Optional[Instance]:
    """One ModelInstance from the API, type- and range-checked; None if unusable."""
    if not isinstance(item, dict):
        return None
    iid = _int_field(item, "id", 1)
    name = item.get("name")
    if iid is None or not isinstance(name, str) or not name:
        return None
    port = _int_field(item, "port", 1, 65535)
    if port is None and isinstance(item.get("ports"), list) and item["ports"]:
        first = item["ports"][0]
        port = first if isinstance(first, int) and not isinstance(first, bool) and 0 < first < 65536 else None
    gpus = item.get("gpu_indexes") or []
    gpus = sorted({g for g in gpus if isinstance(g, int) and not isinstance(g, bool) and 0 <= g < 1024}) \
        if isinstance(gpus, list) else []
    ip = item.get("worker_ip")
    return Instance(id=iid, name=name, state=str(item.get("state") or ""), pid=_int_field(item, "pid", 1, 2 ** 31),
                    port=port, gpu_indexes=gpus, worker_ip=ip if isinstance(ip, str) and ip else None,
                    restart_count=_int_field(item, "restart_count") or 0)


class GPUStackAPI:
    """The few GPUStack routes the watchdog needs, every call bounded by the tick deadline."""

    def __init__(self, cfg: Dict[str, object]):
        self.cfg = cfg
        self.server = str(cfg["gpustack_server"]).rstrip("/")
        self.version = None if cfg.get("gpustack_api_version") in (None, "auto") else str(cfg["gpustack_api_version"])
        self.model_id: Optional[int] = None
        self.key: Optional[str] = None   # the last key read: masked in any text from the server

    def _headers(self) -> Dict[str, str]:
        headers = {"Accept": "application/json", "Content-Type": "application/json"}
        key = read_api_key(self.cfg.get("gpustack_token_file"))
        if key:
            self.key = key
            headers["Authorization"] = "Bearer " + key
        return headers

    def mask(self, text: object) -> str:
        """Server text (a message, a Location, a read-back value) with the API key masked."""
        return _mask_secret(text, self.key)

    def exchange(self, method: str, path: str, deadline: float, payload: Optional[bytes] = None,
                 max_bytes: Optional[int] = None) -> Tuple[int, bytes]:
        """One request, its status and raw body (at most max_bytes, default max_body_bytes); a
        redirect is refused (HTTPFailure), so the API key never reaches another origin."""
        url = self.server + path
        if payload is None and method in ("POST", "PUT"):
            payload = b"{}"
        status, body, headers = http_request(url, method, payload,
                                             self._headers(), deadline,
                                             float(self.cfg["http_timeout_seconds"]),
                                             int(max_bytes or self.cfg["max_body_bytes"]))
        if 300 <= status < 400:
            raise HTTPFailure("%s %s answered %d redirect to %s: not followed (the API key stays here)" % (
                method, _redact_url(url), status, _redact_url(self.mask(headers.get("location", "?")))[:200]))
        return status, body

    def call(self, method: str, path: str, deadline: float, payload: Optional[bytes] = None) -> Tuple[int, object]:
        status, body = self.exchange(method, path, deadline, payload)
        data = None
        if body:
            try:
                data = json.loads(body.decode("utf-8", "replace"))
            except (ValueError, RecursionError):   # not JSON, or nested deeper than the parser's stack
                data = None
        return status, data

    def prefix(self, deadline: float) -> str:
        if self.version is None:
            self.version = self.detect_version(deadline)
        return "/" + self.version

    def detect_version(self, deadline: float) -> str:
        """The collection's rule (gpustack_api.detect_api_version): v2 when GET /v2/models answers
        anything but 404 (a 401 too: the route exists, the real call reports the auth error), else
        v1 when /v1/models does. A redirect is refused as in every call (HTTPFailure)."""
        def status_of(path: str) -> int:
            return self.call("GET", path + "?perPage=1", deadline)[0]
        try:
            return gpustack_api.detect_api_version(status_of)
        except gpustack_api.ApiVersionError as exc:
            raise HTTPFailure("cannot tell the API version: %s" % exc) from None

    def _items(self, path: str, deadline: float) -> List[object]:
        status, data = self.call("GET", path, deadline)
        if status != 200:
            raise HTTPFailure("GET %s answered %d" % (path, status))
        items = data.get("items") if isinstance(data, dict) else data
        if not isinstance(items, list):
            raise HTTPFailure("GET %s: no items list in the answer" % path)
        return items

    def find_model_id(self, deadline: float) -> int:
        import urllib.parse  # pylint: disable=import-outside-toplevel
        name = str(self.cfg["gpustack_deployment"])
        path = "%s/models?search=%s&perPage=100" % (self.prefix(deadline), urllib.parse.quote(name))
        for item in self._items(path, deadline):
            if isinstance(item, dict) and item.get("name") == name and _int_field(item, "id", 1):
                return int(item["id"])
        raise HTTPFailure("deployment %r not found in GPUStack" % name)

    def instances(self, deadline: float) -> List[Instance]:
        """This worker's instances of the deployment (model id re-resolved once if it vanished)."""
        for attempt in range(2):
            if self.model_id is None:
                self.model_id = self.find_model_id(deadline)
            path = "%s/model-instances?model_id=%d&perPage=100" % (self.prefix(deadline), self.model_id)
            status, data = self.call("GET", path, deadline)
            items = data.get("items") if isinstance(data, dict) else None
            if status == 200 and isinstance(items, list):
                worker = self.cfg["gpustack_worker_name"]
                found = []
                for raw in items:
                    inst = parse_instance(raw)
                    if inst is not None and isinstance(raw, dict) and raw.get("worker_name") == worker \
                            and raw.get("model_id") in (None, self.model_id):
                        found.append(inst)
                return sorted(found, key=lambda i: i.id)
            if attempt == 0 and status in (404, 200):
                self.model_id = None   # deployment recreated under a new id: look it up again
                continue
            raise HTTPFailure("GET %s answered %d" % (path, status))
        return []

    def get_model(self, model_id: int, deadline: float) -> Dict[str, object]:
        path = "%s/models/%d" % (self.prefix(deadline), model_id)
        status, data = self.call("GET", path, deadline)
        if status != 200 or not isinstance(data, dict) or data.get("id") != model_id:
            raise HTTPFailure("GET %s answered %d%s" % (path, status, "" if status != 200 else " without the model"))
        return data

    def put_model(self, model_id: int, record: Dict[str, object], deadline: float) -> Tuple[bool, str]:
        """PUT replaces the whole record (GPUStack's ModelUpdate), so the body is the record read
        back, less the server-owned status fields, with the changed fields."""
        path = "%s/models/%d" % (self.prefix(deadline), model_id)
        body = {k: v for k, v in record.items() if k not in SERVER_OWNED_MODEL_FIELDS}
        status, data = self.call("PUT", path, deadline, json.dumps(body).encode("utf-8"))
        detail = "PUT %s -> %d" % (path, status)
        if not 200 <= status < 300 and isinstance(data, dict) and isinstance(data.get("message"), str):
            detail += ": " + self.mask(data["message"])[:300]
        return 200 <= status < 300, detail

    def instance_log(self, instance_id: int, deadline: float, max_bytes: int, tail: Optional[int] = None) -> bytes:
        """The instance's engine log of its current start (GPUStack 0.7.x: GET
        /v1/model-instances/{id}/logs, the worker's serve/{id}.log, rewritten at every start;
        2.x: /v2/..., the current restart's), or its last ``tail`` lines. At most max_bytes: a
        longer answer is an HTTPFailure."""
        path = "%s/model-instances/%d/logs?follow=false%s" % (
            self.prefix(deadline), instance_id, "" if tail is None else "&tail=%d" % int(tail))
        status, body = self.exchange("GET", path, deadline, max_bytes=max_bytes)
        if status != 200:
            raise HTTPFailure("GET %s answered %d" % (path, status))
        return body

    def delete_instance(self, instance_id: int, deadline: float) -> Tuple[bool, str]:
        path = "%s/model-instances/%d" % (self.prefix(deadline), instance_id)
        status, _unused = self.call("DELETE", path, deadline)
        return 200 <= status < 300, "DELETE %s -> %d" % (path, status)


def pick_instance(instances: Sequence[Instance], gpu_indexes: Sequence[int]) -> Optional[Instance]:
    """The instance to watch: running first, then the one on the configured GPUs, lowest id."""
    if not instances:
        return None
    wanted = sorted(gpu_indexes or [])

    def rank(inst: Instance) -> Tuple[int, int, int]:
        return (0 if inst.state in INSTANCE_STATES_RUNNING else 1,
                0 if not wanted or inst.gpu_indexes == wanted else 1, inst.id)
    return sorted(instances, key=rank)[0]


def process_tree(proc_root: str, root_pid: int) -> List[int]:
    """root_pid and all its descendants, from /proc/*/stat parent links."""
    children: Dict[int, List[int]] = {}
    try:
        names = os.listdir(proc_root)
    except OSError:
        return []
    for name in names:
        if not name.isdigit():
            continue
        text = _read_small(os.path.join(proc_root, name, "stat"))
        if not text or ")" not in text:
            continue
        try:
            ppid = int(text[text.rindex(")") + 2:].split()[1])
        except (ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(name))
    if not os.path.isdir(os.path.join(proc_root, str(root_pid))):
        return []
    out, todo = [], [root_pid]
    while todo and len(out) < 4096:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return sorted(out)


def meminfo(proc_root: str) -> Dict[str, int]:
    """/proc/meminfo in bytes."""
    text = _read(os.path.join(proc_root, "meminfo")) or ""
    out = {}
    for line in text.splitlines():
        parts = line.replace(":", " ").split()
        if len(parts) >= 2 and parts[1].isdigit():
            out[parts[0]] = int(parts[1]) * (1024 if len(parts) > 2 and parts[2] == "kB" else 1)
    return out


def cgroup_memory_max(cgroup_dir: Optional[str]) -> Optional[int]:
    """memory.max (v2) or memory.limit_in_bytes (v1); None when unlimited or unreadable."""
    if not cgroup_dir:
        return None
    for name in ("memory.max", "memory.limit_in_bytes"):
        text = (_read(os.path.join(cgroup_dir, name)) or "").strip()
        if text.isdigit():
            value = int(text)
            return value if value < 2 ** 60 else None  # v1 "unlimited" is ~2^63
    return None


def pid_cgroup_dir(cgroup_root: str, proc_root: str, pid: int) -> Optional[str]:
    """The cgroup directory of a process with memory accounting (v2, hybrid or v1)."""
    text = _read(os.path.join(proc_root, str(pid), "cgroup")) or ""
    candidates = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if "memory" in parts[1].split(","):
            candidates.insert(0, os.path.join(cgroup_root, "memory", parts[2].lstrip("/")))
        elif parts[0] == "0":
            candidates.extend(cgroup_candidates(cgroup_root, parts[2])[:2])
    return pick_cgroup_dir(candidates)


def default_limit(engine_bytes: int, engine_cgroup: Optional[str], cgroup_exclusive: bool,
                  cgroup_used: Optional[int], node: Dict[str, int]) -> Tuple[Optional[int], str]:
    """What the engine may grow to before it is killed, in bytes, and where that came from.

    container (cgroup_exclusive): the engine cgroup's memory.max.
    native, the worker unit's cgroup has memory.max: that limit minus what the rest of the
      cgroup (the worker itself) holds: max - (cgroup_used - engine_bytes).
    otherwise the node: MemTotal minus what the rest of the node holds, where the rest is
      (MemTotal - MemAvailable) - engine_bytes; so engine_bytes + MemAvailable. Swap is not
      counted: growing into swap already costs latency, and the earlier limit errs on the
      side of recycling before the OOM killer acts.
    """
    cg_max = cgroup_memory_max(engine_cgroup)
    if cg_max is not None:
        if cgroup_exclusive:
            return cg_max, "cgroup memory.max"
        if cgroup_used is not None:
            rest = max(0, cgroup_used - engine_bytes)
            return max(0, cg_max - rest), "worker cgroup memory.max minus the rest of the cgroup"
    total, available = node.get("MemTotal"), node.get("MemAvailable")
    if total and available is not None:
        rest = max(0, (total - available) - engine_bytes)
        return max(0, total - rest), "node MemTotal minus the rest of the node"
    return None, "none"


class DeploymentSensor:
    """A GPUStack deployment's instance on this worker, found through the API every tick, and
    the engine measured: native -> the instance's process tree (pid from the API and all its
    descendants) anon+swap from /proc; container -> the instance container's cgroup."""

    def __init__(self, cfg: Dict[str, object], api: GPUStackAPI):
        self.cfg = cfg
        self.api = api
        self.instance: Optional[Instance] = None
        # container runtime: the instance container's resolved cgroup, ONE entry
        # (container_key(instance), cgroup dir), so `<runtime> inspect` (a process start, tens
        # of ms of CPU) runs once per container, not once per tick.
        self.container_cache: Optional[Tuple[Tuple[object, ...], str]] = None

    def container_cgroup(self, inst: Instance) -> Optional[str]:
        sub = dict(self.cfg, container=inst.name, unit=None, cgroup_path=None)
        found = resolve_cgroup(sub)
        if found is None and inst.pid:
            found = pid_cgroup_dir(str(self.cfg["cgroup_root"]), str(self.cfg["proc_root"]), inst.pid)
        return found

    @staticmethod
    def container_key(inst: Instance) -> Tuple[object, ...]:
        """The container as the API reports it: the instance (id), its container (name), its
        process and start (pid, restart_count) and its state. Any change: look it up again."""
        return (inst.id, inst.name, inst.pid, inst.restart_count, inst.state)

    def container_memory(self, inst: Instance) -> Tuple[Optional[str], Optional[Tuple[int, str]]]:
        """(cgroup dir, cgroup_memory of it) of the instance's container. The cached dir is used
        while the instance's container_key is unchanged and its memory.stat can be read; a
        changed instance, or a cached dir that vanished or cannot be read (a recreated
        container), is looked up again in the same tick. Only a readable dir is cached."""
        key = self.container_key(inst)
        if self.container_cache is not None and self.container_cache[0] == key:
            got = cgroup_memory(self.container_cache[1])
            if got is not None:
                return self.container_cache[1], got
        self.container_cache = None
        cg = self.container_cgroup(inst)
        got = cgroup_memory(cg) if cg else None
        if cg and got is not None:
            self.container_cache = (key, cg)
        return cg, got

    def sample(self, deadline: float) -> Dict[str, object]:
        cfg = self.cfg
        out: Dict[str, object] = {"memory_bytes": None, "source": "none", "restarted": False,
                                  "per_process": {}, "cgroup": None, "instance": None,
                                  "limit": None, "limit_source": "none"}
        try:
            found = self.api.instances(deadline)
        except HTTPFailure as exc:
            out["status"] = "GPUStack API: %s" % exc
            return out
        inst = pick_instance(found, cfg.get("gpu_indexes") or [])
        if inst is None:
            out["status"] = "no instance of %s on worker %s" % (cfg["gpustack_deployment"], cfg["gpustack_worker_name"])
            return out
        out["instance"] = inst
        if self.instance is not None and inst.identity() != self.instance.identity():
            out["restarted"] = True   # restarted or rescheduled: a new process, a new trend
        self.instance = inst
        if inst.state not in INSTANCE_STATES_RUNNING:
            self.container_cache = None     # stopped or restarting: its container may be replaced
            out["status"] = "instance %d is %s" % (inst.id, self.api.mask(inst.state)[:200])
            return out
        proc_root, cg_root = str(cfg["proc_root"]), str(cfg["cgroup_root"])
        if cfg.get("engine_runtime") == "container":
            cg, got = self.container_memory(inst)
            out["cgroup"] = cg
            if got is not None:
                out["memory_bytes"], out["source"] = got
            exclusive, cg_used = True, out["memory_bytes"]
        else:
            pids = process_tree(proc_root, inst.pid) if inst.pid else []
            per = {}
            for pid in pids[:256]:
                value = proc_anon_swap(proc_root, pid)
                if value is not None:
                    per[pid] = value
            if per:
                out["memory_bytes"] = sum(per.values())
                out["source"] = "proc RssAnon+VmSwap of instance %d process tree (%d processes)" % (inst.id, len(per))
            out["per_process"] = per
            cg = pid_cgroup_dir(cg_root, proc_root, inst.pid) if inst.pid else None
            out["cgroup"] = cg
            got = cgroup_memory(cg) if cg else None
            exclusive, cg_used = False, (got[0] if got else None)
        if out["memory_bytes"] is None:
            out["status"] = "instance %d: engine memory not readable" % inst.id
            return out
        if cfg.get("memory_limit_bytes"):
            out["limit"], out["limit_source"] = int(cfg["memory_limit_bytes"]), "config memory_limit_bytes"
        else:
            out["limit"], out["limit_source"] = default_limit(int(out["memory_bytes"]), out["cgroup"], exclusive,
                                                              cg_used, meminfo(proc_root))
        out["status"] = "ok"
        return out

    def metrics_url(self) -> Optional[str]:
        inst = self.instance
        if inst is None or not inst.port:
            return None
        host = str(self.cfg.get("engine_host") or "127.0.0.1")
        if ":" in host and not host.startswith("["):
            host = "[%s]" % host
        return "http://%s:%d%s" % (host, inst.port, self.cfg.get("metrics_path") or "/metrics")
