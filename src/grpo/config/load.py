"""Building a Config: presets and YAML files (with `extends:`), dotted overrides, validation errors with hints, and
the listings behind `grpo train --list-presets / --list-keys`."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import yaml
from pydantic import ValidationError

from grpo.config.limits import count_limit
from grpo.config.schema import Config, _Section
from grpo.errors import ConfigError

PRESET_DIR = Path(__file__).resolve().parent.parent / "presets"


def describe_keys() -> list[tuple[str, str, str, str]]:
    """(dotted key, type, default, description) of every config field, in declaration order."""
    rows = []
    for section, info in Config.model_fields.items():
        model = info.annotation
        if not (isinstance(model, type) and issubclass(model, _Section)):
            continue
        for key, field in model.model_fields.items():
            kind = _registry_choices(f"{section}.{key}") or _type_name(field.annotation)
            default = field.default_factory() if field.default_factory is not None else field.default
            text = field.description or ""
            bound = f"at most {count_limit(f'{section}.{key}'):,}"  # every count has one (schema.py)
            if int in (field.annotation, *get_args(field.annotation)) and bound not in text:
                text += f"{'; ' if text else ''}{bound}"
            rows.append((f"{section}.{key}", kind, repr(default), text))
    return rows


def _registry_choices(key: str) -> str:
    """'a|b|c' for the keys whose values are registry names (grpo.algo.registry), '' for the others."""
    from grpo.algo.registry import ADVANTAGE_ESTIMATORS, POLICY_LOSSES

    names = {"algo.advantage": [*ADVANTAGE_ESTIMATORS, "gae"], "algo.policy_loss": list(POLICY_LOSSES)}.get(key)
    return "|".join(names) if names else ""


def flat_dict(d: dict, prefix: str = "") -> dict[str, Any]:
    """A nested config dict with dotted keys: {"optim": {"lr": 1e-4}} -> {"optim.lr": 1e-4}."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out |= flat_dict(v, f"{prefix}{k}.")
        else:
            out[f"{prefix}{k}"] = v
    return out


def _type_name(annotation) -> str:
    """'int', 'float | None', or a Literal's choices as 'a|b|c'."""
    if get_origin(annotation) is Literal:
        return "|".join(map(str, get_args(annotation)))
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def list_presets() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def preset_summary(name: str) -> str:
    """A preset's header comment (what it is and which settings it changes), for `grpo train --list-presets`."""
    comment = []
    for line in (PRESET_DIR / f"{name}.yaml").read_text().splitlines():
        if not line.startswith("#"):
            break
        comment.append(line.lstrip("# ").strip())
    return " ".join(comment)


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from e
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of config sections, got {type(data).__name__}")
    dotted = [k for k in data if isinstance(k, str) and "." in k]
    if dotted:  # `train.steps: 5` at the top: the override's form, not YAML's
        key = dotted[0]
        section, _, rest = key.partition(".")
        raise ConfigError(f"{path}: the key {key!r} is dotted; in YAML nest it under its section:\n  {section}:\n"
                          f"    {rest}: {data[key]!r}\n(dotted keys are for the command line: {key}=VALUE)")
    return data


