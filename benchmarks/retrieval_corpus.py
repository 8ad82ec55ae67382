"""Synthetic corpus, queries and cached indexes of ``bench_retrieval.py``.

The corpus is text-like passages about fictional entities (two sentences, ~30 words, ~45 MiniLM tokens each);
queries are questions about random passages' titles, like a policy's searches. Indexes are built once and
cached under the data directory. The 1M-passage corpus for the memory figures is the 100k corpus ten times
(new ids, same texts) with its flat index's vectors ten times: real vectors at 1M rows without encoding 1M
passages, written as a raw FAISS file and brought in with ``import_index`` (whose sample check accepts a
duplicate passage at rank 1).
"""

from __future__ import annotations

import json
import random
import shutil
import time
from pathlib import Path

SYLLABLES = ("ar bel cor dan el fen gar hal in jor kel lun mar nor ol pen quin ros sal tor ul vel wen yar zan "
             "bra cle dro fia gri hel isk jun kra lia mor nia opa pra rei sto tha uvi vra wyn xel yor zel").split()
OCCUPATIONS = ("glassmaker weaver astronomer bridge-builder poet cartographer physician merchant sailor painter "
               "composer botanist mason judge teacher brewer clockmaker printer").split()
PRODUCTS = "wool cheese salt timber glass wine copper linen pottery honey iron silk".split()
LANDMARKS = ("old lighthouse", "stone bridge", "market hall", "clock tower", "ruined abbey", "harbour wall",
             "copper mine", "great library", "winter fair", "botanical garden")
ORG_KINDS = "Guild Society Company Academy Brotherhood Trust Observatory Press".split()
WORK_KINDS = ("novel", "atlas", "symphony", "treatise", "ballad", "chronicle", "map", "painting")
EVENTS = ("a great flood", "a long famine", "the comet year", "a border war", "a plague winter", "the salt riots")
INDEX_BUILDS = {"bm25": dict(retriever="bm25"), "dense-flat": dict(retriever="dense", index="flat"),
                "dense-hnsw": dict(retriever="dense", index="hnsw")}


def _name(rng: random.Random, syllables: int) -> str:
    return "".join(rng.choice(SYLLABLES) for _ in range(syllables)).capitalize()


def _passage(i: int, rng: random.Random) -> dict:
    kind = i % 5
    town, province, river = _name(rng, 2), _name(rng, 3), _name(rng, 2)
    year = rng.randint(1400, 1950)
    if kind == 0:
        title = f"{_name(rng, 2)} {_name(rng, 2)}"
        job = rng.choice(OCCUPATIONS)
        text = (f"{title} was a {job} born in {town} in {year}. {title.split()[0]} settled on the {river} river "
                f"and wrote a {rng.choice(WORK_KINDS)} about {rng.choice(EVENTS)} in {province}.")
    elif kind == 1:
        title = town
        text = (f"{town} is a town in {province} on the {river} river, known for its {rng.choice(PRODUCTS)} "
                f"and its {rng.choice(LANDMARKS)}. It was founded in {year} and suffered {rng.choice(EVENTS)}.")
    elif kind == 2:
        title = f"{river} River"
        text = (f"The {river} is a river of {province} that flows {rng.randint(20, 900)} km from {town} into the "
                f"{_name(rng, 2)} Sea. Its valley is known for {rng.choice(PRODUCTS)} since {year}.")
    elif kind == 3:
        title = f"{_name(rng, 2)} {rng.choice(ORG_KINDS)}"
        text = (f"The {title} is based in {town}, {province}, and was founded in {year} by a "
                f"{rng.choice(OCCUPATIONS)} named {_name(rng, 2)} {_name(rng, 2)} to trade {rng.choice(PRODUCTS)}.")
    else:
        title = f"The {_name(rng, 3)} {rng.choice(WORK_KINDS).capitalize()}"
        text = (f"{title} is a {rng.choice(WORK_KINDS)} completed in {year} by a {rng.choice(OCCUPATIONS)} "
                f"from {town}. It describes {rng.choice(EVENTS)} along the {river} river.")
    return {"id": str(i), "contents": f'"{title}"\n{text}'}


