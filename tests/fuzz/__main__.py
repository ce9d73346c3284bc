"""``python -m tests.fuzz TARGET --runs N [--corpus DIR]``: fuzz one target with atheris.

New inputs go to a scratch corpus (``--work``, default ``/tmp/gguflm-fuzz/TARGET``), read
together with the committed seeds; a finding is written to ``--artifacts`` and the run stops.
``--replay`` runs the committed seeds and regression inputs once, without atheris.
Extra arguments after ``--`` go to libFuzzer as they are (``-max_total_time=600``, ...).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from pathlib import Path

from . import ALL, CORPUS_DIR, RSS_LIMIT_MB, TARGETS, TIMEOUT_S, all_seeds, inputs, make, replay

MAX_LEN = {"gguf_reader": 1 << 17, "vocab_only": 1 << 17, ALL: 1 << 17}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__.split("\n\n")[0])
    parser.add_argument("target", choices=[*TARGETS, ALL], help=f"one target, or {ALL!r}: each input's first byte picks one")
    parser.add_argument("--runs", type=int, default=10_000, help="inputs to run (libFuzzer -runs)")
    parser.add_argument("--corpus", type=Path, help="seed corpus (default: the committed one)")
    parser.add_argument("--work", type=Path, help="scratch corpus the new inputs go to")
    parser.add_argument("--artifacts", type=Path, default=Path("/tmp/gguflm-fuzz/findings"),
                        help="where a finding's input is written")
    parser.add_argument("--replay", action="store_true", help="replay the committed inputs only")
    args, libfuzzer = parser.parse_known_args(argv)
    libfuzzer = [a for a in libfuzzer if a != "--"]

    if args.replay:
        seeds = all_seeds() if args.target == ALL else [
            p.read_bytes() for p in inputs(args.target) + inputs(args.target, "regressions")]
        start = time.perf_counter()
        for data in seeds:
            replay(args.target, data)
        print(f"{args.target}: {len(seeds)} inputs replayed in {time.perf_counter() - start:.2f} s")
        return 0

    import atheris

    # Python coverage of gguflm and of the libraries untrusted input flows through; the target
    # imports them first here (nothing above has imported gguflm)
    with atheris.instrument_imports(include=["gguflm", "jinja2", "json"]):
        check = make(args.target)
    work = args.work or Path("/tmp/gguflm-fuzz") / args.target
    work.mkdir(parents=True, exist_ok=True)
    if args.target == ALL:    # its seeds are the other targets', prefixed with their index
        for data in all_seeds():
            (work / hashlib.sha1(data).hexdigest()).write_bytes(data)
    args.artifacts.mkdir(parents=True, exist_ok=True)
    seeds = args.corpus or CORPUS_DIR / args.target
    flags = [f"-runs={args.runs}", f"-timeout={TIMEOUT_S}", f"-rss_limit_mb={RSS_LIMIT_MB}",
             f"-max_len={MAX_LEN.get(args.target, 4096)}", f"-artifact_prefix={args.artifacts}/{args.target}-",
             "-print_final_stats=1", *libfuzzer, str(work), *([str(seeds)] if seeds.is_dir() else [])]
    def recorded(data: bytes) -> None:
        try:
            check(data)
        except BaseException:   # keep the input even when the report that follows is cut short
            path = args.artifacts / f"{args.target}-exception-{hashlib.sha1(data).hexdigest()}"
            path.write_bytes(data)
            print(f"input written to {path}", file=sys.stderr)
            raise

    atheris.Setup([sys.argv[0], *flags], recorded)
    atheris.Fuzz()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
