"""Worker groups: one interface over in-process workers (``local``) and Ray actors (``ray``)."""

from verl.single_controller.base import WorkerGroup, create_worker_group

__all__ = ["WorkerGroup", "create_worker_group"]
