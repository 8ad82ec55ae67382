"""Index: what a retrieval index is on disk and how it is written.

The JSONL corpus (``corpus.py``), an index directory's ``manifest.json`` (``manifest.py``), the passage and query
encoder a dense index is made with (``encoder.py``, its ONNX runtime ``onnx_backend.py``), the FAISS kinds
(``kinds.py``) and their recall tuning (``tuning.py``), dense and BM25 index files (``dense.py``, ``bm25.py``),
row-range shards (``shards.py``), all-or-nothing writes (``staging.py``), and the two commands that write an index
directory: ``build.py`` (``python -m retrieval_server.build_index``) and ``import_faiss.py`` (``python -m
retrieval_server.import_index``). Nothing here imports ``retrieval_server.search`` or ``retrieval_server.serve``.
"""
