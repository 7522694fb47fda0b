"""The tiny corpus shipped with the recipe, and the generator that wrote it.

    python -m trainguard.recipes.distill.corpus   # rewrites data/tiny_train.txt and data/tiny_eval.txt

Why synthetic: tests and benchmarks must run offline, and a grammar with real regularities (agreement,
arithmetic, recurring names, dates) gives a tiny teacher something to learn that a student can be
taught. Hard strings for alignment are mixed in on purpose: accented and CJK characters, runs of
spaces, digits, punctuation. Deterministic: the same seed always writes the same bytes.
"""

from __future__ import annotations

import random
from pathlib import Path

DATA_DIR = Path(__file__).parent / "data"

NAMES = ["Ada", "Bruno", "Chloé", "Dmitri", "Élodie", "Farah", "Goran", "Hana", "Iñigo", "Jun", "Kofi", "Lena"]
PLACES = ["the market", "the river", "Zürich", "東京", "the old mill", "São Paulo", "the library", "the café"]
THINGS = ["apples", "books", "lamps", "maps", "coins", "shells", "letters", "pears"]
VERBS = [("walks", "walked"), ("runs", "ran"), ("reads", "read"), ("sings", "sang"), ("waits", "waited")]
ADJ = ["quiet", "bright", "naïve", "old", "small", "happy", "cold", "busy"]
NUMBER_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]


def _sentence(rng: random.Random) -> str:
    kind = rng.randrange(7)
    a, b = rng.sample(NAMES, 2)
    if kind == 0:
        now, past = rng.choice(VERBS)
        return f"{a} {now} to {rng.choice(PLACES)}, and yesterday {b} {past} there too."
    if kind == 1:
        x, y = rng.randrange(10), rng.randrange(10)
        return f"{a} has {x} {rng.choice(THINGS)}; {b} gives {y} more, so {a} has {x + y}."
    if kind == 2:
        n = rng.randrange(11)
        return f"The word for {n} is {NUMBER_WORDS[n]}, and {NUMBER_WORDS[n]} means {n}."
    if kind == 3:
        day, month, year = rng.randrange(1, 29), rng.randrange(1, 13), rng.randrange(1990, 2030)
        return f"On {year}-{month:02d}-{day:02d} the {rng.choice(ADJ)} {rng.choice(THINGS)} reached {rng.choice(PLACES)}."
    if kind == 4:
        return f"\"Is it {rng.choice(ADJ)}?\" asked {a}.  \"Yes,\" said {b}, \"very {rng.choice(ADJ)}.\""
    if kind == 5:
        x, y = rng.randrange(2, 10), rng.randrange(2, 10)
        return f"{x} times {y} is {x * y}, and {x * y} minus {x} is {x * y - x}."
    return f"{a} likes {rng.choice(THINGS)} — {b} likes {rng.choice(THINGS)}   more."


def generate(n_paragraphs: int, seed: int) -> str:
    """Paragraphs of 3 to 6 sentences, separated by blank lines."""
    rng = random.Random(seed)
    paras = [" ".join(_sentence(rng) for _ in range(rng.randrange(3, 7))) for _ in range(n_paragraphs)]
    return "\n\n".join(paras) + "\n"


def main() -> None:
    DATA_DIR.mkdir(exist_ok=True)
    (DATA_DIR / "tiny_train.txt").write_text(generate(1200, seed=1), encoding="utf-8")
    (DATA_DIR / "tiny_eval.txt").write_text(generate(60, seed=2), encoding="utf-8")


if __name__ == "__main__":
    main()
