"""A qwen3_specdec instance process: the engine behind its connection to the scheduler."""
