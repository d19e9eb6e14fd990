"""The declarative spec: what model, cache, tree and target a kernel set is generated for.

A spec is a frozen pydantic model loaded from YAML. Every field is checked here, and a bad
value is reported as one line naming the file, the field, the value and what is allowed.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

import networkx as nx
import yaml
from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError, field_validator, model_validator

from .arch import ARCHS
from .errors import SpecError

MAX_TREE_NODES = 1024
MAX_INDEX_TOPK = 1 << 16
KV_DTYPES = ("bfloat16", "float8_e4m3fn")  # fp8: value = stored e4m3 * a per-tensor kv_scale
# MMA precision of an fp8 cache (docs/fp8.md): "f16" converts K/V exactly to f16 and keeps Q and P
# in f16 (only the cache's rounding remains); "e4m3" also rounds Q (scaled per row) and P to e4m3
# for native fp8 MMAs (twice the rate on sm_120, a documented error).
FP8_MMA_TYPES = ("f16", "e4m3")
# Where an fp8 cache's scales live: "per_tensor" (one kv_scale per cache tensor, a launch argument) or
# "per_block" (SGLang's DSA pool: each row carries one fp32 scale per 128 latent dims, rope in bf16).
KV_SCALES = ("per_tensor", "per_block")
SCALE_BLOCK = 128  # latent dims per per-block scale (DSATokenToKVPool.quant_block_size)


class _Strict(BaseModel):
    # strict: a YAML value of the wrong type is an error, not converted (`true` is not a head
    # count, "8" is not 8); a float field still takes an integer.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class ModelSpec(_Strict):
    """Absorbed-MLA dims of one GPU's shard of the model."""

    num_q_heads: int = Field(ge=1, le=128)
    kv_lora_rank: int = Field(ge=64, le=1024)
    qk_rope_head_dim: int = Field(ge=64, le=256)
    softmax_scale: float = Field(gt=0)
    # DSA (DeepSeek sparse attention): each query token attends the index_topk prefix tokens its
    # indexer lists (GLM-5: 2048), plus its tree (DESIGN §12); absent = dense attention.
    index_topk: int | None = Field(default=None, ge=1, le=MAX_INDEX_TOPK)

    @field_validator("kv_lora_rank", "qk_rope_head_dim")
    @classmethod
    def _multiple_of_64(cls, v: int) -> int:
        # The attention kernels split these dims over 4 warp groups of 16-wide MMA tiles.
        if v % 64:
            raise ValueError("must be a multiple of 64")
        return v

    @field_validator("softmax_scale")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("must be a finite number")
        return v

    @property
    def head_dim(self) -> int:
        """Query/key width: latent + rope."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def value_dim(self) -> int:
        return self.kv_lora_rank

    @property
    def sparse(self) -> bool:
        return self.index_topk is not None


class CacheSpec(_Strict):
    page_size: int = Field(ge=1, le=1024)
    kv_dtype: Literal[KV_DTYPES] = "bfloat16"  # type: ignore[valid-type]
    mma: Literal[FP8_MMA_TYPES] | None = None  # type: ignore[valid-type]  # fp8 caches only; default f16
    scales: Literal[KV_SCALES] | None = None  # type: ignore[valid-type]  # fp8 caches only; default per_tensor

    @field_validator("mma", mode="before")
    @classmethod
    def _no_bf16_mode(cls, v: object) -> object:
        if v == "bf16":
            raise ValueError("an fp8 cache's 16-bit mode is f16: every e4m3 value converts to f16 exactly in one "
                             "instruction, and f16 keeps more of Q and P than bf16; use f16 or e4m3")
        return v

    @property
    def mma_type(self) -> str:
        """The MMA input type of the attention kernels: bf16, f16 or e4m3."""
        return "bf16" if self.kv_dtype == "bfloat16" else self.mma or "f16"

    @property
    def per_block(self) -> bool:
        """Rows in the DSA pool's scaled format (kgen.kvrows.scaled_row_bytes)."""
        return self.scales == "per_block"

    @field_validator("page_size")
    @classmethod
    def _power_of_two(cls, v: int) -> int:
        if v & (v - 1):
            raise ValueError("must be a power of two (1, 2, 4, ... 1024)")
        return v


class TreeSpec(_Strict):
    """Either a dynamic tree (mask given per call, up to max_nodes) or a static one (parents)."""

    max_nodes: int | None = Field(default=None, ge=1, le=MAX_TREE_NODES)
    parents: tuple[StrictInt, ...] | None = Field(default=None, strict=False)  # a YAML list

    @model_validator(mode="after")
    def _one_shape(self) -> "TreeSpec":
        if self.parents is None:
            if self.max_nodes is None:
                raise ValueError("give max_nodes (dynamic tree) or parents (static tree)")
            return self
        n = len(self.parents)
        if not 1 <= n <= MAX_TREE_NODES:
            raise ValueError(f"parents must list 1 to {MAX_TREE_NODES} nodes, got {n}")
        if self.max_nodes is not None and self.max_nodes != n:
            raise ValueError(f"max_nodes {self.max_nodes} disagrees with the {n} nodes of parents")
        _check_tree(self.parents)
        return self

    @property
    def nodes(self) -> int:
        return len(self.parents) if self.parents is not None else self.max_nodes  # type: ignore[return-value]

    @property
    def is_static(self) -> bool:
        return self.parents is not None

    @property
    def mask_words(self) -> int:
        """int32 words per tree_mask row."""
        return (self.nodes + 31) // 32


