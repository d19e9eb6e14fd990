"""The sparse (DSA) kernels of a spec with model.index_topk (DESIGN §12, templates/sparse_attention.cuh).

Both arch plans run the sparse loop on the mma.sync design (the sm_120 loop; on sm_90 the wgmma
loop's sparse kernels measured slower: bench/NOTES.md v22s): each CTA builds its key list in a
shared-memory hash set that lives in the KV ring before the ring is used, so the set's size
follows from the tiling.
"""

from __future__ import annotations

from dataclasses import replace

from . import kvrows
from .designs import mma_sync
from .designs.mma_sync import MmaSyncTiles
from .errors import PlanError
from .occupancy import ctas_by_smem
from .spec import Spec
from .splitkv import ceil_div
from .variant import BF16, PlanContext, Variant

SPARSE_KERNELS = ("sparse_verify_attn", "sparse_gather_attn")  # union (the product), per-token gather (baseline)
MAX_TABLE = 8192  # hash-set entries (8 B each): 4096 keys per round
MIN_CHUNK = 64  # list entries a split reads at least, so partial states stay a small overhead
UNBOUNDED = (1 << 31) - 1  # the union kernel's splits have no size cap: a set that overflows runs in rounds
# The partial states' o in bf16, not fp32: at B = 1 the CTAs write (and the combine reads back) as
# many bytes of partial states as the listed rows hold (bench/NOTES.md v50); bf16 rounds each once
# more, within DESIGN §6's 1e-2 for the bf16 output. Their lse stays fp32.
PART_O = BF16
PART_O_BYTES = 2


# The sparse kernels built without the schedule table's read, by (plan arch, kernel, KV rows: bf16,
# fp8 with one scale, the DSA pool's scaled rows): with it, ptxas spilled them at their register cap
# (sm_120's fp8 rows: two CTAs of 5 warps an SM, 168 registers; the union kernel 116 B, the gather
# 84 B; bench/NOTES.md v86, s54a). Their CTAs find their work items themselves.
NO_TABLE = frozenset({("sm_120", "sparse_verify_attn", "fp8"), ("sm_120", "sparse_gather_attn", "fp8")})
# The sparse schedule's inputs but qo_indptr (templates/sparse_schedule.cuh SparseArgs): the sparse
# kernels and sparse_schedule declare them alike.
SCHEDULE_PARAMS = ("int topk_width", "int batch", "int target_ctas", "int min_chunk", "int max_chunk", "int max_nodes",
                   "int total_tokens", "int tree_apart")


def tile_tokens(heads: int, bm: int) -> int:
    """Tokens a row tile of bm packed (token, head) rows touches (TILE_TOKENS)."""
    return bm // heads if bm % heads == 0 else (bm - 1) // heads + 2


def request_splits(heads: int, bm: int, tokens: int, width: int, target: int, max_chunk: int = UNBOUNDED,
                   batch: int = 1) -> tuple[int, int]:
    """(row tiles, splits of each row tile's prefix entries) of each request the sparse schedule gives
    a batch of `batch` requests of `tokens` tree tokens each and lists `width` entries wide
    (templates/sparse_schedule.cuh write_sparse_item)."""
    row_tiles = ceil_div(tokens * heads, bm)
    entries = min(tokens, tile_tokens(heads, bm)) * width
    all_tiles = batch * row_tiles
    slots = target - all_tiles if all_tiles < target else target
    chunk = min(max_chunk, max(MIN_CHUNK, ceil_div(all_tiles * entries, slots)))
    return row_tiles, max(1, ceil_div(entries, chunk))


# Where a row tile holds 2 tokens or fewer, the union kernel runs only while a wave of CTAs gives each
# row tile at most this many splits (union_by_size), by the CTAs an SM holds: two (the sm_90 plan) or
# one (the sm_120 plan, whose CTA has its SM alone and gains more from each shared key).
UNION_MAX_SPLITS = {2: 6, 1: 12}


