"""Write src/quants_iq_codes.h: the grid i-quants' grids as small codes, for the VBMI decoders.

Usage: python src/gen_iq_codes.py src/quants_iq_grids.h > src/quants_iq_codes.h

Every grid element takes one of few values (IQ2: 8, 25, 43; IQ3_XXS: 4, 12, ..., 62; IQ3_S: 1, 3,
..., 15), so an entry is its elements' value numbers side by side: 2 bits each for the 8-element IQ2
entries (16-bit codes), 3 bits each for the 4-element IQ3 ones (12 bits), element j at bits b j .. b
j + b - 1. The codes are stored as two byte planes (low byte of each entry, then high byte),
128-byte pieces of which vpermi2b looks up; IQ3_XXS's values as a 64-byte table vpermb reads with the
6 low bits of a byte (the value number repeated to fill it, so the bits above the code need no
mask). The IQ2 and IQ3_S values are affine in the code bits (quants_iq_vbmi.h maps them with
vgf2p8affineqb): the script checks they are 8, 25, 43 and 1, 3, ..., 15. IQ2_XS loads its grid
entries (quants_iq_vbmi.h says why) and has no codes here. Read from the generated
quants_iq_grids.h (ggml's data); the script checks that the codes rebuild every grid entry.
"""

from __future__ import annotations

import re
import sys

# (grid, elements per entry, bits per element): the grids coded here
GRIDS = [("iq2xxs_grid", 8, 2), ("iq2s_grid", 8, 2), ("iq3xxs_grid", 4, 3), ("iq3s_grid", 4, 3)]
# (IQ1's 2048-entry grid is not coded: its decoders load the entries, see quants_iq_vbmi.h)


def grid(text: str, name: str) -> list[int]:
    m = re.search(r"gguflm_%s\[(\d+)\] = \{(.*?)\};" % name, text, re.S)
    if m is None:
        raise SystemExit(f"{name} not found")
    values = [int(v, 16) for v in re.findall(r"0x[0-9a-fA-F]+", m.group(2))]
    if len(values) != int(m.group(1)):
        raise SystemExit(f"{name}: {len(values)} entries, expected {m.group(1)}")
    return values


def rows(name: str, data: list[int]) -> list[str]:
    out = [f"static const uint8_t {name}[{len(data)}] __attribute__((aligned(64))) = {{"]
    for i in range(0, len(data), 16):
        out.append("    " + ", ".join(f"{v:3d}" for v in data[i:i + 16]) + ",")
    return out + ["};", ""]


def main(path: str) -> None:
    text = open(path, encoding="utf-8").read()
    out = ["/* The grids of ggml's grid i-quants as codes (value numbers side by side, in two byte planes)",
           " * and their value tables, for the VBMI decoders (quants_iq_vbmi.h); written by",
           " * src/gen_iq_codes.py from quants_iq_grids.h; do not edit. */",
           "#ifndef GGUFLM_QUANTS_IQ_CODES_H", "#define GGUFLM_QUANTS_IQ_CODES_H", "", "#include <stdint.h>", ""]
    values_of: dict[str, list[int]] = {}
    for name, width, bits in GRIDS:
        entries = grid(text, name)
        elems = [[(e >> (8 * j)) & 255 for j in range(width)] for e in entries]
        vals = sorted({v for el in elems for v in el})
        assert len(vals) <= 1 << bits, (name, vals)
        codes = [sum(vals.index(v) << (bits * j) for j, v in enumerate(el)) for el in elems]
        assert all(c < 1 << 16 for c in codes)
        # the check: every entry rebuilt from its code
        for e, c in zip(entries, codes):
            assert e == sum(vals[(c >> (bits * j)) & ((1 << bits) - 1)] << (8 * j) for j in range(width))
        out += rows(f"gguflm_{name.replace('_grid', '')}_codes", [c & 255 for c in codes] + [c >> 8 for c in codes])
        values_of[name] = vals
    vals = values_of["iq3xxs_grid"]
    out += rows("gguflm_iq3xxs_values", [vals[i % 8] for i in range(64)])
    # the bit-matrix maps of quants_iq_vbmi.h (GGUFLM_IQV_AFFINE_IQ2, _IQ3S)
    assert values_of["iq2xxs_grid"] == values_of["iq2s_grid"] == [8, 25, 43]
    assert values_of["iq3s_grid"] == [2 * c + 1 for c in range(8)]
    out.append("#endif")
    sys.stdout.write("\n".join(out) + "\n")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    main(sys.argv[1])
