"""Write src/quants_iq_grids.h: the i-quants' grids and sign tables, copied as data from ggml.

Usage: python src/gen_iq_grids.py PATH/TO/ggml/src/ggml-common.h > src/quants_iq_grids.h

The source is llama.cpp's ggml/src/ggml-common.h (MIT license), the copy vendored by
llama-cpp-python 0.3.36; tests/test_quants_iq.py checks the generated tables against the grids of
the ``gguf`` package, which encodes them independently.
"""

from __future__ import annotations

import re
import sys

# (C type, ggml name, entries): the tables the grid i-quants read
TABLES = [
    ("uint8_t", "ksigns_iq2xs", 128),
    ("uint64_t", "ksigns64", 128),
    ("uint64_t", "iq2xxs_grid", 256),
    ("uint64_t", "iq2xs_grid", 512),
    ("uint64_t", "iq2s_grid", 1024),
    ("uint32_t", "iq3xxs_grid", 256),
    ("uint32_t", "iq3s_grid", 512),
    ("uint64_t", "iq1s_grid", 2048),
]


def table(text: str, ctype: str, name: str, n: int) -> list[int]:
    m = re.search(r"GGML_TABLE_BEGIN\(\s*%s\s*,\s*%s\s*,\s*\w+\s*\)(.*?)GGML_TABLE_END\(\)" % (ctype, name), text, re.S)
    if m is None:
        raise SystemExit(f"{name} not found")
    values = [int(v, 0) for v in re.findall(r"0x[0-9a-fA-F]+|\d+", m.group(1))]
    if len(values) != n:
        raise SystemExit(f"{name}: {len(values)} entries, expected {n}")
    return values


def main(path: str) -> None:
    text = open(path, encoding="utf-8").read()
    out = ["/* The grids and sign tables of ggml's grid i-quants (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S,",
           " * IQ1_S, IQ1_M), copied as data from llama.cpp's ggml/src/ggml-common.h (MIT license) by",
           " * src/gen_iq_grids.py; do not edit. Names are ggml's with a gguflm_ prefix.",
           " * ksigns_iq2xs: 7 sign bits and their parity as bit 7 (an even number of minus signs);",
           " * ksigns64: the same as 8 bytes, 0xff where the element is negative. */",
           "#ifndef GGUFLM_QUANTS_IQ_GRIDS_H", "#define GGUFLM_QUANTS_IQ_GRIDS_H", "", "#include <stdint.h>", ""]
    for ctype, name, n in TABLES:
        values = table(text, ctype, name, n)
        width = {"uint8_t": 4, "uint32_t": 10, "uint64_t": 18}[ctype]
        per_line = {"uint8_t": 16, "uint32_t": 8, "uint64_t": 4}[ctype]
        out.append(f"static const {ctype} gguflm_{name}[{n}] = {{")
        for i in range(0, n, per_line):
            chunk = values[i:i + per_line]
            fmt = (lambda v: f"{v:3d}") if ctype == "uint8_t" else (lambda v: f"0x{v:0{width - 2}x}")
            out.append("    " + ", ".join(fmt(v) for v in chunk) + ",")
        out.append("};")
        out.append("")
    out.append("#endif")
    sys.stdout.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
