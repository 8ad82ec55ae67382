"""Several retrieval endpoints behind one ``retriever.url``: the shards of an index and the replicas of each.

Choices:
- ``retriever.url`` stays one string (so launch overrides still work): endpoints separated by commas,
  ``http://h1:8001,http://h2:8001``; an entry ``ray://NAME`` stands for the endpoints that the deployment ``NAME``
  (``retrieval_server/serve/ray_actors.py``) lists now. The client reaches it through Ray's own API, as the service's
  command line does: the detached actor named ``NAME`` in the namespace ``RAY_NAMESPACE``, its ``endpoints()``
  method. The name, the namespace and that method are the contract, like ``/retrieve`` over HTTP; the service's
  module is not imported (``search_r1`` imports only ``verl``: ``tests/test_import_rules.py``).
- The client groups the endpoints itself from what each one's ``GET /health`` says it serves: equal
  shard info (``retrieval_server/index/shards.py``: index, of, start, end, total, set) = replicas of one shard.
  The endpoints must form one set: one corpus (checksum), one encoder (model and fingerprint hash), one
  retriever and index kind, shards of one build (set id) whose row ranges cover ``[0, total)``, none
  missing. Anything else is refused with a message naming the mismatch and the URLs.
- Replica choice (``Shard.acquire``): of the replicas that are up, the one with the fewest requests in
  flight, round-robin among equals. A replica that fails is down for ``cooldown_s``; when every replica
  of a shard is down, all are tried again (a later success brings a replica back up).
- Merge (``merge_hits``): per query, all shards' hits by score descending, equal scores by corpus row
  ascending, the first ``topk``: what one flat index over all rows answers, since the server orders its
  own ties by ascending row too (``retrieval_server.search.service``).
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from dataclasses import dataclass

RAY_SCHEME = "ray://"
RAY_NAMESPACE = "search_r1_retrieval"  # = retrieval_server.serve.ray_deploy.NAMESPACE (a test checks)
RAY_ANSWER_TIMEOUT_S = 60.0  # how long the deployment may take to list its endpoints


class EndpointSetError(ValueError):
    """The endpoints of ``retriever.url`` do not form one index (its shards and their replicas)."""


class EndpointLookupError(RuntimeError):
    """A ``ray://NAME`` entry could not be looked up (no such deployment, or the cluster does not answer)."""


def split_urls(url: str) -> list[str]:
    """The comma-separated endpoints of ``url`` (trailing slashes dropped)."""
    return [part.strip().rstrip("/") for part in url.split(",") if part.strip()]


def resolve_urls(urls: list[str], ray_timeout_s: float = 30.0) -> list[str]:
    """``urls`` with each ``ray://NAME`` replaced by the endpoints it names now (joining the Ray cluster if needed,
    an ``EndpointLookupError`` when it does not answer within ``ray_timeout_s``)."""
    resolved = []
    for url in urls:
        if url.startswith(RAY_SCHEME):
            resolved.extend(part.rstrip("/") for part in ray_endpoints(url, ray_timeout_s))
        else:
            resolved.append(url)
    return resolved


def ray_endpoints(url: str, ray_timeout_s: float = 30.0) -> list[str]:
    """The URLs of the replicas that are up in deployment ``ray://NAME``: joins the Ray cluster (``RAY_ADDRESS``,
    else the one ``ray start`` runs here) unless Ray is initialised, then asks the deployment's named actor."""
    import ray

    from verl.utils.ray_cluster import join_ray_cluster

    name = url[len(RAY_SCHEME):].strip("/")
    if not ray.is_initialized():
        address = os.environ.get("RAY_ADDRESS") or "auto"
        join_ray_cluster(address, ray_timeout_s, f"no Ray cluster answers at {address!r} within {ray_timeout_s:g}s "
                         "(--ray-timeout, trainer.ray_timeout_s); start one with `ray start --head` (or set "
                         "RAY_ADDRESS to a running cluster's address, or unset it to use the one `ray start` runs "
                         "on this machine)", EndpointLookupError, logging_level=logging.WARNING)
    try:
        actor = ray.get_actor(name, namespace=RAY_NAMESPACE)
    except ValueError:
        raise EndpointLookupError(
            f"{url}: no retrieval deployment named {name!r} on the Ray cluster; start it with "
            f"python -m retrieval_server.ray_service up --name {name} --index ... --corpus ...") from None
    try:
        return ray.get(actor.endpoints.remote(), timeout=RAY_ANSWER_TIMEOUT_S)
    except ray.exceptions.GetTimeoutError:
        raise EndpointLookupError(f"{url}: the deployment did not answer within {RAY_ANSWER_TIMEOUT_S:g}s") from None


@dataclass(frozen=True)
class Served:
    """What one endpoint serves, from its ``GET /health`` answer."""

    url: str
    corpus_sha256: str | None
    passages: int | None
    encoder: tuple  # (retriever, model, probe_sha256)
    index: str | None
    shard: dict | None  # None: the whole index

    @classmethod
    def from_health(cls, url: str, body: dict) -> Served:
        return cls(url, body.get("corpus_sha256"), body.get("passages"),
                   (body.get("retriever"), body.get("model"), body.get("probe_sha256")), body.get("index"),
                   body.get("shard"))

    def corpus(self) -> str:
        return f"corpus sha256 {str(self.corpus_sha256)[:12]}... ({self.passages} passages)"

    def what(self) -> str:
        if self.shard is None:
            return "the whole index"
        s = self.shard
        return f"shard {s['index']} of {s['of']} (rows {s['start']}..{s['end'] - 1}, set {s['set']})"


