"""Kernels tried outside the roots (GPU-only experiments; nothing in the library imports them)."""
