"""Keep scikit-learn (and SciPy under it) out of every process that imports transformers through verl.

transformers imports ``sklearn.metrics.roc_curve`` when its generation package loads, and that happens on the first
``from transformers import AutoTokenizer`` (transformers 5 loads ``generation`` with the auto classes). It needs the
function only for assisted decoding's adaptive confidence threshold (``assistant_confidence_threshold``), which this
project never uses. The import costs about 1 s of CPU in every trainer, Ray worker, evaluation and data process
(measured on the 2-core CI machine: 1.06 s of a 6.5 s trainer import).

transformers decides with ``transformers.utils.is_sklearn_available()`` at the moment
``transformers.generation.candidate_generator`` is imported. `install()` adds a finder to ``sys.meta_path`` that, when
that module is about to be imported, makes this check answer False; the finder then steps aside and the module loads
from its real file as usual. Nothing else changes: scikit-learn stays importable for any code that imports it itself
(sentence-transformers' evaluators, a user's reward function), and transformers keeps every other feature. With it,
transformers' assisted decoding runs without the adaptive threshold, as it does where scikit-learn is not installed.

If transformers moves the import, the finder never fires and the cost simply comes back;
``tests/verl/test_lean_imports.py`` then fails, naming the module that loaded scikit-learn.
"""

from __future__ import annotations

import importlib.abc
import sys

GENERATION_MODULE = "transformers.generation.candidate_generator"


class _TransformersWithoutSklearn(importlib.abc.MetaPathFinder):
    """Answers no import itself; only switches off transformers' scikit-learn check just before the module using it."""

    def find_spec(self, fullname, path=None, target=None):  # noqa: ANN001, ANN201 (importlib's signature)
        if fullname == GENERATION_MODULE and "sklearn" not in sys.modules:
            utils = sys.modules.get("transformers.utils")
            if utils is not None:
                utils.is_sklearn_available = _unavailable
        return None


def _unavailable() -> bool:
    return False


def install() -> None:
    """Add the finder once per process (idempotent; a no-op once transformers' generation package is loaded)."""
    if GENERATION_MODULE in sys.modules:
        return
    if not any(isinstance(f, _TransformersWithoutSklearn) for f in sys.meta_path):
        sys.meta_path.insert(0, _TransformersWithoutSklearn())
