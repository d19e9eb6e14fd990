"""A Variant: one extern "C" entry point in one rendered source file, and what every kernel
entry plans it from (PlanContext)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from . import designs
from .arch import Arch
from .designs import Tiles
from .signature import Param
from .spec import Spec

LOG2E = 1.4426950408889634
BF16 = "__nv_bfloat16"


@dataclass(frozen=True)
class Variant:
    kernel: str  # the kernel entry it belongs to (kgen.kernels): prefix_attn, verify_attn, lse_combine, ...
    name: str  # what this entry point does, e.g. "lse_merge_bf16"
    template: str  # templates/<template>
    threads: int
    smem_bytes: int  # dynamic shared memory per block
    min_blocks: int  # second __launch_bounds__ argument: the occupancy the plan is built for
    constants: dict[str, object]  # injected into the template
    params: tuple[Param, ...]
    tag: str  # human-readable part of the id: h8_d576_ps1_bf16_sm120
    requires: tuple[str, ...] = ()  # arch features the cubin needs (e.g. "wgmma": only sm_90a runs it)
    sass_expect: tuple[str, ...] = ()  # instruction classes (kgen.sass) the compiled loop must contain
    # Launched to overlap the previous kernel on its stream (programmatic dependent launch): the
    # kernel waits for that kernel's end (common.cuh wait_for_prior_grid) before it reads its output.
    waits_for_prior: bool = False

    @property
    def digest(self) -> str:
        blob = json.dumps(
            [self.template, self.threads, self.smem_bytes, self.min_blocks, self.constants,
             [(p.name, p.ctype) for p in self.params]],
            sort_keys=True, default=str,
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    @property
    def variant_id(self) -> str:
        """Readable and unique; also the extern "C" symbol."""
        return f"{self.name}__{self.tag}__{self.digest}"


def params(*decls: str) -> tuple[Param, ...]:
    """Parameters from C declarations: "const int* __restrict__ qo_indptr"."""
    return tuple(Param(name, ctype) for ctype, name in (d.rsplit(" ", 1) for d in decls))


@dataclass(frozen=True)
class PlanContext:
    """What every kernel entry plans from: the spec, the arch, the attention tiling, the id tag."""

    spec: Spec
    arch: Arch
    tiles: Tiles
    tag: str

    @property
    def attention_smem(self) -> int:
        return self.tiles.smem_bytes(self.spec)

    @property
    def tree_constants(self) -> dict[str, object]:
        tree = self.spec.tree
        consts: dict[str, object] = {"MASK_WORDS": tree.mask_words, "STATIC_TREE": int(tree.is_static)}
        if tree.is_static:
            from .mask import static_mask_words  # local: the mask module is only needed for static trees
            consts["STATIC_MASK"] = static_mask_words(tree.parents)
        return consts

    def attention(self, kernel: str, template: str, constants: dict[str, object], decls: tuple[str, ...]) -> Variant:
        """An attention variant: the design's header and config, the tiling's threads and shared
        memory, the design's arch features and SASS expectations."""
        t, design = self.tiles, designs.of(self.tiles)
        base = {"HEADS": self.spec.model.num_q_heads, "DESIGN_HEADER": design.header, "CONFIG": t.config(self.spec),
                "CLUSTER": t.cluster,
                "SCALE_LOG2": self.spec.model.softmax_scale * LOG2E}
        return Variant(kernel=kernel, name=kernel, template=template, threads=t.threads,
                       smem_bytes=self.attention_smem, min_blocks=t.min_blocks, constants={**base, **constants},
                       params=params(*decls), tag=self.tag,
                       requires=design.requires + (("multicast",) if t.cluster > 1 else ()),
                       sass_expect=design.sass_expect)
