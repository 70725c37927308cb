"""Cache salts (vLLM cache_salt semantics): the salt enters the first block's extra keys only, so
requests with different salts never share a block, and requests with the same salt share as before."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_routing_workload import _parts, _prompt

from cacheresearch.workload.keys import reference_block_keys, salt_values
from cacheresearch.workload.synthetic import fleet_workload, tenant_workload

SHARE = dict(n_tenants=3, prefix_tokens=37, users_per_tenant=2, user_tokens=21, query_tokens=20,
             rate_per_s=2.0, duration_s=15.0, seed=5, system_tokens=19)


def _rows(w):
    return [w.keys[w.offsets[i]: w.offsets[i + 1]] for i in range(w.n_requests)]


@pytest.mark.parametrize("salt", ["none", "per_tenant", "per_user"])
@pytest.mark.parametrize("system_tokens,prefix_tokens", [(19, 37), (0, 7)])  # (0, 7): block 0 lies in the user part
def test_keys_equal_reference(salt, system_tokens, prefix_tokens):
    kw = dict(SHARE, system_tokens=system_tokens, prefix_tokens=prefix_tokens, salt=salt)
    w = tenant_workload(**kw)
    p = _parts(**{k: v for k, v in kw.items() if k not in ("system_tokens", "salt")})
    assert np.all(w.input_tokens == system_tokens + prefix_tokens + 21 + 20)
    # the system prompt's tokens: its own random stream (the 7th SeedSequence child)
    sys_tok = np.random.default_rng(np.random.SeedSequence(SHARE["seed"]).spawn(7)[6]).integers(
        0, 128_256, size=(system_tokens,), dtype=np.int32) if system_tokens else np.zeros(0, np.int32)
    rows = _rows(w)
    for i in range(w.n_requests):
        prompt = np.concatenate([sys_tok, _prompt(p, i)])
        s = 0
        if salt == "per_tenant":
            s = int(salt_values("tenant", [p["tenant"][i]])[0])
        elif salt == "per_user":
            s = int(salt_values("user", [p["user"][i]])[0])
        ref = reference_block_keys(prompt.tolist(), block_size=16, cache_salt=s)
        assert rows[i].tolist() == ref, (salt, i)


def test_salt_off_keeps_todays_keys():
    kw = dict(SHARE, system_tokens=0)
    a = tenant_workload(**kw)
    b = tenant_workload(**kw, salt="none")
    assert np.array_equal(a.keys, b.keys) and np.array_equal(a.arrival_ms, b.arrival_ms)


@settings(max_examples=6, deadline=None)
@given(n_tenants=st.integers(2, 4), users=st.integers(1, 3), prefix=st.integers(0, 40), system=st.integers(0, 40),
       user_tokens=st.integers(0, 20), salt=st.sampled_from(["per_tenant", "per_user"]), seed=st.integers(0, 50))
@pytest.mark.slow  # long; see README's slow checks
def test_different_salts_never_share_a_block(n_tenants, users, prefix, system, user_tokens, salt, seed):
    w = tenant_workload(n_tenants=n_tenants, users_per_tenant=users, prefix_tokens=prefix, system_tokens=system,
                        user_tokens=user_tokens, query_tokens=17, rate_per_s=2.0, duration_s=10.0, seed=seed,
                        salt=salt)
    p = _parts(n_tenants=n_tenants, users_per_tenant=users, prefix_tokens=prefix, user_tokens=user_tokens,
               query_tokens=17, rate_per_s=2.0, duration_s=10.0, seed=seed)
    owner = p["tenant"] if salt == "per_tenant" else p["user"]
    rows = _rows(w)
    plain = _rows(tenant_workload(n_tenants=n_tenants, users_per_tenant=users, prefix_tokens=prefix,
                                  system_tokens=system, user_tokens=user_tokens, query_tokens=17, rate_per_s=2.0,
                                  duration_s=10.0, seed=seed))
    for i in range(len(rows)):
        for j in range(i + 1, len(rows)):
            shared = set(rows[i].tolist()) & set(rows[j].tolist())
            if owner[i] != owner[j]:
                assert not shared, (i, j)
            else:  # same salt: exactly the blocks the unsalted prompts share
                lead = 0
                while lead < min(len(plain[i]), len(plain[j])) and plain[i][lead] == plain[j][lead]:
                    lead += 1
                assert len(shared) == lead


def test_fleet_per_tenant_salt():
    a = fleet_workload(n_tenants=3, n_requests=40, system_tokens=40, doc_tokens=20, user_tokens=10, seed=2)
    b = fleet_workload(n_tenants=3, n_requests=40, system_tokens=40, doc_tokens=20, user_tokens=10, seed=2,
                       salt="per_tenant")
    nb = a.n_blocks[0]
    ka, kb = a.keys.reshape(-1, nb), b.keys.reshape(-1, nb)
    t = a.tenant
    # unsalted: tenants share the system prompt's 2 full blocks; salted: nothing across tenants
    i, j = np.argwhere(t[:, None] != t[None, :])[0]
    assert np.array_equal(ka[i, :2], ka[j, :2])
    assert not set(kb[i].tolist()) & set(kb[j].tolist())
    same = np.argwhere((t[:, None] == t[None, :]) & ~np.eye(len(t), dtype=bool))[0]
    assert np.array_equal(kb[same[0], :3], kb[same[1], :3])  # 60 tokens of system + document = 3 blocks
    with pytest.raises(ValueError, match="salt"):
        fleet_workload(n_requests=4, salt="per_user")


def test_salt_values_distinct_and_nonzero():
    v = salt_values("user", np.arange(5000))
    assert len(set(v.tolist())) == 5000 and np.all(v != 0)
    assert not np.array_equal(v, salt_values("tenant", np.arange(5000)))  # namespaces use different mixes
    with pytest.raises(ValueError, match="namespace"):
        salt_values("org", [1])


def test_sweep_salt_grid(tmp_path):
    from cacheresearch.shell.sweep import run_experiment

    ds = run_experiment(["experiment=routing", "workload.tenant.n_tenants=3", "workload.tenant.prefix_tokens=64",
                         "workload.tenant.system_tokens=64", "workload.tenant.users_per_tenant=2",
                         "workload.tenant.query_tokens=16", "workload.tenant.n_requests=80",
                         "workload.tenant.rate_per_s=2", "grid.router=null", "grid.rate_per_s=null",
                         "grid.capacity_blocks=null", "grid.layout=null", "grid.salt=[none,per_tenant,per_user]",
                         "fleet.replicas=1", "fleet.router=round_robin", "output.figure=false"], tmp_path)
    h = ds.token_hit_rate.sel
    # isolation costs hits: the shared system prompt first, then the tenant prefix across users
    assert float(h(salt="none")) > float(h(salt="per_tenant")) > float(h(salt="per_user")) > 0