def _check_tree(parents: tuple[int, ...]) -> None:
    n = len(parents)
    bad = [p for p in parents if p != -1 and not 0 <= p < n]
    if bad:
        raise ValueError(f"parent {bad[0]} is not a node index (0..{n - 1}) or -1")
    graph = nx.DiGraph()
    graph.add_nodes_from(range(n))
    graph.add_edges_from((p, i) for i, p in enumerate(parents) if p != -1)
    try:
        cycle = nx.find_cycle(graph)
    except nx.NetworkXNoCycle:
        cycle = None
    if cycle:
        path = " -> ".join(str(u) for u, _ in cycle) + f" -> {cycle[0][0]}"
        raise ValueError(f"parents form a cycle ({path})")
    roots = [i for i, p in enumerate(parents) if p == -1]
    if len(roots) != 1:
        raise ValueError(f"a tree has exactly one root (parent -1), found {len(roots)}: nodes {roots}")
    late = [(i, p) for i, p in enumerate(parents) if p >= i]
    if late:
        i, p = late[0]
        raise ValueError(f"node {i} has parent {p}: parents must come before their children")
    assert nx.is_arborescence(graph)


class TargetSpec(_Strict):
    arch: str

    @field_validator("arch")
    @classmethod
    def _known_arch(cls, v: str) -> str:
        if v not in ARCHS:
            raise ValueError(f"unknown arch; known: {', '.join(sorted(ARCHS))}")
        return v


class Spec(_Strict):
    name: str = Field(pattern=r"^[a-z][a-z0-9_]{0,63}$")
    model: ModelSpec
    cache: CacheSpec
    tree: TreeSpec
    target: TargetSpec

    @model_validator(mode="after")
    def _fp8(self) -> "Spec":
        if self.cache.mma is not None and self.cache.kv_dtype != "float8_e4m3fn":
            raise ValueError(f"cache.mma = {self.cache.mma!r} chooses the MMA precision of a float8_e4m3fn cache; "
                             f"a {self.cache.kv_dtype} cache always runs bf16 MMAs (remove cache.mma)")
        if self.cache.scales is not None and self.cache.kv_dtype != "float8_e4m3fn":
            raise ValueError(f"cache.scales = {self.cache.scales!r} says where the scales of a float8_e4m3fn cache "
                             f"live; a {self.cache.kv_dtype} cache has none (remove cache.scales)")
        m = self.model
        if self.cache.per_block and (m.kv_lora_rank % SCALE_BLOCK or m.kv_lora_rank // SCALE_BLOCK != 4):
            # The kernels' 4 warp groups own one 128-dim scale block each (templates/attention.cuh).
            raise ValueError(f"cache.scales per_block needs model.kv_lora_rank = 4 x {SCALE_BLOCK} = 512 "
                             f"(one scale block per warp group), got {m.kv_lora_rank}")
        # e4m3 MMAs step 32 dims at a time; each of the 4 warp groups owns kv_lora_rank / 4 of them.
        if self.cache.mma_type == "e4m3" and self.model.kv_lora_rank % 128:
            raise ValueError(f"cache.mma e4m3 needs model.kv_lora_rank a multiple of 128, "
                             f"got {self.model.kv_lora_rank}")
        return self


def _describe(err: dict, source: str) -> str:
    loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
    if err["type"] == "extra_forbidden":
        return f"{source}: {loc}: unknown key"
    if err["type"] == "missing":
        return f"{source}: {loc}: required field is missing"
    msg = err["msg"].removeprefix("Value error, ")
    if not err["loc"]:  # a check across fields names them itself
        return f"{source}: {msg}"
    return f"{source}: {loc} = {err.get('input')!r}: {msg}"


def parse_spec(data: object, source: str = "<spec>") -> Spec:
    """Validate a mapping (already parsed YAML) into a Spec; errors name `source`."""
    if not isinstance(data, dict):
        raise SpecError(f"{source}: a spec is a YAML mapping, got {type(data).__name__}")
    try:
        return Spec.model_validate(data)
    except ValidationError as e:
        lines = [_describe(err, source) for err in e.errors()]
        raise SpecError("; ".join(lines)) from None


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, but a key given twice in one mapping is an error: plain YAML keeps the
    last value silently, so a spec would run with a value its author may not have meant."""

    def construct_mapping(self, node, deep=False):
        seen = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is given twice (first on line {seen[key]}); give each key once",
                    key_node.start_mark)
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


def load_spec(path: str | Path) -> Spec:
    """Load and validate a spec file."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise SpecError(f"{path}: cannot read spec ({e.strerror})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SpecError(f"{path}: not a YAML text file (byte {raw[e.start]:#04x} at offset {e.start} is not UTF-8); "
                        f"a spec is UTF-8 YAML like specs/glm5_sm120.yaml") from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.MarkedYAMLError as e:
        where = f", line {e.problem_mark.line + 1}" if e.problem_mark else ""
        raise SpecError(f"{path}{where}: not valid YAML ({e.problem or e.context})") from None
    except yaml.YAMLError as e:
        raise SpecError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
    return parse_spec(data, str(path))
