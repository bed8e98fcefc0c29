"""Serving logic shared by the Triton models, testable without Triton.

The model.py adapters parse tensors into these objects, call them and turn what
they return back into tensors; everything worth testing lives here.
"""
