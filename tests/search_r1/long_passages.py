"""A corpus of real-sized passages (Search-R1's wiki-18 passages are 100 words; with titles and Qwen2.5's
tokenizer three of them make a 430-520 token ``<information>`` block), for the tests of the length budgets.

The text is English words drawn with a fixed seed, each passage led by its topic's words, so BM25 finds a topic's
passages first. ``write_corpus`` writes the JSONL corpus the retrieval service reads.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

WORDS = ("the of and in to was is for on as by with from at which that his an were are also it be this had first "
         "one after its new who they two has but not have been other her their or all during city river century "
         "world state national year when between later school war member team season music film series built "
         "north south east west population government university history area church founded published known "
         "called became since under until about most three many several named part time used group region early "
         "large small county village district family king army battle record album band game station line "
         "island park museum company club league cup championship final played born died married son daughter "
         "father mother local public service house building road bridge water sea mountain valley lake forest").split()
TOPICS = {"paris": ("Paris", "Paris capital France Seine"), "tokyo": ("Tokyo", "Tokyo capital Japan Honshu"),
          "nile": ("Nile", "Nile river Africa Egypt"),
          "everest": ("Mount Everest", "Everest mountain Himalayas Nepal"),
          "curie": ("Marie Curie", "Curie Nobel physicist radium"),
          "berlin": ("Berlin", "Berlin capital Germany Spree")}


def passages(per_topic: int = 3, words: tuple[int, int] = (120, 165), seed: int = 0) -> list[dict]:
    """``per_topic`` passages per topic of ``words[0]``..``words[1]`` words -> corpus rows ``{"id", "contents"}``."""
    rng = random.Random(seed)
    rows = []
    for key, (title, lead) in TOPICS.items():
        for i in range(per_topic):
            body = " ".join(rng.choice(WORDS) for _ in range(rng.randint(*words) - len(lead.split())))
            rows.append({"id": f"{key}-{i}", "contents": f'"{title}"\n{lead} {body}.'})
    return rows


def write_corpus(path: Path, **kwargs) -> Path:
    with path.open("w") as f:
        for row in passages(**kwargs):
            f.write(json.dumps(row) + "\n")
    return path
