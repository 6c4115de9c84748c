"""Test helpers: tiny randomly initialised Qwen2 / Llama checkpoints with a chat-template tokenizer, and a JSONL
file of conversational prompts, all written to a temporary directory (nothing is downloaded).

Imported as `helpers.tiny_hf` by tests/models, tests/data, tests/train and tests/parallel.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from helpers.precision import FLOAT32

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL = ["<pad>", "<|im_end|>", "<unk>", "<|im_start|>"]


def chat_tokenizer():
    """A byte-level PreTrainedTokenizerFast (256 byte symbols, no merges) with ChatML-style special tokens and a
    chat template. Byte-level, like real Qwen2/Llama-3 tokenizers, so AutoTokenizer's per-architecture classes
    (Qwen2Tokenizer rebuilds the pipeline) load it back unchanged."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL + sorted(pre_tokenizers.ByteLevel.alphabet()))}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<|im_end|>",
                                  unk_token="<unk>", padding_side="left")
    tok.chat_template = CHAT_TEMPLATE
    tok.model_max_length = 256
    return tok


def zephyr_tokenizer():
    """A byte-level BPE tokenizer trained on Zephyr-style turns, whose chat template writes its turn markers
    ('<|user|>', '<|assistant|>', '<|tool|>') as plain text: the tokenizer merges them ('<|', 'user', '|>'), and only
    '</s>' is an added (special) token. For tests of plain-text markers in environment messages."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["</s>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    core.train_from_iterator(["<|system|>\n<|user|>\nhi</s>\n<|assistant|>\nyes</s>\n<|tool|>\n4</s>\n"] * 20, trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="</s>", pad_token="</s>")
    tok.chat_template = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}</s>\n{% endfor %}"
                         "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
    return tok


def save_tiny_model(path: Path, arch: str = "qwen2", *, seed: int = 0, hidden: int = 32, layers: int = 2,
                    intermediate: int = 64) -> Path:
    """Write a random `arch` ('qwen2' or 'llama') causal LM and the chat tokenizer to `path`; returns path."""
    import torch

    from helpers.tiny_models import tiny_model

    tok = chat_tokenizer()
    with torch.random.fork_rng():
        model = tiny_model(arch, seed=seed, vocab_size=len(tok), hidden_size=hidden, num_hidden_layers=layers,
                           num_attention_heads=2, num_key_value_heads=1, intermediate_size=intermediate,
                           max_position_embeddings=256, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                           bos_token_id=None)
    path = Path(path)
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    return path


def write_chat_jsonl(path: Path, n: int = 20, *, system: bool = False) -> Path:
    """n rows {prompt: [messages], answer, level}: 'What is a + b?' questions with their sums."""
    rows = []
    for i in range(n):
        a, b = (7 * i + 3) % 10, (3 * i + 1) % 10
        messages = ([{"role": "system", "content": "Answer with a number."}] if system else [])
        messages.append({"role": "user", "content": f"What is {a} + {b}?"})
        rows.append({"prompt": messages, "answer": str(a + b), "level": i % 3})
    Path(path).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return Path(path)


def small_run(model_dir: Path, data: Path, run_dir: Path, *extra: str) -> list[str]:
    """Overrides of a 2-step run small enough for a unit test (P=2, G=2, 8 new tokens, 2 held-out prompts)."""
    return [f"model.name={model_dir}", f"data.path={data}", "reward.functions=[exact_answer]",
            f"train.output_dir={run_dir}", "train.steps=2", "train.eval_every=0", "eval.n=2",
            "rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=8",
            "data.test_fraction=0.2", "log.progress=false", "log.plots=false", "optim.lr=0.01",
            "optim.warmup_steps=0", "reward.timeout_s=5",
            "train.preflight=warn",  # random tiny models: the preflight would stop them (correctly)
            *FLOAT32, *extra]  # the same computation on every CPU (helpers/precision.py)


def varied_reward(prompts, completions, **columns):
    """Deterministic and different between completions, so advantages and gradients are not all 0."""
    return [(sum(map(ord, c)) % 11) / 10 for c in completions]


varied_reward.in_process = True
REWARDS = [("varied", varied_reward, 1.0)]
_CALLS = [0]


def varied_reward_rank1_worker_dies_once(prompts, completions, **columns):
    """varied_reward, except that the rollout worker of rank 1 (rollout.mode=async under torchrun) exits at its
    second call, once per directory (a file `worker-died` in the working directory marks it; a resume finishes)."""
    _CALLS[0] += 1
    if (os.environ.get("GRPO_ROLLOUT_WORKER") and os.environ.get("RANK") == "1" and _CALLS[0] == 2
            and not Path("worker-died").exists()):
        Path("worker-died").touch()
        os._exit(9)
    return varied_reward(prompts, completions, **columns)


varied_reward_rank1_worker_dies_once.in_process = True
