"""The strict serializer that brings a test call's value out of the sandbox.

Inside the sandbox the harness encodes a value with ENCODER_SRC: the built-in types, and what an honest program
returns for them, as the plain value it stands for (an int or float subclass by the base type's own repr, a
namedtuple as a tuple, a Counter or OrderedDict as a dict, a numpy scalar or array through .item()/.tolist(), a
complex by its two floats, a re.Match reduced to what a test can use of a returned match: that it is one, i.e. true
and not None, with its text); anything else is refused. Here `decode` rebuilds it from the text with the trainer's
own json parser and strict type rules. Nothing of the program's survives the trip: what comes back is made of fresh
built-in objects, so the comparison with the expected value runs only trusted code (a subclass's custom __eq__ never
reaches it).

Wire format (a JSON value): null, true, false, integers, floats (NaN, Infinity, -Infinity), strings and arrays
(a Python list) as in JSON; every JSON object is a tagged container with exactly one key:
  {"t": [...]} tuple    {"d": [[key, value], ...]} dict    {"s": [...]} set    {"f": [...]} frozenset
  {"c": [re, im]} complex    {"m": [text]} a re.Match (decoded as a MatchValue: true, not None, equal to nothing)
Limits: nesting depth MAX_DEPTH, encoded length MAX_CHARS per value.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["ENCODER_SRC", "decode", "WireError", "MatchValue", "MAX_DEPTH", "MAX_CHARS"]

MAX_DEPTH = 64
MAX_CHARS = 32_000

# Runs inside the sandbox, defined before the program: every built-in it uses is captured in a closure at
# definition time, so a program that rebinds builtins or patches json afterwards does not change how honest values
# are encoded (the program can still do anything in its own process: this is for robustness, not for security;
# security comes from `decode` and from the expected values staying outside).
ENCODER_SRC = r'''
def _grpo_make_encoder(max_depth, max_chars):
    try:
        from _json import encode_basestring_ascii as _estr  # the C function itself: no json/re/enum imports
    except ImportError:
        from json.encoder import encode_basestring_ascii as _estr
    _type, _repr_int, _repr_float, _len, _join = type, int.__repr__, float.__repr__, len, ",".join
    _C, _cre, _cim = complex, complex.real.__get__, complex.imag.__get__
    _I, _F, _S, _B, _N, _L, _T, _D, _SET, _FS = int, float, str, bool, type(None), list, tuple, dict, set, frozenset
    _specials = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}
    _isinstance, _getattr, _dict_items, _str_len, _str_str = isinstance, getattr, dict.items, str.__len__, str.__str__
    _ValueError = ValueError

    def enc(v, depth=0):
        t = _type(v)
        if depth > max_depth:
            raise _ValueError("nested too deeply")
        if t is _N:
            return "null"
        if t is _B:
            return "true" if v else "false"
        if _isinstance(v, _I):
            return _repr_int(v)
        if _isinstance(v, _F):
            r = _repr_float(v)
            return _specials.get(r, r)
        if _isinstance(v, _C):
            return '{"c":[' + enc(_cre(v), depth + 1) + "," + enc(_cim(v), depth + 1) + "]}"
        if _getattr(t, "__module__", "") == "re" and t.__name__ == "Match":  # what a test can use of a match
            return '{"m":[' + enc(v.group(0), depth + 1) + "]}"
        if _isinstance(v, _S):
            if _str_len(v) > max_chars:
                raise _ValueError("string too long")
            return _estr(_S(_str_str(v)))
        for base, tag in ((_L, ""), (_T, "t"), (_SET, "s"), (_FS, "f")):
            if _isinstance(v, base):
                items = _L(v)
                if _len(items) > max_chars:
                    raise _ValueError("too many items")
                body = "[" + _join([enc(x, depth + 1) for x in items]) + "]"
                return body if not tag else '{"' + tag + '":' + body + "}"
        if _isinstance(v, _D):
            pairs = _L(_dict_items(v))
            if _len(pairs) > max_chars:
                raise _ValueError("too many items")
            return '{"d":[' + _join(["[" + enc(k, depth + 2) + "," + enc(x, depth + 2) + "]"
                                     for k, x in pairs]) + "]}"
        if _getattr(t, "__module__", "") == "numpy":  # a numpy scalar or array: the plain value it holds
            for name in ("tolist", "item"):
                f = _getattr(v, name, None)
                if f is not None:
                    return enc(f(), depth + 1)
        raise _ValueError("type " + t.__name__ + " is not a plain value")

    def encode(v):
        s = enc(v)
        if _len(s) > max_chars:
            raise _ValueError("value too large")
        return s

    return encode
'''


class WireError(ValueError):
    """The text is not a value in the wire format."""


_TAGS = {"t": tuple, "s": set, "f": frozenset}


class MatchValue:
    """A re.Match the program returned, as the judge sees it: true, not None, equal only to itself; `text` is its
    group(0). (A test that calls a method of the program's match has that call in its hole: it runs inside.)"""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __bool__(self) -> bool:
        return True

    def __repr__(self) -> str:
        return f"<re.Match {self.text[:40]!r}>"


def decode(text: str) -> Any:
    """The plain value encoded in `text`; WireError if it is not exactly the wire format (or too deep, too long)."""
    if len(text) > MAX_CHARS + 64:
        raise WireError("value too large")
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError) as e:  # includes ints over Python's digit limit
        raise WireError(f"not JSON: {e}") from None
    return _build(raw, 0)


def _build(x: Any, depth: int) -> Any:
    if depth > MAX_DEPTH + 2:
        raise WireError("nested too deeply")
    t = type(x)
    if x is None or t in (bool, int, float, str):
        return x
    if t is list:
        return [_build(e, depth + 1) for e in x]
    if t is dict and len(x) == 1:
        (tag, body), = x.items()
        if type(body) is list:
            if tag in _TAGS:
                try:
                    return _TAGS[tag](_build(e, depth + 1) for e in body)
                except TypeError as e:  # an unhashable set element
                    raise WireError(str(e)) from None
            if tag == "c" and len(body) == 2 and all(type(e) in (int, float) for e in body):
                return complex(float(body[0]), float(body[1]))
            if tag == "m" and len(body) == 1 and type(body[0]) is str:
                return MatchValue(body[0])
            if tag == "d":
                out = {}
                for pair in body:
                    if type(pair) is not list or len(pair) != 2:
                        raise WireError("a dict item is not a [key, value] pair")
                    try:
                        out[_build(pair[0], depth + 1)] = _build(pair[1], depth + 1)
                    except TypeError as e:
                        raise WireError(str(e)) from None
                return out
    raise WireError(f"not a wire value: {t.__name__}")
