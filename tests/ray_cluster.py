"""The Ray instance of a test run (``ray_address`` in tests/conftest.py) and what test clusters must not leave behind.

The instance is a ``ray.cluster_utils.Cluster`` head owned by the test process. Its worker processes get the
environment of the moment it starts: the tree under test first on PYTHONPATH, and the settings a trainer's
``setup_logging`` would have given a Ray instance it started itself.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKER_ENV = {"TRANSFORMERS_VERBOSITY": "error", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "VLLM_LOGGING_LEVEL": "ERROR"}


def start_cluster(num_cpus: int = 4):
    """A one-node Ray instance (no dashboard) -> the ``Cluster``; ``.address`` to join it, ``.shutdown()`` to stop
    it. ``num_cpus``: logical CPUs, room for a 2-rank run and what a killed run's workers hold until Ray reaps them."""
    from ray.cluster_utils import Cluster

    saved = dict(os.environ)
    os.environ.update(WORKER_ENV, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    try:
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": num_cpus, "include_dashboard": False})
    finally:
        os.environ.clear()
        os.environ.update(saved)
    forget_as_current_ray(cluster.address)
    return cluster


def forget_as_current_ray(address: str) -> None:
    """``Cluster`` records its head in /tmp/ray/ray_current_cluster, and a plain ``ray.init()`` anywhere on the
    machine then joins it instead of starting its own Ray (the trainer's ``ray.init(num_cpus=...)`` even fails:
    "When connecting to an existing cluster, num_cpus and num_gpus must not be provided"), another test run on the
    machine included. Every user of a test cluster names its address, so the record is removed."""
    from ray._common.utils import get_ray_address_file

    record = Path(get_ray_address_file(None))
    with contextlib.suppress(OSError):
        if record.read_text().strip() == address:
            record.unlink()
