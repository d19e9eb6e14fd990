"""Call s30a's two bound trees from .ab/main.tgz: .ab/nocopy.tgz (the mma.sync producer arrives on each
full barrier with no bytes) and .ab/nocompute.tgz (the consumers only wait and free). Timing only:
their results are wrong. Run from the repository root: python bench/pending/make_s30a_trees.py"""

import subprocess
import tempfile
from pathlib import Path

WAIT = "        const int stage = ring_wait_free<C>(smem, st.ring_pos);\n"
COMPUTE = """        partial_scores<C>(st, kt, s_part, w);
        named_barrier(block_bar, C::ROW_BLOCK_THREADS);
        softmax_tile<C>(smem, st, kt, tile, num_keys, tile_visible, w);
        named_barrier(block_bar, C::ROW_BLOCK_THREADS);
        rescale_and_pv<C>(smem, st, kt, w);
"""
EDITS = {
    "nocopy": (WAIT, WAIT + "        if (lane == 0) mbar_arrive(ring_full<C>(smem, stage));  // s30a: no bytes\n"
               "        if (true) continue;\n"),
    "nocompute": (COMPUTE, "        (void)kt; (void)s_part; (void)tile_visible; (void)block_bar;  // s30a: no compute\n"),
}

for name, (old, new) in EDITS.items():
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["tar", "xzf", ".ab/main.tgz", "-C", tmp], check=True)
        path = Path(tmp, "templates", "attention.cuh")
        text = path.read_text()
        assert text.count(old) == 1, f"{name}: the anchor moved"
        path.write_text(text.replace(old, new))
        subprocess.run(["tar", "czf", f".ab/{name}.tgz", "-C", tmp, "kgen", "templates", "bench", "specs",
                        "pyproject.toml"], check=True)
