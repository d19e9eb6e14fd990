"""kgen's half of the SGLang DSA backend (kgen/integrations/sglang_dsa.py, KgenDSA), on the CPU and
without SGLang: SGLang's top-k lists and draft tree -> kgen's sparse verify inputs (DESIGN §12).

- split: the batch's own tree tokens are cut out of each row's list (the prefix part) and their
  selection is ANDed into the tree mask; a previous batch's tree tokens (prefix tokens now) stay
  in the prefix part; -1 entries anywhere; an empty prefix.
- hide_non_ancestors: the tree-aware indexer hides, in row i's logits, exactly the tree tokens
  that are not i's ancestors (or i).
- attend: one layer through a stand-in module whose sparse_verify_attention is the §12 reference
  (kgen.reference, through tests/sparse_reference.py), against attention computed straight from SGLang's lists and tree
  (a listed tree token counts where the tree shows it), bf16 and 656-byte fp8 rows; decode (T = 1).
- the CUDA-graph buffers: plan(graph=True) rewrites fixed buffers in place and gives the eager plan.
tests/test_sglang_dsa_sglang.py drives the SGLang side (the indexer hook, the registry, the
server-arg resolution) against the installed SGLang.
"""

from __future__ import annotations

import copy

import pytest
import torch
from sparse_reference import ReferenceModule, dequantize_rows

from kgen.fp8 import quantize_rows
from kgen.integrations.sglang_sparse import KgenDSA, physical_lists
from kgen.mask import mask_from_parents, unpack_bits
from kgen.reference import attend
from kgen.inputs import tree_parents

H, D, DV, SCALE = 4, 576, 512, 0.0625
SLOTS = 400


class Batch:
    """B requests of n tree tokens: prefix and tree slots scattered over the pool (slot 0 unused,
    as SGLang's padding slot), a random (or chain) tree, and each row's top-k list: a random part
    of its prefix slots and of its request's tree slots (ancestors or not), -1 padded, shuffled."""

    def __init__(self, prefix_lens, n, k, gen, *, chain=False, taken=()):
        self.prefix_lens, self.n, self.k = list(prefix_lens), n, k
        free = torch.tensor([s for s in torch.randperm(SLOTS - 1, generator=gen).add(1).tolist() if s not in taken])
        need = [length + n for length in prefix_lens]
        ends = torch.tensor(need).cumsum(0).tolist()
        self.prefix = [free[e - m:e - m + length] for e, m, length in zip(ends, need, prefix_lens)]
        self.tree_slots = torch.cat([free[e - n:e] for e in ends])
        parents = tree_parents("chain" if chain else "random", len(prefix_lens), n, generator=gen, device="cpu")
        self.tree_mask = mask_from_parents(parents, words=1)
        self.visible = unpack_bits(self.tree_mask, n)  # [R, n]: j is i's ancestor (or i)
        rows = []
        for b, length in enumerate(prefix_lens):
            mine = torch.cat([self.prefix[b], self.tree_slots[b * n:(b + 1) * n]])
            for _ in range(n):
                pick = mine[torch.randperm(mine.numel(), generator=gen)[:min(k, mine.numel()) - 1]]
                row = torch.cat([pick, torch.full((k - pick.numel(),), -1)])
                rows.append(row[torch.randperm(k, generator=gen)])
        self.lists = torch.stack(rows).to(torch.int32)

    def expected_split(self):
        prefix = self.lists.clone()
        picked = torch.zeros(self.lists.shape[0], self.n, dtype=torch.bool)
        for i, row in enumerate(self.lists.tolist()):
            b = i // self.n
            own = self.tree_slots[b * self.n:(b + 1) * self.n].tolist()
            for c, slot in enumerate(row):
                if slot in own:
                    prefix[i, c] = -1
                    picked[i, own.index(slot)] = True
        return prefix, picked & self.visible


def kgen_dsa(n=8, kv_dtype="bfloat16"):
    return KgenDSA(ReferenceModule(heads=H, index_topk=16, max_nodes=n, scale=SCALE, kv_dtype=kv_dtype), SLOTS)


@pytest.mark.parametrize("prefix_lens", [[7, 0, 12], [30]])
def test_split_cuts_the_batchs_tree_tokens_out_of_the_lists_into_the_mask(seed, prefix_lens):
    gen = torch.Generator().manual_seed(seed)
    kd = kgen_dsa()
    batch = Batch(prefix_lens, 5, 10, gen)
    tree = kd.plan(batch.tree_slots, torch.tensor(prefix_lens), 5, custom_mask=_sglang_mask(batch))
    prefix, mask = kd.split(batch.lists, tree)
    want_prefix, want_picked = batch.expected_split()
    assert prefix.dtype == torch.int32 and torch.equal(prefix, want_prefix)
    assert torch.equal(unpack_bits(mask, 5), want_picked)


