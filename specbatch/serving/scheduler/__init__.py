"""The scheduler process: admission, the instance connections, replies (no torch)."""
