"""Client of the retrieval service: batched search with timeouts, retries and a health check."""

from search_r1.search.client import RetrievalClient, RetrievalError, RetrievalUnavailable

__all__ = ["RetrievalClient", "RetrievalError", "RetrievalUnavailable"]
