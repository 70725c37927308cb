"""The per-block policies' kernels: one numba file per policy, used by every engine that runs them.

Each kernel module implements libCacheSim's policy on one *row* (a replica's cache, a tier's row, a vLLM
pool) as a handful of inlined functions over the same arguments, ``row = (o_, n_, w_, a_, s, pr, hd, tl,
ct)``: the list links ``o_`` / ``n_``, the list each block is in ``w_`` (0 absent; ``1 .. TOP`` stored;
above ``TOP``: a ghost), a per-block extra ``a_`` (a visited bit, a frequency), the row's integer scalars
``s`` (int64 [NS]: heads, tails, counts, hands), a float scalar ``pr`` ([1]: ARC's target) and the
frequency buckets ``hd``, ``tl``, ``ct`` (``BUCKETS``: LFU). ``C`` is the capacity in blocks, ``x1 .. x3``
the policy's integer sizes (:func:`cacheresearch.cache.block.block_sizes`).

What a kernel module defines (``docs/adding_a_policy.md``):

* ``TOP`` (int), ``BUCKETS`` (bool);
* ``init(s)``: the scalars of an empty row; ``occ(s)``: blocks stored;
* ``get(*row, k, C, x1, x2, x3)``: libCacheSim's ``get`` of ``k`` (a hit updates, a miss evicts until the
  newcomer fits, then inserts it); returns the block that left (evicted, or moved to a ghost list) or -1;
* for a pool that frees blocks before it knows which block will use them (the vllm replica), optionally
  ``touch(*row, k)`` (a reused block), ``admit(*row, k, C, x1, x2, x3)`` (a computed block enters, room
  already made) and ``victim(*row, C, x1, x2, x3, pin)`` (the next block to free, never one with
  ``pin[k] > 0``, unlinked). A policy without them is refused by the vllm pool with the reason in its
  ``NO_POOL`` string.

:mod:`.dispatch` generates the engines' dispatch on a policy code from the registry
(:mod:`cacheresearch.cache.policies`, ``engine="blocks"``, ``kernel=`` the module's name).
"""
