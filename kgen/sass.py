"""SASS of a built cubin, read with the pip nvdisasm (nvidia-cuda-nvdisasm; no system toolkit).

`counts` tallies the instruction classes that say whether a kernel compiled the way its plan
intends: tensor-core MMAs (HMMA; QMMA is sm_120's fp8 mma.sync; any *MMA opcode gets its own
key), LDSM (ldmatrix), UBLKCP (cp.async.bulk), global loads/stores by width (LDG.128, STG.64, ...),
local-memory traffic (LDL/STL: register spills or stack arrays), barriers (BAR), 16-byte
cp.async copies (LDGSTS; HGMMA is Hopper's wgmma) and tensor copies (UTMALDG: cp.async.bulk.tensor).
A kgen cubin holds one variant: one entry point and whatever it calls, so counts are per cubin.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from collections import Counter
from functools import lru_cache

from .errors import KgenError

# Bump when the classes below change: cached counts of an older version are recomputed.
COUNTS_VERSION = 5
ALWAYS = ("HMMA", "LDSM", "UBLKCP", "LDG", "STG", "LDL", "STL", "BAR")  # reported even when 0

# "        /*0050*/   @!P0 LDG.E.128.CONSTANT R20, desc[UR6][R2.64] ;" -> "LDG.E.128.CONSTANT"
_INSTR = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Za-z0-9_]+)*)(.*)")  # modifiers may be lowercase: HGMMA.64x32x16
_LABEL = re.compile(r"^\s*(\.L_x_\d+):")
_BRANCH_TARGET = re.compile(r"`\((\.L_x_\d+)\)")
_WIDTHS = {"U8": 8, "S8": 8, "U16": 16, "S16": 16, "32": 32, "64": 64, "128": 128, "256": 256}
_TARGET = re.compile(r"^\s*\.target\s+(\S+)", re.M)


class SassError(KgenError):
    """nvdisasm is missing or could not read a cubin."""


@lru_cache(maxsize=1)
def nvdisasm_path() -> str:
    from cuda import pathfinder

    found = pathfinder.find_nvidia_binary_utility("nvdisasm")
    if not found:
        raise SassError("nvdisasm not found: pip install nvidia-cuda-nvdisasm")
    return str(found)


def disassemble(cubin: bytes, *extra: str) -> str:
    """nvdisasm's text for the code sections of `cubin`."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        run = subprocess.run([nvdisasm_path(), "--print-code", *extra, f.name],
                             capture_output=True, text=True)
    if run.returncode:
        raise SassError(f"nvdisasm failed ({run.returncode}): {run.stderr.strip() or run.stdout.strip()}")
    return run.stdout


def dump(cubin: bytes, arch: str | None = None, line_info: bool = False) -> str:
    """The SASS listing `kgen inspect` prints; checks the cubin is for `arch` when given."""
    text = disassemble(cubin, *(["--print-line-info"] if line_info else []))
    target = _TARGET.search(text)
    if arch and target and target.group(1) != arch:
        raise SassError(f"cubin is for {target.group(1)}, not {arch}")
    return text


def opcodes(sass: str) -> list[str]:
    """Every instruction's full opcode with modifiers, predicates stripped, in order."""
    return [m.group(2) for line in sass.splitlines() if (m := _INSTR.match(line))]


def tile_loop(sass: str) -> Counter:
    """Opcodes of the loop that runs the most MMAs, by full opcode: the attention kernels' KV
    tile loop, one tile per iteration."""
    return Counter(op for op, _ in _tile_loop_body(sass))


_CONSTANT = re.compile(r"c\[0x[0-9a-f]+\]\[0x[0-9a-f]+\]")


def tile_loop_text(sass: str) -> str:
    """The tile loop's instructions with their operands, one a line, constant-bank addresses (where
    the kernel parameters sit) blanked: equal texts mean ptxas scheduled the loop the same, whatever
    else changed (bench/NOTES.md v47: code outside the loop can move it)."""
    return "".join(f"{op}{_CONSTANT.sub('c[]', rest.rstrip())}\n" for op, rest in _tile_loop_body(sass))


