"""Answer-checking rewards: exact answer, math equivalence (math-verify), countdown expressions.

All take TRL's signature and return 1.0 (right), 0.0 (wrong) or None (no reference for that row: no signal).
Where the answer sits in a completion: the last \\boxed{...} if there is one, else the last <answer>...</answer>,
else the whole completion.
"""

from __future__ import annotations

import ast
import importlib
import re
from collections import Counter
from fractions import Fraction
from typing import Any

from grpo.rewards.base import completion_text, register_reward
from grpo.scan import between

__all__ = ["exact_answer", "math_verify", "countdown", "extract_answer", "last_boxed", "to_number"]

_NUMBER = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?|-?\d+(?:\.\d+)?(?:\s*/\s*\d+)?|-?\.\d+")
_FRAC = re.compile(r"\\[dt]?frac\{([^{}]*)\}\{([^{}]*)\}")
_EXPONENT = re.compile(r"[eE]([+-]?[0-9_]{1,12})")  # what Fraction reads after the mantissa (ASCII digits only here)
MAX_EXPONENT = 1000  # '1e1000' is a number; '1e99999999' is a 100-million-digit integer Fraction would build (minutes)


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (or \\fbox{...}) in `text`, braces balanced; None if there is none."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth = 1
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    return None


def answer_tags(text: str) -> list[str]:
    """The contents of every <answer>...</answer> (any case), in order: linear in the text (grpo.scan)."""
    return between(text, "<answer>", "</answer>", case=False)


def extract_answer(text: str) -> str:
    """The part of a completion that holds its final answer (see the module docstring)."""
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    tags = answer_tags(text)
    return tags[-1] if tags else text


def to_number(text: str) -> Fraction | None:
    """Parse '42', '-3.5', '1,000', '3/4', '\\frac{3}{4}', '$42$', '42.', '1e6' exactly; None if it is not one number
    (or has an exponent past MAX_EXPONENT: the policy writes this text, and 10**exponent is computed exactly)."""
    s = text.strip().strip("$").replace("\\!", "").replace("\\,", "").replace(" ", "")
    s = _FRAC.sub(r"(\1)/(\2)", s).rstrip(".")
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", s):
        s = s.replace(",", "")
    m = re.fullmatch(r"(-?)\(?(-?[\d.]+)\)?/\(?(-?[\d.]+)\)?", s)
    try:
        if m:
            value = Fraction(m.group(2)) / Fraction(m.group(3))
            return -value if m.group(1) else value
        return Fraction(s) if _exponent_ok(s) else None
    except (ValueError, ZeroDivisionError):
        return None


def _exponent_ok(s: str) -> bool:
    """False when `s` has an exponent Fraction would read and it is not a small ASCII integer (any 'e' in a string
    Fraction accepts starts its exponent; a non-ASCII digit there is refused too: int() would read it)."""
    i = max(s.rfind("e"), s.rfind("E"))
    if i < 0:
        return True
    m = _EXPONENT.fullmatch(s, i)
    return m is not None and abs(int(m.group(1).replace("_", "") or "0")) <= MAX_EXPONENT


def _normalize_text(s: str) -> str:
    s = re.sub(r"\\text\{([^{}]*)\}", r"\1", s.strip().strip("$"))
    return re.sub(r"\s+", " ", s).strip().rstrip(".").lower()


def _reference(ref: Any) -> str | None:
    if ref is None:
        return None
    s = str(ref)
    if "####" in s:  # GSM8K: the final answer follows '####'
        s = s.rsplit("####", 1)[1]
    s = s.strip()
    return s or None


def _exact_one(completion: Any, ref: Any) -> float | None:
    gold = _reference(ref)
    if gold is None:
        return None
    pred = extract_answer(completion_text(completion))
    gold_num = to_number(gold)
    if gold_num is not None:
        value = to_number(pred)
        if value is None:
            found = _NUMBER.findall(pred)
            value = to_number(found[-1]) if found else None
        return 1.0 if value is not None and value == gold_num else 0.0
    return 1.0 if _normalize_text(pred) == _normalize_text(gold) else 0.0


@register_reward("exact_answer")
def exact_answer(prompts: list[Any], completions: list[Any], answer: list[Any], **kwargs: Any) -> list[float | None]:
    """1.0 when the completion's answer equals the reference `answer` column, else 0.0; None without a reference.

    Numeric references ('42', '3/4', GSM8K's '... #### 42') are compared exactly as numbers with the answer part's
    value, or its last number when it is a sentence ('The answer is 42.'). Other references are compared as text
    (case, surrounding $ and spaces, a final period ignored).
    """
    return [_exact_one(c, a) for c, a in zip(completions, answer, strict=True)]


# -------------------------------------------------------------------------------------------------- math-verify


def _math_verify_module() -> Any:
    try:
        mv = importlib.import_module("math_verify")
    except ImportError as e:
        from grpo.errors import MissingExtraError

        raise MissingExtraError("the 'math_verify' reward needs the math-verify package: pip install 'grpo[math]'") from e
    # We pass timeouts of None (math-verify's signal.alarm fails off the main thread); the runner's forked child
    # with a hard kill is the timeout. Silence math-verify's one-time "timeout disabled" warning accordingly.
    for sub in ("parser", "grader"):
        mod = getattr(mv, sub, None)
        if mod is not None and hasattr(mod, "TIMEOUT_WARNING_SHOWN"):
            mod.TIMEOUT_WARNING_SHOWN = True
    return mv


