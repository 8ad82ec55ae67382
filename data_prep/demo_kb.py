"""The demo knowledge base: a fictional world, its Wikipedia-like corpus, and one-hop / two-hop questions.

``python -m data_prep.demo_kb --out data/demo`` writes, deterministically from ``--seed``:

- ``corpus.jsonl``: one ``{"id", "contents": "\\"Title\\"\\ntext"}`` passage per entity (corpus format:
  docs/design.md, "Retrieval API and corpus format");
- ``train.parquet`` / ``test.parquet``: questions in the Search-R1 schema (``data_prep.qa_search.make_row``),
  ``data_source`` = ``demo_single`` (one hop, NQ-like) or ``demo_multi`` (two hops, HotpotQA-like);
- ``questions.jsonl``: the same questions with their reasoning chains (entity, relation, answer per hop) and
  answer kind, for the scripted agent of ``data_prep.tiny_policy`` and for the tests.

Choices:

- The world is a set of independent *groups*. A group is an organisation, its founder, the founder's
  birthplace, the organisation's seat, a work the organisation built and a book the founder wrote (six
  entities, six passages). Relations: founder (org -> person), seat (org -> place), birthplace (person ->
  place), maker (work -> org), author (book -> person). Two-hop questions compose two of them inside a group
  (e.g. the founder of the organisation that built a work).
- Names are random words over a small syllable inventory (each syllable one BPE token, so a name is two or
  three tokens), and every name word except first names is used once in the whole world: an answer cannot
  be guessed (test answers never occur in training questions) and a BM25 query with an entity's name ranks
  its own passage first (the name is in its title and its text).
- Train/test split by group: all entities of a group, hence every entity a test question mentions or answers,
  belong to test questions only.
- Passages are short (about 20 tokens of text) so that three retrieved passages fit in the agent's 96-token
  information block. Each passage states its entity's fact first, in the words the scripted agent restates
  ("X was founded by Y", "X was born in Y", "The X was built by Y", "X was written by Y"; "based in" for the
  seat), followed by distractors: years, place types, provinces and mentions of the group's other entities.
- The mentions are chosen so that each entity's name occurs in exactly three passages of its group (its own
  and two others), so a search for it returns those three, and no other passage of the block states the
  same relation: the phrase the question asks for ("founded by", "built by", ...) occurs once per block, in
  Doc 1. (Works and books therefore have one-word names: with "Bridge" or "Atlas" in the name, a search would
  return other bridges built by other organisations.)
- Questions use two templates per relation. Golden answers are the main name plus an alias (a person's
  surname, an organisation's name without its kind, a place with its province).
"""

from __future__ import annotations

import argparse
import json
import logging
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from data_prep.qa_search import make_row, rows_to_parquet

logger = logging.getLogger(__name__)

SINGLE, MULTI = "demo_single", "demo_multi"

_ONSETS = ["b", "br", "d", "dr", "f", "g", "gr", "k", "l", "m", "n", "p", "r", "s", "t", "th", "v", "z", "sh"]
_VOWELS = ["a", "e", "i", "o", "u", "ae", "ei", "ou"]
_CODAS = ["", "", "", "n", "r", "l", "s", "m", "th", "x"]
_PLACE_SUFFIXES = ["haven", "mere", "ford", "holm", "wick", "dale", "stead", "burg", "moor", "fell"]
_ORG_KINDS = ["Guild", "Company", "Works", "Society", "Foundry", "Syndicate"]
_PLACE_TYPES = ["river town", "port city", "mountain village", "market town", "fortress town", "island town"]


@dataclass(frozen=True)
class Relation:
    """A fact type: who it links, how passages and the scripted agent state it, how questions ask it."""

    subject_kind: str
    object_kind: str
    statement: str  # "{s} was founded by {o}." -- the words before {o} also appear in the subject's passage
    questions: tuple[str, ...]  # one-hop templates, {s} = subject display name
    phrase: str  # noun phrase for two-hop templates: "the founder of {s}"


