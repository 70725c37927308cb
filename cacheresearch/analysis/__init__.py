"""Closed forms and one-pass curves beside the simulation: :mod:`.analytic` (TTL, cost, Che),
:mod:`.pricing` (provider presets, daily costs, the TTL advisor), :mod:`.mrc` (exact hit-rate curves
at every capacity from one stack-distance pass; SHARDS)."""
