"""End to end: a Qwen3-style decoder built only from the operators, a rollout engine with
continuous batching, and a GRPO trainer step — run with stock PyTorch kernels or the
unified ones, recomputing the old log-probs or reusing the rollout's.

Only torch and triton are imported here, so the whole thing runs on the GPU machine.
"""
