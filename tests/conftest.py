"""Fixtures shared by all test directories: the real-vocabulary (Qwen2.5) tokenizer.

``qwen_tokenizer`` is built from the BPE ranks the ``dashscope`` package ships
(``data_prep.qwen_tokenizer``); the first build of a machine takes a few seconds, later ones read the
cached ``tokenizer.json``. Tests that must hold for any real vocabulary parametrize their tokenizer
fixture over the project's tiny tokenizer and this one.
"""

from __future__ import annotations

import pytest

from data_prep.qwen_tokenizer import build_qwen_tokenizer


@pytest.fixture(scope="session")
def qwen_tokenizer():
    """Qwen2.5's tokenizer: 151,665 ids, byte-level BPE, search tags are several tokens."""
    return build_qwen_tokenizer()
