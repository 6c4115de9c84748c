"""Prompts are tokenized as the model expects (grpo.tokens): plain text with the special tokens `tokenizer(text)`
adds (BOS here), conversations exactly as `apply_chat_template(..., tokenize=True)` (whose template writes BOS
itself, so never a second one). Checked on the ids the model is fed, in training (the Trainer's sampler), in
evaluation (Trainer.evaluate and `grpo eval`), in the length check, and in the reward model."""

from __future__ import annotations

import json
import string
from pathlib import Path

import pytest
import torch

from helpers.tiny_hf import small_run
from helpers.tiny_models import tiny_model

from grpo.config import load_config  # noqa: E402
from grpo.tokens import text_token_ids  # noqa: E402
from grpo.types import Prompt  # noqa: E402

SPECIAL = ["<pad>", "<s>", "</s>", "<unk>"]
BOS_TEMPLATE = ("{{ bos_token }}{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
                "{% if add_generation_prompt %}[assistant] {% endif %}")
QUESTIONS = [f"What is {a} + {b}? Answer:" for a, b in zip(range(1, 30, 3), range(2, 40, 4))]


def bos_tokenizer(eos_too: bool = False):
    """A character tokenizer whose post-processor adds <s> (and </s> with eos_too), as Llama/Gemma/Mistral's do,
    with a chat template that writes <s> itself."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, processors
    from transformers import PreTrainedTokenizerFast

    chars = sorted(set(string.printable) - set("\x0b\x0c\r"))
    core = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(SPECIAL + chars)}, merges=[], unk_token="<unk>"))
    core.decoder = decoders.Fuse()
    core.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    single = "<s> $A </s>" if eos_too else "<s> $A"
    core.post_processor = processors.TemplateProcessing(single=single, pair="<s> $A <s> $B",
                                                        special_tokens=[("<s>", 1), ("</s>", 2)])
    tok = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                  unk_token="<unk>", padding_side="left")
    tok.chat_template = BOS_TEMPLATE
    tok.model_max_length = 256
    return tok


def test_the_tokenizer_adds_bos_and_the_template_writes_it():
    """The premises of this file, so the other tests cannot pass vacuously."""
    tok = bos_tokenizer()
    assert tok("ab")["input_ids"] == [1, tok.convert_tokens_to_ids("a"), tok.convert_tokens_to_ids("b")]
    ids = tok.apply_chat_template([{"role": "user", "content": "ab"}], tokenize=True, add_generation_prompt=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    assert ids[0] == 1 and ids[1] != 1


def _chat_ids(tok, messages):
    ids = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def test_rule_plain_templated_and_the_guards():
    tok = bos_tokenizer()
    msgs = [{"role": "user", "content": "What is 2 + 3?"}]
    rendered = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    got = text_token_ids(tok, ["What is 2 + 3?", rendered, rendered], [False, True, False])
    assert got[0] == tok("What is 2 + 3?")["input_ids"] and got[0][0] == 1
    assert got[1] == _chat_ids(tok, msgs)
    assert got[2] == _chat_ids(tok, msgs)  # pre-rendered text that begins with <s>: one BOS, not two
    eos_tok = bos_tokenizer(eos_too=True)
    plain = eos_tok("hi", add_special_tokens=False)["input_ids"]
    assert text_token_ids(eos_tok, ["hi"])[0] == [1, *plain]  # a prompt to continue does not end with </s>
    assert text_token_ids(eos_tok, ["hi"], for_generation=False)[0] == [1, *plain, 2]  # a scored text keeps it
    with pytest.raises(ValueError, match="2 templated flags"):
        text_token_ids(tok, ["a"], [False, True])


@pytest.fixture(scope="module")
def bos_model_dir(tmp_path_factory):
    tok = bos_tokenizer()
    path = tmp_path_factory.mktemp("bos_model")
    model = tiny_model("llama", seed=0, vocab_size=len(tok), pad_token_id=tok.pad_token_id,
                       eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id)
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    return path


def _write(path: Path, chat: bool) -> Path:
    rows = [{"prompt": [{"role": "user", "content": q}] if chat else q, "answer": "0"} for q in QUESTIONS * 2]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _expected(tok, prompt_value) -> list[int]:
    return _chat_ids(tok, prompt_value) if isinstance(prompt_value, list) else tok(prompt_value)["input_ids"]


class _Feed:
    """Records the unpadded prompt ids of every prefill (the first forward of a generate call)."""

    def __init__(self, model):
        self.seen: list[list[int]] = []
        self.handle = model.register_forward_pre_hook(self, with_kwargs=True)

    def __call__(self, module, args, kwargs):
        ids, mask = kwargs.get("input_ids"), kwargs.get("attention_mask")
        prefill = kwargs.get("logits_to_keep") == 1 and not torch.is_grad_enabled()  # the sampler (no_grad)
        if ids is not None and prefill:
            self.seen += [row[m.bool()].tolist() for row, m in zip(ids, mask)]


@pytest.mark.parametrize("chat", [False, True], ids=["plain", "chat"])
def test_trainer_feeds_the_models_own_tokens(bos_model_dir, tmp_path, chat):
    from grpo.train.trainer import Trainer

    data = _write(tmp_path / "d.jsonl", chat)
    raw = [] if chat else ["data.plain_prompts=raw"]  # plain text as it is (auto would make it a chat turn)
    cfg = load_config(None, small_run(bos_model_dir, data, tmp_path / "run",
                                      "eval.n=4", "data.test_fraction=0.3", *raw))
    trainer = Trainer(cfg)
    try:
        tok = trainer.tokenizer
        rows = {f"d.jsonl:{i}": json.loads(line)["prompt"]  # uid: file:line
                for i, line in enumerate(data.read_text().splitlines(), 1)}
        feed = _Feed(trainer.policy)
        trainer.step()  # training: the sampler's prefill
        train_seen = feed.seen[:]
        assert len(train_seen) == cfg.rollout.prompts_per_step
        want = {tuple(_expected(tok, rows[p.uid])) for p in trainer.train_prompts}
        assert all(tuple(s) in want for s in train_seen) and all(s.count(1) == 1 for s in train_seen)
        feed.seen.clear()
        trainer.evaluate()  # evaluation: its own greedy sampler
        assert feed.seen == [_expected(tok, rows[p.uid]) for p in trainer.eval_prompts]
        feed.handle.remove()
    finally:
        trainer.close()


def test_grpo_eval_feeds_the_models_own_tokens(bos_model_dir, tmp_path, monkeypatch):
    """`grpo eval` on a saved model directory with the run's config.yaml beside it (a data set of conversations)."""
    import transformers

    from grpo.cli import main

    data = _write(tmp_path / "d.jsonl", chat=True)
    run = tmp_path / "run"
    run.mkdir()
    cfg = load_config(None, small_run(bos_model_dir, data, run, "eval.n=4",
                                      "data.test_fraction=0.3"))
    (run / "config.yaml").write_text(cfg.to_yaml())
    final = run / "final"
    transformers.AutoModelForCausalLM.from_pretrained(bos_model_dir).save_pretrained(final)
    transformers.AutoTokenizer.from_pretrained(bos_model_dir).save_pretrained(final)
    feeds = []
    real = transformers.AutoModelForCausalLM.from_pretrained

    def spying(*args, **kwargs):
        model = real(*args, **kwargs)
        feeds.append(_Feed(model))
        return model

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", spying)
    assert main(["eval", str(final), "--json"]) == 0
    tok = bos_tokenizer()
    msgs = [[{"role": "user", "content": q}] for q in QUESTIONS]
    want = {tuple(_chat_ids(tok, m)) for m in msgs}
    assert feeds and feeds[0].seen and all(tuple(s) in want for s in feeds[0].seen)


