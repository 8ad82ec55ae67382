#!/usr/bin/env bash
# Launch the retrieval service on loopback: serve an index, building it only when asked (or for the demo).
#
#   bash retrieval_launch.sh                              # demo knowledge base, BM25, port 8000 (built if missing)
#   RETRIEVER=dense PORT=8001 bash retrieval_launch.sh    # demo, dense (FAISS flat, all-MiniLM-L6-v2)
#   CORPUS=data/wiki/corpus.jsonl INDEX_DIR=data/wiki/bm25 bash retrieval_launch.sh --max-topk 20   # a built index
#   BUILD=1 RETRIEVER=bm25 CORPUS=data/wiki/corpus.jsonl INDEX_DIR=data/wiki/bm25 bash retrieval_launch.sh
#                                                         # builds data/wiki/bm25 first if it has no manifest.json
#
# An online search engine instead of an index (no index is prepared; the key is read from the variable named):
#   SERPAPI_KEY=... bash retrieval_launch.sh --backend serpapi --api-key-env SERPAPI_KEY --max-requests 5000 \
#       --cost-per-request 0.015 --cache-dir data/online_cache
#
# An index built elsewhere (e.g. Search-R1's e5_Flat.index) is imported once, then launched like any other:
#   python -m retrieval_server.import_index --faiss e5_Flat.index --corpus wiki-18.jsonl \
#       --model /path/to/e5-base-v2 --e5-prefixes --out data/wiki/e5_flat
#   CORPUS=wiki-18.jsonl INDEX_DIR=data/wiki/e5_flat bash retrieval_launch.sh --faiss-gpu shard --reranker /path/to/ce
#
# Environment (relative paths are relative to the repository root):
#   CORPUS     JSONL corpus, one {"id", "contents"} per line    (default: with INDEX_DIR, the corpus its manifest
#              was built from; with neither, the demo's data/demo/corpus.jsonl, generated when missing)
#   RETRIEVER  bm25 or dense; used only when the index is built (default: the index's kind; bm25 for the demo)
#   INDEX_DIR  index directory                                 (default data/demo/index_$RETRIEVER for the demo;
#              required with CORPUS. Demo parts are prepared only when neither CORPUS nor INDEX_DIR is set)
#   BUILD      1: build the index when INDEX_DIR has no manifest.json (an existing index is never rebuilt)
#              (default 0: a missing index is an error, exit status 2, since a mistyped INDEX_DIR would
#              otherwise start a build of hours on a large corpus; the demo, CORPUS and INDEX_DIR both
#              unset, is built when missing)
#   PORT       port on 127.0.0.1                              (default 8000)
#   TOPK       passages per query when a request gives none    (default 3)
#   PYTHON     interpreter                                     (default .venv/bin/python, else python)
# Extra arguments go to `python -m retrieval_server.serve` (e.g. --host 0.0.0.0 --threads 4 --encoder-dtype fp16
# --cache-size 0 --reranker DIR --rerank-topk 10 --encoder-device cpu|cuda|cuda:N (default cpu)
# --faiss-gpu off|shard|replicate (default off: the service takes no GPU unless asked) --faiss-gpu-fp16
# --faiss-gpu-memory-gb 12: the most of each GPU the index may take, the rest left to training;
# --log-interval 30: seconds between summary lines of the requests served, 0 for none).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then  # this header, before anything is prepared
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
    exit 0
fi

DEFAULT_CORPUS=data/demo/corpus.jsonl
if [[ -z "${CORPUS:-}" && -z "${INDEX_DIR:-}" ]]; then DEMO=1; else DEMO=0; fi  # the user named no data
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python; fi
fi
BUILD=${BUILD:-0}
PORT=${PORT:-8000}
TOPK=${TOPK:-3}
prev=""
for arg in "$@"; do  # --backend serpapi|google|serper|brave: everything goes to serve, nothing is prepared
    case "$prev $arg" in "--backend serpapi"|"--backend google"|"--backend serper"|"--backend brave") ONLINE=1 ;; esac
    case "$arg" in --backend=serpapi|--backend=google|--backend=serper|--backend=brave) ONLINE=1 ;; esac
    prev=$arg
done
if [[ "${ONLINE:-0}" == 1 ]]; then
    exec "$PYTHON" -m retrieval_server.serve --topk "$TOPK" --port "$PORT" "$@"
fi
if [[ "$BUILD" != 0 && "$BUILD" != 1 ]]; then
    echo "retrieval_launch.sh: BUILD must be 1 (build a missing index) or 0, got '$BUILD'" >&2
    exit 2
