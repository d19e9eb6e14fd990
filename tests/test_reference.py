"""The float64 reference, the mask helpers and the test-input helpers, checked on the CPU against
naive per-row computations written straight from DESIGN §5."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest
import torch

from kgen import fp8
from kgen import reference as ref
from kgen.mask import mask_from_dense, mask_from_parents, mask_from_sglang, static_mask_words, unpack_bits
from kgen.inputs import TREE_KINDS, Dims, make_verify_inputs, poison_, tree_parents
from kgen.accuracy import assert_all_written, assert_close_attention

# Small dims keep the CPU tests fast; 40 nodes span two mask words.
DIMS = Dims(num_heads=3, head_dim=64, value_dim=48, scale=0.2, max_nodes=40)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def ancestors(parents: list[int], i: int) -> set[int]:
    seen = set()
    while i != -1:
        seen.add(i)
        i = parents[i]
    return seen


def naive_verify(inp, prefix=True, tree=True):
    """One softmax per (row, head) over an explicit list of key rows: prefix slots computed with
    Python integers, tree keys from an ancestor walk (or the raw mask bits for "bits" masks)."""
    q, cache, k_tree = inp.q.double(), inp.kv_cache.double(), inp.k_tree.double()
    qo, kv_indptr, kv_indices, kv_lens = (t.tolist() for t in (inp.qo_indptr, inp.kv_indptr, inp.kv_indices,
                                                                 inp.kv_lens))
    words, p, dv = inp.tree_mask.tolist(), inp.page_size, inp.value_dim
    o = torch.zeros(q.shape[0], q.shape[1], dv, dtype=torch.float64)
    lse = torch.full(q.shape[:2], -math.inf, dtype=torch.float64)
    for b in range(len(qo) - 1):
        for i in range(qo[b], qo[b + 1]):
            keys = [cache[kv_indices[kv_indptr[b] + t // p] * p + t % p] for t in range(kv_lens[b])] if prefix else []
            if tree:
                n, local = qo[b + 1] - qo[b], i - qo[b]
                if inp.parents is not None:
                    seen = ancestors(inp.parents[b].tolist(), local)
                else:
                    seen = {j for j in range(n) if (words[i][j // 32] >> (j % 32)) & 1}
                keys += [k_tree[qo[b] + j] for j in sorted(seen)]
            if not keys:
                continue
            k = torch.stack(keys)
            for h in range(q.shape[1]):
                logits = inp.scale * (k @ q[i, h])
                lse[i, h] = torch.logsumexp(logits, 0)
                o[i, h] = torch.softmax(logits, 0) @ k[:, :dv]
    return o, lse


def assert_same(a, b, tol=1e-12):
    torch.testing.assert_close(a[0], b[0], rtol=tol, atol=tol)
    torch.testing.assert_close(a[1], b[1], rtol=tol, atol=tol)  # -inf must match -inf


# ---- attention reference -------------------------------------------------------------------

@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("tree_kind", TREE_KINDS)
def test_reference_matches_naive_per_row_softmax(seed, tree_kind, page_size):
    inp = make_verify_inputs(DIMS, [5, 0, 40, 1, 7], [0, 9, 70, 1, 64], page_size=page_size, tree_kind=tree_kind,
                             generator=gen(seed))
    assert_same(inp.verify_ref(), naive_verify(inp))
    assert_same(inp.prefix_ref(), naive_verify(inp, tree=False))
    assert_same(inp.tree_ref(), naive_verify(inp, prefix=False))


@pytest.mark.parametrize("tree_kind", TREE_KINDS)
def test_verify_equals_merge_of_prefix_and_tree(seed, tree_kind):
    rng = random.Random(seed)
    sizes = [rng.randint(0, DIMS.max_nodes) for _ in range(6)]
    lens = [rng.choice([0, 1, rng.randint(1, 300)]) for _ in range(6)]
    inp = make_verify_inputs(DIMS, sizes, lens, page_size=16, tree_kind=tree_kind, generator=gen(seed))
    assert_same(inp.verify_ref(), ref.merge_states_ref(*inp.prefix_ref(), *inp.tree_ref()))


def test_row_seeing_only_itself_returns_its_own_value_row(seed):
    inp = make_verify_inputs(DIMS, [6, 1], [0, 0], tree_kind="star", generator=gen(seed))
    o, lse = inp.verify_ref()
    for row in (0, 6):  # the star's root and a one-node tree see only themselves
        k = inp.k_tree[row].double()
        torch.testing.assert_close(o[row], k[:DIMS.value_dim].expand(DIMS.num_heads, -1), rtol=0, atol=1e-15)
        torch.testing.assert_close(lse[row], DIMS.scale * (inp.q[row].double() @ k), rtol=1e-15, atol=1e-15)


def test_empty_prefix_empty_tree_and_blind_rows(seed):
    inp = make_verify_inputs(DIMS, [0, 3, 0, 2], [5, 0, 0, 4], generator=gen(seed))
    inp.tree_mask[0] = 0  # request 1 (L = 0), row 0: sees nothing at all
    inp.parents = None  # the mask is no longer the parents' tree: naive_verify reads its bits
    o, lse = inp.verify_ref()
    assert o.shape == (5, DIMS.num_heads, DIMS.value_dim) and lse.dtype == torch.float64
    assert torch.isneginf(lse[0]).all() and (o[0] == 0).all()
    assert torch.isfinite(lse[1:]).all()
    po, plse = inp.prefix_ref()  # request 1 has no prefix: -inf; request 3 has one
    assert torch.isneginf(plse[:3]).all() and (po[:3] == 0).all() and torch.isfinite(plse[3:]).all()
    assert_same((o, lse), naive_verify(inp))


@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_scattered_pages_give_the_same_result_as_a_contiguous_prefix(seed, page_size):
    g, rng = gen(seed), random.Random(seed)
    lens = [rng.choice([0, 1, page_size, page_size + 1, rng.randint(1, 200)]) for _ in range(5)]
    inp = make_verify_inputs(DIMS, [rng.randint(1, DIMS.max_nodes) for _ in lens], lens, generator=g)

    def verify(cache, pages_per_request, indices, page):
        return ref.verify_attention_ref(inp.q, cache, inp.k_tree, inp.qo_indptr,
                                        torch.tensor([0, *pages_per_request]).cumsum(0).int(),
                                        torch.tensor(indices, dtype=torch.int32), inp.kv_lens, inp.tree_mask, page,
                                        DIMS.scale, DIMS.value_dim)

    rows = torch.randn(sum(lens), DIMS.head_dim, generator=g).bfloat16()  # the prefixes, end to end
    contiguous = verify(rows, lens, list(range(sum(lens))), 1)
    # The same rows, laid out by hand in a shuffled pool of pages with NaN in the unused slots.
    need = [math.ceil(length / page_size) for length in lens]
    pool = torch.randperm(sum(need) + 3, generator=g).tolist()
    cache = torch.full((len(pool) * page_size, DIMS.head_dim), float("nan"), dtype=torch.bfloat16)
    indices, token = [], 0
    for length, count in zip(lens, need):
        pages, pool = pool[:count], pool[count:]
        for t in range(length):
            cache[pages[t // page_size] * page_size + t % page_size] = rows[token]
            token += 1
        indices += pages
    assert_same(verify(cache, need, indices, page_size), contiguous, tol=0)


def test_cache_with_a_singleton_middle_dim_reads_the_same(seed):
    inp = make_verify_inputs(DIMS, [4, 9], [33, 17], page_size=16, generator=gen(seed))
    wide = ref.verify_attention_ref(inp.q, inp.kv_cache.unsqueeze(1), inp.k_tree, inp.qo_indptr, inp.kv_indptr,
                                    inp.kv_indices, inp.kv_lens, inp.tree_mask, 16, DIMS.scale, DIMS.value_dim)
    assert_same(wide, inp.verify_ref(), tol=0)


def test_reference_at_full_mla_width(seed):
    dims = Dims(num_heads=2, max_nodes=16, page_size=64)  # D 576, Dv 512, scale 0.0625
    inp = make_verify_inputs(dims, [16, 3], [100, 64], generator=gen(seed))
    o, lse = inp.verify_ref()
    assert o.shape == (19, 2, 512)
    assert_same((o, lse), naive_verify(inp))


# ---- mask helpers ----------------------------------------------------------------------------

@pytest.mark.parametrize("nodes", [1, 31, 32, 33, 70])
@pytest.mark.parametrize("kind", ["random", "chain", "star"])
def test_mask_from_parents_matches_an_ancestor_walk(seed, kind, nodes):
    batch = 4
    parents = tree_parents(kind, batch, nodes, generator=gen(seed), device="cpu")
    counts = torch.randint(0, nodes + 1, (batch,), generator=gen(seed + 1))
    counts[0] = nodes
    mask = mask_from_parents(parents, counts, words=3)
    assert mask.shape == (int(counts.sum()), 3) and mask.dtype == torch.int32
    rows = iter(mask)
    for b in range(batch):
        for i in range(int(counts[b])):
            row = next(rows)
            expected = ancestors(parents[b].tolist(), i)
            assert set(unpack_bits(row[None], 96)[0].nonzero().view(-1).tolist()) == expected
            assert set(ref.tree_visibility(row[None], 96)[0].nonzero().view(-1).tolist()) == expected


def test_mask_bit_layout_is_word_j_div_32_bit_j_mod_32():
    mask = mask_from_parents(torch.arange(40).unsqueeze(0) - 1)  # a chain: row i sees 0..i
    assert mask.shape == (40, 2)
    assert mask[0].tolist() == [1, 0]
    assert mask[30].tolist() == [2**31 - 1, 0]
    assert mask[31].tolist() == [-1, 0]  # bit 31 is the int32 sign bit
    assert mask[39].tolist() == [-1, 0xFF]


def test_mask_from_sglang_reads_the_tree_part_of_each_request(seed):
    n, g = 7, gen(seed)
    seq_lens = torch.tensor([0, 5, 13])
    parents = tree_parents("random", 3, n, generator=g, device="cpu")
    vis = torch.zeros(3, n, n, dtype=torch.bool)
    for b in range(3):
        for i in range(n):
            vis[b, i, sorted(ancestors(parents[b].tolist(), i))] = True
    # SGLang: per request [N, prefix + N] bool row-major (the prefix all visible), concatenated.
    flat = torch.cat([torch.cat([torch.ones(n, int(s), dtype=torch.bool), vis[b]], 1).reshape(-1)
                      for b, s in enumerate(seq_lens)])
    assert torch.equal(mask_from_sglang(flat, seq_lens, n, words=1), mask_from_parents(parents, words=1))


def test_mask_from_dense_and_static_words_agree_with_parents(seed):
    parents = tree_parents("random", 2, 45, generator=gen(seed), device="cpu")
    mask = mask_from_parents(parents, words=2)
    assert torch.equal(mask_from_dense(unpack_bits(mask, 45), 2), mask)
    words = static_mask_words(tuple(parents[0].tolist()))
    assert words == [w & 0xFFFFFFFF for w in mask[:45].reshape(-1).tolist()]


# ---- merge_states_ref --------------------------------------------------------------------------

def random_state(g, rows=50, heads=3, dim=8, empty=0.2):
    o = torch.randn(rows, heads, dim, generator=g, dtype=torch.float64)
    lse = torch.randn(rows, heads, generator=g, dtype=torch.float64) * 4
    blind = torch.rand(rows, heads, generator=g) < empty
    return torch.where(blind.unsqueeze(-1), float("nan"), o), lse.masked_fill(blind, -math.inf)


def test_merge_equals_attention_over_the_united_keys(seed):
    g = gen(seed)
    q = torch.randn(30, 3, 16, generator=g, dtype=torch.float64)
    keys = torch.randn(50, 16, generator=g, dtype=torch.float64)
    visible = torch.rand(30, 50, generator=g) < 0.3
    part = torch.rand(30, 50, generator=g) < 0.5
    visible[:3] = False  # rows that see nothing at all
    visible[3:6] &= part[3:6]  # rows that see keys of one part only
    whole = ref.attend(q, keys, visible, 0.3, 12)
    merged = ref.merge_states_ref(*ref.attend(q, keys, visible & part, 0.3, 12),
                                  *ref.attend(q, keys, visible & ~part, 0.3, 12))
    assert_same(merged, whole)
    assert torch.isneginf(whole[1][:3]).all() and (whole[0][:3] == 0).all()


def test_merge_is_commutative_and_associative_and_ignores_blind_states(seed):
    g = gen(seed)
    a, b, c = random_state(g), random_state(g), random_state(g)
    assert_same(ref.merge_states_ref(*a, *b), ref.merge_states_ref(*b, *a))
    assert_same(ref.merge_states_ref(*ref.merge_states_ref(*a, *b), *c),
                ref.merge_states_ref(*a, *ref.merge_states_ref(*b, *c)))
    blind = (torch.full_like(a[0], float("nan")), torch.full_like(a[1], -math.inf))
    o, lse = ref.merge_states_ref(*a, *blind)
    seen = torch.isfinite(a[1])
    assert torch.equal(lse, a[1]) and torch.equal(o[seen], a[0][seen]) and (o[~seen] == 0).all()


# ---- defrag_ref --------------------------------------------------------------------------------

def test_defrag_moves_read_before_write():
    cache = torch.arange(10, dtype=torch.float32).repeat_interleave(4).view(10, 4)
    stacked = torch.stack([cache, cache + 100])
    src, dst = torch.tensor([1, 2, 5, 6, 7]), torch.tensor([2, 1, 6, 7, 8])  # a swap and a chain
    moved = ref.defrag_ref(stacked, src, dst)
    expected = torch.tensor([0, 2, 1, 3, 4, 5, 5, 6, 7, 9], dtype=torch.float32)
    assert torch.equal(moved[:, :, 0], torch.stack([expected, expected + 100]))
    assert stacked[0, :, 0].tolist() == list(range(10))  # the input is untouched
    as_list = ref.defrag_ref([stacked[0].unsqueeze(1), stacked[1].unsqueeze(1)], src, dst)
    assert torch.equal(torch.stack(as_list).squeeze(2), moved)


def test_defrag_cycle_rotates_and_duplicate_destinations_are_rejected():
    cache = torch.arange(6, dtype=torch.int32).view(1, 6, 1)
    moved = ref.defrag_ref(cache, torch.tensor([0, 3, 5]), torch.tensor([3, 5, 0]))  # 0 -> 3 -> 5 -> 0
    assert moved.view(-1).tolist() == [5, 1, 2, 0, 4, 3]
    with pytest.raises(ValueError, match="dst"):
        ref.defrag_ref(cache, torch.tensor([0, 1]), torch.tensor([2, 2]))


# ---- kgen.inputs, kgen.accuracy---------------------------------------------------------------------------

@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_verify_inputs_scatter_pages_and_poison_unused_slots(seed, page_size):
    lens = [0, 1, 17, 64, 130]
    inp = make_verify_inputs(DIMS, [3, 1, 40, 2, 0], lens, page_size=page_size, generator=gen(seed))
    pages = inp.kv_indices.long()
    assert pages.unique().numel() == pages.numel() and inp.kv_cache.shape[0] % page_size == 0
    assert inp.kv_indptr.tolist()[-1] == pages.numel() == sum(math.ceil(n / page_size) for n in lens)
    used = torch.zeros(inp.kv_cache.shape[0], dtype=torch.bool)
    for b, length in enumerate(lens):
        t = torch.arange(length)
        used[pages[inp.kv_indptr[b] + t // page_size] * page_size + t % page_size] = True
    assert torch.isnan(inp.kv_cache[~used]).all() and (~used).sum() >= page_size  # spare pages exist
    # drawn from N(0, 1): finite and nonzero, apart from the ~1e-7 of bf16 draws that round to 0
    for drawn in (inp.kv_cache[used], inp.q, inp.k_tree):
        assert torch.isfinite(drawn).all() and (drawn == 0).float().mean() < 1e-3
    assert inp.q.dtype == inp.kv_cache.dtype == inp.k_tree.dtype == torch.bfloat16
    assert all(t.dtype == torch.int32 for t in (inp.qo_indptr, inp.kv_indptr, inp.kv_indices, inp.kv_lens,
                                                 inp.tree_mask))
    assert inp.tree_mask.shape == (46, 2)


def test_static_tree_inputs_use_the_spec_tree(seed):
    dims = Dims(num_heads=2, head_dim=64, value_dim=64, max_nodes=5, parents=(-1, 0, 0, 1, 2))
    inp = make_verify_inputs(dims, [5, 5], [3, 0], generator=gen(seed))
    assert inp.op_mask is None and inp.tree_args()[-1] is None and inp.verify_args()[-1] is None
    assert inp.tree_mask.view(-1).tolist() == static_mask_words(dims.parents) * 2
    with pytest.raises(ValueError, match="static tree"):
        make_verify_inputs(dims, [4], [0])


def test_poison_and_assert_all_written():
    for t in (torch.empty(3, 4, dtype=torch.bfloat16), torch.empty(5, dtype=torch.int32)):
        poison_(t)
        with pytest.raises(AssertionError, match="12 of 12|5 of 5"):
            assert_all_written(t, "out")
        t.view(-1)[:] = 1
        t.view(-1)[-1] = poison_(t.view(-1)[-1:].clone())[0]
        with pytest.raises(AssertionError, match=r"1 of \d+ elements"):
            assert_all_written(t, "out")
        t.view(-1)[-1] = 2
        assert_all_written(t, "out")


def test_comparator_accepts_bf16_rounding_and_rejects_real_errors(seed):
    inp = make_verify_inputs(DIMS, [3, 8], [0, 20], generator=gen(seed))
    inp.tree_mask[0] = 0  # row 0 sees nothing
    o_ref, lse_ref = inp.verify_ref()
    o, lse = o_ref.to(torch.bfloat16), lse_ref.float()
    assert_close_attention(o, lse, o_ref, lse_ref)

    def rejects(o_bad, lse_bad, match):
        with pytest.raises(AssertionError, match=match):
            assert_close_attention(o_bad, lse_bad, o_ref, lse_ref)

    def changed(t, index, value):
        t = t.clone()
        t[index] = value
        return t

    rejects(changed(o, (5, 0, 3), float("nan")), lse, "o has 1 NaN")
    rejects(o, changed(lse, 0, float("nan")), "lse has 3 NaN")
    rejects(o, changed(lse, (1, 2), -math.inf), "disagree on -inf")
    rejects(o, changed(lse, (0, 1), 0.0), "disagree on -inf")
    rejects(changed(o, 0, 1.0), lse, "see no key but o != 0")
    rejects(o * 1.05, lse, "relative L2 error")
    rejects(o, lse + 0.01, "lse error")
    rejects(o[:-1], lse[:-1], "shapes")


def test_comparator_finds_one_broken_row_in_a_good_average(seed):
    o_ref, lse_ref = make_verify_inputs(DIMS, [40, 40, 40], [10, 50, 0], generator=gen(seed)).verify_ref()
    o = o_ref.to(torch.bfloat16)
    # Break the smallest row that sees keys: its share of ||o|| is at most 1/sqrt(rows), so 10% off
    # there stays under the whole-output tolerance on every seed (a large early-tree row would not).
    row_norm = torch.linalg.vector_norm(o_ref, dim=-1)
    token, head = divmod(int(torch.where(row_norm > 0, row_norm, math.inf).argmin()), o_ref.shape[1])
    o[token, head] *= 1.1
    whole = (torch.linalg.vector_norm(o.double() - o_ref) / torch.linalg.vector_norm(o_ref)).item()
    assert whole < 1e-2, f"the broken row must hide in the average, but the whole output is {whole:.2e} off"
    with pytest.raises(AssertionError, match=rf"row \(token, head\) \({token}, {head}\) has relative L2 error"):
        assert_close_attention(o, lse_ref, o_ref, lse_ref)


def test_fp8_inputs_mean_their_dequantized_values(seed):
    """An e4m3 cache with kv_scale means byte * kv_scale: the reference on it equals the reference
    on a bf16-free float cache holding those values, and tree keys are quantized the same way."""
    inp = make_verify_inputs(DIMS, [5, 9], [70, 3], page_size=4, generator=gen(seed))
    scale = 0.37
    q8 = inp.to_fp8(scale)
    assert q8.kv_cache.dtype == torch.float8_e4m3fn and q8.kv_fp8 and q8.kv_scale == scale
    dequantized = fp8.dequantize(q8.kv_cache, scale)
    err = (dequantized - inp.kv_cache.double()).abs()
    used = ~torch.isnan(inp.kv_cache).any(-1)
    assert (err[used] <= inp.kv_cache.double().abs()[used] * 2 ** -4 + 2 ** -9 * scale).all()  # e4m3 rounding
    as_values = replace(inp, kv_cache=dequantized, k_tree=q8.ref_k_tree)
    for got, want in zip(q8.verify_ref(), as_values.verify_ref()):
        torch.testing.assert_close(got, want, equal_nan=True, rtol=0, atol=0)


def test_fp8_quantize_saturates_instead_of_making_nan():
    x = torch.tensor([1e6, -1e6, 448.0, 0.0, 3.0])
    assert fp8.quantize(x, 1.0).float().tolist() == [448.0, -448.0, 448.0, 0.0, 3.0]
    assert fp8.quantize(x, 2.0).float().tolist()[-1] == 1.5


@pytest.mark.parametrize("bad,error", [(0.0, ValueError), (float("nan"), ValueError), (-1.0, ValueError),
                                       (torch.tensor(1.0), TypeError), (True, TypeError)])
def test_fp8_scale_must_be_a_positive_python_number(bad, error):
    with pytest.raises(error, match="kv_scale"):
        fp8.check_scale(bad)
