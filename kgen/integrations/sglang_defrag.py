"""Opt-in tier-0 KV defragmentation for SGLang (KGEN_DEFRAG=1), outside the attention backend.

Off by default: on the H200, with kgen's paged kernels, a prefix in contiguous slots was only
0.0-1.0% faster than the same prefix scattered over permuted slots (CUDA-graph replay; B=1
L=131072 T=16 and T=1, B=32 L=4096 T=16, B=8 L=32768 T=1), and a pass moves KV rows and rewrites
the allocator's state with host syncs. It stays for measurements that say otherwise.

With KGEN_DEFRAG=1, register() installs a BEFORE hook on SGLang's ModelRunner.forward (through
SGLang's plugin HookRegistry, which applies it after the plugins load). Every
KGEN_DEFRAG_INTERVAL (256) decode steps, before the step's attention metadata is built, it moves
the batch's fragmented requests into contiguous runs of free slots (defrag_planner.py: plan +
apply; one kgen kv_defrag launch for all layers), rewrites their req_to_token rows and frees the
old slots. It runs only where moving slots is safe (`blocker`); `stats()` reports each runner's
passes and why it is off.
"""

from __future__ import annotations

import weakref

import torch

from .. import env
from . import sglang_compat as compat
from .defrag_planner import Defragmenter, DefragStats, Settings

TARGET = "sglang.srt.model_executor.model_runner.ModelRunner.forward"
_HOOKS: "weakref.WeakSet" = weakref.WeakSet()  # every runner's _Hook (each runner holds its own)


def enabled() -> bool:
    return env.flag("KGEN_DEFRAG")


def install() -> None:
    """Register the BEFORE hook on ModelRunner.forward with SGLang's HookRegistry."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    compat.check(defrag=True)
    HookRegistry.register(TARGET, before_forward, HookType.BEFORE)


def stats() -> list[dict]:
    """The defrag report of every model runner the hook has seen in this process."""
    return [h.defragmenter.stats.as_dict() for h in list(_HOOKS)]


def before_forward(runner, forward_batch, *args, **kwargs) -> None:
    hook = getattr(runner, "_kgen_defrag", None)
    if hook is None:
        hook = runner._kgen_defrag = _Hook(runner)
        _HOOKS.add(hook)
    hook.maybe_run(forward_batch)


def blocker(runner) -> str:
    """Why defrag must not run on this runner ("" when it may)."""
    compat.check_instance(runner, "ModelRunner", defrag=True)
    backend = runner.attn_backend
    if not getattr(type(backend), "is_kgen_backend", False):  # set by kgen.integrations.sglang's backend class
        return "the runner's attention backend is not kgen (defrag needs --attention-backend kgen)"
    if backend.kgen is None:
        return f"kgen does not serve this model ({backend.kgen_off_reason})"
    radix, speculative = compat.server_settings()
    if not compat.is_plain_token_allocator(runner.token_to_kv_pool_allocator) or runner.page_size != 1:
        return "needs --page-size 1 and SGLang's plain token allocator"
    if radix:
        return "the radix cache also points at request slots: use --disable-radix-cache"
    if speculative:
        return "a speculative draft model keeps its own KV in the same slots, which tier-0 does not move"
    return ""


class _FreeList:
    """SlotAllocator over SGLang's page-size-1 TokenToKVPoolAllocator (free_pages, release_pages)."""

    def __init__(self, allocator):
        self.a = allocator

    def free_slots(self) -> torch.Tensor:
        return torch.cat([self.a.free_pages, self.a.release_pages]).cpu()

    def take(self, slots: torch.Tensor) -> None:
        slots = slots.to(self.a.free_pages.device)
        self.a.free_pages = self.a.free_pages[~torch.isin(self.a.free_pages, slots)]
        self.a.release_pages = self.a.release_pages[~torch.isin(self.a.release_pages, slots)]

    def release(self, slots: torch.Tensor) -> None:
        self.a.free(slots.to(self.a.free_pages.device))


class _ReqRows:
    """SlotTable over req_to_token rows [0, length) of the batch's requests."""

    def __init__(self, req_to_token: torch.Tensor, rows: list[int], lengths: list[int]):
        self.t = req_to_token
        self.lengths: dict[int, int] = {}
        for r, n in zip(rows, lengths):  # a CUDA-graph batch may pad with repeated rows of length 1
            self.lengths[r] = max(n, self.lengths.get(r, 0))

    def rows(self):
        return [(r, self.t[r, :n].cpu()) for r, n in self.lengths.items()]

    def rewrite(self, row, slots: torch.Tensor) -> None:
        self.t[row, :slots.numel()] = slots.to(self.t.device, self.t.dtype)


class _Hook:
    """One model runner's defragmenter and step counter."""

    def __init__(self, runner):
        self.runner = runner
        self.defragmenter = Defragmenter(Settings(
            threshold=env.number("KGEN_DEFRAG_THRESHOLD", 0.25),
            min_tokens=max(2, env.integer("KGEN_DEFRAG_MIN_TOKENS", 256)),
            max_tokens=env.integer("KGEN_DEFRAG_MAX_TOKENS", 1 << 20)))
        self.interval = max(1, env.integer("KGEN_DEFRAG_INTERVAL", 256))
        self.steps = 0
        self.defragmenter.stats = DefragStats(disabled=blocker(runner))

    def maybe_run(self, fb) -> None:
        if self.defragmenter.stats.disabled or not fb.forward_mode.is_decode():
            return
        self.steps += 1
        if self.steps % self.interval:
            return
        r = self.runner
        # The step writes the current token's KV during the forward, at a slot already chosen:
        # that last token stays where it is.
        lengths = (fb.seq_lens[:fb.batch_size] - 1).tolist()
        table = _ReqRows(r.req_to_token_pool.req_to_token, fb.req_pool_indices[:fb.batch_size].tolist(), lengths)
        layers = r.token_to_kv_pool.kv_buffer
        module = r.attn_backend.kgen.module
        self.defragmenter.run(_FreeList(r.token_to_kv_pool_allocator), table,
                              lambda src, dst: module.defrag(layers, src, dst))
