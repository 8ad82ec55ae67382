"""``python -m retrieval_server.serve``: the command users type (and ``launcher.py`` and the Ray replicas run); the
command line is ``cli.py``."""

import sys

from retrieval_server.serve.cli import main

if __name__ == "__main__":
    sys.exit(main())
