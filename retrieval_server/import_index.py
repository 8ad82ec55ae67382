"""``python -m retrieval_server.import_index``: the command users type; the importer is
``retrieval_server.index.import_faiss``."""

import sys

from retrieval_server.index.import_faiss import main

if __name__ == "__main__":
    sys.exit(main())
