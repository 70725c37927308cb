"""Plain-Python reference of the autoscaled fcfs fleet (docs/autoscale_semantics.md), request by request.

Block by block: one ``OrderedDict`` leaf-first LRU per replica slot (``tests/reference.py``'s ``lru``),
one list of (finish, blocks) per slot, Python integers, no run compression and no ring search (the
consistent-hash rules take the minimum of ``((pos - h) mod 2**32, slot, v)`` over eligible nodes).
The engine (``cacheresearch.fleet.autoscale``) must equal it field by field.
"""

from __future__ import annotations

from collections import OrderedDict

from cacheresearch.routers import prefix_hash_u64

OFF, PROV, ACTIVE = 0, 1, 2
POLICIES = ("schedule", "queue", "utilisation", "kv", "slo")
ROUTERS = ("least_loaded", "ring", "chwbl", "cache_aware", "prefix_hash")
M32 = 0xFFFFFFFF


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _match(od: OrderedDict, keys) -> int:
    h = 0
    for k in keys:
        if k not in od:
            break
        h += 1
    return h


def _insert(od: OrderedDict, keys, cap: int) -> None:
    for k in reversed(keys):  # leaf-first: the first block ends most recent
        od[k] = True
        od.move_to_end(k)
    while len(od) > cap:
        od.popitem(last=False)


class _Slot:
    def __init__(self):
        self.state, self.ready, self.born, self.busy = OFF, 0, 0, 0
        self.cache: OrderedDict = OrderedDict()
        self.jobs: list = []  # (finish, blocks)

    def live(self, t):
        return [(f, b) for f, b in self.jobs if f > t]


