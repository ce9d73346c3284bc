"""Write src/quants_iq_codes.h: the grid i-quants' grids as small codes, for the VBMI decoders.

Usage: python src/gen_iq_codes.py src/quants_iq_grids.h > src/quants_iq_codes.h

Every grid element takes one of few values (IQ2: 8, 25, 43; IQ3_XXS: 4, 12, ..., 52, 62; IQ3_S: 1,
3, ..., 15), so an entry is its elements' codes side by side: 2 bits each for the 8-element IQ2
entries (16-bit codes), 4 bits each for the 4-element IQ3 ones, element j at bits b j .. b j + b - 1.
A code is the element's value number, except that IQ3_XXS's last value (62, not 60) also sets bit
3: then every value is affine in its code's bits over GF(2), and quants_iq_vbmi.inc maps the codes
to values with one vgf2p8affineqb (its GGUFLM_IQV_AFFINE_* matrices and constants are repeated here
and checked on every code). The codes are stored as two byte planes (low byte of each entry, then
high byte), 128-byte pieces of which vpermi2b looks up. IQ2_XS loads its grid entries
(quants_iq_vbmi.inc says why) and has no codes here. Read from the generated quants_iq_grids.h
(ggml's data); the script checks that the codes rebuild every grid entry.
"""

from __future__ import annotations

import re
import sys

# (grid, elements per entry, bits per element, the affine map of quants_iq_vbmi.inc: matrix,
# constant)
GRIDS = [("iq2xxs_grid", 8, 2, 0x0302000001020000, 8), ("iq2s_grid", 8, 2, 0x0302000001020000, 8),
         ("iq3xxs_grid", 4, 4, 0x0008000102040000, 4), ("iq3s_grid", 4, 4, 0x0001020400000000, 1)]
# (IQ1's 2048-entry grid is not coded: its decoders load the entries, see quants_iq_vbmi.inc)


def affine(matrix: int, constant: int, byte: int) -> int:
    """vgf2p8affineqb on one byte: output bit i is the parity of matrix byte 7 - i AND the byte,
    XOR bit i of the constant"""
    return sum((bin((matrix >> (8 * (7 - i))) & byte).count("1") & 1) << i for i in range(8)) ^ constant


def code_of(name: str, number: int) -> int:
    """an element's code from its value number (IQ3_XXS: 7 also sets bit 3, its value 62 being
    no multiple of 8 plus 4)"""
    return number | 8 if name == "iq3xxs_grid" and number == 7 else number


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
    out = ["/* The grids of ggml's grid i-quants as codes (side by side, in two byte planes), for the VBMI",
           " * decoders (quants_iq_vbmi.inc); written by src/gen_iq_codes.py from quants_iq_grids.h; do",
           " * not edit. */",
           "#ifndef GGUFLM_QUANTS_IQ_CODES_H", "#define GGUFLM_QUANTS_IQ_CODES_H", "", "#include <stdint.h>", ""]
    for name, width, bits, matrix, constant in GRIDS:
        entries = grid(text, name)
        elems = [[(e >> (8 * j)) & 255 for j in range(width)] for e in entries]
        vals = sorted({v for el in elems for v in el})
        assert len(vals) <= 1 << bits, (name, vals)
        codes = [sum(code_of(name, vals.index(v)) << (bits * j) for j, v in enumerate(el)) for el in elems]
        assert all(c < 1 << 16 for c in codes)
        # the checks: the affine map reads only a code's bits of a byte (the decoders leave the next
        # element's above them), and every entry is rebuilt from its code through it
        assert all((matrix >> (8 * i)) & 255 < 1 << bits for i in range(8)), name
        for e, c in zip(entries, codes):
            fields = [(c >> (bits * j)) & ((1 << bits) - 1) for j in range(width)]
            assert e == sum(affine(matrix, constant, f) << (8 * j) for j, f in enumerate(fields))
        out += rows(f"gguflm_{name.replace('_grid', '')}_codes", [c & 255 for c in codes] + [c >> 8 for c in codes])
    out.append("#endif")
    sys.stdout.write("\n".join(out) + "\n")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    main(sys.argv[1])
