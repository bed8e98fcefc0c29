"""Client for the specbatch ensemble over HTTP /generate and the gRPC stream."""

from specbatch_client.api import Answer, GenerationOptions, ServerError, SpecbatchClient

__all__ = ["Answer", "GenerationOptions", "ServerError", "SpecbatchClient"]
