"""Evaluation figures from scored trajectories: per data_source and overall, as JSON, markdown and a PNG.

Choices:

- The unit is the question (a dataset row). With ``k`` samples per question a question's EM is the
  mean over its samples (so ``em`` is the expected EM of one sample) and ``pass_at_k`` is 1 when any
  sample is exact. With one sample (greedy) the figures are the usual EM / sub-EM / F1.
- 95% confidence intervals are percentile bootstraps over questions (``BOOTSTRAP_RESAMPLES``
  resamples from a fixed seed), so a report is reproducible bit for bit.
- ``overall`` pools every question; ``overall.macro_em`` / ``macro_f1`` average the per-source
  figures, which is how Search-R1's tables compute their "Avg." column.
- ``searches``, ``turns`` and ``response_tokens`` are per question (means over its samples), with intervals;
  ``stop_reasons`` counts trajectories.
- Beside EM, where the errors come from (``error_classes``, per question, with intervals): ``recall`` = some passage
  the policy saw holds a gold answer (its searches' ``<information>`` / ``<tool_response>`` blocks, and RAG's
  passages in the prompt; Search-R1's normalisation, token-aligned as the ``retrieval_hit`` term matches), the
  agent's retrieval recall; ``wrong_retrieved`` = answered wrongly although a gold answer was retrieved (a
  misreading), ``name_read`` = of those, the answer is itself a name in the passages (the wrong entity copied);
  ``wrong_not_retrieved`` = answered wrongly with no gold answer in any passage. ``benchmarks/error_analysis.py``
  prints the same classes per run and seed.
- ``answer_bearing``: the same figures on the questions whose ``extra_info.answer_bearing`` is true (a gold answer
  occurs somewhere in the corpus: ``data_prep.wiki_nq``), when the data have the flag.
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

from search_r1.reward.qa_em import DEFAULT_NORMALIZE
from search_r1.reward.terms import contains

BOOTSTRAP_RESAMPLES = 1000
BOOTSTRAP_SEED = 0
SCORES = ("em", "subem", "f1")
# The evidence blocks of a response, either action format (tags: <information>; hermes: <tool_response>).
EVIDENCE = re.compile(r"<information>(.*?)</information>|<tool_response>(.*?)</tool_response>", re.S)
# Per question, mean over its samples, each with a 95% interval: the loop's counters and the error classes.
COUNTERS = ("searches", "turns", "response_tokens")
CLASSES = ("recall", "wrong_retrieved", "name_read", "wrong_not_retrieved")


def evidence(record: dict) -> str:
    """The text of every passage one trajectory record's policy saw: the evidence blocks of its response and the
    passages of its prompt (``prompt_passages``: RAG's; absent or empty otherwise), joined."""
    blocks = [a or b for a, b in EVIDENCE.findall(record["response"])]
    return " ".join([*blocks, record.get("prompt_passages") or ""])


def contains_gold(text: str, golds: list[str], normalize: str = DEFAULT_NORMALIZE) -> bool:
    """Some gold answer occurs in ``text`` as a whole token sequence (``reward.terms.contains``)."""
    return any(contains(text, gold, normalize) for gold in golds)


def error_classes(record: dict, normalize: str = DEFAULT_NORMALIZE) -> dict[str, bool]:
    """Where one trajectory's error comes from (module docstring): recall, wrong_retrieved, name_read,
    wrong_not_retrieved."""
    found = evidence(record)
    gold = contains_gold(found, record["golden"], normalize)
    wrong = record["em"] < 1
    name_read = gold and wrong and bool(record.get("answer")) and contains_gold(found, [record["answer"]], normalize)
    return {"recall": gold, "wrong_retrieved": gold and wrong, "name_read": name_read,
            "wrong_not_retrieved": wrong and not gold}


def bootstrap_ci(values: np.ndarray, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED,
                 level: float = 0.95) -> list[float]:
    """Percentile bootstrap interval [lo, hi] of the mean of ``values`` (shape [N], N >= 1)."""
    values = np.asarray(values, dtype=np.float64)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(values), size=(resamples, len(values)))  # [R, N]
    means = values[picks].mean(axis=1)  # [R]
    tail = (1.0 - level) / 2 * 100
    lo, hi = np.percentile(means, [tail, 100 - tail])
    return [float(lo), float(hi)]


def summarise(records: list[dict]) -> dict:
    """Figures of one group of trajectory records (each with row, em, subem, f1, searches, turns, response_tokens,
    stop_reason and its ``error_classes``): the scores, counters and error classes per question, with intervals."""
    by_question: dict[int, list[dict]] = defaultdict(list)
    for r in records:
        by_question[r["row"]].append(r)
    per_question = {s: np.array([np.mean([r[s] for r in rs]) for rs in by_question.values()])  # [N] each
                    for s in (*SCORES, *COUNTERS, *CLASSES)}
    k = max(len(rs) for rs in by_question.values())
    out = {
        "n": len(by_question),
        "em": float(per_question["em"].mean()),
        "em_ci": bootstrap_ci(per_question["em"]),
        "subem": float(per_question["subem"].mean()),
        "f1": float(per_question["f1"].mean()),
        "f1_ci": bootstrap_ci(per_question["f1"]),
        **{key: value for name in (*COUNTERS, *CLASSES)
           for key, value in ((name, float(per_question[name].mean())), (f"{name}_ci",
                                                                           bootstrap_ci(per_question[name])))},
        "stop_reasons": dict(sorted(Counter(r["stop_reason"] for r in records).items())),
    }
    if k > 1:
        passed = np.array([max(r["em"] for r in rs) for rs in by_question.values()])
        out.update(k=k, pass_at_k=float(passed.mean()), pass_at_k_ci=bootstrap_ci(passed))
    return out