def _math_one(mv: Any, completion: Any, ref: Any) -> float | None:
    gold_text = _reference(ref)
    if gold_text is None:
        return None
    gold = []
    wrapped = (f"${gold_text}$", f"\\boxed{{{gold_text}}}")
    # A bare reference is LaTeX without delimiters ('\\{1, 2\\}', '\\frac12'): parse it as math first.
    order = (gold_text, *wrapped) if "$" in gold_text or "\\boxed" in gold_text else (*wrapped, gold_text)
    for candidate in order:
        gold = mv.parse(candidate, parsing_timeout=None)
        if gold:
            break
    if not gold:
        return None  # an unparseable reference is no signal, not a wrong answer
    text = completion_text(completion)
    if last_boxed(text) is None:
        tags = answer_tags(text)
        text = tags[-1] if tags else text
    config = [
        mv.LatexExtractionConfig(boxed_match_priority=0, try_extract_without_anchor=True),
        mv.ExprExtractionConfig(),
    ]
    pred = mv.parse(text, extraction_config=config, parsing_timeout=None)
    if not pred and "$" not in text:  # bare LaTeX such as '\\sqrt{4}' needs math delimiters to be found
        pred = mv.parse(f"${text}$", extraction_config=config, parsing_timeout=None)
    if not pred:
        return 0.0
    return 1.0 if mv.verify(gold, pred, timeout_seconds=None) else 0.0


@register_reward("math_verify")
def math_verify(prompts: list[Any], completions: list[Any], answer: list[Any], **kwargs: Any) -> list[float | None]:
    """1.0 when the completion's final answer is mathematically equal to `answer` (math-verify: LaTeX, fractions,
    \\boxed{}, sets, intervals), else 0.0; None when the reference is missing or cannot be parsed.

    Needs the optional extra `pip install 'grpo[math]'`. It calls math-verify with its signal-based timeouts off
    (they fail off the main thread); run it under RewardRunner, whose forked child is killed at the timeout.
    """
    mv = _math_verify_module()
    return [_math_one(mv, c, a) for c, a in zip(completions, answer, strict=True)]


math_verify.requires = ("math_verify", "grpo[math]")  # type: ignore[attr-defined]


# ------------------------------------------------------------------------------------------------------ countdown

_MAX_EXPR_CHARS = 500


def _safe_eval(expr: str) -> tuple[Fraction, list[int]] | None:
    """Evaluate + - * / and parentheses over non-negative integers exactly. -> (value, numbers used) or None."""
    if len(expr) > _MAX_EXPR_CHARS:
        return None
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except (SyntaxError, ValueError):
        return None
    used: list[int] = []
    ops = {
        ast.Add: lambda a, b: a + b,
        ast.Sub: lambda a, b: a - b,
        ast.Mult: lambda a, b: a * b,
        ast.Div: lambda a, b: a / b,
    }

    def ev(node: ast.AST) -> Fraction:
        if isinstance(node, ast.BinOp) and type(node.op) in ops:
            return ops[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.Constant) and type(node.value) is int and node.value >= 0:
            used.append(node.value)
            return Fraction(node.value)
        raise ValueError(f"not allowed: {ast.dump(node)[:40]}")

    try:
        return ev(tree.body), used
    except (ValueError, ZeroDivisionError, RecursionError):
        return None


def _countdown_expr(text: str) -> str:
    tags = answer_tags(text)
    expr = tags[-1] if tags else (text.strip().splitlines() or [""])[-1]
    return expr.split("=")[0].strip()  # '3 * 4 + 5 = 17' -> '3 * 4 + 5'


def _countdown_one(completion: Any, nums: Any, target: Any, require_all: bool) -> float | None:
    if nums is None or target is None:
        return None
    res = _safe_eval(_countdown_expr(completion_text(completion)))
    if res is None:
        return 0.0
    value, used = res
    have, want = Counter(int(x) for x in nums), Counter(used)
    if want - have or (require_all and want != have):
        return 0.0
    return 1.0 if value == Fraction(target) else 0.0


@register_reward("countdown")
def countdown(
    prompts: list[Any],
    completions: list[Any],
    numbers: list[Any],
    target: list[Any],
    *,
    require_all: bool = False,
    **kwargs: Any,
) -> list[float | None]:
    """1.0 when the completion's expression (in <answer>...</answer>, else its last line; a trailing '= ...' is
    ignored) uses only + - * / and parentheses, each of the row's `numbers` at most once (exactly once with
    require_all=True), and equals `target` exactly (rational arithmetic); else 0.0. None when the row has no numbers
    or target. Evaluated with a whitelist over Python's ast, never eval(): no sandbox needed.
    """
    return [_countdown_one(c, n, t, require_all) for c, n, t in zip(completions, numbers, target, strict=True)]
