"""verl keeps scikit-learn out of the processes that import transformers through it (verl/_imports.py).

A fresh interpreter imports what a trainer, its Ray workers and the evaluation import; scikit-learn must not load,
and if it does, the failure names the import chain that pulled it in. The finder must not hide scikit-learn from code
that imports it itself, and transformers must still generate.
"""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = r"""
import importlib.abc, json, sys, traceback

chain = []

class Watch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        # A submodule is looked up only while the package really imports (a bare find_spec("sklearn") only asks).
        if name.startswith("sklearn.") and not chain:
            chain.extend(f"{f.filename}:{f.lineno}" for f in traceback.extract_stack()
                         if "importlib" not in f.filename and "/sklearn/" not in f.filename)
        return None

sys.meta_path.insert(0, Watch())
import verl.trainer.ppo_trainer, verl.workers.actor_rollout, verl.workers.critic, search_r1.recipe, search_r1.evaluate
from transformers import AutoModelForCausalLM, AutoTokenizer
loaded = [m for m in ("sklearn", "scipy") if m in sys.modules]
import sklearn.metrics  # still importable by whoever asks for it
print(json.dumps({"loaded": loaded, "chain": chain[-12:], "sklearn_after": "sklearn.metrics" in sys.modules}))
"""


def test_trainer_worker_and_evaluation_imports_load_no_scikit_learn():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["loaded"] == [], "scikit-learn was imported by:\n" + "\n".join(got["chain"])
    assert got["sklearn_after"]


def test_generation_works_with_the_finder_installed():
    code = r"""
import sys, torch, verl
from transformers import LlamaConfig, LlamaForCausalLM
cfg = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=2, max_position_embeddings=64)
torch.manual_seed(0)
model = LlamaForCausalLM(cfg).eval()
out = model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=5, do_sample=False, pad_token_id=0)
print(out.shape[1], "sklearn" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["8", "False"]


def test_the_rest_of_transformers_still_sees_scikit_learn():
    code = r"""
import sys, verl
from transformers import AutoTokenizer  # loads transformers.generation
import transformers.generation.candidate_generator as cg
import transformers.utils
print(cg.is_sklearn_available(), transformers.utils.is_sklearn_available(), "sklearn" in sys.modules,
      cg.__loader__.get_filename(cg.__name__).endswith("candidate_generator.py"))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["False", "True", "False", "True"]
