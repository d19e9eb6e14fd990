"""Loading: a spec and a Target -> its plans (one per tiling a batch may run) and their kernels,
keyed by their tiles objects. Plans share the kernels their tilings do not change (merge, defrag,
and the combine where BM agrees): each variant is loaded once."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .arch import Target, arch_for_capability, get_arch
from .build import build
from .designs import Tiles
from .plan import Plan, plan
from .runtime import Kernel
from .spec import Spec


def resolve_device(device: torch.device | str | None) -> torch.device:
    if not torch.cuda.is_available():
        raise RuntimeError("kgen.jit needs a CUDA GPU (torch.cuda.is_available() is False)")
    device = torch.device(device or "cuda")
    return torch.device("cuda", torch.cuda.current_device()) if device.index is None else device


def target_of(device: torch.device, plan_arch: str | None = None) -> Target:
    """The GPU's arch for the cubins; the plan of that arch, or of `plan_arch` (e.g. the sm_120
    plan tested on an H200)."""
    props = torch.cuda.get_device_properties(device)
    here = arch_for_capability(props.major, props.minor)
    return Target(get_arch(plan_arch) if plan_arch else here, here, props.multi_processor_count)


@dataclass(frozen=True)
class LoadedPlans:
    """Plans and their kernels (by variant name), keyed by tiling."""

    spec: Spec
    target: Target
    plans: dict[Tiles, Plan]
    kernels: dict[Tiles, dict[str, Kernel]]


def load(spec: Spec, target: Target, tilings: list[Tiles], device: torch.device) -> LoadedPlans:
    """Plan `spec` for each tiling on target.plan_arch, build for target.cubin_arch, load on `device`."""
    plans = {t: plan(spec, target.plan_arch, tiles=t) for t in tilings}
    loaded: dict[str, Kernel] = {}  # by variant id
    kernels = {}
    for t, p in plans.items():
        kernels[t] = {b.variant.name: loaded.get(b.variant.variant_id) or
                      loaded.setdefault(b.variant.variant_id, Kernel.load(b, device))
                      for b in build(p, [target.cubin_arch.name])}
    return LoadedPlans(spec, target, plans, kernels)
