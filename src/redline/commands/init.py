"""``redline init [FOLDER]``: a project that ``redline serve`` runs at once.

The scaffold is a working example, not a skeleton: settings, feature definitions, two days of
purchase events, labels, a training script and a README. Events are generated here with the
standard library so that ``init`` needs no optional package.
"""

from __future__ import annotations

import json
import random
import re
import time
from importlib import resources
from pathlib import Path

import click

from redline.errors import InvalidInput

TEMPLATES = {
    "redline.yaml": "redline.yaml.tmpl",
    "features.py": "features.py.tmpl",
    "train.py": "train.py.tmpl",
    "README.md": "README.md.tmpl",
}
DATA_FILES = ("data/events.jsonl", "data/labels.jsonl")
# The model repository and the feature registry the scaffold's redline.yaml names; one that is
# there already belongs to another project (the demo's, in a clone of redline).
PROJECT_FOLDER = ".redline"
HOUR_MS = 3_600_000


@click.command("init")
@click.argument("folder", default=".", required=False)
@click.option("--model", "-m", "model", default="purchases", show_default=True, metavar="NAME",
              help="Name of the project's model.")
@click.option("--users", type=int, default=50, show_default=True,
              help="Users in the generated events.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed of the generated events (the same seed, the same files).")
@click.option("--force", is_flag=True,
              help="Overwrite the scaffold's files where they already exist (others are left "
                   "alone).")
def init(folder: str, model: str, users: int, seed: int, force: bool) -> None:
    """Create a redline project in FOLDER (default: here) that `redline serve` runs at once.

    It writes redline.yaml, features.py (per-user features), data/events.jsonl and
    data/labels.jsonl (two days of purchases), train.py (point-in-time training set, a model,
    registration) and a README. It never overwrites a file: when any of them (or a .redline
    project folder) exists already it lists them and stops, unless --force.

    \b
    Examples:
      redline init shop && cd shop
      redline serve &                 # serves the features at once
      python train.py                 # adds the model; the running server loads it
      redline init churn --model churn --users 200
    """
    root = Path(folder)
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", model):
        raise InvalidInput(f"--model {model!r}: use letters, digits, '_', '-' and '.'")
    if users < 1:
        raise InvalidInput("--users must be at least 1")
    if root.exists() and not root.is_dir():
        raise InvalidInput(f"{root} exists and is not a folder")
    taken = existing_paths(root)
    if taken and not force:
        raise InvalidInput(
            f"{root} already has {', '.join(taken)}: redline init never overwrites a file; name "
            "a new folder (redline init my-project) or pass --force to overwrite them")
    root.mkdir(parents=True, exist_ok=True)
    name = root.resolve().name
    package = resources.files("redline.commands") / "templates" / "project"
    for target, template in TEMPLATES.items():
        text = (package / template).read_text()
        (root / target).write_text(text.replace("__MODEL__", model).replace("__NAME__", name))
    events, labels = purchases(users, seed)
    # the (empty) model repository `redline serve` watches until train.py adds the model
    (root / PROJECT_FOLDER / "models").mkdir(parents=True, exist_ok=True)
    data = root / "data"
    data.mkdir(exist_ok=True)
    (data / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (data / "labels.jsonl").write_text("".join(json.dumps(r) + "\n" for r in labels))
    click.echo(f"created a redline project in {root}: redline.yaml, features.py, train.py, "
               f"README.md, data/ ({len(events)} events, {len(labels)} labels)")
    where = "" if folder == "." else f"cd {folder} && "
    click.echo(f"next: {where}redline serve   (then, in another shell: python train.py)")


def existing_paths(root: Path) -> list[str]:
    """The scaffold's paths that already exist under ``root``, the project folder included."""
    names = [*TEMPLATES, *DATA_FILES, PROJECT_FOLDER]
    return [name for name in names if (root / name).exists()]


def purchases(users: int, seed: int, days: float = 2.0) -> tuple[list[dict], list[dict]]:
    """Purchase events ending now; 5% are unusual (several times the user's typical amount)."""
    rng = random.Random(seed)
    end = int(time.time() * 1000)
    start = end - int(days * 24 * HOUR_MS)
    events: list[dict] = []
    labels: list[dict] = []
    for u in range(users):
        typical = rng.lognormvariate(3.5, 0.6)
        ts = start + rng.randrange(0, 6 * HOUR_MS)
        while ts < end:
            unusual = rng.random() < 0.05
            amount = round(typical * (rng.uniform(4, 10) if unusual else rng.uniform(0.3, 1.7)), 2)
            events.append({"user_id": f"u{u}", "amount": amount, "ts": ts})
            labels.append({"user_id": f"u{u}", "amount": amount, "ts": ts, "label": int(unusual)})
            ts += int(rng.expovariate(1 / (3 * HOUR_MS)))
    events.sort(key=lambda e: e["ts"])
    labels.sort(key=lambda r: r["ts"])
    return events, labels
