"""The ``gguflm`` command: one subcommand per job, flags named like llama.cpp's tools."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence


def _cmd_info(args: argparse.Namespace) -> int:
    from gguflm.system import system_info

    print(json.dumps(system_info(), indent=2))
    return 0


def _cmd_inspect(args: argparse.Namespace) -> int:
    from gguflm.errors import GGUFError
    from gguflm.inspect import inspect_report

    try:
        report = inspect_report(args.file, max_items=args.items)
    except GGUFError as exc:
        print(f"gguflm inspect: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write(report)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gguflm", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("info", help="print build and CPU facts")
    p.set_defaults(func=_cmd_info)
    p = sub.add_parser("inspect", help="describe a GGUF file: header, metadata, tensors, totals")
    p.add_argument("file", help="GGUF file (the first part of a split model)")
    p.add_argument("--items", type=int, default=5, help="items shown of each metadata array")
    p.set_defaults(func=_cmd_inspect)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
