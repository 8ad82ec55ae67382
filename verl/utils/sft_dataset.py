"""Parquet rows of trajectories -> the RL loop's token layout, with the loss on the policy's tokens only.

A row is the RL schema (``prompt``, ``reward_model``, optional ``data_source`` and ``extra_info``; docs/design.md,
"Parquet row schema") plus ``turns``: the response in order, a list of ``{"text": str, "sampled": bool}``. A
``sampled`` turn was written by the policy (trained); any other turn was inserted by the environment (for example an
``<information>`` block, invalid-action feedback: context only). An optional ``tools`` column (a JSON string of tool
schemas) marks a trajectory in a format with tools: its prompt is rendered with those tools, as the RL trainer
renders it.

Choices:
- **The RL loop's layout, built by the RL loop's code.** The prompt is tokenised by ``PromptDataset`` (the chat
  template, applied as the RL trainer applies it), each turn's text on its own without special tokens (the agent
  loop tokenises each inserted block as one text, ``formatting.observation_ids``, and its engine samples a turn
  after the context so far), and the rows are packed by ``seq.pack_trajectories``, the function that packs the
  rollouts. ``loss_mask = response_mask * info_mask`` is the RL trainer's state-masking rule, made here once
  per row: 1 = sampled by the policy (trained), 0 = the prompt, inserted blocks and padding.
- **Text, not token ids, on disk**, so one trajectory file serves any tokenizer (a cold start written once starts
  Qwen or Llama). A policy turn ends where the loop's stop string ends it (``</search>``, ``</answer>``): no EOS is
  appended, because the loop never samples past a stop string.
- **Refuse, never cut**: a row without turns, a turn that is not ``{text, sampled}``, a row with no sampled text or
  longer than ``data.max_length`` is a ``DataError`` naming the file, the row and the fix.
- **Text rows** (``TextDataset``, ``data.mix_files``): only ``turns``, no prompt and no chat template; the leading
  unsampled turns are the row's context (its "prompt"), the rest its response. Plain text with a trained span, for
  a second objective mixed into every step (the demo keeps its tiny model's copying skill with them).
"""

from __future__ import annotations

import json
import sys

import numpy as np

from verl.protocol import Batch
from verl.utils.dataset import DataError, PromptDataset, StatefulLoader, read_rows
from verl.utils.seq import pack_trajectories
from verl.utils.tokenizer import pad_token_id, render_prompt

TURNS_HINT = ("an SFT row is the RL schema plus turns: [{text: str, sampled: bool}, ...] (sampled = written by the "
              "policy); see docs/design.md, \"Supervised cold start\", and python -m data_prep.cold_start")


def encode_turns(tokenizer, turns: list[dict]) -> tuple[list[int], list[int]]:
    """(response ids, info mask) of ``turns``: each turn's text tokenised on its own, in order; the mask is 1 on the
    ids of sampled turns (trained), 0 on inserted ones (context only)."""
    texts = [turn["text"] for turn in turns]
    ids_per_turn = tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
    response, info_mask = [], []
    for turn, ids in zip(turns, ids_per_turn, strict=True):
        response += ids
        info_mask += [1 if turn["sampled"] else 0] * len(ids)
    return response, info_mask


def _check_turns(turns, where: str) -> list[dict]:
    if isinstance(turns, np.ndarray):
        turns = list(turns)
    if not isinstance(turns, list) or not turns:
        raise DataError(f"{where}: column 'turns' must be a non-empty list, got {str(turns)[:120]!r}; {TURNS_HINT}")
    for turn in turns:
        if not (isinstance(turn, dict) and isinstance(turn.get("text"), str) and isinstance(turn.get("sampled"), bool)):
            raise DataError(f"{where}: a turn must be {{text: str, sampled: bool}}, got {str(turn)[:120]!r}; "
                            f"{TURNS_HINT}")
    if not any(turn["sampled"] and turn["text"] for turn in turns):
        raise DataError(f"{where}: no sampled turn (nothing to train on); {TURNS_HINT}")
    return turns


class TokenizedRows:
    """Rows in the RL loop's token layout: per row, prompt ids, response ids and info mask (1 = sampled, trained).
    The two readers below fill them (``add``); packing and counting are shared."""

    def __init__(self, tokenizer):
        self.pad_id = pad_token_id(tokenizer)
        self.prompt_ids: list[list[int]] = []
        self.response_ids: list[list[int]] = []
        self.info_masks: list[list[int]] = []

    def add(self, prompt: list[int], response: list[int], info_mask: list[int]) -> None:
        self.prompt_ids.append(prompt)
        self.response_ids.append(response)
        self.info_masks.append(info_mask)

    def __len__(self) -> int:
        return len(self.prompt_ids)

    def policy_tokens(self) -> int:
        return sum(sum(m) for m in self.info_masks)

    def batch(self, indices: list[int] | np.ndarray) -> Batch:
        """Rows ``indices`` packed as the RL loop packs its rollouts (``pack_trajectories``: [B, P], [B, R],
        [B, P + R]) plus ``loss_mask`` [B, R]: 1 = sampled by the policy (trained), 0 = inserted or padding."""
        idx = [int(i) for i in indices]
        packed = pack_trajectories([self.prompt_ids[i] for i in idx], [self.response_ids[i] for i in idx],
                                   [self.info_masks[i] for i in idx], self.pad_id)
        packed["loss_mask"] = packed["response_mask"] * packed["info_mask"]  # [B, R]
        return Batch(packed, {"row": idx})


