"""Each named preset trains with the update its paper defines: one step of `Trainer` built from the preset on the
fixed batch gives the gradient of the naive reference (wiring_helpers.py) for the settings written out here by hand,
and not the default's, so a preset file reduced to the default (or missing one of its settings) fails.
Presets with algo.epochs=2 are checked on their second update (off-policy, pi_old = the sampling policy).
PPO's preset is checked in test_wiring_ppo.py."""

from __future__ import annotations

import copy

import pytest
from wiring_helpers import one_thread  # noqa: F401  (an autouse fixture)
from wiring_helpers import Setting, assert_matches, fixed_step, load_params, perturb_, reference_grad, rows_of

from grpo.config import load_config
from grpo.train.trainer import Trainer

PRESETS = {
    "deepseekmath": Setting(kl_coef=0.04, kl_estimator="k3"),
    # + dynamic sampling (no flat group in this batch); run with 2 epochs so that clip-higher acts
    "dapo": Setting(clip_high=0.28, aggregate="token_mean", epochs=2),
    "dr_grpo": Setting(advantage="dr_grpo", scale="none", aggregate="seq_sum_norm"),
    "rloo": Setting(advantage="rloo", scale="none"),
    "gspo": Setting(ratio_level="sequence", clip_low=3e-4, clip_high=4e-4, epochs=2),
    "cispo": Setting(policy_loss="cispo", clip_low=1.0, clip_high=0.28, aggregate="token_mean", epochs=2),
}


@pytest.mark.parametrize("preset", list(PRESETS))
def test_preset_update_is_its_papers(preset, tiny_model_dir, tmp_path, precision):
    from train_helpers import base_overrides

    made = []

    def make(*overrides, **kwargs):
        cfg = load_config(preset, base_overrides(tiny_model_dir, tmp_path / "run") + list(overrides))
        made.append(Trainer(cfg, **kwargs))
        return made[-1]

    saved = {}

    s = PRESETS[preset]

    def away_from_reference(trainer):  # beta = 0.04 is small: the KL part shows only well away from pi_ref
        saved["ref"] = copy.deepcopy(trainer.policy)
        perturb_(trainer.policy, 0.15 if s.kl_coef > 0 else 0.06)

    try:
        extra = ["algo.epochs=2"] if preset == "dapo" else []
        trainer, spy, calls, initial = fixed_step(make, Setting(), *extra, before=away_from_reference,
                                                  precision=precision)
    finally:
        for t in made:
            t.close()
    rows = rows_of(calls[0])
    ref = {"ref_model": saved["ref"]} if s.kl_coef > 0 else {}
    if s.epochs == 1:
        assert len(spy.grads) == 1
        assert_matches(spy.grads[0], reference_grad(initial, rows, s, G=4, **ref),
                       reference_grad(initial, rows, Setting(), G=4), precision)
    else:
        assert len(spy.grads) == 2
        theta1 = load_params(initial, spy.params[1])
        assert_matches(spy.grads[1], reference_grad(theta1, rows, s, G=4, old_model=initial,
                                                    edge_band=precision.edge_band),
                       reference_grad(theta1, rows, Setting(epochs=2), G=4, old_model=initial), precision)
