"""Search: answering queries over a loaded index, in this process.

``service.py`` loads an index directory (``retrieval_server.index``) into a ``SearchService`` (its options, checks and
device plan) and answers ``search(queries, k)`` with passages: dense search (``dense.py``: the encoder and FAISS, on
the CPU or placed on GPUs) or BM25 (``bm25.py``), the answer cache (``query_cache.py``), the optional re-ranker
(``rerank.py``), whole documents by id (``documents.py``) and where each part runs (``devices.py``). ``online/``
answers the same calls from a web search engine. Nothing here imports ``retrieval_server.serve``; the HTTP API is
there.
"""
