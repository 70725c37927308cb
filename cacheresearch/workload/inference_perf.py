"""inference-perf configurations in, request tables out: the ``shared_prefix`` data generator with
inference-perf's prompt order, and its load stages with the wait for each stage to drain.

What inference-perf does (``inference_perf/datagen/shared_prefix_datagen.py`` and
``loadgen/load_generator.py`` at 5b1da4d, 2025-09-18, as read for the llm-d 73-capacity benchmark):

* ``shared_prefix`` makes exactly ``num_groups x num_prompts_per_group`` fixed prompts: group ``g``'s
  system prompt (``system_prompt_len`` random tokens) followed by one fixed question per prompt
  (``question_len`` random tokens). The list is shuffled once; request ``n`` of a stage is
  ``prompts[n mod len(prompts)]`` with ``max_tokens = output_len`` (``ignore_eos``: every request
  generates exactly ``output_len`` tokens). The request number restarts at 0 in every stage.
* A stage of ``rate`` and ``duration`` sends ``int(rate x duration)`` requests, Poisson (exponential
  gaps of mean ``1 / rate``) or constant (gaps of exactly ``1 / rate``).
* inference-perf waits for every request of a stage to finish before it starts the next one.
* Each worker process (``num_workers``, default the client machine's ``cpu_count()``) takes a permit of its
  semaphore (``worker_max_concurrency``, default 100) *before* it pulls the next request from the shared
  queue and sleeps to its scheduled time, and gives it back when the response ends; a request's TTFT is
  timed from its actual send. So at most ``num_workers x worker_max_concurrency`` requests are in flight,
  in send order: a closed loop once they are all held (the vllm replica's ``client_permits``).

Warm-up stages are not a field of inference-perf's schema: the series marks them with a YAML comment
(``# PREWARM``, ``# warmup phase``, ``# Warmup — seat residents``). :func:`stage_notes` keeps the comments
of each stage item (full-line comments directly above it and comments on its own lines), and
``InferencePerfConfig.warmup_stages`` counts the leading stages whose notes name a warm-up (``warm``,
any case); a file without such a comment has none. This reading of comments is a heuristic, stated in
the study's summary; ``llmd.warmup_stages=N`` overrides it.

The simulator takes arrival times fixed before the run, so the drain is reproduced by starting stage
``k + 1`` a gap ``stage_gap_s`` after stage ``k``'s last send: the pools are LRU (order-based, no TTL),
so an idle gap changes nothing but lets the queues empty. Whether each gap was long enough is checked
after the run (:func:`stage_drained`): a stage whose requests were still running when the next began is
reported, never hidden.

Token ids are drawn by the generator's own seed (numpy), not Qwen3's tokenizer: the prefix-cache
structure (which blocks are shared) is what matters here, not the text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from cacheresearch.workload.synthetic import extend_keys, hash_rows, random_tokens
from cacheresearch.workload.table import Workload

__all__ = ["InferencePerfError", "Stage", "SharedPrefix", "InferencePerfConfig", "read_inference_perf", "stage_notes",
           "prompt_order", "stage_arrivals_ms", "shared_prefix_workload", "stage_drained"]

_TOP = {"load", "api", "server", "tokenizer", "data", "report", "storage", "metrics"}
_SHARED = ("num_groups", "num_prompts_per_group", "system_prompt_len", "question_len", "output_len")
#: inference-perf's own defaults of ``SharedPrefix`` (``config.py``): a parameter the file leaves out takes them
_SHARED_DEFAULTS = dict(num_groups=10, num_prompts_per_group=10, system_prompt_len=100, question_len=50,
                        output_len=50)
#: inference-perf's aliases (newer releases: ``AliasChoices``)
_SHARED_ALIASES = {"num_unique_system_prompts": "num_groups", "num_users_per_system_prompt": "num_prompts_per_group"}
#: ``shared_prefix`` keys inference-perf knows that only their neutral value can take here
_SHARED_NEUTRAL = {"enable_multi_turn_chat": (False, None), "question_distribution": (None,),
                   "output_distribution": (None,)}
#: ``load`` keys of inference-perf's ``LoadConfig`` that are read or accepted (client-side settings that do not
#: change the sent workload: worker counts, TCP connections, circuit breakers, the data seed)
_LOAD_KEYS = ("type", "stages", "interval", "sweep", "num_workers", "worker_max_concurrency",
              "worker_max_tcp_connections", "circuit_breakers", "request_timeout", "base_seed", "trace",
              "lora_traffic_split")


class InferencePerfError(ValueError):
    """An inference-perf file the reader cannot take (the message names the file and the key)."""


@dataclass(frozen=True)
class Stage:
    rate: float  # requests per second
    duration: float  # seconds

    @property
    def n_requests(self) -> int:
        return int(self.rate * self.duration)


@dataclass(frozen=True)
class SharedPrefix:
    num_groups: int
    num_prompts_per_group: int
    system_prompt_len: int
    question_len: int
    output_len: int

    @property
    def n_prompts(self) -> int:
        return self.num_groups * self.num_prompts_per_group


@dataclass(frozen=True)
class InferencePerfConfig:
    file: str
    load_type: str  # poisson | constant
    stages: tuple[Stage, ...]
    data: SharedPrefix
    ignore_eos: bool
    model_name: str
    tokenizer_name: str = ""  # tokenizer.pretrained_model_name_or_path
    request_timeout_s: float | None = None  # load.request_timeout: the vllm replica's client_timeout_ms (llmd study)
    stage_notes: tuple[str, ...] = ()  # the YAML comments of each stage item (:func:`stage_notes`)
    num_workers: int | None = None  # load.num_workers (inference-perf's default: the client machine's cpu_count())
    worker_max_concurrency: int = 100  # load.worker_max_concurrency (inference-perf's default 100)

    @property
    def client_permits(self) -> int | None:
        """inference-perf's permits: ``num_workers x worker_max_concurrency`` when the file sets ``num_workers``;
        None when it takes the client machine's CPU count, which the file does not say."""
        return None if self.num_workers is None else self.num_workers * self.worker_max_concurrency

    @property
    def warmup_stages(self) -> int:
        """Leading stages whose comments name a warm-up (``warm`` in any case: PREWARM, warmup, Warm-up)."""
        n = 0
        for note in self.stage_notes:
            if not _WARM.search(note):
                break
            n += 1
        return n