def union_by_size(heads: int, bm: int, num_tokens: int, target: int, ctas_per_sm: int) -> bool:
    """Whether a step of `num_tokens` tree tokens runs the union kernel (else the per-token gather)
    by its size. The union saves the keys a row tile's tokens list in common, and pays for a hash-set
    build in every split. A 2-token tile (16-row tiles at H = 8) saves ~1/3 of its keys. With many
    splits per row tile, each split has too few keys to repay its build, and the gather wins. H100,
    sm_90 plan, L131072 T16 (bench/NOTES.md v99), gather against union in us, lists 0.7 / 0.5 shared:
    B4 (8.25 splits a tile) 38.4 / 38.4 and 38.9 / 42.4, B6 (5.5) 55.4 / 51.9 and 55.8 / 58.1, B8 (4.1)
    64.9 / 61.0 and 66.6 / 69.5; one request: the gather up to T64 (8.25). So the edge lies between
    8.25 and 5.5 splits where two CTAs share an SM. Where one CTA has it (the sm_120 plan, run on the
    H100 in 132 CTAs: bench/NOTES.md s54a), the union at B2 T16 (8.25 splits) 37.8 / gather 40.6, at B1
    T16 (16.5) 28.0 / 27.4: the edge lies between 8.25 and 16.5. Tiles of more tokens always take the
    union."""
    if tile_tokens(heads, bm) > 2:
        return True
    row_tiles = ceil_div(num_tokens * heads, bm)
    return target <= UNION_MAX_SPLITS[min(ctas_per_sm, 2)] * row_tiles


def tree_apart(batch: int, row_tiles: int, splits: int, target: int) -> bool:
    """Whether each row tile's tree is a split of its own (SparseArgs::tree_apart) rather than riding
    on its last split: for one request, where its row tiles' R (S + 1) items still fit the wave of
    `target` CTAs. With the tree on it, the last split's CTA ended the call at B = 1 (the tree, up to
    2.8 us on the H100 after its keys: bench/NOTES.md v112); batches have no such room."""
    return batch == 1 and row_tiles * (splits + 1) <= target


def sparse_tiles(c: PlanContext) -> MmaSyncTiles:
    """The mma.sync tiling of the sparse kernels: 16-row tiles (one row block, 2 tokens at H = 8), the
    plan's own where it gives them (without clusters: the sparse schedule has none), else
    row_block_tiles, else the plan's own mma.sync tiling (a row tile's tokens must fit a 32-bit
    mask: BM <= 32) or the design's choice for the arch; with Q's tile apart from the ring where
    shared memory allows (its copies then overlap the key list's build: bench/NOTES.md v49)."""
    own = isinstance(c.tiles, MmaSyncTiles) and c.tiles.bm <= 32
    if own and c.tiles.bm == 16:
        return with_q_apart(c, replace(c.tiles, cluster=1))
    if rows := row_block_tiles(c):
        return rows
    return with_q_apart(c, replace(c.tiles, cluster=1) if own else mma_sync.DESIGN.choose(c.spec, c.arch))


def with_q_apart(c: PlanContext, t: MmaSyncTiles) -> MmaSyncTiles:
    """t with Q's tile apart from the ring where min_blocks CTAs of it still fit an SM."""
    apart = replace(t, q_apart=1)
    return apart if fits_sm(c, apart) else t


def fits_sm(c: PlanContext, t: MmaSyncTiles) -> bool:
    """Whether min_blocks CTAs of t fit the arch's shared memory, per block and per SM."""
    return ctas_by_smem(c.arch, t.smem_bytes(c.spec)) >= t.min_blocks


def row_block_tiles(c: PlanContext) -> MmaSyncTiles | None:
    """16-row tiles (one row block, 2 tokens at H = 8), two CTAs an SM where two fit, else one, at the
    deepest ring that fits: on sm_90 (228 KB an SM) two CTAs of 4 stages, on sm_120 (100 KB) one of 4.
    Two CTAs' chains cover each other's latencies, which bind the sparse loop whatever the row format
    (bench/NOTES.md s41e): on the H100, against 32-row tiles one CTA an SM, -1.5 us at B1 T16, -19% at
    B8, -15% at B32 and B64 (s41g). Where one CTA fits, a row block still does each (token, key) of
    the gather once and builds its union from 2 tokens' lists, not 4 (s54a)."""
    chosen = mma_sync.DESIGN.choose(c.spec, c.arch)
    for ctas in (2, 1):
        for stages in (4, 3, 2):
            t = with_q_apart(c, replace(chosen, bm=16, warps_m=1, stages=stages, min_blocks=ctas))
            if fits_sm(c, t):
                return t
    return None


