"""Serve an index: ``python -m retrieval_server.serve --index DIR --corpus C.jsonl --topk 3 --port 8000``.

Choices:
- Binds 127.0.0.1 unless ``--host`` says otherwise: the service has no authentication.
- The retriever kind (dense / BM25), the encoder and its prefixes come from the index manifest. A
  shard (``--index OUT/shard-i``, see ``index/shards.py``) is served with the whole ``--corpus``.
- Serving choices (encoder dtype, query cache, reranker, FAISS GPU placement) are flags, collected
  into one ``ServeOptions`` (validated once); ``/health`` reports them.
- Devices (``search/devices.py``): the CPU unless asked (``--encoder-device`` for the encoder and the re-ranker,
  ``--faiss-gpu`` for a dense index); a device that cannot be used here is refused before the port is bound (status
  2). The start line names each part's device, the ready line adds the device memory each took, and ``/health``
  holds both. JAX is kept off the devices (``keep_jax_off_devices``, first thing in ``main``).
- Cheap checks (manifest present, corpus and imported index file sizes, the address can be bound) run before
  the port is bound and exit with status 2; the full checks (corpus checksum, encoder fingerprint) run while
  loading, and a failure stops the server with status 1. Either way the message says which part does not match.
- Request heads (request line and headers) over ``--max-header-bytes`` (64 KiB) get 431 and their
  connection is closed; heads or bodies slower than ``--client-timeout`` are cut off (``slow_clients.py``).
- One process, one event loop: the index is held once in memory and all search work goes through
  one worker thread (see ``batcher.py``).
- No log line per request: one summary line per ``--log-interval`` (requests, queries, q/s, p50/p99 latency,
  errors; see ``retrieval_server/logs.py``), and library chatter (FAISS's build probes, httpx requests) below INFO.
- ``--backend serpapi|google|serper|brave --api-key-env VAR`` serves an online search engine instead of an index
  (``search/online/backend.py``: cache, budget, backoff, cost); the API, limits and summary line are the same. A missing
  key variable is refused before the port is bound (status 2).
"""

from __future__ import annotations

import argparse
import errno
import logging
import socket
import sys
from collections.abc import Callable
from pathlib import Path

import uvicorn

from retrieval_server.index.corpus import CorpusError
from retrieval_server.index.encoder import ENCODER_BACKENDS, ENCODER_DTYPES
from retrieval_server.index.kinds import FaissMissing, require_faiss
from retrieval_server.index.manifest import Manifest, ManifestError, check_corpus_size, check_index_file
from retrieval_server.logs import configure_logging
from retrieval_server.search.devices import describe_placements, keep_jax_off_devices
from retrieval_server.search.online.backend import OnlineService, add_online_args, online_options, read_api_key
from retrieval_server.search.online.engines import ENGINES
from retrieval_server.search.service import GPU_MODES, ServeOptions, load_service, plan_devices
from retrieval_server.serve.app import Limits, create_app
from retrieval_server.serve.slow_clients import request_head_protocol

logger = logging.getLogger("retrieval_server.serve")


# Search-R1's retrieval_server.py flags -> ours (same meaning unless a notice says how ours differs).
SEARCH_R1_FLAGS = {"--index_path": "--index", "--corpus_path": "--corpus", "--retriever_model": "--model",
                   "--retriever_name": None, "--faiss_gpu": "--faiss-gpu"}