RELATIONS: dict[str, Relation] = {
    "founder": Relation("org", "person", "{s} was founded by {o}.",
                        ("Who founded {s}?", "Who is the founder of {s}?"), "the founder of {s}"),
    "seat": Relation("org", "place", "{s} is based in {o}.",
                     ("Where is {s} based?", "In which town is {s} based?"), "the seat of {s}"),
    "birthplace": Relation("person", "place", "{s} was born in {o}.",
                           ("Where was {s} born?", "What is the birthplace of {s}?"), "the birthplace of {s}"),
    "maker": Relation("work", "org", "{s} was built by {o}.",
                      ("Which organisation built {s}?", "Who built {s}?"), "the organisation that built {s}"),
    "author": Relation("book", "person", "{s} was written by {o}.",
                       ("Who wrote {s}?", "Who is the author of {s}?"), "the author of {s}"),
}
# Two-hop questions: (inner relation, outer relation) -> templates; {s} = the inner relation's subject.
TWO_HOP: dict[tuple[str, str], tuple[str, ...]] = {
    ("maker", "founder"): ("Who founded the organisation that built {s}?",
                           "Who is the founder of the organisation that built {s}?"),
    ("maker", "seat"): ("Where is the organisation that built {s} based?",
                        "In which town is the organisation that built {s} based?"),
    ("founder", "birthplace"): ("Where was the founder of {s} born?", "What is the birthplace of the founder of {s}?"),
    ("author", "birthplace"): ("Where was the author of {s} born?", "What is the birthplace of the author of {s}?"),
}
GROUP_SUBJECTS = {"founder": "org", "seat": "org", "birthplace": "person", "maker": "work", "author": "book"}


@dataclass
class Entity:
    """One fictional entity; ``name`` is what a search should use, ``display`` how sentences mention it."""

    id: str
    kind: str  # person | place | org | work | book
    name: str
    display: str
    aliases: list[str]
    group: int
    text: str = ""
    facts: dict[str, str] = field(default_factory=dict)  # relation -> object entity id

    def contents(self) -> str:
        return f'"{self.name}"\n{self.text}'


@dataclass(frozen=True)
class Hop:
    """One step of a question's reasoning chain: search ``query``, read ``statement`` (which names ``answer``)."""

    query: str
    relation: str
    statement: str
    answer: str


@dataclass(frozen=True)
class Question:
    """A generated question with its answers and the chain that answers it (one hop or two)."""

    data_source: str
    question: str
    answers: list[str]
    answer_kind: str
    chain: list[Hop]
    group: int
    split: str


class _Namer:
    """Random words over a fixed syllable inventory, each word used once (case-insensitively) in the world.

    A small inventory makes every syllable one BPE token, so a name is two or three tokens to copy.
    """

    def __init__(self, rng: random.Random, n_syllables: int = 96) -> None:
        self.rng = rng
        self.used: set[str] = set()
        syllables: set[str] = set()
        while len(syllables) < n_syllables:
            syllables.add(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS))
        self.syllables = sorted(syllables)

    def word(self, n_syllables: int = 2, suffix: str = "") -> str:
        while True:
            w = ("".join(self.rng.choice(self.syllables) for _ in range(n_syllables)) + suffix).capitalize()
            if w.lower() not in self.used:
                self.used.add(w.lower())
                return w


def _sentence(text: str) -> str:
    return text[0].upper() + text[1:]


def _a(noun_phrase: str) -> str:
    """'a weaver', 'an astronomer'."""
    return ("an " if noun_phrase[0] in "aeiou" else "a ") + noun_phrase


def _make_group(g: int, rng: random.Random, namer: _Namer, first_names: list[str],
                provinces: list[str]) -> list[Entity]:
    """The six entities of group ``g`` with their passages (see the module docstring)."""
    person_first, surname = rng.choice(first_names), namer.word()
    person = Entity(f"person-{g}", "person", f"{person_first} {surname}", f"{person_first} {surname}",
                    [surname], g)
    birthplace, seat = (Entity(f"place-{role}-{g}", "place", name, name, [f"{name}, {rng.choice(provinces)}"], g)
                        for role, name in (("birth", namer.word(suffix=rng.choice(_PLACE_SUFFIXES))),
                                           ("seat", namer.word(suffix=rng.choice(_PLACE_SUFFIXES)))))
    org_core, org_kind = namer.word(), rng.choice(_ORG_KINDS)
    org = Entity(f"org-{g}", "org", f"{org_core} {org_kind}", f"{org_core} {org_kind}", [org_core], g)
    work_name, book_name = namer.word(), namer.word()
    work = Entity(f"work-{g}", "work", work_name, f"the {work_name}", [], g)
    book = Entity(f"book-{g}", "book", book_name, book_name, [], g)

    born = rng.randint(1600, 1800)
    built, written = born + rng.randint(40, 90), born + rng.randint(20, 60)
    person.text = (f"{person.name} was born in {birthplace.name} in {born}. "
                   f"{rng.choice(['He', 'She'])} founded {org.name} and wrote {book.name}.")
    org.text = f"{org.name} was founded by {person.name}. It is based in {seat.name} and built {work.display}."
    work.text = _sentence(f"{work.display} was built by {org.name} in {built}.")
    book.text = f"{book.name} was written by {person.name} in {written}."
    for place, mention in ((birthplace, f"the setting of {book.name}"), (seat, f"home of {work.display}")):
        place.text = f"{place.name} is {_a(rng.choice(_PLACE_TYPES))} in {place.aliases[0].split(', ')[1]}, {mention}."
    org.facts = {"founder": person.id, "seat": seat.id}
    person.facts = {"birthplace": birthplace.id}
    work.facts = {"maker": org.id}
    book.facts = {"author": person.id}
    return [person, birthplace, seat, org, work, book]


