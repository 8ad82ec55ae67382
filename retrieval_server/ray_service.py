"""``python -m retrieval_server.ray_service up|status|down``: the command users type; the deployment is
``retrieval_server.serve.ray_deploy`` (driver side) and ``retrieval_server.serve.ray_actors`` (the actors)."""

import sys

from retrieval_server.serve.ray_deploy import main

if __name__ == "__main__":
    sys.exit(main())
