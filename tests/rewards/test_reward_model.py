"""The learned reward model path, with a tiny randomly initialised Llama classifier built here."""

from __future__ import annotations

import math

import pytest
import torch
from helpers.tiny_models import tiny_model

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from grpo.rewards import RewardModel, RewardRunner, get_reward_function  # noqa: E402

CHARS = list("abcdefghijklmnopqrstuvwxyz0123456789 +-*/=?.:,<>\n")
TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"


def _tokenizer(chat_template: bool) -> transformers.PreTrainedTokenizerFast:
    vocab = {"[PAD]": 0, "[UNK]": 1, "[BOS]": 2, "[EOS]": 3, **{c: i + 4 for i, c in enumerate(CHARS)}}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Split(tokenizers.Regex("."), behavior="isolated")
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", bos_token="[BOS]", eos_token="[EOS]"
    )
    if chat_template:
        fast.chat_template = TEMPLATE
    return fast


@pytest.fixture(scope="module", params=[False, True], ids=["plain", "chat_template"])
def rm_dir(request, tmp_path_factory):
    torch.manual_seed(0)
    tok = _tokenizer(chat_template=request.param)
    model = tiny_model("llama", head="sequence", vocab_size=len(tok), num_attention_heads=4, num_key_value_heads=2,
                       num_labels=1, pad_token_id=tok.pad_token_id)
    path = tmp_path_factory.mktemp("rm")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path, request.param


def _single(rm: RewardModel, text: str, special: bool = True) -> float:
    enc = rm.tokenizer([text], return_tensors="pt", add_special_tokens=special)
    with torch.no_grad():
        return rm.model(**enc).logits[0, 0].item()


def test_scores_are_per_completion_logits_and_batch_invariant(rm_dir):
    path, _ = rm_dir
    prompts = ["1+1=?", "2*3=?", "what is 7-2?", "q"]
    completions = ["2", "six is the answer: 6", "5", "a much longer completion to force padding in the batch"]
    small, big = RewardModel(path, batch_size=2), RewardModel(path, batch_size=16)
    a, b = small(prompts, completions), big(prompts, completions)
    assert len(a) == 4 and all(isinstance(x, float) and math.isfinite(x) for x in a)
    assert a == pytest.approx(b, abs=1e-5)  # padding does not change a score
    want = [_single(big, p + c) for p, c in zip(prompts, completions, strict=True)]
    assert a == pytest.approx(want, abs=1e-5)
    assert len(set(round(x, 6) for x in a)) > 1


def test_conversational_completions_use_the_chat_template(rm_dir):
    path, has_template = rm_dir
    rm = RewardModel(path, batch_size=4)
    prompts = [[{"role": "user", "content": "1+1=?"}], [{"role": "user", "content": "2+2=?"}]]
    completions = [[{"role": "assistant", "content": "2"}], [{"role": "assistant", "content": "4"}]]
    got = rm(prompts, completions)
    if has_template:
        texts = [
            rm.tokenizer.apply_chat_template(p + c, tokenize=False) for p, c in zip(prompts, completions, strict=True)
        ]
        want = [_single(rm, t, special=False) for t in texts]
    else:
        want = [_single(rm, "1+1=?2"), _single(rm, "2+2=?4")]
    assert got == pytest.approx(want, abs=1e-5)


def test_through_the_registry_and_runner(rm_dir):
    path, _ = rm_dir
    fn = get_reward_function("reward_model", path=str(path), batch_size=3)
    assert fn.in_process and fn.__name__ == "reward_model"
    with RewardRunner([fn, ("len", lambda completions, **kw: [float(len(c)) for c in completions], 0.0)]) as runner:
        res = runner(["a"] * 5, ["1", "22", "333", "4444", "55555"], {})
    assert res.per_function["reward_model"].isfinite().all() and not res.missing.any()
    assert res.metrics["reward/reward_model/s"] > 0


def test_missing_pad_token_falls_back_to_eos(tmp_path):
    tok = _tokenizer(False)
    tiny_model("llama", head="sequence", vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
               num_key_value_heads=2, max_position_embeddings=2048, num_labels=1).save_pretrained(tmp_path)
    tok.pad_token = None
    tok.save_pretrained(tmp_path)
    rm = RewardModel(tmp_path, batch_size=2)
    assert rm.model.config.pad_token_id == rm.tokenizer.eos_token_id
    assert all(math.isfinite(x) for x in rm(["a", "b", "c"], ["x", "yy", "zzz"]))
