"""CPU backends of the engine: the same algorithms compiled with numba, tested equal to the JAX engine."""