class TrajectoryDataset(TokenizedRows):
    """Trajectory rows (``data.train_files``, ``data.val_files``): the prompt through the chat template, as the RL
    trainer renders it, then the turns (see the module docstring)."""

    def __init__(self, files: str, tokenizer, max_length: int):
        super().__init__(tokenizer)
        prompts = PromptDataset(files, tokenizer, max_prompt_length=sys.maxsize)  # checks prompt and reward_model
        for i, (row, prompt) in enumerate(zip(prompts.rows, prompts.prompt_ids, strict=True)):
            where = f"row {i} of {files!r}"
            if "turns" not in row:
                raise DataError(f"{files!r} lacks the column 'turns' (it has {sorted(row)}); {TURNS_HINT}")
            response, info_mask = encode_turns(tokenizer, _check_turns(row["turns"], where))
            if row.get("tools"):  # a format with tools: the prompt shows them, as the RL trainer renders it
                prompt = render_prompt(tokenizer, row["prompt"], json.loads(row["tools"]))
            if len(prompt) + len(response) > max_length:
                raise DataError(f"{where}: the trajectory has {len(prompt) + len(response)} tokens (prompt "
                                f"{len(prompt)} + response {len(response)}) > data.max_length={max_length}: raise "
                                "data.max_length or drop the row (trajectories are never cut)")
            self.add(prompt, response, info_mask)


TEXT_HINT = ("a text row (data.mix_files) is a column turns: [{text: str, sampled: bool}, ...] that starts with a "
             "context turn (sampled: false, the text the trained turns follow); no prompt or chat template is applied")


class TextDataset(TokenizedRows):
    """Text rows (``data.mix_files``): per row, the ids of its leading unsampled turns as the prompt (the tokenizer's
    bos first when it adds one), the rest as response ids and info mask, each turn tokenised on its own (special
    tokens written in the text, e.g. a chat template's, become their ids). No prompt column, no chat template."""

    def __init__(self, files: str, tokenizer, max_length: int):
        super().__init__(tokenizer)
        rows = read_rows(files)
        if rows and "turns" not in rows[0]:
            raise DataError(f"{files!r} lacks the column 'turns' (it has {sorted(rows[0])}); {TEXT_HINT}")
        bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None and \
            tokenizer("a", add_special_tokens=True)["input_ids"][:1] == [tokenizer.bos_token_id] else []
        for i, row in enumerate(rows):
            where = f"text row {i} of {files!r}"
            turns = _check_turns(row["turns"], where)
            n_context = next(k for k, turn in enumerate(turns) if turn["sampled"] and turn["text"])
            if n_context == 0:
                raise DataError(f"{where}: the first turn is sampled; {TEXT_HINT}")
            context, _ = encode_turns(tokenizer, turns[:n_context])
            response, info_mask = encode_turns(tokenizer, turns[n_context:])
            if len(bos) + len(context) + len(response) > max_length:
                raise DataError(f"{where}: {len(bos) + len(context) + len(response)} tokens > "
                                f"data.max_length={max_length}: raise data.max_length or drop the row")
            self.add(bos + context, response, info_mask)


class TokenBudgetLoader(StatefulLoader):
    """Steps of trajectories of similar length, each step's padded size (rows x (longest prompt + longest response),
    as ``pack_trajectories`` pads them) at most ``budget`` tokens; a trajectory longer than the budget is a step of
    its own. ``StatefulLoader``'s iteration and ``state_dict``, so a run resumes exactly.

    Why: trajectories differ in length by 10x (an answer at once, or two searches with their passages). Fixed row
    counts pad the short rows of a batch to its longest; grouping by length wastes little compute on padding and
    spends optimiser steps in proportion to tokens, not rows. Each epoch the rows are sorted by length (ties in a
    seeded random order) and cut greedily into steps, and the steps are shuffled; so every epoch has the same number
    of steps and the same policy tokens (``policy_tokens_per_step``), whatever the shuffle.
    """

    def __init__(self, dataset: TokenizedRows, budget: int, shuffle: bool, seed: int):
        super().__init__(dataset, batch_size=1, shuffle=shuffle, seed=seed)
        self.budget = budget
        self._cached: tuple[int, list[list[int]]] | None = None

    def steps(self, epoch: int) -> list[list[int]]:
        """The row indices of each step of ``epoch``, in the order they are trained."""
        if self._cached is not None and self._cached[0] == epoch:
            return self._cached[1]
        rng = np.random.default_rng([self.seed, epoch])
        ties = rng.random(len(self.dataset)) if self.shuffle else np.zeros(len(self.dataset))
        prompt = [len(p) for p in self.dataset.prompt_ids]
        response = [len(r) for r in self.dataset.response_ids]
        # by length, then by response length (equal keys then have equal prompts too, so the cut below does not
        # depend on the tie order): ascending, so the row being added is (about) the longest so far
        order = sorted(range(len(self.dataset)), key=lambda i: (prompt[i] + response[i], response[i], ties[i]))
        steps: list[list[int]] = []
        current: list[int] = []
        longest_prompt = longest_response = 0
        for i in order:
            p, r = max(longest_prompt, prompt[i]), max(longest_response, response[i])
            if current and (len(current) + 1) * (p + r) > self.budget:
                steps.append(current)
                current, p, r = [], prompt[i], response[i]
            current.append(i)
            longest_prompt, longest_response = p, r
        if current:
            steps.append(current)
        if self.shuffle:
            steps = [steps[k] for k in rng.permutation(len(steps))]
        self._cached = (epoch, steps)
        return steps

    def batches_per_epoch(self) -> int:
        return len(self.steps(self.epoch))

    def policy_tokens_per_step(self) -> float:
        """Mean policy tokens of a step over an epoch (the same for every epoch): the constant the loss divides by."""
        return self.dataset.policy_tokens() / self.batches_per_epoch()
