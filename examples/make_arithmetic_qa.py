"""Write examples/arithmetic_qa.jsonl: plain question/answer rows as a user would have them,
{"prompt": "What is 20 + 9?", "answer": "29"}, additions and subtractions of 0-59 drawn with a fixed seed.

    python examples/make_arithmetic_qa.py [--rows 1000] [--output examples/arithmetic_qa.jsonl]

The README's own-data command trains the built-in model on this file (its held-out rows: a hash split, 10%).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path


def rows(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    seen: dict[str, str] = {}
    while len(seen) < n:
        a, b, op = rng.randint(0, 59), rng.randint(0, 59), rng.choice("+-")
        if op == "-" and b > a:
            a, b = b, a
        seen.setdefault(f"What is {a} {op} {b}?", str(a + b if op == "+" else a - b))
    return [{"prompt": q, "answer": a} for q, a in seen.items()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--output", default=str(Path(__file__).parent / "arithmetic_qa.jsonl"))
    args = parser.parse_args()
    Path(args.output).write_text("".join(json.dumps(r) + "\n" for r in rows(args.rows)))


if __name__ == "__main__":
    main()
