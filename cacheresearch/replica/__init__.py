"""Replica models: the fcfs server (`fcfs`), vLLM's continuous batching (`vllm`) over its KV pool (`pool`),
and KV capacity from hardware (`hardware`)."""
