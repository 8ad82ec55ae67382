"""Retrieval service: dense (FAISS) and BM25 search over a JSONL corpus, served over HTTP.

`build_index` writes an index directory (index files + manifest.json); `serve` loads it and answers
Search-R1-compatible ``POST /retrieve`` requests (see DESIGN.md, "Retrieval API").
"""