def _by(served: list[Served], key) -> dict:
    groups: dict = {}
    for s in served:
        groups.setdefault(key(s), []).append(s.url)
    return groups


def _require_one(served: list[Served], key, what: str, describe) -> None:
    groups = _by(served, key)
    if len(groups) > 1:
        listed = "; ".join(f"{', '.join(urls)} serve {describe(value)}" for value, urls in groups.items())
        raise EndpointSetError(f"different {what}: {listed}; all endpoints of retriever.url must serve one index "
                               "(its shards and their replicas)")


def group_replicas(served: list[Served]) -> list[list[str]]:
    """The replica URLs of each shard, in row order (one group for a whole index); ``EndpointSetError`` naming the
    mismatch and the URLs when the endpoints are not one set (module docstring)."""
    _require_one(served, lambda s: (s.corpus_sha256, s.passages), "corpus", lambda v: f"corpus sha256 "
                 f"{str(v[0])[:12]}... ({v[1]} passages)")
    _require_one(served, lambda s: s.encoder, "encoder",
                 lambda v: f"{v[0]} model {v[1]} (encoder fingerprint {v[2]})")
    _require_one(served, lambda s: s.index, "index kind", lambda v: f"a {v or 'BM25'} index")
    _require_one(served, lambda s: None if s.shard is None else (s.shard["set"], s.shard["of"]), "shard sets",
                 lambda v: "the whole index" if v is None else f"shards of set {v[0]} (one of {v[1]} shards)")
    if served[0].shard is None:
        return [[s.url for s in served]]
    by_shard = _by(served, lambda s: tuple(sorted(s.shard.items())))
    by_index = _by(served, lambda s: s.shard["index"])
    if len(by_shard) != len(by_index):
        raise EndpointSetError(f"replicas differ: {'; '.join(f'{s.url} serves {s.what()}' for s in served)}")
    n_shards, total = served[0].shard["of"], served[0].shard["total"]
    missing = sorted(set(range(n_shards)) - set(by_index))
    if missing:
        have = "; ".join(f"shard {i} at {', '.join(urls)}" for i, urls in sorted(by_index.items()))
        raise EndpointSetError(f"missing shard {missing[0]} of {n_shards}"
                               f"{f' (and {len(missing) - 1} more)' if len(missing) > 1 else ''}: retriever.url "
                               f"names {have}; start a server for every shard-i of the index and list them all")
    shards = sorted({s.shard["index"]: s.shard for s in served}.values(), key=lambda s: s["index"])
    bounds = [(s["start"], s["end"]) for s in shards]
    contiguous = all(a[1] == b[0] for a, b in itertools.pairwise(bounds))
    if bounds[0][0] != 0 or bounds[-1][1] != total or total != served[0].passages or not contiguous:
        raise EndpointSetError(f"the shards' row ranges {bounds} do not cover the corpus's {served[0].passages} "
                               f"passages [0, {total}) in order: {', '.join(by_index[0])} ...")
    return [by_index[i] for i in range(n_shards)]


class Shard:
    """The replicas of one row range and their state (requests in flight, down until when); thread-safe."""

    def __init__(self, index: int, of: int, urls: list[str], cooldown_s: float):
        self.index = index
        self.of = of
        self.urls = urls
        self.cooldown_s = cooldown_s
        self._in_flight = dict.fromkeys(urls, 0)
        self._down_until = dict.fromkeys(urls, 0.0)
        self._next = 0  # round-robin position among replicas with equal load
        self._lock = threading.Lock()

    def name(self) -> str:
        return f"shard {self.index} of {self.of}" if self.of > 1 else "the index"

    def all_down(self) -> bool:
        now = time.monotonic()
        with self._lock:
            return all(until > now for until in self._down_until.values())

    def acquire(self, tried: set[str], include_down: bool) -> tuple[str, bool] | None:
        """A replica not in ``tried`` for the next request (counted in flight until ``release``) and whether another
        one would be left after it; None when there is none. Down replicas only with ``include_down``."""
        now = time.monotonic()
        with self._lock:
            n = len(self.urls)
            candidates = [i for i, url in enumerate(self.urls)
                          if url not in tried and (include_down or self._down_until[url] <= now)]
            if not candidates:
                return None
            best = min(candidates, key=lambda i: (self._in_flight[self.urls[i]], (i - self._next) % n))
            self._next = (best + 1) % n
            url = self.urls[best]
            self._in_flight[url] += 1
            return url, len(candidates) > 1

    def release(self, url: str, ok: bool) -> None:
        """A request to ``url`` ended; a failed one marks it down for ``cooldown_s``, a success up."""
        with self._lock:
            self._in_flight[url] -= 1
            self._down_until[url] = 0.0 if ok else time.monotonic() + self.cooldown_s


def merge_hits(hits_per_shard: list[list[list[dict]]], topk: int) -> list[list[dict]]:
    """Per query, the ``topk`` best hits of all shards (``{"document", "score", "row"}`` each), by score descending
    then row ascending, as ``{"id", "contents"}``."""
    merged = []
    for hits_per_query in zip(*hits_per_shard, strict=True):  # one query: its hits from every shard
        hits = sorted(itertools.chain(*hits_per_query), key=lambda h: (-h["score"], h["row"]))[:topk]
        merged.append([{"id": h["document"]["id"], "contents": h["document"]["contents"]} for h in hits])
    return merged
