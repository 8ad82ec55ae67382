"""Rule-based rewards for the search agent (exact match, sub-EM, F1, format score)."""

from search_r1.reward.qa_em import (
    DATA_SOURCE_SCORERS,
    DEFAULT_NORMALIZE,
    NORMALIZERS,
    SCORERS,
    compute_score,
    em_check,
    extract_answer,
    f1_score,
    is_valid_format,
    normalize_answer,
    subem_check,
)

__all__ = [
    "DATA_SOURCE_SCORERS",
    "DEFAULT_NORMALIZE",
    "NORMALIZERS",
    "SCORERS",
    "compute_score",
    "em_check",
    "extract_answer",
    "f1_score",
    "is_valid_format",
    "normalize_answer",
    "subem_check",
]
