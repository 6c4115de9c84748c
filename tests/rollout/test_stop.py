"""rollout.stop in the native sampler: the completions equal a naive reference (sample without stop strings, decode
every prefix, end the row at the first prefix that holds a stop string, cut its text there), the decode loop really
stops there, and it decodes only a window of each row's newest tokens per step."""

from __future__ import annotations

import pytest
import torch
from rollout_helpers import check_against_naive, make_prompts, naive, tiny_model

from grpo.rollout import Sampler, decode
from grpo.rollout.stop import WINDOW_MARGIN, StopScan, cut_at_stop, first_stop


def stops_from(texts: list[str]) -> tuple[str, str, str]:
    """A two-token stop string taken from the middle of the first long text, one that occurs in several rows, and one
    that occurs nowhere."""
    long = next(t for t in texts if len(t) >= 12)
    never = "\u2603never\u2603"
    assert not any(never in t for t in texts)
    return long[8:10], "\n", never


@pytest.mark.parametrize("lean", [True, False])
@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_stopped_rows_equal_the_naive_reference(tok, lean, temperature, monkeypatch):
    if not lean:  # the model's own forward and the buffered cache
        monkeypatch.setattr(decode.LeanDecoder, "for_model", classmethod(lambda cls, model: None))
    model, prompts, G, T = tiny_model("llama", tok), make_prompts(), 3, 30
    free = Sampler(model, tok, max_new_tokens=T, temperature=temperature).generate(
        prompts, G, generator=torch.Generator().manual_seed(5))
    stops = stops_from(free.texts)
    assert len(tok(stops[0], add_special_tokens=False)["input_ids"]) == 2  # split across two tokens
    out = Sampler(model, tok, max_new_tokens=T, temperature=temperature, stop=stops).generate(
        prompts, G, generator=torch.Generator().manual_seed(5))
    assert check_against_naive(tok, free, out, stops) >= 2
    never = Sampler(model, tok, max_new_tokens=T, temperature=temperature, stop=[stops[2]]).generate(
        prompts, G, generator=torch.Generator().manual_seed(5))  # a stop string that never occurs changes nothing
    assert torch.equal(never.completion_ids, free.completion_ids) and never.texts == free.texts
    assert torch.equal(never.truncated, free.truncated)


def test_the_decode_loop_stops_at_the_stop_string(tok, monkeypatch):
    """Rows leave the batch at their stop string: with a stop string every row meets early, decoding ends there,
    long before max_new_tokens (finish() alone would give the same rows after sampling all T tokens)."""
    model, prompts, G, T = tiny_model("llama", tok), make_prompts(), 3, 60
    free = Sampler(model, tok, max_new_tokens=T).generate(prompts, G, generator=torch.Generator().manual_seed(5))
    common = sorted(set("".join(free.texts)), key=lambda c: -sum(c in t[:20] for t in free.texts))[:6]
    stops = [c for c in common if c.strip()] or common
    steps = []
    hits = StopScan.hits
    monkeypatch.setattr(StopScan, "hits", lambda self, tokens, rows, t, check: steps.append(t) or hits(
        self, tokens, rows, t, check))
    out = Sampler(model, tok, max_new_tokens=T, stop=stops).generate(prompts, G,
                                                                    generator=torch.Generator().manual_seed(5))
    check_against_naive(tok, free, out, stops)
    longest = int(out.completion_mask.sum(-1).max())
    assert longest < T // 2 and max(steps) == longest - 1  # the last row's stop ended the loop


def test_only_a_window_of_the_newest_tokens_of_the_rows_that_may_stop_is_decoded(tok, monkeypatch):
    """Per step, only the rows whose newest token's text holds a stop string's last character decode their newest
    `window` tokens (the longest stop string's bytes + WINDOW_MARGIN), never the whole completion."""
    model, prompts, G, T = tiny_model("llama", tok), make_prompts(), 2, 40
    stops = ["\u2603never\u2603", "x\n"]
    decoded, steps = [], [0]
    windows, hits = StopScan._decode_windows, StopScan.hits
    monkeypatch.setattr(StopScan, "_decode_windows", lambda self, w: decoded.extend(w) or windows(self, w))
    monkeypatch.setattr(StopScan, "hits", lambda self, tokens, rows, t, check: steps.__setitem__(
        0, steps[0] + int(check.sum())) or hits(self, tokens, rows, t, check))
    out = Sampler(model, tok, max_new_tokens=T, stop=stops).generate(prompts, G,
                                                                    generator=torch.Generator().manual_seed(5))
    window = max(len(s.encode()) for s in stops) + WINDOW_MARGIN
    assert decoded and max(len(w) for w in decoded) == window < T
    newest = {tok.decode(w[-1:], skip_special_tokens=True) for w in decoded}
    assert newest <= {"\n", ""}, newest  # only rows that may complete a stop string (special tokens are empty)
    assert len(decoded) < steps[0] / 4 and out.completion_mask.sum() > 8 * len(decoded)


