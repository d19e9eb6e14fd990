"""Dump the SASS of every kernel of every shipped spec, to compare two versions of kgen.

For each spec in specs/ and each (plan arch, cubin arch) in PAIRS it plans, builds (through the
cache) and disassembles every variant, and writes one line per variant to OUT:
    <spec> <plan arch> <cubin arch> <variant name> <sha256 of the listing, symbol names blanked>
and the listing's opcode sequence to OUT.d/<...>.ops, and of a kernel with a tile loop that loop with
its operands to OUT.d/<...>.loop (kgen.sass.tile_loop_text: code outside a loop can reschedule it,
bench/NOTES.md v47, so compare the loops before timing a change). Run it from each checkout and diff:
    PYTHONPATH=$PWD python -m bench.sass_dump /tmp/sass_a && ... /tmp/sass_b; diff -r /tmp/sass_a.d /tmp/sass_b.d
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from kgen import sass
from kgen.build import build_variant
from kgen.cache import KernelCache
from kgen.plan import plan
from kgen.spec import load_spec

# (plan arch, cubin arch): each arch's own plan, and the sm_120 plan run on the H200 for tests.
PAIRS = (("sm_120", "sm_120"), ("sm_90", "sm_90"), ("sm_120", "sm_90"))
_SYMBOL = re.compile(r"\b\w+__h\d+_\w+__[0-9a-f]{12}\b")  # variant ids (they hold the plan digest)


def main(out: str) -> None:
    root = Path(__file__).resolve().parents[1]
    cache = KernelCache()
    lines = []
    folder = Path(out + ".d")
    folder.mkdir(parents=True, exist_ok=True)
    for path in sorted((root / "specs").glob("*.yaml")):
        spec = load_spec(path)
        for plan_arch, cubin_arch in PAIRS:
            for v in plan(spec, plan_arch).variants:
                text = sass.disassemble(build_variant(v, cubin_arch, cache).cubin, "--no-dataflow")
                blanked = _SYMBOL.sub("SYMBOL", text)
                name = f"{spec.name}.{plan_arch}.{cubin_arch}.{v.name}"
                (folder / f"{name}.ops").write_text("\n".join(sass.opcodes(text)) + "\n")
                try:
                    (folder / f"{name}.loop").write_text(sass.tile_loop_text(text))
                except sass.SassError:  # no MMA loop: not an attention kernel
                    pass
                lines.append(f"{spec.name} {plan_arch} {cubin_arch} {v.name} "
                             f"{hashlib.sha256(blanked.encode()).hexdigest()[:16]} {v.variant_id}")
                print(lines[-1], flush=True)
    Path(out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", help="the hashes file; listings go to OUT.d/")
    main(ap.parse_args().out)