def test_a_previous_batchs_tree_tokens_are_prefix_tokens_of_the_next(seed):
    gen = torch.Generator().manual_seed(seed)
    kd = kgen_dsa()
    first = Batch([6, 9], 4, 8, gen)
    kd.plan(first.tree_slots, torch.tensor([6, 9]), 4, custom_mask=_sglang_mask(first))
    second = Batch([6, 9], 4, 8, gen, taken=set(first.tree_slots.tolist()))
    # the second batch's lists also point at the first batch's tree slots: prefix tokens by now
    second.lists[:, 0] = first.tree_slots[torch.arange(8) % 8].to(torch.int32)
    tree = kd.plan(second.tree_slots, torch.tensor([6, 9]), 4, custom_mask=_sglang_mask(second))
    prefix, mask = kd.split(second.lists, tree)
    want_prefix, want_picked = second.expected_split()
    assert torch.equal(prefix[:, 0], second.lists[:, 0])
    assert torch.equal(prefix, want_prefix) and torch.equal(unpack_bits(mask, 4), want_picked)


def test_hide_non_ancestors_hides_exactly_the_tree_tokens_off_each_rows_path(seed):
    gen = torch.Generator().manual_seed(seed)
    kd = kgen_dsa()
    lens = [5, 0, 11]
    batch = Batch(lens, 6, 8, gen)
    tree = kd.plan(batch.tree_slots, torch.tensor(lens), 6, custom_mask=_sglang_mask(batch))
    wide = torch.randn(18, 40, generator=gen)
    logits = wide[:, :32]  # a strided view, as the indexer's padded logits can be
    before = logits.clone()
    kd.hide_non_ancestors(logits, tree)
    want = before.clone()
    for i in range(18):
        b, length = i // 6, lens[i // 6]
        for j in range(6):
            if not batch.visible[i, j]:
                want[i, length + j] = float("-inf")
    assert torch.equal(logits, want)


def _sglang_mask(batch: Batch) -> torch.Tensor:
    """SGLang's flat verify custom_mask for the batch's tree (per request [n, L + n], row-major)."""
    n = batch.n
    return torch.cat([torch.cat([torch.ones(n, length, dtype=torch.bool), batch.visible[b * n:(b + 1) * n]], 1)
                      .flatten() for b, length in enumerate(batch.prefix_lens)])


def _direct(batch: Batch, q, cache_rows):
    """Attention straight from SGLang's lists: row i attends to every listed slot, except listed
    tree tokens of its request that are not its ancestors (or itself)."""
    outs = []
    for i, row in enumerate(batch.lists.tolist()):
        b = i // batch.n
        own = batch.tree_slots[b * batch.n:(b + 1) * batch.n].tolist()
        keep = [s for s in row if s >= 0 and (s not in own or batch.visible[i, own.index(s)])]
        keys = cache_rows[torch.tensor(keep, dtype=torch.long)] if keep else cache_rows[:0]
        o, _ = attend(q[i:i + 1], keys, torch.ones(1, len(keep), dtype=torch.bool), SCALE, DV)
        outs.append(o)
    return torch.cat(outs)


@pytest.mark.parametrize("kv_dtype", ["bfloat16", "float8_e4m3fn"])
@pytest.mark.parametrize("chain", [False, True])
def test_attend_runs_kgens_sparse_verify_on_the_split_and_matches_attention_from_sglangs_lists(seed, kv_dtype, chain):
    gen = torch.Generator().manual_seed(seed)
    kd = kgen_dsa(kv_dtype=kv_dtype)
    lens = [9, 3, 14]
    batch = Batch(lens, 5, 12, gen, chain=chain)
    rows = torch.randn(SLOTS, D, generator=gen)
    rows = rows.to(torch.bfloat16)
    cache = quantize_rows(rows, 512) if kv_dtype == "float8_e4m3fn" else rows.unsqueeze(1)
    q = torch.randn(15, H, D, generator=gen).to(torch.bfloat16)
    tree = kd.plan(batch.tree_slots, torch.tensor(lens), 5, custom_mask=None if chain else _sglang_mask(batch))
    out = kd.attend(q[..., :DV].reshape(15, H * DV), q[..., DV:], cache, batch.lists, tree)
    want = _direct(batch, q.double(), dequantize_rows(cache))
    assert out.shape == (15, H, DV) and out.dtype == torch.bfloat16
    assert float((out.double() - want).norm() / want.norm()) <= 1e-2
    call, = kd.module.calls
    assert torch.equal(call["topk_indices"], batch.expected_split()[0])


