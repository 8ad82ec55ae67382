"""``search-r1-import-model`` (``data_prep.import_model``): a GGUF file written here from a tiny random Llama model and
a byte-level BPE tokenizer trained here, imported, and compared with the original: the same logits, the same token
ids, the same chat template; and the refusals of bad inputs.

The GGUF is written as llama.cpp's converter writes a Llama model (its tensor names, the rotary permutation of the
query and key rows, the tokenizer as ``gpt2`` byte-level BPE with its merges and control tokens), so the test goes
through the same reader as a downloaded file.
"""

from __future__ import annotations

import json

import gguf
import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from data_prep.import_model import sha256_of
from tests.entry_points import in_process
from verl.utils.tokenizer import render_prompt

SPECIALS = ["<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>"]
TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
            "{{ m['content'] }}<|eot_id|>{% endfor %}"
            "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")
TEXTS = ["Answer the question. <search> capital of France </search> <answer> Paris </answer>",
         "Paris is the capital and largest city of France, on the river Seine."] * 5


def _tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer (GPT-2 style pre-tokenizer and decoder) with Llama 3's control tokens."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(TEXTS, trainers.BpeTrainer(vocab_size=300, special_tokens=SPECIALS,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=SPECIALS[0], eos_token=SPECIALS[1])
    fast.chat_template = TEMPLATE
    return fast


def _llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's row order for a query/key projection (rotary halves interleaved per head), which its GGUF
    converter writes and transformers' reader undoes."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path, model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast) -> None:
    """``model`` and ``tokenizer`` as one float32 GGUF file, under llama.cpp's names."""
    cfg = model.config
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny-llama")
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    writer.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    state = json.loads(tokenizer.backend_tokenizer.to_str())
    vocab = sorted(state["model"]["vocab"].items(), key=lambda kv: kv[1])
    assert [i for _, i in vocab] == list(range(len(vocab)))
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([t for t, _ in vocab])
    writer.add_token_types([3 if t in SPECIALS else 1 for t, _ in vocab])  # 3: control, 1: normal
    writer.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in state["model"]["merges"]])
    writer.add_bos_token_id(tokenizer.bos_token_id)
    writer.add_eos_token_id(tokenizer.eos_token_id)
    writer.add_chat_template(TEMPLATE)
    sd = {k: v.detach().numpy().astype(np.float32) for k, v in model.state_dict().items()}
    writer.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        names = {"attn_norm": "input_layernorm", "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
                 "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                 "ffn_down": "mlp.down_proj"}
        for ours, theirs in names.items():
            writer.add_tensor(f"blk.{i}.{ours}.weight", sd[p + theirs + ".weight"])
        writer.add_tensor(f"blk.{i}.attn_q.weight", _llama_cpp_permute(sd[p + "self_attn.q_proj.weight"],
                                                                       cfg.num_attention_heads))
        writer.add_tensor(f"blk.{i}.attn_k.weight", _llama_cpp_permute(sd[p + "self_attn.k_proj.weight"],
                                                                       cfg.num_key_value_heads))
    writer.add_tensor("output_norm.weight", sd["model.norm.weight"])
    if not cfg.tie_word_embeddings:
        writer.add_tensor("output.weight", sd["lm_head.weight"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    return _tokenizer()


@pytest.mark.parametrize("tied", [True, False])
def test_gguf_round_trip_gives_the_same_model_and_tokenizer(tmp_path, tokenizer, tied):
    """Guards against an import that changes the model (a query/key permutation not undone, the head tied or
    untied wrongly, a lost bos/eos) or loses the tokenizer's merges or chat template: the imported directory's
    logits equal the original model's, its tokenizer gives the same ids and the same rendered prompt, and
    ``import.json`` names the source and its sha256."""
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=tied, bos_token_id=tokenizer.bos_token_id,
                      eos_token_id=tokenizer.eos_token_id)
    model = LlamaForCausalLM(cfg).eval()
    source = tmp_path / "tiny.gguf"
    write_gguf(source, model, tokenizer)
    out = tmp_path / "hf"
    run = in_process("data_prep.import_model", "--gguf", source, "--out", out)
    assert run.returncode == 0, run.stderr
    assert "[import-model] done" in run.stderr

    imported = AutoModelForCausalLM.from_pretrained(out).eval()
    imported_tok = AutoTokenizer.from_pretrained(out)
    assert imported.config.tie_word_embeddings is tied
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    ids = render_prompt(tokenizer, messages)
    assert render_prompt(imported_tok, messages) == ids and ids[0] == tokenizer.bos_token_id
    assert imported_tok(TEXTS[1])["input_ids"] == tokenizer(TEXTS[1])["input_ids"]
    with torch.no_grad():
        torch.testing.assert_close(imported(torch.tensor([ids])).logits, model(torch.tensor([ids])).logits)
    assert imported.generation_config.eos_token_id == tokenizer.eos_token_id
    record = json.loads((out / "import.json").read_text())
    assert record["source"] == str(source.resolve()) and record["sha256"] == sha256_of(source)
    assert record["dtype"] == "float32" and record["date"]


def test_import_refuses_bad_inputs(tmp_path):
    """Guards against a traceback (or a silent overwrite) on a bad input: a missing file, a file that is not GGUF
    and a non-empty output directory are each exit 2 with a message naming the argument."""
    not_gguf = tmp_path / "model.safetensors"
    not_gguf.write_bytes(b"\x00" * 64)
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("x")
    gguf_header = tmp_path / "ok.gguf"
    gguf_header.write_bytes(b"GGUF" + b"\x00" * 60)
    cases = [((tmp_path / "missing.gguf", tmp_path / "out"), "no such file"),
             ((not_gguf, tmp_path / "out"), "is not a GGUF file"),
             ((gguf_header, full), "is not empty")]
    for (source, out), message in cases:
        run = in_process("data_prep.import_model", "--gguf", source, "--out", out)
        assert run.returncode == 2 and "error: --" in run.stderr and message in run.stderr, run.stderr
        assert str(source if message != "is not empty" else out) in run.stderr
    assert (full / "keep.txt").exists() and not (tmp_path / "out").exists()