fi
if [[ "$DEMO" == 1 ]]; then
    RETRIEVER=${RETRIEVER:-bm25}
    CORPUS=$DEFAULT_CORPUS
    INDEX_DIR=data/demo/index_${RETRIEVER}
fi
if [[ -n "${CORPUS:-}" && ! -f "$CORPUS" && "$DEMO" == 0 ]]; then
    echo "retrieval_launch.sh: corpus $CORPUS not found" >&2
    exit 2
fi

# Nothing below prepares demo parts for a user who named an index or a corpus.
if [[ -z "${INDEX_DIR:-}" ]]; then
    echo "retrieval_launch.sh: CORPUS=$CORPUS is set but INDEX_DIR is not: name the index directory of that" \
         "corpus (with BUILD=1 and RETRIEVER=bm25|dense it is built there when missing)" >&2
    exit 2
fi
manifest_field() {  # manifest_field NAME: a field of $INDEX_DIR/manifest.json
    "$PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1])).get(sys.argv[2]) or "")' \
        "$INDEX_DIR/manifest.json" "$1"
}
# The user's retriever kind for the hints: RETRIEVER, else the index's manifest, else a guess from the directory name
# (a build without RETRIEVER is bm25, as documented above).
KIND=${RETRIEVER:-}
if [[ -z "$KIND" && -f "$INDEX_DIR/manifest.json" ]]; then KIND=$(manifest_field retriever); fi
if [[ -z "$KIND" ]]; then
    case "$(basename "$INDEX_DIR")" in
        *bm25*|*sparse*) KIND=bm25 ;;
        *) KIND=dense ;;  # e5_flat, minilm, hnsw, ...: Search-R1's indexes are dense
    esac
fi
RETRIEVER=${RETRIEVER:-bm25}

if [[ ! -f "$INDEX_DIR/manifest.json" && "$BUILD" == 0 && "$DEMO" == 0 ]]; then
    if [[ "$INDEX_DIR" == /* ]]; then where=$INDEX_DIR; else where="$INDEX_DIR (in $PWD)"; fi
    hint_corpus=${CORPUS:-YOUR_CORPUS.jsonl}
    cat >&2 <<EOF
retrieval_launch.sh: $where has no manifest.json: there is no index there (nothing was built).
  If the index is elsewhere, set INDEX_DIR to its directory.
  To build it (hours on a corpus like wiki-18), either
    BUILD=1 RETRIEVER=$KIND CORPUS=$hint_corpus INDEX_DIR=$INDEX_DIR bash retrieval_launch.sh
  or
    $PYTHON -m retrieval_server.build_index --corpus $hint_corpus --out $INDEX_DIR --retriever $KIND
EOF
    exit 2
fi

if [[ -z "${CORPUS:-}" ]]; then  # an index named without its corpus: the one its manifest was built from
    if [[ ! -f "$INDEX_DIR/manifest.json" ]]; then
        echo "retrieval_launch.sh: BUILD=1 needs CORPUS, the JSONL corpus to index into $INDEX_DIR" >&2
        exit 2
    fi
    CORPUS=$(manifest_field corpus_path)
    if [[ -z "$CORPUS" || ! -f "$CORPUS" ]]; then
        echo "retrieval_launch.sh: CORPUS is not set and ${CORPUS:-the corpus}, which $INDEX_DIR was built from" \
             "(its manifest.json), is not there: set CORPUS to that JSONL file" >&2
        exit 2
    fi
    echo "retrieval_launch.sh: serving $INDEX_DIR with $CORPUS, the corpus its manifest.json names" >&2
fi

if [[ "$DEMO" == 1 && ! -f "$CORPUS" ]]; then
    echo "retrieval_launch.sh: generating the demo knowledge base in data/demo" >&2
    "$PYTHON" -m data_prep.demo_kb --out data/demo
fi

if [[ ! -f "$INDEX_DIR/manifest.json" ]]; then
    echo "retrieval_launch.sh: building the $RETRIEVER index of $CORPUS in $INDEX_DIR" >&2
    "$PYTHON" -m retrieval_server.build_index --corpus "$CORPUS" --out "$INDEX_DIR" --retriever "$RETRIEVER"
fi

exec "$PYTHON" -m retrieval_server.serve --index "$INDEX_DIR" --corpus "$CORPUS" --topk "$TOPK" --port "$PORT" "$@"
