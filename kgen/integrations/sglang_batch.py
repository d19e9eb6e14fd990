"""What kgen's two SGLang backends share (integrations/sglang.py: KgenAttnBackend over the MLA pools;
integrations/sglang_dsa.py: KgenDSABackend over the DSA pool): the forward modes kgen serves, the
model's one kind of absorbed-MLA layer, and the metadata hooks in front of SGLang's."""

from __future__ import annotations

VERIFY, DECODE = "verify", "decode"


def kgen_mode(forward_batch) -> str | None:
    """The forward modes kgen serves (VERIFY, DECODE), or None: SGLang's Triton backend."""
    mode = forward_batch.forward_mode
    if mode.is_target_verify():
        return VERIFY
    if mode.is_decode() and forward_batch.spec_info is None:
        return DECODE
    return None


def absorbed_mla_kind(cfg, layers) -> tuple[tuple[int, float] | None, str]:
    """(heads per GPU, softmax scale) of the model's one kind of absorbed-MLA attention layer
    (q·k over kv_lora_rank + qk_rope_head_dim dims, values kv_lora_rank wide), or None and why."""
    dim = cfg.kv_lora_rank + cfg.qk_rope_head_dim
    kinds = {(m.tp_q_head_num, float(m.scaling)) for m in layers
             if m.qk_head_dim == dim and m.v_head_dim == cfg.kv_lora_rank}
    if len(kinds) != 1:
        return None, f"found {len(kinds)} kinds of absorbed-MLA attention layer, kgen serves exactly one"
    return next(iter(kinds)), ""


class BatchHooks:
    """The metadata hooks of kgen's backends, in front of SGLang's: SGLang's metadata for a forward
    batch, then kgen's (`_kgen_prepare`), eagerly, before CUDA-graph capture and before each replay;
    kgen's graph buffers (`_kgen_init_graph`) allocated once with SGLang's."""

    def init_forward_metadata(self, forward_batch):
        super().init_forward_metadata(forward_batch)
        self._kgen_prepare(forward_batch, graph=False)

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int, *args, **kwargs):
        super().init_cuda_graph_state(max_bs, max_num_tokens, *args, **kwargs)
        if self.kgen is not None:
            self._kgen_init_graph(max_bs)

    def init_forward_metadata_out_graph(self, forward_batch, in_capture: bool = False, **kwargs):
        super().init_forward_metadata_out_graph(forward_batch, in_capture=in_capture, **kwargs)
        self._kgen_prepare(forward_batch, graph=True, capture=in_capture)
