"""Serve: the retrieval service as a process: HTTP, command line, Ray deployment.

``app.py`` is the HTTP API (``POST /retrieve``, ``POST /doc``, ``GET /health``, ``GET /stats``) over a
``retrieval_server.search`` service, ``batcher.py`` coalesces concurrent requests into one search call,
``slow_clients.py`` guards request heads, ``cli.py`` is ``python -m retrieval_server.serve`` (``__main__.py``).
``ray_deploy.py`` is ``python -m retrieval_server.ray_service`` (connect, deploy, look up, stop) and ``ray_actors.py``
the replicas and the deployment actor that keeps them served.
"""
