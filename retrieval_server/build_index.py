"""``python -m retrieval_server.build_index``: the command users type; the builder is
``retrieval_server.index.build``."""

import sys

from retrieval_server.index.build import main

if __name__ == "__main__":
    sys.exit(main())
