"""Small repository queries for the CI workflow's shell steps.

    python deploy/ci/has_production.py REPOSITORY MODEL           # exit 0 if it has production
    python deploy/ci/has_production.py REPOSITORY MODEL --latest  # print the newest version
"""

from __future__ import annotations

import sys

from redline.models import ModelRepository


def main(argv: list[str]) -> int:
    root, model = argv[0], argv[1]
    repo = ModelRepository(root)
    versions = repo.versions(model)
    if argv[2:] == ["--latest"]:
        if not versions:
            print(f"no versions of {model} in {root}", file=sys.stderr)
            return 1
        print(versions[-1])
        return 0
    return 0 if versions and "production" in repo.aliases(model) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