_WARM = re.compile(r"warm", re.IGNORECASE)


def stage_notes(text: str, n_stages: int) -> tuple[str, ...]:
    """The comments of each item of ``load.stages`` in a YAML text: full-line comments between the
    previous item (or ``stages:``) and the item, and comments at the end of the item's own lines.
    A line-based reading of block-style YAML (what the series' files use); an item it cannot find
    gets an empty note (flow-style lists, anchors: no comments are read, nothing fails)."""
    lines = text.splitlines()
    notes: list[list[str]] = []
    in_load = in_stages = False
    load_ind = st_ind = -1
    pending: list[str] = []
    for raw in lines:
        body = raw.split("#", 1)[0] if not raw.lstrip().startswith("#") else ""
        com = raw.split("#", 1)[1].strip() if "#" in raw else ""
        ind = len(raw) - len(raw.lstrip())
        if not raw.strip():
            continue
        if not in_load:
            if body.strip() == "load:" and ind == 0:
                in_load, load_ind = True, ind
            continue
        if body.strip() and ind <= load_ind:
            break  # the next top-level key
        if not in_stages:
            if body.strip() == "stages:":
                in_stages, st_ind = True, ind
            continue
        if not body.strip():  # a full-line comment: it belongs to the next item
            pending.append(com)
            continue
        if ind <= st_ind and not body.lstrip().startswith("-"):
            break  # a sibling key of stages
        if body.lstrip().startswith("-"):
            notes.append(pending + ([com] if com else []))
            pending = []
        elif notes and com:
            notes[-1].append(com)
    out = [" ".join(n) for n in notes[:n_stages]]
    return tuple(out + [""] * (n_stages - len(out)))


def _err(path, key, msg):
    return InferencePerfError(f"{path}: {key}: {msg}")