def test_length_check_counts_the_bos(tmp_path):
    """data.max_prompt_tokens counts the tokens fed, BOS included: a prompt of exactly the limit in characters is
    one token over it."""
    from grpo.data.validate import DataError, check_lengths

    tok = bos_tokenizer()
    text = "x" * 9
    train = [Prompt(uid=f"t{i}", text=text) for i in range(2)]
    cfg = load_config(None, ["data.max_prompt_tokens=9", "rollout.prompts_per_step=1"])
    with pytest.raises(DataError, match="10 tokens"):
        check_lengths(train, train, tok, cfg)
    templated = [Prompt(uid=f"c{i}", text="<s>" + "x" * 8, templated=True) for i in range(2)]
    assert check_lengths(templated, templated, tok, cfg) == (templated, templated)  # 9 tokens: the template's BOS


def test_reward_model_scores_the_models_own_tokens(tmp_path):
    from grpo.rewards import RewardModel

    tok = bos_tokenizer()
    tiny_model("llama", head="sequence", seed=0, vocab_size=len(tok), num_labels=1,
               pad_token_id=tok.pad_token_id).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    rm = RewardModel(str(tmp_path), batch_size=4)

    def score(ids):
        with torch.no_grad():
            return rm.model(input_ids=torch.tensor([ids])).logits[0, 0].item()

    rendered = tok.apply_chat_template([{"role": "user", "content": "Q?"}], tokenize=False, add_generation_prompt=True)
    prompts, completions = ["What is 1 + 1?", "Say hi.", rendered], [" 2", " hi there", " 7"]
    got = rm(prompts, completions)
    want = [score(tok(p + c)["input_ids"]) for p, c in zip(prompts[:2], completions[:2])]
    want.append(score(tok(rendered + " 7", add_special_tokens=False)["input_ids"]))  # one BOS: the template's
    assert got == pytest.approx(want, abs=1e-5)
    convo = [[{"role": "user", "content": "Q?"}], [{"role": "user", "content": "R?"}]]
    answers = [[{"role": "assistant", "content": "1"}], [{"role": "assistant", "content": "22"}]]
    got = rm(convo, answers)
    ids = [tok.apply_chat_template(m + a, tokenize=True) for m, a in zip(convo, answers)]
    ids = [list(x["input_ids"] if hasattr(x, "keys") else x) for x in ids]
    assert all(x[0] == 1 and x[1] != 1 for x in ids)
    assert got == pytest.approx([score(x) for x in ids], abs=1e-5)
