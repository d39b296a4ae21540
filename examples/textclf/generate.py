"""Seeded support tickets in four classes: billing, shipping, account, technical.

Most tickets say what they are about in plain words ("invoice", "courier", "password",
"crash"): a linear model over hashed tokens is sure of them. The rest are terse and ambiguous:
a subject word and an action word whose *combination* decides the class ("card locked" is an
account problem and "card charged" a billing one, but "app locked" is a billing problem and
"app charged" an account one): an exclusive or, which a linear model cannot express and a small
MLP learns. Every ticket carries filler words and, sometimes, a misleading word of another
class.

    python generate.py --out data --tickets 6000
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

CLASSES = ["billing", "shipping", "account", "technical"]
TOPIC = {
    "billing": ["invoice", "refund", "charge", "payment", "receipt", "billed", "price", "vat"],
    "shipping": ["courier", "parcel", "delivery", "tracking", "shipped", "warehouse", "arrive",
                 "address"],
    "account": ["password", "login", "profile", "email", "username", "verify", "reset",
                "signin"],
    "technical": ["crash", "error", "bug", "freeze", "slow", "update", "screen", "install"],
}
FILLER = ["please", "help", "my", "the", "is", "not", "with", "since", "yesterday", "today",
          "again", "hello", "thanks", "urgent", "still", "why", "can", "you", "check", "it"]
# The ambiguous tickets: subject x action -> class, an exclusive or that no sum of words says
PAIRS = {("card", "locked"): "account", ("card", "charged"): "billing",
         ("app", "locked"): "billing", ("app", "charged"): "account",
         ("box", "late"): "shipping", ("box", "broken"): "technical",
         ("plan", "late"): "technical", ("plan", "broken"): "shipping"}


def ticket(rng: np.random.Generator, hard_share: float) -> tuple[str, int]:
    filler = list(rng.choice(FILLER, size=rng.integers(3, 8)))
    if rng.random() < hard_share:
        (subject, action), label = list(PAIRS.items())[rng.integers(len(PAIRS))]
        words = [subject, action] + filler
    else:
        label = CLASSES[rng.integers(len(CLASSES))]
        words = list(rng.choice(TOPIC[label], size=rng.integers(2, 4))) + filler
    if rng.random() < 0.25:  # a misleading word of another class
        other = CLASSES[rng.integers(len(CLASSES))]
        words.append(str(rng.choice(TOPIC[other])))
    rng.shuffle(words)
    return " ".join(words), CLASSES.index(label)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="data")
    parser.add_argument("--tickets", type=int, default=6000)
    parser.add_argument("--hard-share", type=float, default=0.3)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = [ticket(rng, args.hard_share) for _ in range(args.tickets)]
    cut = int(len(rows) * 0.8)
    for name, part in (("train", rows[:cut]), ("test", rows[cut:])):
        with (out / f"{name}.jsonl").open("w") as f:
            for text, label in part:
                f.write(json.dumps({"text": text, "label": label}) + "\n")
    print(f"{len(rows)} tickets ({args.hard_share:.0%} ambiguous) in {out}/train.jsonl and "
          f"{out}/test.jsonl")


if __name__ == "__main__":
    main()