def write_corpus(path: Path, n: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    tmp = path.with_suffix(".tmp")
    with tmp.open("w") as f:
        for i in range(n):
            f.write(json.dumps(_passage(i, rng)) + "\n")
    tmp.replace(path)


def make_queries(corpus: Path, n: int, seed: int = 1) -> list[str]:
    """Questions about random passages (title + a question pattern), like a policy's searches."""
    rng = random.Random(seed)
    lines = corpus.read_text().splitlines()
    patterns = ("where was {t} born?", "what is {t} known for?", "who founded {t}?", "which river flows past {t}?",
                "when was {t} completed", "{t} history and trade")
    queries = []
    for _ in range(n):
        title = json.loads(rng.choice(lines))["contents"].split("\n")[0].strip('"')
        queries.append(rng.choice(patterns).format(t=title))
    return queries


def _count_lines(path: Path) -> int:
    with path.open("rb") as f:
        return sum(1 for _ in f)


def _index_ok(index_dir: Path, n_passages: int) -> bool:
    from retrieval_server.index.manifest import Manifest, ManifestError

    try:
        return Manifest.load(index_dir).count == n_passages
    except ManifestError:
        return False


def ensure_indexes(data: Path, n_passages: int, names: list[str]) -> Path:
    """The corpus of ``n_passages`` under ``data`` and the indexes ``names`` (``INDEX_BUILDS``), built if missing."""
    data.mkdir(parents=True, exist_ok=True)
    corpus = data / "corpus.jsonl"
    if not corpus.exists() or _count_lines(corpus) != n_passages:
        print(f"writing a synthetic corpus of {n_passages} passages to {corpus}", flush=True)
        write_corpus(corpus, n_passages)
        for stale in data.glob("index_*"):
            shutil.rmtree(stale)
    needed = set(names) | ({"dense-flat"} if "dense-hnsw" in names else set())
    for name in INDEX_BUILDS:  # dense-flat before dense-hnsw, which copies its vectors
        index_dir = data / f"index_{name}"
        if name in needed and not _index_ok(index_dir, n_passages):
            from retrieval_server.index.build import build_index

            print(f"building {name} index (cached in {index_dir})", flush=True)
            start = time.perf_counter()
            from_flat = {"from_flat": data / "index_dense-flat"} if name == "dense-hnsw" else {}
            build_index(corpus, index_dir, **INDEX_BUILDS[name], **from_flat)
            print(f"  built in {time.perf_counter() - start:.0f}s", flush=True)
    return corpus


def ensure_tiled(data: Path, copies: int) -> tuple[Path, Path]:
    """``copies`` x the corpus under ``data`` (ids ``c-i``) and a raw FAISS flat file of ``copies`` x its flat
    index's vectors, in the same row order. Returns (corpus, FAISS file)."""
    import faiss

    from retrieval_server.index.dense import read_index
    from retrieval_server.index.manifest import Manifest

    source = data / "index_dense-flat"
    n = Manifest.load(source).count
    out = data / f"tiled_{copies * n}"
    corpus, faiss_file = out / "corpus.jsonl", out / "e5_Flat.index"
    if corpus.exists() and faiss_file.exists():
        return corpus, faiss_file
    out.mkdir(parents=True, exist_ok=True)
    print(f"writing {copies} copies of the {n}-passage corpus and its vectors to {out}", flush=True)
    rows = [json.loads(line) for line in (data / "corpus.jsonl").read_text().splitlines()]
    with (out / "corpus.tmp").open("w") as f:
        for c in range(copies):
            for row in rows:
                f.write(json.dumps({"id": f"{c}-{row['id']}", "contents": row["contents"]}) + "\n")
    flat = read_index(Manifest.load(source).index_path(source))
    vectors = flat.reconstruct_n(0, flat.ntotal)  # [n, dim]
    tiled = faiss.IndexFlatIP(flat.d)
    for _ in range(copies):
        tiled.add(vectors)
    faiss.write_index(tiled, str(out / "e5_Flat.tmp"))
    (out / "e5_Flat.tmp").replace(faiss_file)
    (out / "corpus.tmp").replace(corpus)
    return corpus, faiss_file
