"""Model directories checked before any worker loads them.

Choices:

* **Checked before loading.** ``check_model_files`` (``check_models`` for a config) reads a model
  directory's JSON files, config and tokenizer and the weights files' headers and sizes, so a damaged
  directory is one error naming the file before any worker starts, not a traceback from a worker.
* **No torch at import.** transformers and safetensors are imported by the checks that use them, so a caller can
  import this module (and refuse a bad directory) before the heavy imports.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

from verl.config import Config, ConfigError, max_sequence_length, uses_critic

JSON_FILES = ("config.json", "generation_config.json", "tokenizer_config.json", "tokenizer.json")
WEIGHTS_HINT = ("model.safetensors, model-*.safetensors shards with model.safetensors.index.json, or "
                "pytorch_model.bin")


def check_model_files(path: str, trust_remote_code: bool = False, tokenizer: bool = True) -> None:
    """Check, without loading the weights, that the model at ``path`` will load: its JSON files parse,
    transformers reads its config (and ``tokenizer``), and every weights file is whole (a safetensors file's
    header and size, a zipped ``.bin``'s directory). A Hub id (no such local directory) gets the config and
    tokenizer checks only. Raises ValueError naming the file and what is wrong, so a damaged model directory
    is one message before any worker starts, not a traceback from inside a worker's ``from_pretrained``."""
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig  # heavy import

    local = Path(path)
    if local.is_dir():
        for name in JSON_FILES:
            if (local / name).is_file():
                try:
                    json.loads((local / name).read_bytes())
                except ValueError as err:  # JSONDecodeError and UnicodeDecodeError
                    raise ValueError(f"{name} is not valid JSON ({err})") from None
        _check_weights(local)
    remote = {"trust_remote_code": trust_remote_code}
    loads = [("config.json", lambda: AutoConfig.from_pretrained(path, **remote))]
    if tokenizer:
        loads.append(("the tokenizer", lambda: AutoTokenizer.from_pretrained(path, **remote)))
    if (local / "generation_config.json").is_file():
        loads.append(("generation_config.json", lambda: GenerationConfig.from_pretrained(path)))
    for what, load in loads:
        try:
            load()
        except Exception as err:  # transformers raises OSError, ValueError, KeyError, ... for a bad file
            where = "" if local.is_dir() else " (not a local directory; looked up on the Hugging Face Hub)"
            raise ValueError(f"{what} does not load{where}: {type(err).__name__}: {err}") from None


def _check_weights(model_dir: Path) -> None:
    """Every weights file of ``model_dir`` (and every shard its ``*.index.json`` names) is there and whole."""
    files = set(model_dir.glob("*.safetensors")) | set(model_dir.glob("pytorch_model*.bin"))
    for index in model_dir.glob("*.index.json"):
        try:
            shards = set(json.loads(index.read_bytes())["weight_map"].values())
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise ValueError(f"{index.name} is not a weights index (JSON with a weight_map): {err!r}") from None
        missing = sorted(name for name in shards if not (model_dir / name).is_file())
        if missing:
            raise ValueError(f"{index.name} names {', '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} "
                             "missing: copy the whole model directory")
        files |= {model_dir / name for name in shards}
    if not files:
        raise ValueError(f"the directory holds no weights (allowed: {WEIGHTS_HINT})")
    from safetensors import safe_open

    for file in sorted(files):
        if file.suffix == ".safetensors":
            try:
                with safe_open(str(file), framework="pt"):  # reads the header; checks the file covers it
                    pass
            except Exception as err:  # SafetensorError, OSError
                raise ValueError(f"{file.name} is damaged or truncated ({file.stat().st_size:,} bytes: {err}); copy "
                                 "or save the model again") from None
        elif _starts_with(file, b"PK") and not zipfile.is_zipfile(file):  # torch.save's zip format, cut off
            raise ValueError(f"{file.name} is damaged or truncated ({file.stat().st_size:,} bytes: no zip directory "
                             "at its end); copy or save the model again")


def _starts_with(file: Path, magic: bytes) -> bool:
    with file.open("rb") as f:
        return f.read(len(magic)) == magic


def check_models(cfg: Config) -> None:
    """``check_model_files`` for the policy (``actor_rollout_ref.model.path``, with its tokenizer) and a critic
    with its own ``critic.model.path``; ConfigError naming the key otherwise."""
    paths = [("actor_rollout_ref.model.path", cfg.actor_rollout_ref.model.path, True)]
    if cfg.critic.model.path is not None and uses_critic(cfg):
        paths.append(("critic.model.path", cfg.critic.model.path, False))
    for key, path, with_tokenizer in paths:
        try:
            check_model_files(path, cfg.actor_rollout_ref.model.trust_remote_code, tokenizer=with_tokenizer)
        except ValueError as err:
            raise ConfigError(f"config key {key}={path!r} is invalid: {err} (allowed: a Hugging Face model directory "
                              "whose config.json, tokenizer and weights load)") from None


def check_positions(cfg: Config) -> None:
    """The longest sequence the lengths allow (``verl.config.max_sequence_length``) fits the policy's (and a critic's)
    ``max_position_embeddings``; else ConfigError naming the keys and the limit, for either engine (vLLM refuses such
    a request with a traceback; the HF engine would run past the trained positions silently)."""
    from transformers import AutoConfig  # heavy import

    d = cfg.data
    need = max_sequence_length(d)
    paths = [("actor_rollout_ref.model.path", cfg.actor_rollout_ref.model.path)]
    if cfg.critic.model.path is not None and uses_critic(cfg):
        paths.append(("critic.model.path", cfg.critic.model.path))
    for key, path in paths:
        hf = AutoConfig.from_pretrained(path, trust_remote_code=cfg.actor_rollout_ref.model.trust_remote_code)
        limit = getattr(hf, "max_position_embeddings", None)
        if limit is not None and need > limit:
            raise ConfigError(
                f"the lengths allow sequences of {need} tokens, more than the model's max_position_embeddings={limit} "
                f"({key}={path!r}): min(data.max_prompt_length + data.max_response_length = "
                f"{d.max_prompt_length} + {d.max_response_length}, data.max_start_length + data.max_trajectory_length "
                f"= {d.max_start_length} + {d.max_trajectory_length}) must be at most {limit}; lower these keys "
                "(docs/design.md, Lengths)")
