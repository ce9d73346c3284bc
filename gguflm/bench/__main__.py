"""``python -m gguflm.bench <name> [args]`` runs ``gguflm.bench.<name>.main(args)``."""

import importlib
import pkgutil
import sys

import gguflm.bench


def module_names() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(gguflm.bench.__path__) if m.name != "__main__")


def main(argv: list[str]) -> int:
    names = module_names()
    if not argv or argv[0] not in names:
        print(f"usage: python -m gguflm.bench {{{','.join(names)}}} [args]", file=sys.stderr)
        return 2
    return importlib.import_module(f"gguflm.bench.{argv[0]}").main(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