def _hop(subject: Entity, relation: str, by_id: dict[str, Entity]) -> tuple[Hop, Entity]:
    obj = by_id[subject.facts[relation]]
    statement = _sentence(RELATIONS[relation].statement.format(s=subject.display, o=obj.display))
    return Hop(query=subject.name, relation=relation, statement=statement, answer=obj.name), obj


def _questions_for_group(group: list[Entity], n_per_group: int, split: str, rng: random.Random) -> list[Question]:
    """``n_per_group`` questions about one group, alternating one-hop and two-hop, no (relations) repeated."""
    by_id = {e.id: e for e in group}
    by_kind = {e.kind: e for e in group}
    singles = rng.sample(list(RELATIONS), len(RELATIONS))
    multis = rng.sample(list(TWO_HOP), len(TWO_HOP))
    out = []
    for i in range(n_per_group):
        multi = i % 2 == 1
        relations = multis[(i // 2) % len(multis)] if multi else (singles[(i // 2) % len(singles)],)
        subject = by_kind[GROUP_SUBJECTS[relations[0]]]
        chain, entity = [], subject
        for relation in relations:
            hop, entity = _hop(entity, relation, by_id)
            chain.append(hop)
        template = rng.choice(TWO_HOP[relations] if multi else RELATIONS[relations[0]].questions)
        out.append(Question(MULTI if multi else SINGLE, _sentence(template.format(s=subject.display)),
                            [entity.name, *entity.aliases], entity.kind, chain, group[0].group, split))
    return out


def build_kb(seed: int = 0, n_groups: int = 1100, n_test_groups: int = 100,
             questions_per_group: int = 2) -> tuple[list[Entity], list[Question]]:
    """The whole world: entities (six per group) and questions (train groups first, then test groups).

    Deterministic in its arguments. The first ``n_groups - n_test_groups`` groups are train, the rest test.
    """
    if not 0 < n_test_groups < n_groups:
        raise ValueError(f"need 0 < n_test_groups < n_groups, got {n_test_groups} and {n_groups}")
    rng = random.Random(seed)
    namer = _Namer(rng)
    first_names = sorted({namer.word() for _ in range(150)})
    provinces = sorted({namer.word() for _ in range(12)})
    entities, questions = [], []
    for g in range(n_groups):
        group = _make_group(g, rng, namer, first_names, provinces)
        entities.extend(group)
        split = "train" if g < n_groups - n_test_groups else "test"
        questions.extend(_questions_for_group(group, questions_per_group, split, rng))
    return entities, questions


def write_kb(out: str | Path, entities: list[Entity], questions: list[Question]) -> dict[str, int]:
    """Write corpus.jsonl, train/test parquet and questions.jsonl into ``out``; returns counts per file."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with (out / "corpus.jsonl").open("w") as f:
        for e in entities:
            f.write(json.dumps({"id": e.id, "contents": e.contents()}) + "\n")
    with (out / "questions.jsonl").open("w") as f:
        for q in questions:
            f.write(json.dumps(asdict(q)) + "\n")
    counts = {"corpus": len(entities)}
    for split in ("train", "test"):
        rows = [make_row(q.data_source, q.question, q.answers, split, i)
                for i, q in enumerate(q for q in questions if q.split == split)]
        rows_to_parquet(rows, out / f"{split}.parquet")
        counts[split] = len(rows)
    return counts


def load_questions(data_dir: str | Path, split: str | None = None) -> list[Question]:
    """Read ``questions.jsonl`` back (optionally one split) as Question objects."""
    out = []
    with (Path(data_dir) / "questions.jsonl").open() as f:
        for line in f:
            d = json.loads(line)
            if split is None or d["split"] == split:
                d["chain"] = [Hop(**h) for h in d["chain"]]
                out.append(Question(**d))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point."""
    parser = argparse.ArgumentParser(prog="python -m data_prep.demo_kb", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="output directory (e.g. data/demo)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the whole world")
    parser.add_argument("--n-groups", type=int, default=1100, help="entity groups (six entities/passages each)")
    parser.add_argument("--n-test-groups", type=int, default=100, help="groups whose questions form the test set")
    parser.add_argument("--questions-per-group", type=int, default=2, help="questions per group (one- and two-hop)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    entities, questions = build_kb(args.seed, args.n_groups, args.n_test_groups, args.questions_per_group)
    counts = write_kb(args.out, entities, questions)
    print(f"demo KB -> {args.out}: {counts['corpus']} passages, {counts['train']} train / {counts['test']} test "
          f"questions")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
