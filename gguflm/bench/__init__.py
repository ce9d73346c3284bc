"""Benchmarks that print figures: ``python -m gguflm.bench <name> [args]``.

Each ``gguflm/bench/<name>.py`` defines ``main(argv) -> int``; speed targets are checked by reading
these figures, never by timed assertions in tests.
"""
