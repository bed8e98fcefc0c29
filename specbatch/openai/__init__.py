"""An OpenAI-compatible HTTP front for the specbatch pipeline.

`/v1/completions`, `/v1/chat/completions` and `/v1/models`, forwarded over Triton's
gRPC API to the pipeline's router and scheduler, so every request is routed, queued
and batched exactly like one sent to the `specbatch` ensemble. Run it with
`python -m specbatch.openai` (`specbatch serve` starts it beside tritonserver).
"""
