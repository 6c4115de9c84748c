"""The vLLM engine's weight probe decides from log-probs alone (grpo.rollout.vllm_engine.probe_verdict): hand vectors
for a fresh engine and a stale one, in fp32 and with a bf16-sized offset between the engine's kernels and the
trainer's, where one missed optimizer step is far below the absolute tolerance. No vLLM needed."""

from __future__ import annotations

import torch

from grpo.rollout.vllm_engine import PROBE_MOVE_FLOOR, PROBE_TOLERANCE, probe_verdict

PREV_TRAINER = torch.tensor([-1.25, -2.5, -0.5, -3.0], dtype=torch.float64)
STEP = torch.tensor([0.05, -0.04, 0.02, 0.06], dtype=torch.float64)  # one optimizer step's change of the log-probs
OFFSET = torch.tensor([0.06, -0.05, 0.04, 0.08], dtype=torch.float64)  # the engine's kernels against the trainer's
BF16 = {"tolerance": PROBE_TOLERANCE[torch.bfloat16], "floor": PROBE_MOVE_FLOOR[torch.bfloat16]}


def test_a_fresh_engine_follows_the_trainer_in_bf16():
    prev_engine = PREV_TRAINER + OFFSET
    engine = PREV_TRAINER + STEP + OFFSET + 0.004  # the offset itself shifts a little with the weights
    assert probe_verdict(engine, PREV_TRAINER + STEP, prev_engine, PREV_TRAINER, **BF16) == ""


def test_a_stale_engine_is_caught_in_bf16_below_the_absolute_tolerance():
    prev_engine = PREV_TRAINER + OFFSET
    trainer = PREV_TRAINER + STEP
    assert float((prev_engine - trainer).abs().max()) < BF16["tolerance"]  # the absolute check alone would pass it
    why = probe_verdict(prev_engine.clone(), trainer, prev_engine, PREV_TRAINER, **BF16)  # it repeats itself
    assert "did not move with the trainer's" in why


def test_a_change_below_the_dtype_floor_is_not_judged():
    prev_engine = PREV_TRAINER + OFFSET
    tiny = PREV_TRAINER + 0.01  # below bf16's floor: old and new cannot be told apart in the log-probs
    assert probe_verdict(prev_engine.clone(), tiny, prev_engine, PREV_TRAINER, **BF16) == ""


def test_fp32_one_step_and_another_model():
    fp32 = {"tolerance": PROBE_TOLERANCE[torch.float32], "floor": PROBE_MOVE_FLOOR[torch.float32]}
    step = torch.full((4,), 2e-3, dtype=torch.float64)  # one Adam step of the output head at lr 1e-4 (measured)
    trainer = PREV_TRAINER + step
    assert probe_verdict(trainer + 1e-6, trainer, PREV_TRAINER + 1e-6, PREV_TRAINER, **fp32) == ""
    stale = probe_verdict(PREV_TRAINER.clone(), trainer, PREV_TRAINER, PREV_TRAINER, **fp32)
    assert stale.startswith("differ from the trainer's by 0.002")  # fp32: the absolute bound already catches it
    half = PREV_TRAINER + step / 4  # a quarter step (5e-4), inside the absolute bound: the relative check
    assert "did not move" in probe_verdict(PREV_TRAINER.clone(), half, PREV_TRAINER, PREV_TRAINER, **fp32)
    assert "differ from the trainer's" in probe_verdict(trainer + 0.5, trainer, **fp32)  # first sync, wrong model
    assert probe_verdict(trainer + 1e-5, trainer, **fp32) == ""  # first sync: only the absolute check
