"""Frozen float64 references, one module per operator; importable on CPU without Triton."""
