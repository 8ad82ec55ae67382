"""Retrieval service: dense (FAISS) and BM25 search over a JSONL corpus, served over HTTP.

`build_index` writes an index directory (index files + manifest.json), `import_index` writes the manifest of a
FAISS index built elsewhere (Search-R1's e5_Flat.index); `serve` loads either and answers Search-R1-compatible
``POST /retrieve`` requests (see docs/design.md, "Retrieval API and corpus format").
"""
