"""``python -m search_r1.inspect``: the same as ``search-r1-inspect``."""

import sys

from search_r1.inspect.cli import main

sys.exit(main())