def _refuse(message: str) -> None:
    print(f"python -m retrieval_server.serve: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def translate_search_r1_flags(argv: list[str]) -> tuple[list[str], list[str]]:
    """Search-R1's flags in ``argv`` rewritten as ours -> (argv, notices where ours differ). ``--index_path`` may name
    the index directory or the FAISS file inside one (Search-R1 names its e5_Flat.index file); ``--faiss_gpu`` is
    Search-R1's sharding over all GPUs; ``--retriever_name`` is read from the index's manifest instead."""
    out, notices, rest = [], [], list(argv)
    while rest:
        arg = rest.pop(0)
        flag, eq, value = arg.partition("=")
        if flag not in SEARCH_R1_FLAGS:
            out.append(arg)
            continue
        if flag == "--faiss_gpu":
            out += ["--faiss-gpu", "shard"]
            notices.append("--faiss_gpu means --faiss-gpu shard here (Search-R1 shards the index over all GPUs)")
            continue
        if not eq:
            if not rest:
                _refuse(f"{flag} needs a value")
            value = rest.pop(0)
        if flag == "--retriever_name":
            notices.append(f"--retriever_name {value} is not needed here: the kind (bm25 or dense, and the encoder's "
                           "query prefixes) comes from the index's manifest.json")
            continue
        if flag == "--index_path":
            path = Path(value)
            if path.is_file() and (path.parent / "manifest.json").is_file():
                notices.append(f"--index_path {value}: serving its directory {path.parent} (ours is the index "
                               "directory with its manifest.json)")
                value = str(path.parent)
            elif path.is_file():
                _refuse(f"--index_path {value} is a FAISS file without our manifest.json beside it: import it once "
                        f"with `python -m retrieval_server.import_index --faiss {value} --corpus CORPUS "
                        "--model ENCODER --out DIR` (Search-R1's e5 index: add --e5-prefixes), then serve --index DIR")
        out += [SEARCH_R1_FLAGS[flag], value]
    return out, notices


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    argv, notices = translate_search_r1_flags(sys.argv[1:] if argv is None else list(argv))
    for notice in notices:
        print(f"notice: {notice}", file=sys.stderr)
    p = argparse.ArgumentParser(prog="python -m retrieval_server.serve", description=__doc__.split("\n")[0],
                                epilog="Search-R1's flags are accepted: --index_path, --corpus_path, --topk, "
                                       "--retriever_name, --retriever_model, --faiss_gpu.")
    p.add_argument("--backend", choices=("index", *ENGINES), default="index",
                   help="what answers /retrieve: a local index (--index, --corpus; the default) or an online search "
                        "engine (see the online search backend flags)")
    p.add_argument("--index", default=None, help="index directory written by retrieval_server.build_index")
    p.add_argument("--corpus", default=None, help="the JSONL corpus the index was built from")
    p.add_argument("--topk", type=int, default=3, help="passages per query when a request gives no topk")
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default: loopback only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--model", default=None,
                   help="encoder path for a dense index (default: the one in the manifest; must embed identically)")
    p.add_argument("--max-topk", type=int, default=50, help="largest topk a request may ask for")
    p.add_argument("--max-queries", type=int, default=1024, help="most queries in one request")
    p.add_argument("--max-query-chars", type=int, default=2048, help="longest query, in characters")
    p.add_argument("--client-timeout", type=float, default=10.0,
                   help="seconds a client may take to send a request's headers, and again its body (slow clients)")
    p.add_argument("--max-header-bytes", type=int, default=64 * 1024,
                   help="largest request line + headers; a larger one is answered 431 and its connection closed")
    p.add_argument("--threads", type=int, default=0, help="CPU threads for encode + search (0: library default)")
    p.add_argument("--encoder-dtype", choices=ENCODER_DTYPES, default="auto",
                   help="dense query encoder precision; auto: fp16 on GPU, fp32 on CPU (the fastest that keeps "
                        "top-1 agreement with fp32 >= 99%%; a half precision is checked against fp32 at load)")
    p.add_argument("--encoder-backend", choices=ENCODER_BACKENDS, default="auto",
                   help="dense query encoder runtime; auto: ONNX Runtime on a CPU in fp32 (same embeddings, ~3.5x "
                        "faster at batch 1; exported once per model into ~/.cache/search_r1/onnx), torch otherwise")
    p.add_argument("--cache-size", type=int, default=ServeOptions.cache_size,
                   help="(query, topk) answers kept in the LRU cache (0: off; repeats inside a batch are always "
                        "searched once)")
    p.add_argument("--reranker", default=None,
                   help="local cross-encoder directory: rerank the first stage's --rerank-topk candidates (off by "
                        "default)")
    p.add_argument("--rerank-topk", type=int, default=ServeOptions.rerank_topk,
                   help="candidates per query given to the reranker (at least the request's topk)")
    p.add_argument("--encoder-device", default=ServeOptions.encoder_device,
                   help="device of a dense index's query encoder and of the --reranker: cpu (default), cuda or "
                        "cuda:N (as CUDA_VISIBLE_DEVICES numbers the GPUs this process sees)")
    p.add_argument("--faiss-gpu", choices=GPU_MODES, default=ServeOptions.gpu_mode,
                   help="a dense index on the GPUs (needs the FAISS GPU build): shard the flat/IVF index over all "
                        "visible GPUs (each holds 1/n), replicate it on each, or off (default: search on the CPU)")
    p.add_argument("--faiss-gpu-fp16", action="store_true", help="store the vectors on GPU in fp16 (half the memory)")
    p.add_argument("--faiss-gpu-memory-gb", type=float, default=None,
                   help="most GiB of each GPU the index may take (the rest is left to training); an index that "
                        "needs more is refused at start with exit status 2 (default: no limit)")
    p.add_argument("--log-interval", type=float, default=30.0,
                   help="seconds between summary log lines of the /retrieve requests (none in an interval "
                        "without requests; 0: off)")
    p.add_argument("--delay-ms", type=float, default=0.0,
                   help="benchmarks only: hold every /retrieve answer this many ms after its search, as a slow "
                        "backend would (a dense search over 21M passages, a web search API); concurrent "
                        "requests wait at the same time")
    p.add_argument("--docs", action="store_true", help="serve the API docs at /docs, /redoc and /openapi.json "
                                                        "(off by default)")
    add_online_args(p)
    args = p.parse_args(argv)
    if args.backend == "index" and not (args.index and args.corpus):
        p.error("--index and --corpus are required (or --backend ENGINE to serve an online search engine: "
                f"{', '.join(ENGINES)})")
    if args.backend != "index":
        given = [flag for flag, value in (("--index", args.index), ("--corpus", args.corpus)) if value]
        if given:
            p.error(f"{' and '.join(given)} name a local index; --backend {args.backend} searches online: drop them")
        try:
            args.online = online_options(args)
        except ValueError as e:
            p.error(str(e))
    if not 0 <= args.delay_ms < float("inf"):
        p.error(f"--delay-ms must be 0 (off) or a positive number of milliseconds, got {args.delay_ms}")
    if not 0 <= args.port <= 65535:
        p.error(f"--port must be between 0 and 65535, got {args.port}")
    if not 1 <= args.topk <= args.max_topk:
        p.error(f"--topk must be between 1 and --max-topk ({args.max_topk}), got {args.topk}")
    if not 0 < args.client_timeout < float("inf"):  # also refuses nan
        p.error(f"--client-timeout must be a positive number of seconds, got {args.client_timeout}")
    if args.max_header_bytes < 1024:
        p.error(f"--max-header-bytes must be at least 1024, got {args.max_header_bytes}")
    if not 0 <= args.log_interval < float("inf"):
        p.error(f"--log-interval must be 0 (off) or a positive number of seconds, got {args.log_interval}")
    for name in ("max_queries", "max_query_chars"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    try:
        args.options = ServeOptions(model=args.model, threads=args.threads, encoder_dtype=args.encoder_dtype,
                                    encoder_backend=args.encoder_backend, encoder_device=args.encoder_device,
                                    cache_size=args.cache_size, reranker=args.reranker, rerank_topk=args.rerank_topk,
                                    gpu_mode=args.faiss_gpu, gpu_fp16=args.faiss_gpu_fp16,
                                    gpu_budget_gb=args.faiss_gpu_memory_gb)
    except ValueError as e:
        p.error(str(e))
    return args


def check_address(host: str, port: int) -> None:
    """Bind (and release) ``host:port`` once, so a port in use or a host that does not resolve is refused with
    exit status 2 before the index loads (uvicorn binds it again when serving)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))


def main(argv: list[str] | None = None) -> int:
    keep_jax_off_devices()
    args = parse_args(argv)
    configure_logging()
    prepared = prepare_index(args) if args.backend == "index" else prepare_online(args)
    if isinstance(prepared, int):
        return prepared
    load, what = prepared
    try:
        check_address(args.host, args.port)
    except OSError as e:
        hint = "another process listens there: stop it or choose another --port" if e.errno == errno.EADDRINUSE \
            else "give --host a local interface address (default 127.0.0.1)"
        logger.error("cannot listen on %s:%d (%s); %s", args.host, args.port, e.strerror, hint)
        return 2
    limits = Limits(default_topk=args.topk, max_topk=args.max_topk, max_queries=args.max_queries,
                    max_query_chars=args.max_query_chars, client_timeout_s=args.client_timeout)
    failures: list[BaseException] = []

    def on_failure(exc: BaseException) -> None:
        failures.append(exc)
        server.should_exit = True

    app = create_app(load, limits, on_failure, args.log_interval, args.delay_ms, docs=args.docs)
    server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, access_log=False,
                                           timeout_graceful_shutdown=5,
                                           http=request_head_protocol(args.client_timeout,
                                                                         args.max_header_bytes)))
    logger.info("serving %s on http://%s:%d (loading in the background; GET /health)%s", what, args.host, args.port,
                f"; every answer delayed by {args.delay_ms:g} ms (--delay-ms, benchmarks only)" if args.delay_ms
                else "")
    server.run()
    return 1 if failures else 0


def prepare_online(args: argparse.Namespace) -> tuple[Callable[[], OnlineService], str] | int:
    """(the online service's loader, what it serves), or exit status 2 when the key's variable is unset."""
    options = args.online
    try:
        key = read_api_key(options.api_key_env)
    except ValueError as e:
        logger.error("%s", e)
        return 2
    return (lambda: OnlineService(options, key),
            f"online search engine {options.engine} (cache {options.cache_dir}, budget {options.max_requests:,} "
            "requests)")


def prepare_index(args: argparse.Namespace) -> tuple[Callable[[], object], str] | int:
    """The cheap checks of ``--index`` and ``--corpus`` -> (the index's loader, what it serves), or exit status 2."""
    try:
        manifest = Manifest.load(args.index)
        check_corpus_size(manifest, args.index, args.corpus)
        check_index_file(manifest, args.index)
    except FileNotFoundError:
        logger.error("corpus file not found: %s", args.corpus)
        return 2
    except (ManifestError, CorpusError) as e:
        logger.error("%s", e)
        return 2
    try:
        if manifest.retriever == "dense":  # before the server starts, not a failure of its background load
            require_faiss(f"serving the dense index {args.index}")
        plan = plan_devices(manifest, args.options)
    except (ValueError, FaissMissing) as e:
        logger.error("%s", e)
        return 2
    shard = manifest.shard
    rows = f" (shard {shard['index']} of {shard['of']}: rows {shard['start']}..{shard['end'] - 1})" if shard else ""
    return (lambda: load_service(args.index, args.corpus, args.options, plan),
            f"{manifest.retriever} index {args.index}{rows} ({describe_placements(plan)})")
