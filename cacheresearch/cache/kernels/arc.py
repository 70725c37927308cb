"""libCacheSim ARC (FAST'03): T1 (seen once, ``w_`` 1), T2 (seen again, 2), ghosts B1 (3), B2 (4), and the
adaptive target ``p`` of T1 (``pr[0]``, float64 as libCacheSim's double).

Scalars: T1, T2, B1, B2 as (head, tail, count) at 0-2, 3-5, 6-8, 9-11. A hit in T1 or T2 moves the block to
T2's head. A miss whose key is in B1 raises ``p`` by ``max(|B2| / |B1|, 1)`` (capped at C), in B2 lowers it by
``max(|B1| / |B2|, 1)``; then, while full, REPLACE moves T1's tail to B1 when ``|T1| > p`` (or ``= p`` and the
key was in B2, or T2 is empty), else T2's tail to B2; a complete miss first trims B1 (or T1) when
``|T1| + |B1|`` reaches C, or B2 when the four lists reach 2C. A ghost hit enters T2, a complete miss T1.
"""

from __future__ import annotations

from cacheresearch.cache.kernels.lists import J, push, unlink

TOP = 2
BUCKETS = False
#: why the vllm pool cannot run it
NO_POOL = ("ARC picks its victim by the block coming in (a ghost hit in B1 or B2 moves its target and the "
           "REPLACE rule), and vLLM's pool frees blocks before it knows which block will use them")


@J
def init(s):
    for x in range(12):
        s[x] = -1 if x % 3 != 2 else 0


@J
def occ(s):
    return s[2] + s[5]


@J
def _replace(o_, n_, w_, s, p, b2):
    """Move T1's or T2's tail to its ghost list; returns the block moved."""
    c1, c2 = s[2], s[5]
    if (c1 > 0 and (c1 > p or (c1 == p and b2))) or c2 == 0:
        t = s[1]
        s[0], s[1] = unlink(o_, n_, w_, s[0], s[1], t)
        s[6], s[7] = push(o_, n_, w_, s[6], s[7], 3, t)
        s[2] -= 1
        s[8] += 1
        return t
    t = s[4]
    s[3], s[4] = unlink(o_, n_, w_, s[3], s[4], t)
    s[9], s[10] = push(o_, n_, w_, s[9], s[10], 4, t)
    s[5] -= 1
    s[11] += 1
    return t


@J
def get(o_, n_, w_, a_, s, pr, hd, tl, ct, k, C, x1, x2, x3):
    w = w_[k]
    if w == 1:
        s[0], s[1] = unlink(o_, n_, w_, s[0], s[1], k)
        s[2] -= 1
        s[3], s[4] = push(o_, n_, w_, s[3], s[4], 2, k)
        s[5] += 1
        return -1
    if w == 2:
        s[3], s[4] = unlink(o_, n_, w_, s[3], s[4], k)
        s[3], s[4] = push(o_, n_, w_, s[3], s[4], 2, k)
        return -1
    p = pr[0]
    in1, in2 = w == 3, w == 4
    if in1:
        p = min(p + max(s[11] / s[8], 1.0), float(C))
        s[6], s[7] = unlink(o_, n_, w_, s[6], s[7], k)
        s[8] -= 1
    elif in2:
        p = max(p - max(s[8] / s[11], 1.0), 0.0)
        s[9], s[10] = unlink(o_, n_, w_, s[9], s[10], k)
        s[11] -= 1
    pr[0] = p
    if C < 1:
        return -1
    v = -1
    while s[2] + s[5] + 1 > C:
        rep_ = True
        if not (in1 or in2):
            if s[2] + s[8] + 1 > C:
                if s[8] > 0:
                    s[6], s[7] = unlink(o_, n_, w_, s[6], s[7], s[7])
                    s[8] -= 1
                else:
                    v = s[1]
                    s[0], s[1] = unlink(o_, n_, w_, s[0], s[1], v)
                    s[2] -= 1
                    rep_ = False
            elif s[2] + s[8] + s[5] + s[11] >= 2 * C and s[11] > 0:
                s[9], s[10] = unlink(o_, n_, w_, s[9], s[10], s[10])
                s[11] -= 1
        if rep_:
            v = _replace(o_, n_, w_, s, p, in2)
    if in1 or in2:
        s[3], s[4] = push(o_, n_, w_, s[3], s[4], 2, k)
        s[5] += 1
    else:
        s[0], s[1] = push(o_, n_, w_, s[0], s[1], 1, k)
        s[2] += 1
    return v
