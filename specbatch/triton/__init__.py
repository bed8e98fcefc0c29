"""Adapters between Triton's Python backend and the specbatch library.

The modules that import triton_python_backend_utils (tensors, replies, metrics, logs)
are importable only inside a Python-backend stub process; `strings` and `outputs` are
plain numpy, so the tensor contract is tested without a server.
"""