def test_generate_from_ids_ends_a_row_at_its_stop_string(tok):
    model = tiny_model("qwen2", tok)
    contexts = [tok("What is 1 + 2?\n")["input_ids"], tok("hi")["input_ids"], tok("a")["input_ids"]]
    uniforms = torch.rand((3, 24), generator=torch.Generator().manual_seed(3))
    free_ids, free_logp, free_end = Sampler(model, tok, max_new_tokens=24).generate_from_ids(contexts, uniforms)
    texts = [tok.decode(i, skip_special_tokens=True) for i in free_ids]
    stops = stops_from(texts + ["x" * 12])[:2] if any(len(t) >= 12 for t in texts) else ("\n",)
    ids, logp, ended = Sampler(model, tok, max_new_tokens=24, stop=stops).generate_from_ids(contexts, uniforms)
    for i in range(3):
        k, _, hit = naive(tok, free_ids[i], stops)
        assert ids[i] == free_ids[i][:k] and logp[i] == free_logp[i][:k]
        assert ended[i] == (hit or free_end[i])


def test_half_a_stop_string_at_max_new_tokens_is_truncated_and_kept(tok):
    """A row that ends on the first half of a multi-token stop string when max_new_tokens comes: truncated (not
    finished), and its text keeps the half (nothing was stopped)."""
    model, prompts, G, T = tiny_model("llama", tok), make_prompts(), 3, 20
    free = Sampler(model, tok, max_new_tokens=T).generate(prompts, G, generator=torch.Generator().manual_seed(5))
    i = int(free.truncated.nonzero()[0, 0])
    half = free.texts[i][-2:]
    stop = half + "\u2603"  # its first two characters are the row's last two
    out = Sampler(model, tok, max_new_tokens=T, stop=[stop]).generate(prompts, G,
                                                                     generator=torch.Generator().manual_seed(5))
    assert bool(out.truncated[i]) and out.texts[i] == free.texts[i] and out.texts[i].endswith(half)
    assert torch.equal(out.completion_ids, free.completion_ids)


def test_first_stop_takes_the_occurrence_that_completes_first():
    assert first_stop("xabcde", ["abcde", "cd"]) == (3, 5)  # "cd" completes first, as vLLM's check_stop_strings
    assert first_stop("xabc", ["bc", "abc"]) == (1, 4)  # both end there: the earlier start
    assert cut_at_stop("30\nQuestion: 1", ["Question:", "\n"]) == "30"
    assert cut_at_stop("no stop", ["\n"]) == "no stop" and cut_at_stop("a\nb", ()) == "a\nb"
    with pytest.raises(ValueError, match="rollout.stop"):
        StopScan(None, ["\n", ""])


def byte_level_bpe():
    """A byte-level BPE tokenizer trained here on question/answer text: multi-character tokens ("Question", "Answer",
    " 12"), so stop strings end inside tokens and span several."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE(unk_token=None))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    corpus = [f"Question: What is {a} + {b}?\nAnswer: {a + b}\n" for a in range(40) for b in range(0, 40, 7)]
    core.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=300, special_tokens=["<pad>", "<eos>"],
                                                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", padding_side="left")


def test_a_bpe_tokenizer_with_stops_inside_and_across_tokens():
    bpe = byte_level_bpe()
    model = tiny_model("qwen2", bpe)
    prompts, G, T = make_prompts(("Question: What is 3 + 4?\nAnswer:", "Question: What is 10 + 7?\nAnswer:")), 4, 24
    free = Sampler(model, bpe, max_new_tokens=T).generate(prompts, G, generator=torch.Generator().manual_seed(1))
    ids = free.completion_ids[0].tolist()
    pieces = [bpe.decode(ids[:j]) for j in range(T + 1)]
    j = next(j for j in range(3, T) if len(pieces[j]) - len(pieces[j - 1]) >= 2)  # a token of 2+ characters
    inside = pieces[j][len(pieces[j - 1]) - 2:len(pieces[j - 1]) + 1]  # ends one character into token j
    stops = [inside, "\u2603never\u2603"]
    out = Sampler(model, bpe, max_new_tokens=T, stop=stops).generate(prompts, G,
                                                                    generator=torch.Generator().manual_seed(1))
    assert check_against_naive(bpe, free, out, stops) >= 1
    assert out.texts[0] == cut_at_stop(pieces[int(out.completion_mask[0].sum())], stops)
