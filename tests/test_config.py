"""Config: presets load, round-trip through YAML, and bad input is rejected naming the field."""

import pytest
import yaml

from grpo.config import Config, ConfigError, build_config, list_presets, load_config


def test_every_preset_loads_and_round_trips(tmp_path):
    assert {"grpo", "deepseekmath", "dapo", "dr_grpo", "gspo", "ppo"} <= set(list_presets())
    for name in list_presets():
        cfg = load_config(name)
        path = tmp_path / f"{name}.yaml"
        path.write_text(cfg.to_yaml())
        assert load_config(path) == cfg
        assert build_config(yaml.safe_load(cfg.to_yaml())) == cfg


def test_seed_defaults():
    cfg = load_config()
    assert cfg.algo.advantage == "grpo" and cfg.algo.std == "population"
    assert cfg.algo.clip_low == cfg.algo.clip_high == 0.2
    assert cfg.algo.aggregate == "seq_mean_token_mean" and cfg.algo.epochs == 1
    assert cfg.kl.coef == 0.0


def test_presets_change_what_they_say():
    assert load_config("deepseekmath").kl.coef == 0.04
    dapo = load_config("dapo")
    assert (dapo.algo.clip_high, dapo.algo.aggregate, dapo.algo.drop_zero_std_groups) == (0.28, "token_mean", True)
    dr = load_config("dr_grpo")
    assert (dr.algo.advantage, dr.algo.aggregate) == ("dr_grpo", "seq_sum_norm")
    assert load_config("gspo").algo.ratio_level == "sequence"
    assert load_config("ppo").algo.advantage == "gae"


def test_overrides_parse_values():
    cfg = load_config("grpo", ["rollout.group_size=16", "optim.lr=3e-5", "algo.std=sample", "reward.functions=[a, b]"])
    assert cfg.rollout.group_size == 16 and cfg.optim.lr == 3e-5 and cfg.algo.std == "sample"
    assert cfg.reward.functions == ["a", "b"]


@pytest.mark.parametrize(
    "override, words",
    [
        ("algo.std=foo", ["algo.std", "population", "sample"]),
        ("algo.stdd=1", ["algo.stdd", "unknown key"]),
        ("nosuchsection.x=1", ["nosuchsection", "unknown key"]),
        ("rollout.group_size=1", ["rollout.group_size", "greater than or equal to 2"]),
        ("algo.clip_low=1.5", ["algo.clip_low"]),
        ("optim.lr=-1", ["optim.lr"]),
        ("algo.aggregate=mean", ["algo.aggregate", "token_mean"]),
        ("kl.estimator=k4", ["kl.estimator", "k3"]),
    ],
)
def test_bad_values_name_the_field(override, words):
    with pytest.raises(ConfigError) as e:
        load_config("grpo", [override])
    for w in words:
        assert w in str(e.value)


def test_bad_sources():
    with pytest.raises(ConfigError, match="unknown preset"):
        load_config("no_such_preset")
    with pytest.raises(ConfigError, match="section.key=value"):
        load_config("grpo", ["novalue"])