def list_keys(c: PlanContext, t: MmaSyncTiles) -> int:
    """Keys of a CTA's list scratch: a row tile's list entries, which bound its distinct slots."""
    return tile_tokens(c.spec.model.num_q_heads, t.bm) * c.spec.model.index_topk


def set_bytes(table: int) -> int:
    """Shared memory of the hash set in the KV ring (SlotSet::BYTES): 8 B an entry and 136 B of
    counters and scan scratch."""
    return table * 8 + 136


# The warps' insertion queues follow the set (on into the partial-score region, idle while the list is
# built), 4 B an entry, LOADS x 32 entries a warp (templates/sparse_attention.cuh queue_loads: up to
# 32 loads a thread, fewer where the room before the barriers is short, never under MIN_QUEUE_LOADS).
MIN_QUEUE_LOADS = 16


def table_entries(c: PlanContext, t: MmaSyncTiles) -> int:
    """Entries of the shared-memory hash set, the largest power of two up to MAX_TABLE whose set
    fits the KV ring and leaves room for the insertion queues before the barriers."""
    layout = t.layout(c.spec)
    ring, room = layout["RING_BYTES"], layout["BAR_OFF"]
    queues = t.threads * 4 * MIN_QUEUE_LOADS
    table = MAX_TABLE
    while set_bytes(table) > ring or set_bytes(table) + queues > room:
        table //= 2
    if table < 1024:
        raise PlanError(f"{c.spec.name}: the sparse hash set needs at least 1024 entries in the KV ring "
                        f"({ring} B with {t.stages} stages) and its insertion queues {queues} B more")
    return table


def list_capacity(table: int) -> int:
    """Keys a union round holds (SlotSet::CAP), and what a gather split reads at most."""
    return table // 2


def sparse_variants(c: PlanContext) -> list[Variant]:
    """sparse_verify_attn and sparse_gather_attn; none for a dense spec. Launched to overlap the
    kernel before them (programmatic dependent launch: their CTAs are resident and waiting when it
    ends, rather than launched then; bench/NOTES.md v98)."""
    spec = c.spec
    if not spec.model.sparse:
        return []
    t = sparse_tiles(c)
    ctx = PlanContext(spec, c.arch, t, c.tag)
    kv = kvrows.ctype(spec)
    decls = (f"const {BF16}* __restrict__ q", f"const {kv}* __restrict__ kv_cache", "float kv_scale",
             f"const {kv}* __restrict__ k_tree", "const int* __restrict__ tree_mask",
             "const int* __restrict__ qo_indptr", "const int* __restrict__ topk_indices", *SCHEDULE_PARAMS,
             "int validate", "int* __restrict__ error_flag", "int4* __restrict__ req_meta",
             f"{PART_O}* __restrict__ part_o", "float* __restrict__ part_lse", "int* lists", "long long num_slots",
             "const int* __restrict__ schedule_table")
    table = table_entries(c, t)
    late = tile_tokens(spec.model.num_q_heads, t.bm) <= 8  # byte masks, held as loaded (bench/NOTES.md v106)
    constants = {"TABLE": table, "LIST_KEYS": list_keys(c, t), **ctx.tree_constants}
    return [replace(ctx.attention(name, "sparse_attn.cu.j2", {"UNION": name == "sparse_verify_attn",
                                                              "LATE_MASKS": late and name == "sparse_verify_attn",
                                                              "SCHEDULE_TABLE": reads_table(c, name), **constants},
                                  decls),
                    kernel="sparse_attn", waits_for_prior=True)
            for name in SPARSE_KERNELS]


def reads_table(c: PlanContext, kernel: str) -> bool:
    """Whether a sparse kernel takes its work items from a prepared step's schedule table
    (templates/sparse_schedule.cuh): all but NO_TABLE's."""
    return (c.arch.name, kernel, row_kind(c.spec)) not in NO_TABLE


def row_kind(spec: Spec) -> str:
    """The sparse kernels' KV rows, as NO_TABLE names them: bf16, fp8 (one scale) or
    scaled (the DSA pool's block-scaled rows)."""
    cache = spec.cache
    return "bf16" if cache.kv_dtype == "bfloat16" else "scaled" if cache.per_block else "fp8"


def sparse_bm(c: PlanContext) -> int:
    """BM of the sparse kernels' partial states (what their combine merges)."""
    return sparse_tiles(c).bm
