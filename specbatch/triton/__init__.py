"""Adapters between Triton's Python backend and the specbatch library.

The only package that imports triton_python_backend_utils; it is importable only
inside a Python-backend stub process.
"""
