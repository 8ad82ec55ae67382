"""Retrieval service: dense (FAISS) and BM25 search over a JSONL corpus, served over HTTP.

Grouped by job, imports pointing one way (``serve`` -> ``search`` -> ``index``; ``tests/test_layout.py`` checks it):

- ``index/``: what an index is on disk and the commands that write one (``python -m retrieval_server.build_index``
  builds an index directory, ``python -m retrieval_server.import_index`` writes the manifest of a FAISS index built
  elsewhere, Search-R1's e5_Flat.index).
- ``search/``: answering queries over a loaded index in this process (dense, BM25, cache, re-ranker, devices) or from
  an online search engine.
- ``serve/``: the HTTP API and its command line (``python -m retrieval_server.serve``, Search-R1-compatible ``POST
  /retrieve``), and the Ray deployment (``python -m retrieval_server.ray_service``).

At the top: the modules users type after ``python -m`` (thin shims over the modules above), ``logs.py`` (the logging
setup of every command and the service's summary line) and ``launcher.py`` (runs the service as a subprocess, for
tests, benchmarks and scripts). See docs/design.md, "Retrieval API and corpus format".
"""
