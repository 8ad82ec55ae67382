"""Keep scikit-learn (and SciPy under it) out of every process that imports transformers through verl.

transformers imports ``sklearn.metrics.roc_curve`` when its generation package loads, and that happens on the first
``from transformers import AutoTokenizer`` (transformers 5 loads ``generation`` with the auto classes). It needs the
function only for assisted decoding's adaptive confidence threshold (``assistant_confidence_threshold``), which this
project never uses. The import costs about 1 s of CPU in every trainer, Ray worker and evaluation process
(measured on the 2-core CI machine: 1.06 s of a 6.5 s trainer import).

transformers decides with ``transformers.utils.is_sklearn_available()`` while
``transformers.generation.candidate_generator`` is imported (and that module keeps the function it saw). `install()`
adds a finder to ``sys.meta_path`` that loads that one module from its real file with the check answering False for
the length of its import, then puts the check back. So only assisted decoding runs without the adaptive threshold, as
it does where scikit-learn is not installed; every other part of transformers sees scikit-learn as installed, and
any code that imports scikit-learn itself (sentence-transformers' evaluators, a user's reward function) gets it.

If transformers moves the import, the finder never fires and the cost simply comes back;
``tests/verl/test_lean_imports.py`` then fails, naming the module that loaded scikit-learn.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys

GENERATION_MODULE = "transformers.generation.candidate_generator"


class _TransformersWithoutSklearn(importlib.abc.MetaPathFinder):
    """Finds only ``GENERATION_MODULE`` (through the normal path finder) and hands it to `_LoadWithoutSklearn`."""

    def find_spec(self, fullname, path=None, target=None):  # noqa: ANN001, ANN201 (importlib's signature)
        if fullname != GENERATION_MODULE or "sklearn" in sys.modules or "transformers.utils" not in sys.modules:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _LoadWithoutSklearn(spec.loader)
        return spec


class _LoadWithoutSklearn(importlib.abc.Loader):
    """The module's own loader, run with ``transformers.utils.is_sklearn_available`` answering False."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self.loader = loader

    def create_module(self, spec):  # noqa: ANN001, ANN201
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:  # noqa: ANN001
        utils = sys.modules["transformers.utils"]
        check = utils.is_sklearn_available
        utils.is_sklearn_available = _unavailable
        try:
            self.loader.exec_module(module)
        finally:
            utils.is_sklearn_available = check

    def __getattr__(self, name: str):  # noqa: ANN204 (get_source, get_filename, ...: the real loader's)
        return getattr(self.loader, name)


def _unavailable() -> bool:
    return False


def install() -> None:
    """Add the finder once per process (idempotent; a no-op once transformers' generation package is loaded)."""
    if GENERATION_MODULE in sys.modules:
        return
    if not any(isinstance(f, _TransformersWithoutSklearn) for f in sys.meta_path):
        sys.meta_path.insert(0, _TransformersWithoutSklearn())