def _desired(c, t, slots, win_a, win_s):
    pol = POLICIES[c["policy"]]
    act = [s for s in slots if s.state == ACTIVE]
    if pol == "schedule":
        sch = c["schedule"]
        return sch[(t // c["schedule_period_ms"]) % len(sch)]
    if pol == "queue":
        return _cdiv(sum(len(s.live(t)) for s in act), c["target"])
    if pol == "utilisation":
        return _cdiv(win_s * 100, c["interval_ms"] * c["target"])
    if pol == "kv":
        return _cdiv(sum(b for s in act for _, b in s.live(t)) * 100, max(c["capacity"], 1) * c["target"])
    if win_a == 0:
        return 0
    if win_a * c["slo_ms"] <= win_s:
        return c["max_replicas"]
    return _cdiv(win_s * win_a * c["slo_ms"], c["interval_ms"] * (win_a * c["slo_ms"] - win_s))


def _tick(c, t, slots, win_a, win_s, st):
    want = min(max(_desired(c, t, slots, win_a, win_s), c["min_replicas"]), c["max_replicas"])
    cur = sum(s.state != OFF for s in slots)
    if want == cur or (st["last"] is not None and t - st["last"] < c["cooldown_ms"]):
        return
    st["last"] = t
    if want > cur:
        st["ups"] += 1
        need = want - cur
        for s in slots:
            if need and s.state == OFF and s.busy <= t:
                s.state, s.ready, s.born, s.cache, s.jobs = PROV, t + c["delay_ms"], t, OrderedDict(), []
                need -= 1
        return
    st["downs"] += 1
    extra = cur - want
    for state in (PROV, ACTIVE):
        for s in reversed(slots):
            if extra and s.state == state:
                st["gpu_ms"] += (t if state == PROV else max(t, s.busy)) - s.born
                s.state, s.cache = OFF, OrderedDict()
                extra -= 1


def _activate(c, s, slots, st):
    sib = [x for x in slots if x.state == ACTIVE]
    s.state = ACTIVE
    if c["prewarm_blocks"] > 0 and sib:
        hot = list(sib[0].cache)[-c["prewarm_blocks"]:]
        s.cache = OrderedDict((k, True) for k in hot)
        st["prewarmed"] += len(hot)


def _advance(c, now, slots, st, timeline, win):
    """Ready events and scaler ticks up to ``now``, in time order (a ready event first on a tie)."""
    while True:
        prov = [(s.ready, i) for i, s in enumerate(slots) if s.state == PROV and s.ready <= now]
        tt = st["k"] * c["interval_ms"]
        if prov and min(prov)[0] <= tt:
            _activate(c, slots[min(prov)[1]], slots, st)
            continue
        if tt > now:
            return
        _tick(c, tt, slots, win[0], win[1], st)
        timeline.append((sum(s.state == ACTIVE for s in slots), sum(s.state == PROV for s in slots)))
        win[0] = win[1] = 0
        st["k"] += 1


def _route(c, i, keys, h, slots, ring):
    act = [r for r, s in enumerate(slots) if s.state == ACTIVE]
    q = {r: len(slots[r].live(i["now"])) for r in act}
    rt = ROUTERS[c["router"]]
    ll = min(act, key=lambda r: (q[r], r))
    if rt == "least_loaded":
        return ll
    if rt == "prefix_hash":
        return act[h % len(act)]
    if rt in ("ring", "chwbl"):
        cap = _cdiv(c["chwbl_c_pct"] * (sum(q.values()) + 1), 100 * len(act)) if rt == "chwbl" else None
        ok = [(((pos - h) & M32), r, v) for pos, r, v in ring if r in q and (cap is None or q[r] < cap)]
        return min(ok)[1]
    m = {r: _match(slots[r].cache, keys) for r in act}
    if max(q.values()) - min(q.values()) > c["balance_abs"]:
        return ll
    best = min(act, key=lambda r: (-m[r], q[r], r))
    return best if m[best] > 0 else ll


def reference_autoscale(wl, c: dict, *, ring_vnodes: int = 16):
    """Per-request (replica, hit blocks, TTFT ms, best match over active replicas), the timeline of
    (active, provisioning) after each tick, and the totals (gpu_ms, ups, downs, prewarmed)."""
    R = c["max_replicas"]
    slots = [_Slot() for _ in range(R)]
    for s in slots[: c["initial_replicas"]]:
        s.state = ACTIVE
    ring = [(prefix_hash_u64((r << 32) | v), r, v) for r in range(R) for v in range(ring_vnodes)]
    st = dict(k=1, last=None, ups=0, downs=0, gpu_ms=0, prewarmed=0)
    timeline, win = [], [0, 0]
    bt, out = wl.block_tokens, []
    for i in range(wl.n_requests):
        now, keys = int(wl.arrival_ms[i]), [int(k) for k in wl.request_keys(i)]
        n = len(keys)
        _advance(c, now, slots, st, timeline, win)
        h = prefix_hash_u64(keys[min(c["prefix_blocks"], n) - 1]) if n else 0
        mbest = max(_match(s.cache, keys) for s in slots if s.state == ACTIVE)
        r = _route(c, dict(now=now), keys, h, slots, ring)
        s = slots[r]
        hit = _match(s.cache, keys)
        _insert(s.cache, keys, c["capacity"])
        inp, outp = int(wl.input_tokens[i]), int(wl.output_tokens[i])
        ht = min(hit * bt, inp)
        pre = _cdiv((inp - ht) * 1000, c["prefill_tps"])
        dec = _cdiv(outp * c["decode_us_per_token"], 1000)
        start = max(now, s.busy)
        s.busy = start + pre + dec
        s.jobs.append((s.busy, n))
        win[0] += 1
        win[1] += pre + dec
        out.append((r, hit, start - now + pre, mbest))
    end = max([int(wl.arrival_ms[-1])] + [s.busy for s in slots]) if wl.n_requests else 0
    for s in slots:
        if s.state != OFF:
            st["gpu_ms"] += end - s.born
    totals = dict(gpu_ms=st["gpu_ms"], ups=st["ups"], downs=st["downs"], prewarmed=st["prewarmed"], end_ms=end)
    return out, timeline, totals