def _tile_loop_body(sass: str) -> list[tuple[str, str]]:
    """(opcode, operands) of the loop that runs the most MMAs. A loop is the code from a label to a
    branch back to it; branches back from out-of-line slow paths (placed after the kernel's EXIT)
    are not loops."""
    instrs, labels, pending = [], {}, []
    for line in sass.splitlines():
        if m := _LABEL.match(line):
            pending.append(m.group(1))
        elif m := _INSTR.match(line):
            addr = int(m.group(1), 16)
            labels.update((name, addr) for name in pending)
            pending = []
            instrs.append((addr, m.group(2), m.group(3)))
    best: tuple[tuple[int, int], list[tuple[str, str]]] | None = None
    for addr, op, rest in instrs:
        target = _BRANCH_TARGET.search(rest) if op.startswith("BRA") else None
        if not target or labels.get(target.group(1), addr + 1) > addr:
            continue
        body = [(o, r) for a, o, r in instrs if labels[target.group(1)] <= a <= addr]
        if any(o.startswith(("EXIT", "RET")) for o, _ in body):
            continue
        mmas = sum(1 for o, _ in body if o.split(".")[0].endswith("MMA"))
        rank = (mmas, -len(body))  # the most MMAs, then the tightest loop
        if mmas and (best is None or rank > best[0]):
            best = (rank, body)
    if best is None:
        raise SassError("no loop with tensor-core MMAs in this kernel")
    return best[1]


def classify(opcode: str) -> str | None:
    """The class an opcode counts under, or None for the ones kgen does not track."""
    base, *mods = opcode.split(".")
    if base.endswith("MMA"):
        return base  # HMMA, QMMA (fp8 on sm_120), IMMA, ...
    if base in ("LDG", "STG"):
        widths = [_WIDTHS[m] for m in mods if m in _WIDTHS]
        return f"{base}.{widths[-1] if widths else 32}"
    if base in ("LDSM", "UBLKCP", "UTMALDG", "LDGSTS", "LDL", "STL", "BAR"):
        return base
    return None


def count_text(sass: str) -> dict[str, int]:
    """Counts per class; LDG and STG also as totals over widths."""
    tally = Counter(c for op in opcodes(sass) if (c := classify(op)))
    for base in ("LDG", "STG"):
        tally[base] = sum(n for k, n in tally.items() if k.startswith(base + "."))
    return ordered(tally)


def ordered(c: dict[str, int]) -> dict[str, int]:
    """Counts in a stable order: the ALWAYS classes (0 when absent) first, then the rest by name."""
    out = {k: c.get(k, 0) for k in ALWAYS}
    out.update(sorted((k, n) for k, n in c.items() if k not in out))
    return out


def counts(cubin: bytes) -> dict[str, int]:
    """Instruction-class counts of a cubin (runs nvdisasm once, ~0.3 s)."""
    return count_text(disassemble(cubin, "--no-dataflow"))


# What the classes a variant expects (Variant.sass_expect) are, for messages; "MMA" is any *MMA.
EXPECT_NAMES = {"MMA": "tensor-core MMA (HMMA/QMMA/HGMMA)", "UBLKCP": "bulk copy (UBLKCP)",
                "HGMMA": "warpgroup MMA (HGMMA)", "LDGSTS": "cp.async (LDGSTS)"}


def mma_count(c: dict[str, int]) -> int:
    """Tensor-core MMAs of any form (bf16 HMMA, fp8 QMMA, ...)."""
    return sum(n for k, n in c.items() if k.endswith("MMA"))


def local_memory_count(c: dict[str, int]) -> int:
    return c.get("LDL", 0) + c.get("STL", 0)


def summary(c: dict[str, int]) -> str:
    """One line for tables; zero classes left out except LDL/STL:
    "HMMA 68 LDSM 45 UBLKCP 3 LDG 128x1,32x9 STG 64x32,32x1 LDL/STL 0/0 BAR 6"; UTMALDG (tensor copies) where any."""
    parts = [f"{k} {n}" for k, n in c.items() if n and (k.endswith("MMA") or k in ("LDSM", "UBLKCP", "UTMALDG", "LDGSTS"))]
    for base in ("LDG", "STG"):
        widths = sorted(((int(k.split(".")[1]), n) for k, n in c.items() if k.startswith(base + ".")), reverse=True)
        if widths:
            parts.append(f"{base} " + ",".join(f"{w}x{n}" for w, n in widths))
    parts.append(f"LDL/STL {c['LDL']}/{c['STL']}")
    if c["BAR"]:
        parts.append(f"BAR {c['BAR']}")
    return " ".join(parts)