def build_results(records: list[dict], normalize: str = DEFAULT_NORMALIZE) -> dict:
    """``{"overall": {...}, "by_source": {data_source: {...}}}`` from all trajectory records, plus
    ``"answer_bearing": {...}`` (the overall figures on the answer-bearing questions) when some record is flagged."""
    if not records:
        raise ValueError("no trajectories to report")
    records = [{**r, **error_classes(r, normalize)} for r in records]  # once, for every group below
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        groups[r["data_source"]].append(r)
    by_source = {name: summarise(rs) for name, rs in sorted(groups.items())}
    overall = summarise(records)
    overall["macro_em"] = float(np.mean([s["em"] for s in by_source.values()]))
    overall["macro_f1"] = float(np.mean([s["f1"] for s in by_source.values()]))
    results = {"overall": overall, "by_source": by_source}
    bearing = [r for r in records if r.get("answer_bearing")]
    if bearing:
        results["answer_bearing"] = summarise(bearing)
    return results


def _ci(ci: list[float]) -> str:
    return f"[{ci[0]:.3f}, {ci[1]:.3f}]"


def to_markdown(results: dict, title: str) -> str:
    """A markdown table: one line per data_source, then the pooled overall line and the macro averages."""
    first = next(iter(results["by_source"].values()))
    k = first.get("k")
    head = ["source", "n", "EM", "EM 95% CI", "sub-EM", "F1", "F1 95% CI", "searches", "turns"]
    head += [f"pass@{k}"] if k else []
    head += ["stop reasons"]
    lines = [f"# {title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, s in [*results["by_source"].items(), ("**overall**", results["overall"])]:
        cells = [name, str(s["n"]), f"{s['em']:.3f}", _ci(s["em_ci"]), f"{s['subem']:.3f}", f"{s['f1']:.3f}",
                 _ci(s["f1_ci"]), f"{s['searches']:.2f}", f"{s['turns']:.2f}"]
        if k:
            cells.append(f"{s['pass_at_k']:.3f}")
        cells += [", ".join(f"{reason} {count}" for reason, count in s["stop_reasons"].items())]
        lines.append("| " + " | ".join(cells) + " |")
    o = results["overall"]
    lines += ["", f"Average over sources (macro): EM {o['macro_em']:.3f}, F1 {o['macro_f1']:.3f}.", ""]
    lines += beside_em_table([("all questions", o)] + ([("answer-bearing", results["answer_bearing"])]
                                                         if "answer_bearing" in results else []))
    return "\n".join(lines)


BESIDE_EM = (("em", "EM"), ("searches", "searches"), ("recall", "retrieval recall"), ("turns", "turns"),
             ("response_tokens", "response tokens"), ("wrong_retrieved", "wrong, gold retrieved"),
             ("name_read", "of which another name read"), ("wrong_not_retrieved", "wrong, not retrieved"))


def with_ci(s: dict, key: str) -> str:
    """``value [lo, hi]`` of one figure of a ``summarise`` result (counts with 2 decimals, shares with 3)."""
    digits = 1 if key == "response_tokens" else 2 if key in COUNTERS else 3
    lo, hi = s[f"{key}_ci"]
    return f"{s[key]:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def beside_em_table(groups: list[tuple[str, dict]]) -> list[str]:
    """Markdown lines: per group of questions, EM and what is reported beside it, each with its 95% interval."""
    head = ["questions", "n", *(label for _, label in BESIDE_EM)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, s in groups:
        lines.append("| " + " | ".join([name, str(s["n"]), *(with_ci(s, key) for key, _ in BESIDE_EM)]) + " |")
    return [*lines, ""]


def plot_results(results: dict, out_png: str | Path, title: str) -> Path:
    """Bar chart of EM and F1 per data_source and overall, with the 95% bootstrap intervals as error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = [*results["by_source"].items(), ("overall", results["overall"])]
    x = np.arange(len(groups))
    width = 0.38
    fig, ax = plt.subplots(figsize=(max(5.0, 1.3 * len(groups) + 2), 4))
    for offset, (score, label) in zip((-width / 2, width / 2), (("em", "EM"), ("f1", "F1")), strict=True):
        means = np.array([s[score] for _, s in groups])
        cis = np.array([s[f"{score}_ci"] for _, s in groups])  # [G, 2]
        errors = np.stack([means - cis[:, 0], cis[:, 1] - means])  # [2, G]
        ax.bar(x + offset, means, width, yerr=np.clip(errors, 0, None), capsize=3, label=label)
    ax.set_xticks(x, [f"{name}\n(n={s['n']})" for name, s in groups], fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("score (95% bootstrap CI)")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    out = Path(out_png)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def write_reports(records: list[dict], out_dir: str | Path, title: str, normalize: str = DEFAULT_NORMALIZE) -> dict:
    """Write results.json, results.md and results.png into ``out_dir``; returns the results."""
    out = Path(out_dir)
    results = build_results(records, normalize)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "results.md").write_text(to_markdown(results, title))
    plot_results(results, out / "results.png", title)
    return results
