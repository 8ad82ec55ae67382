"""Online search engines (SerpAPI, Google Custom Search, Serper, Brave) behind the retrieval service's ``/retrieve``.

``engines.py``: each engine's request and documented JSON answer; ``response_cache.py``: the replayable answer cache
on disk; ``backend.py``: the service object that ``serve --backend ENGINE`` serves (budget, backoff, timeout, rate,
cost, key handling). See docs/design.md, "Online search backends".
"""
