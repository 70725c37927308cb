"""Plain-Python reference of the hosted-cache model (cacheresearch.analysis.hosted), written from its
docstring: lists instead of dicts and deques, every window and every cache scanned in full."""

M64 = (1 << 64) - 1


def mix(x):
    x &= M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def reference_replay(requests, *, block_tokens, machines, route_tokens, per_min, window_s, ttl_s, min_tokens,
                     increment, u):
    """``requests``: list of (t_s, input_tokens, [block keys], cache_key or None). Returns per request
    (machine, overflowed, cached_tokens)."""
    slots = max(int(per_min * window_s / 60.0 + 1e-9), 1)
    admitted = []  # (route key, time) of every request a home machine admitted
    cached = [[] for _ in range(machines)]  # per machine: [key, last_use]
    out = []
    for i, (t, n_in, ks, ck) in enumerate(requests):
        if ks:
            rb = max(-(-route_tokens // block_tokens) - 1, 0)
            rid = ks[min(rb, len(ks) - 1)]
        else:
            rid = (1 << 63) + i
        home = (mix(rid) if ck is None else mix(rid ^ mix(ck + 0x9E3779B97F4A7C15))) % machines
        rk = (rid, ck)
        recent = [s for (k, s) in admitted if k == rk and s > t - window_s]
        if len(recent) < slots:
            admitted.append((rk, t))
            m, over = home, False
        else:
            m, over = (home + 1 + int(u[i] * (machines - 1))) % machines, True
        hit = 0
        for k in ks:
            live = [e for e in cached[m] if e[0] == k and e[1] + ttl_s >= t]
            if not live:
                break
            hit += block_tokens
        for k in ks:
            found = [e for e in cached[m] if e[0] == k]
            if found:
                found[0][1] = t
            else:
                cached[m].append([k, t])
        h = min(hit, n_in)
        rep = 0 if h < max(min_tokens, 1) else min_tokens + (h - min_tokens) // increment * increment
        out.append((m, over, rep))
    return out