def read_inference_perf(path) -> InferencePerfConfig:
    """Parse an inference-perf YAML file (``load``, ``data.type: shared_prefix``; ``api``, ``server``,
    ``tokenizer``, ``report``, ``storage`` are accepted and only ``server.ignore_eos`` /
    ``server.model_name`` / ``tokenizer.pretrained_model_name_or_path`` are read). ``shared_prefix``
    parameters take inference-perf's defaults where left out and its aliases (``num_unique_system_prompts``,
    ``num_users_per_system_prompt``); length distributions and multi-turn chat are clear errors. The
    client-side ``load`` keys (connections, circuit breakers, seed) are accepted and change nothing sent;
    ``num_workers`` and ``worker_max_concurrency`` are read (:attr:`InferencePerfConfig.client_permits`: the
    client's permits, a closed loop); ``load.request_timeout`` is read (``request_timeout_s``: the client's timeout,
    the vllm replica's ``client_timeout_ms`` in the llmd study)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
        doc = yaml.safe_load(text)
    except OSError as e:
        raise InferencePerfError(f"{path}: cannot read: {e}") from None
    except yaml.YAMLError as e:
        raise InferencePerfError(f"{path}: not YAML: {e}") from None
    if not isinstance(doc, dict):
        raise _err(path, "(top)", "must be a mapping")
    for k in doc:
        if k not in _TOP:
            raise _err(path, k, f"unknown key; expected {sorted(_TOP)}")
    load = doc.get("load")
    if not isinstance(load, dict):
        raise _err(path, "load", "missing (a mapping with type and stages)")
    for k in load:
        if k not in _LOAD_KEYS:
            raise _err(path, f"load.{k}", f"unknown key; inference-perf's load keys: {list(_LOAD_KEYS)}")
    for k in ("trace", "lora_traffic_split"):
        if load.get(k):
            raise _err(path, f"load.{k}", "not supported (shared_prefix stages only)")
    timeout = load.get("request_timeout")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0):
        raise _err(path, "load.request_timeout", f"must be a number of seconds > 0, got {timeout!r}")
    for k in ("num_workers", "worker_max_concurrency"):
        v = load.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise _err(path, f"load.{k}", f"must be an integer >= 1, got {v!r}")
    lt = load.get("type", "constant")
    if lt not in ("constant", "poisson"):
        raise _err(path, "load.type", f"must be constant or poisson, got {lt!r}")
    if "sweep" in load:
        raise _err(path, "load.sweep", "sweeps are not supported; list the stages")
    st = load.get("stages")
    if not isinstance(st, list) or not st:
        raise _err(path, "load.stages", "must be a non-empty list of {rate, duration}")
    stages = []
    for i, s in enumerate(st):
        if not isinstance(s, dict):
            raise _err(path, f"load.stages[{i}]", "must be a mapping with rate and duration")
        for k in s:
            if k not in ("rate", "duration"):
                raise _err(path, f"load.stages[{i}].{k}", "unknown key; expected rate, duration")
        for k in ("rate", "duration"):
            v = s.get(k)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise _err(path, f"load.stages[{i}].{k}", f"must be a number > 0, got {v!r}")
        stages.append(Stage(float(s["rate"]), float(s["duration"])))
    data = doc.get("data")
    if not isinstance(data, dict):
        raise _err(path, "data", "missing (a mapping with type: shared_prefix)")
    for k in data:
        if k not in ("type", "shared_prefix"):
            raise _err(path, f"data.{k}", "unknown key; expected type, shared_prefix")
    if data.get("type") != "shared_prefix":
        raise _err(path, "data.type", f"only shared_prefix is supported, got {data.get('type')!r}")
    sp = data.get("shared_prefix")
    if not isinstance(sp, dict):
        raise _err(path, "data.shared_prefix", "missing (a mapping of its parameters)")
    sp = dict(sp)
    for a, k in _SHARED_ALIASES.items():
        if a in sp:
            if k in sp:
                raise _err(path, f"data.shared_prefix.{a}", f"an alias of {k}, which is also given")
            sp[k] = sp.pop(a)
    for k in sp:
        if k in _SHARED_NEUTRAL:
            if sp[k] not in _SHARED_NEUTRAL[k]:
                raise _err(path, f"data.shared_prefix.{k}", f"not supported (fixed lengths, one turn), got {sp[k]!r}")
        elif k not in _SHARED:
            raise _err(path, f"data.shared_prefix.{k}", f"unknown parameter; known: {list(_SHARED)}")
    vals = {}
    for k in _SHARED:
        v = sp.get(k, _SHARED_DEFAULTS[k])  # inference-perf's default where the file leaves it out
        if isinstance(v, dict):
            raise _err(path, f"data.shared_prefix.{k}", "a length distribution is not supported (fixed lengths)")
        lo = 0 if k == "question_len" else 1
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise _err(path, f"data.shared_prefix.{k}", f"must be an integer >= {lo}, got {v!r}")
        vals[k] = v
    server = doc.get("server") or {}
    if not isinstance(server, dict):
        raise _err(path, "server", "must be a mapping")
    ignore_eos = server.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise _err(path, "server.ignore_eos", f"must be true or false, got {ignore_eos!r}")
    tok = doc.get("tokenizer") or {}
    if not isinstance(tok, dict):
        raise _err(path, "tokenizer", "must be a mapping")
    return InferencePerfConfig(file=str(path), load_type=lt, stages=tuple(stages), data=SharedPrefix(**vals),
                               ignore_eos=ignore_eos, model_name=str(server.get("model_name", "") or ""),
                               tokenizer_name=str(tok.get("pretrained_model_name_or_path", "") or ""),
                               stage_notes=stage_notes(text, len(stages)),
                               request_timeout_s=None if timeout is None else float(timeout),
                               num_workers=load.get("num_workers"),
                               worker_max_concurrency=int(load.get("worker_max_concurrency") or 100))


def prompt_order(n_prompts: int, seed: int) -> np.ndarray:
    """The shuffled prompt list: ``order[j]`` is the prompt at position ``j`` (shuffled once)."""
    return np.random.default_rng([seed, 0x5EED]).permutation(n_prompts)


def stage_arrivals_ms(stage: Stage, load_type: str, rng: np.random.Generator) -> np.ndarray:
    """Send times (float ms from the stage's start) of a stage's ``int(rate x duration)`` requests."""
    n = stage.n_requests
    if load_type == "poisson":
        return np.cumsum(rng.exponential(1000.0 / stage.rate, size=n))
    return np.arange(n, dtype=np.float64) * (1000.0 / stage.rate)


def shared_prefix_workload(cfg: InferencePerfConfig, *, block_tokens: int, seed: int = 0, stage_gap_s: float = 600.0,
                           max_requests_per_stage: int | None = None, vocab: int = 151_643) -> Workload:
    """The benchmark's requests: stage by stage, request ``n`` of a stage is ``prompts[order[n mod P]]``.

    ``stage_gap_s``: idle time between a stage's last send and the next stage's first (the drain).
    ``max_requests_per_stage``: a reduced run (the first requests of each stage; stated in ``meta``).
    ``meta`` holds ``stage`` (per request), ``stage_start_ms``, ``prompt`` (per request) and the order.
    """
    d = cfg.data
    bs = int(block_tokens)
    rng = np.random.default_rng(seed)
    system = random_tokens(rng, (d.num_groups, d.system_prompt_len), vocab)
    question = random_tokens(rng, (d.n_prompts, d.question_len), vocab)
    owner = np.repeat(np.arange(d.num_groups), d.num_prompts_per_group)  # prompt -> group
    p_full = (d.system_prompt_len // bs) * bs
    pre = hash_rows(system[:, :p_full], bs)
    keys = extend_keys(pre, system[:, p_full:], owner, question, bs)  # [P, nb]
    order = prompt_order(d.n_prompts, seed)
    arr_rng = np.random.default_rng([seed, 0xA11])
    t0 = 0.0
    arrivals, stage_of, prompt_of, starts = [], [], [], []
    for k, s in enumerate(cfg.stages):
        t = stage_arrivals_ms(s, cfg.load_type, arr_rng)
        if max_requests_per_stage is not None:
            t = t[: int(max_requests_per_stage)]
        starts.append(t0)
        arrivals.append(t0 + t)
        stage_of.append(np.full(t.shape[0], k, np.int32))
        prompt_of.append(order[np.arange(t.shape[0]) % d.n_prompts])
        t0 = t0 + (float(t[-1]) if t.shape[0] else 0.0) + 1000.0 * float(stage_gap_s)
    arr = np.floor(np.concatenate(arrivals)).astype(np.int64)
    prompt = np.concatenate(prompt_of).astype(np.int64)
    stage = np.concatenate(stage_of)
    n = arr.shape[0]
    nb = keys.shape[1]
    return Workload(
        arrival_ms=arr, input_tokens=np.full(n, d.system_prompt_len + d.question_len, np.int64),
        output_tokens=np.full(n, d.output_len, np.int64), tenant=owner[prompt].astype(np.int32),
        keys=keys[prompt].reshape(-1), offsets=np.arange(n + 1, dtype=np.int64) * nb, block_tokens=bs,
        name=f"inference-perf shared_prefix ({Path(cfg.file).name})",
        meta=dict(stage=stage, prompt=prompt, order=order, stage_start_ms=np.floor(np.array(starts)).astype(np.int64),
                  stage_gap_s=float(stage_gap_s), max_requests_per_stage=max_requests_per_stage,
                  ignore_eos=cfg.ignore_eos),
    )


def stage_drained(arrival_ms, finish_ms, stage) -> np.ndarray:
    """bool per stage: every request of stage ``k`` finished before stage ``k + 1``'s first send (the last
    stage: every request finished). ``finish_ms < 0`` (never served) counts as not drained."""
    arrival_ms, finish_ms, stage = (np.asarray(x) for x in (arrival_ms, finish_ms, stage))
    K = int(stage.max()) + 1 if stage.size else 0
    out = np.zeros(K, bool)
    for k in range(K):
        sel = stage == k
        f = finish_ms[sel]
        ok = f.size > 0 and bool(np.all(f >= 0))
        if ok and k + 1 < K and np.any(stage == k + 1):
            ok = bool(f.max() <= arrival_ms[stage == k + 1].min())
        out[k] = ok
    return out