def test_the_layers_of_a_batch_run_one_prepared_step_over_their_own_lists(seed):
    """Each layer has its own top-k lists: the batch's one prepared step reads them from the buffers
    every layer's split writes (the step keeps their addresses), so layer 2 sees its lists, not
    layer 1's. Lists of another width than the spec's top-k take a one-shot call."""
    gen = torch.Generator().manual_seed(seed)
    kd = kgen_dsa()
    lens = [9, 3, 14]
    batch = Batch(lens, 5, 16, gen)  # 16 = the stand-in spec's index_topk
    rows = torch.randn(SLOTS, D, generator=gen).to(torch.bfloat16).unsqueeze(1)
    tree = kd.plan(batch.tree_slots, torch.tensor(lens), 5, custom_mask=_sglang_mask(batch))
    step, = kd.module.steps
    assert tree.step is step and step.topk_indices is tree.lists and step.tree_mask is tree.mask
    layer2 = copy.copy(batch)
    layer2.lists = batch.lists[:, torch.randperm(16, generator=gen)].masked_fill(torch.rand(15, 16, generator=gen) < 0.3, -1)
    for i, layer in enumerate((batch, layer2)):
        q = torch.randn(15, H, D, generator=gen).to(torch.bfloat16)
        out = kd.attend(q[..., :DV].reshape(15, H * DV), q[..., DV:], rows, layer.lists, tree)
        want = _direct(layer, q.double(), dequantize_rows(rows))
        assert float((out.double() - want).norm() / want.norm()) <= 1e-2
        assert torch.equal(kd.module.calls[i]["topk_indices"], layer.expected_split()[0])
    assert len(kd.module.steps) == 1
    before = tree.lists.clone()
    q = torch.randn(15, H, D, generator=gen).to(torch.bfloat16)
    kd.attend(q[..., :DV].reshape(15, H * DV), q[..., DV:], rows, batch.lists[:, :12], tree)
    assert torch.equal(tree.lists, before)  # the step's buffers are left alone
    assert kd.module.calls[2]["topk_indices"].shape == (15, 12)


def test_decode_is_a_one_token_tree_whose_own_row_counts_when_listed(seed):
    gen = torch.Generator().manual_seed(seed)
    kd = kgen_dsa()
    lens = [8, 20, 1]  # prefix tokens before each request's new token
    batch = Batch(lens, 1, 6, gen)
    batch.lists[0, 0] = int(batch.tree_slots[0])  # request 0's new token is listed, request 2's is not
    batch.lists[2] = torch.tensor([int(batch.prefix[2][0])] + [-1] * 5, dtype=torch.int32)
    tree = kd.plan(batch.tree_slots, torch.tensor(lens), 1)
    prefix, mask = kd.split(batch.lists, tree)
    want_prefix, want_picked = batch.expected_split()
    assert torch.equal(prefix, want_prefix) and torch.equal(unpack_bits(mask, 1), want_picked)
    assert bool(want_picked[0, 0]) and not bool(want_picked[2, 0])


def test_the_graph_plan_rewrites_fixed_buffers_and_equals_the_eager_plan(seed):
    gen = torch.Generator().manual_seed(seed)
    kd = kgen_dsa()
    kd.init_graph(max_bs=4, n=5)
    ptrs = {k: v.data_ptr() for k, v in kd.graph.items()}
    for lens in ([9, 3, 14], [2, 30]):
        batch = Batch(lens, 5, 10, gen)
        eager = kd.plan(batch.tree_slots, torch.tensor(lens), 5, custom_mask=_sglang_mask(batch))
        want = kd.split(batch.lists, eager)
        fixed = kd.plan(batch.tree_slots, torch.tensor(lens), 5, custom_mask=_sglang_mask(batch), graph=True)
        assert all(getattr(fixed, k).data_ptr() == ptrs[k] for k in ptrs)
        got = kd.split(batch.lists, fixed)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert {k: v.data_ptr() for k, v in kd.graph.items()} == ptrs
    # one step for the batch shape (3 x 5 and 2 x 5: two), kept across plans, rescheduled at each
    steps = [s for s in kd.module.steps if s.workspace is not None]
    assert [s.reschedules for s in steps] == [1, 1] and all(s.workspace is kd._graph_workspace for s in steps)
    again = kd.plan(batch.tree_slots, torch.tensor([2, 30]), 5, custom_mask=_sglang_mask(batch), graph=True)
    assert again.step is steps[1] and steps[1].reschedules == 2 and steps[1].topk_indices.data_ptr() == ptrs["lists"]


def test_too_many_draft_tokens_is_a_clear_error():
    with pytest.raises(ValueError, match="exceed the kgen spec's max_nodes 8"):
        kgen_dsa(n=8).plan(torch.arange(9), torch.tensor([3]), 9)


def test_logical_positions_become_physical_slots_through_the_page_table(seed):
    gen = torch.Generator().manual_seed(seed)
    table = torch.randperm(1000, generator=gen)[:60].view(3, 20).to(torch.int32)
    logical = torch.tensor([[0, 19, -1, 4], [-1, -1, -1, -1], [7, 3, 2, -1]], dtype=torch.int32)
    got = physical_lists(logical, table)
    want = torch.where(logical >= 0, table.gather(1, logical.clamp(min=0).long()), -1)
    assert got.dtype == torch.int32 and torch.equal(got, want)