def _merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def parse_override(text: str) -> tuple[list[str], Any]:
    """'algo.clip_high=0.28' -> (['algo', 'clip_high'], 0.28); the value is parsed as YAML."""
    if "=" not in text:
        hint = f"; write {text.strip()}=VALUE (no spaces around =)" if "." in text else ""
        raise ConfigError(f"override {text!r} must look like section.key=value{hint}")
    key, raw = text.split("=", 1)
    path = key.strip().split(".")
    if not all(path):
        raise ConfigError(f"override {text!r}: empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    return path, value


def _apply_override(data: dict[str, Any], path: list[str], value: Any) -> None:
    node = data
    for part in path[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"{'.'.join(path)}: {part} is not a section")
    node[path[-1]] = value


def _dotted(loc: tuple, empty: str = "config") -> str:
    """A pydantic error location as the user writes it: ('reward', 'weights', 0) -> 'reward.weights[0]'."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f"{'.' if out else ''}{part}"
    return out or empty


def _format_error(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        field = _dotted(e["loc"])
        msg = e["msg"].removeprefix("Value error, ")  # a validator's own sentence reads better without it
        if e["type"] == "extra_forbidden":
            section = _dotted(e["loc"][:-1], "")
            msg = f"unknown key{' in section ' + section if section else ''}"
            msg += _unknown_key_hints(field, e.get("input"))
        elif e["type"] == "finite_number":  # inf, nan, 1e400: no setting means one
            msg = f"must be a finite number, got {e.get('input')!r}: no setting takes inf or NaN"
        elif e["type"] == "literal_error":
            allowed = e.get("ctx", {}).get("expected", "")
            msg = f"must be one of {allowed}, got {e.get('input')!r}"
        elif "input" in e and not isinstance(e["input"], (dict, list)) and repr(e["input"]) not in msg:
            msg += f", got {e['input']!r}"  # `train.steps=three`: the value that was refused, beside pydantic's words
        lines.append(f"{field}: {msg}")
    return "invalid config:\n  " + "\n  ".join(lines)


def _unknown_key_hints(field: str, value: Any) -> str:
    """': `beta` (TRL) is `kl.coef` here' or ': did you mean `optim.lr`?' for an unknown key (and the keys under
    it, when its value is a mapping such as verl's `actor_rollout_ref: {rollout: {n: 8}}`); '' when none fits."""
    from grpo.config.hints import hint

    def leaves(prefix: str, v: Any) -> list[str]:
        if isinstance(v, dict) and v:
            return [x for k, sub in v.items() for x in leaves(f"{prefix}.{k}", sub)]
        return [prefix]

    keys = [k for k, *_ in describe_keys()]
    hints = [h for h in dict.fromkeys(hint(k, keys) for k in leaves(field, value)) if h]
    return (": " + "; ".join(hints)) if hints else ""


def build_config(data: dict[str, Any]) -> Config:
    try:
        return Config.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_format_error(e)) from None


def load_config(source: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Build a config from a preset name or YAML path (default: the 'grpo' preset) plus dotted overrides.

    Only the keys written in a file or an override count as set (each section's `model_fields_set`); the keys
    that only a packaged preset set are listed in `cfg.preset_keys` (grpo.train.defaults reads both)."""
    data, preset_keys = _layer("grpo" if source is None else str(source), ())
    for text in overrides or []:
        keys, value = parse_override(text)
        _apply_override(data, keys, value)
        preset_keys.discard(".".join(keys))
    cfg = build_config(data)
    cfg._preset_keys = frozenset(preset_keys)
    return cfg


def _layer(source: str, chain: tuple[str, ...], base: Path | None = None) -> tuple[dict[str, Any], set[str]]:
    """(the raw data of a preset or YAML file merged over what it extends, the 'section.key's that came from a
    packaged preset and from no user file). A YAML's `extends:` path is read relative to that YAML's folder
    (`base`) first, then the working directory; `chain` holds the files and presets already on the way here, so
    a cycle is a ConfigError naming it."""
    path = _yaml_path(source, base)
    if path is not None:
        data, packaged, name = _read_yaml(path), False, str(path.resolve())
    elif (PRESET_DIR / f"{source}.yaml").exists():
        data, packaged, name = _read_yaml(PRESET_DIR / f"{source}.yaml"), True, f"preset {source}"
        data.setdefault("preset", source)
    else:
        raise ConfigError(_unknown_source(source, base))
    if name in chain:
        raise ConfigError("`extends:` goes round in a circle: " + " -> ".join([*chain, name]))
    own = {f"{section}.{key}" for section, keys in data.items() if isinstance(keys, dict) for key in keys}
    preset_keys = set(own) if packaged else set()
    if "extends" in data:
        parent, parent_keys = _layer(str(data.pop("extends")), (*chain, name), path.parent if path else None)
        parent.pop("preset", None)
        preset_keys |= parent_keys - own
        data = _merge(parent, data)
    return data, preset_keys


def _yaml_path(source: str, base: Path | None) -> Path | None:
    """The YAML file `source` names: relative to `base` (the folder of the YAML that extends it) when it is there,
    else as given (the working directory); None when it is no existing .yaml/.yml file."""
    path = Path(source).expanduser()
    if path.suffix not in (".yaml", ".yml"):
        return None
    for candidate in ([base / path] if base is not None and not path.is_absolute() else []) + [path]:
        if candidate.is_file():
            return candidate
    return None


def _unknown_source(source: str, base: Path | None) -> str:
    """The message for a preset or file that is neither: a config key without its value (`grpo train train.steps
    2`), a YAML file that is not there, or an unknown preset name."""
    keys = {k for k, *_ in describe_keys()}
    if source in keys:
        return f"{source!r} is a config key, not a preset or file: write {source}=VALUE (no spaces around =)"
    if Path(source).suffix in (".yaml", ".yml"):
        where = f" (looked in {base} and the working directory)" if base is not None else ""
        return f"no such config file {source!r}{where}"
    return f"unknown preset or file {source!r}; presets: {list_presets()}"
