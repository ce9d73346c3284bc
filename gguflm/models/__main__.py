"""``python -m gguflm.models [--write README.md]``: print README's architecture list, or rewrite it
in place between its markers."""

from __future__ import annotations

import argparse
from pathlib import Path

from gguflm.models import README_BEGIN, README_END, readme_section


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m gguflm.models", description=__doc__)
    parser.add_argument("--write", metavar="README", help="replace the list in this file")
    args = parser.parse_args()
    section = readme_section()
    if not args.write:
        print(section)
        return
    path = Path(args.write)
    text = path.read_text(encoding="utf-8")
    start, end = text.find(README_BEGIN), text.find(README_END)
    if start < 0 or end < start:
        raise SystemExit(f"{path}: no {README_BEGIN!r} ... {README_END!r} markers")
    path.write_text(text[:start] + section + text[end + len(README_END):], encoding="utf-8")


if __name__ == "__main__":
    main()