def test_yaml_file_with_extends(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("extends: dapo\nrollout:\n  group_size: 4\n")
    cfg = load_config(path)
    assert cfg.rollout.group_size == 4 and cfg.algo.clip_high == 0.28


def test_extends_reads_a_relative_path_from_the_yaml_s_own_folder(tmp_path, monkeypatch):
    """Issue 29: `extends: base.yaml` is the base.yaml beside the YAML, wherever the command runs."""
    configs = tmp_path / "configs"
    configs.mkdir()
    (configs / "base.yaml").write_text("extends: dapo\nrollout:\n  group_size: 6\n")
    (configs / "run.yaml").write_text("extends: base.yaml\ntrain:\n  steps: 7\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "base.yaml").write_text("rollout:\n  group_size: 99\n")  # the working directory's: not this one
    monkeypatch.chdir(elsewhere)
    cfg = load_config(configs / "run.yaml")
    assert (cfg.rollout.group_size, cfg.train.steps, cfg.algo.clip_high) == (6, 7, 0.28)
    (configs / "base.yaml").unlink()
    assert load_config(configs / "run.yaml").rollout.group_size == 99  # not beside it: the working directory's
    (elsewhere / "base.yaml").unlink()
    with pytest.raises(ConfigError, match=f"no such config file 'base.yaml' \\(looked in {configs}"):
        load_config(configs / "run.yaml")


def test_default_config_is_valid():
    assert Config().preset == "grpo"


def test_every_preset_describes_itself(capsys):
    from grpo.cli import main
    from grpo.config import preset_summary

    for name in list_presets():
        assert len(preset_summary(name)) > 20, f"preset {name} has no header comment"
    assert main(["train", "--list-presets"]) == 0
    out = capsys.readouterr().out
    assert "code\n" in out and "DAPO (arXiv 2503.14476)" in out


def test_list_keys_names_every_field_with_its_default_and_choices(capsys):
    from grpo.cli import main
    from grpo.config import describe_keys

    rows = {key: (kind, default) for key, kind, default, _ in describe_keys()}
    defaults = Config().to_dict()
    for section, fields in defaults.items():
        if isinstance(fields, dict):
            for key in fields:
                assert f"{section}.{key}" in rows, f"{section}.{key} missing from --list-keys"
    assert rows["algo.std"] == ("population|sample", "'population'")
    assert main(["train", "--list-keys"]) == 0
    assert "warmup.seed" in capsys.readouterr().out


def test_cispo_settings_are_checked_together():
    assert load_config("cispo").algo.clip_low == 1.0  # no lower bound on the weight
    with pytest.raises(ConfigError, match="algo.clip_low must be < 1"):
        load_config(None, ["algo.clip_low=1.0"])
    with pytest.raises(ConfigError, match="ratio_level=sequence"):
        load_config("cispo", ["algo.ratio_level=sequence"])


@pytest.mark.parametrize("override,hint", [
    ("beta=0.04", "`beta` (TRL) is `kl.coef` here"),
    ("algo.beta=0.04", "`beta` (TRL) is `kl.coef` here"),
    ("num_generations=8", "`num_generations` (TRL) is `rollout.group_size` here"),
    ("max_completion_length=64", "`max_completion_length` (TRL) is `rollout.max_new_tokens` here"),
    ("epsilon=0.2", "`epsilon` (TRL) is `algo.clip_low` here"),
    ("loss_type=dapo", "`loss_type` (TRL) is `algo.aggregate` here"),
    ("actor_rollout_ref.rollout.n=8", "`actor_rollout_ref.rollout.n` (verl) is `rollout.group_size` here"),
    ("learning_rate=1e-6", "is `optim.lr` here"),
    ("optim.learning_rate=1e-6", "is `optim.lr` here"),
    ("algo.beta_kl=0.1", "did you mean `kl.coef`?"),  # close to TRL's beta
    ("algo.clip_hgih=0.3", "did you mean `algo.clip_high`?"),
    ("seed=3", "did you mean `train.seed` or `warmup.seed`?"),
])
def test_an_unknown_key_names_our_key_or_the_closest_ones(override, hint):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert "unknown key" in str(err.value) and hint in str(err.value)


def test_an_unknown_key_in_a_yaml_file_gets_the_hint_too(tmp_path):
    path = tmp_path / "verl.yaml"
    path.write_text("actor_rollout_ref:\n  actor:\n    kl_loss_coef: 0.001\n  rollout:\n    n: 8\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert "`actor_rollout_ref.actor.kl_loss_coef` (verl) is `kl.coef` here" in str(err.value)
    assert "`actor_rollout_ref.rollout.n` (verl) is `rollout.group_size` here" in str(err.value)


def test_every_alias_points_at_a_real_key():
    from grpo.config import describe_keys
    from grpo.config.hints import ALIASES

    keys = {k for k, *_ in describe_keys()}
    assert {ours for ours, _, _ in ALIASES.values()} <= keys
    with pytest.raises(ConfigError) as err:
        load_config(None, ["xyzzy=1"])
    assert str(err.value).rstrip().endswith("xyzzy: unknown key")  # nothing close: no guess


@pytest.mark.parametrize("override, words", [
    ('rollout.stop=["\\n", ""]', ["rollout.stop[1] is empty"]),
    ("rollout.stop=[" + ", ".join(f"s{i}" for i in range(10_000)) + "]", ["rollout.stop", "10000 strings, at most 32"]),
    ("rollout.stop=[" + "x" * 65 + "]", ["rollout.stop[0] has 65 characters, at most 64"]),
    ("rollout.stop=\\n", ["rollout.stop[0]", "backslash", "rollout.stop='[\"\\n\"]'"]),
    ("rollout.stop=Question:", ["rollout.stop", "quote it", "rollout.stop='[\"Question:\"]'"]),
    ("rollout.stop=[1]", ["rollout.stop", "list of strings"]),
])
def test_rollout_stop_refuses_what_cannot_be_meant(override, words):
    """An empty stop string would end every completion at once; 10,000 would be searched at every token; a shell's
    \\n is a backslash and an n; Question: unquoted is a YAML mapping (issue #51)."""
    with pytest.raises(ConfigError) as e:
        load_config("grpo", [override])
    for w in words:
        assert w in str(e.value)


def test_rollout_stop_takes_a_list_or_one_string():
    assert load_config("grpo", ['rollout.stop=["\\n", "Question:"]']).rollout.stop == ["\n", "Question:"]
    assert load_config("grpo", ['rollout.stop="\\nQ"']).rollout.stop == ["\nQ"]
    assert load_config("grpo", []).rollout.stop == []
