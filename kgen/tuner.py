"""`kgen tune`: time candidate attention tilings per shape bucket on the GPU present and keep the
winners in a tuned table (kgen/tuning.py), timed as the benchmark times (kgen/timing.py: CUDA-graph
replays over rotated input sets, so no call reads KV still in L2). A tiling is timed in a bucket only
once its output on that bucket's shape agrees with the heuristic plan's (DESIGN §6's tolerances): a
table never keeps a fast tiling that computes something else.
"""

from __future__ import annotations

import math
import time
from functools import partial
from typing import Callable

import torch

from . import designs
from .accuracy import assert_close_attention, tolerances
from .arch import arch_for_capability
from .ops import Module
from .spec import Spec
from .inputs import make_verify_inputs
from .timing import time_rotation
from .tuning import Bucket, Choice, Table, candidates, decide, find_table, selected, shape_of, spec_digest
from .version import __version__

L2_ROTATION_BYTES = 4 * 60 << 20  # rotated input sets hold at least four H200 L2s of KV


def _calls(mod: Module, spec: Spec, bucket: Bucket, generator: torch.Generator) -> list[Callable[[], object]]:
    """One call per rotated input set of the bucket's shape (decode: prefix attention alone)."""
    t, b, l = shape_of(bucket, spec.tree.nodes)
    sets = max(2, min(8, math.ceil(L2_ROTATION_BYTES / (b * (l + t) * spec.model.head_dim * 2))))
    ins = [make_verify_inputs(spec, [t] * b, [l] * b, generator=generator, device=mod.device) for _ in range(sets)]
    return [partial(_run, mod, x, t) for x in ins]


def _run(mod: Module, x, t: int):
    """The bucket's op on inputs x: decode (t = 1) runs prefix attention alone."""
    if t == 1:
        return mod.prefix_attention(*x.prefix_args(), **x.kv_kwargs)
    return mod.verify_attention(*x.verify_args(), **x.kv_kwargs)


def disagreeing(mods: dict[str, Module], base: str, spec: Spec, bucket: Bucket,
                generator: torch.Generator) -> dict[str, str]:
    """The tilings whose output on one input set of the bucket's shape is not the heuristic plan's
    (`base`, the tiling the GPU suite checks against the reference on every shipped spec), each with
    what differs."""
    t, b, l = shape_of(bucket, spec.tree.nodes)
    x = make_verify_inputs(spec, [t] * b, [l] * b, generator=generator, device=mods[base].device)
    o_ref, lse_ref = _run(mods[base], x, t)
    bad = {}
    for text, mod in mods.items():
        if text != base:
            o, lse = _run(mod, x, t)
            try:
                assert_close_attention(o, lse, o_ref, lse_ref, what=f"{text} against {base}", **tolerances(spec))
            except AssertionError as e:
                bad[text] = str(e)
    return bad


def tune(spec: Spec, budget_s: float, on_bucket: Callable[[Bucket, dict], None] | None = None,
         seed: int = 1234, only: tuple[str, ...] = ()) -> Table:
    """Tune `spec` on the current GPU within about `budget_s` seconds (the buckets not reached keep
    the previous table's choice). Each bucket: every candidate timed once on the same inputs, the
    heuristic tiling once more for the noise; tuning.decide picks among those that agree with the
    heuristic plan on the bucket's shape (the others are reported as "rejected"). `only`: the
    buckets whose key starts with one of these (e.g. "decode/"); the others keep their choice."""
    start = time.monotonic()
    here = arch_for_capability(*torch.cuda.get_device_capability())
    heuristic = designs.choose(spec, here)
    base = designs.text(heuristic)
    mods = {base: Module(spec, tiles=heuristic)}
    for tiles in candidates(spec, here):
        mods.setdefault(designs.text(tiles), Module(spec, tiles=tiles))
    arch, device = here.name, mods[base].device
    old = find_table(spec, arch)
    generator = torch.Generator(device=device).manual_seed(seed)
    choices = dict(old.choices) if old else {}
    for bucket in selected(only):
        if time.monotonic() - start > budget_s:
            break
        rejected = disagreeing(mods, base, spec, bucket, generator)
        times = {text: time_rotation(_calls(m, spec, bucket, generator)) for text, m in mods.items()
                 if text not in rejected}
        again = time_rotation(_calls(mods[base], spec, bucket, generator))
        noise = abs(again - times[base]) / times[base]
        previous = old.tiles_for(bucket) if old else None
        incumbent = designs.text(previous) if previous else base
        chosen = decide(times, incumbent, noise)
        choices[bucket.key] = Choice(mods[chosen].plan.tiles, times[chosen], times[base], noise)
        if on_bucket:
            on_bucket(bucket, {"times": times, "noise": noise, "chosen": chosen, "rejected": rejected})
        torch.cuda.empty_cache()
    return Table(spec.name, spec_digest(spec), arch, __version__, torch.cuda.get_device_name(device), choices)
