"""kgen inspect, bench and tune (registered on the app in kgen/cli.py)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from . import report, sass
from .arch import get_arch, nvrtc_arch
from .build import build_variant
from .cache import KernelCache
from .cli_io import console, err_console, fail, writable_dir
from .errors import CacheMissError, KgenError
from .model import validation
from .plan import plan
from .render import render, templates_dir
from .spec import load_spec
from .tuning import buckets


def inspect_cmd(
    spec_path: Path = typer.Argument(..., metavar="SPEC", help="spec YAML file"),
    kernel: str = typer.Argument(..., metavar="KERNEL", help="variant name (e.g. prefix_attn, lse_merge_bf16) or kernel kind"),
    arch: Optional[str] = typer.Option(None, "--arch", help="the arch whose cubin to disassemble; default: the spec's target"),
    line_info: bool = typer.Option(False, "--line-info", help="annotate with source lines"),
) -> None:
    """Dump the SASS of one kernel of SPEC (compiled or loaded from the cache) with nvdisasm."""
    try:
        spec = load_spec(spec_path)
        a = get_arch(arch or spec.target.arch)
        p = plan(spec, a)
        variants = [v for v in p.variants if kernel in (v.name, v.kernel)]
        if not variants:
            raise KgenError(f"{spec.name} has no kernel {kernel!r}; kernels: {', '.join(v.name for v in p.variants)}")
        cache = KernelCache()
        for v in variants:
            try:
                b = build_variant(v, a.name, cache, inspect=True)
            except CacheMissError as e:
                raise CacheMissError(f"spec {spec.name}: {e}") from None
            print(f"// {v.variant_id} for {a.name}: {b.report.registers} registers, {b.report.spill_bytes} B spills, "
                  f"{b.occupancy.ctas_per_sm} CTAs/SM (limit: {b.occupancy.limit})\n// {sass.summary(b.sass)}")
            text = sass.dump(b.cubin, nvrtc_arch(a.name, v.requires), line_info=line_info)  # sm_90a for wgmma
            print(_existing_line_paths(text, v, cache) if line_info else text)
    except KgenError as e:
        fail(e)


_LINE_FILE = re.compile(r'(//## File ")([^"]*)(")')


def _existing_line_paths(text: str, variant, cache: KernelCache) -> str:
    """nvdisasm's line info names the files as NVRTC saw them (`<name>.cu`, `kgen/<header>.cuh`,
    under the directory the kernel was first compiled in): point them at files that exist — the
    rendered source, written next to the cache, and the headers in kgen's templates."""
    source = cache.root / "sources" / f"{variant.variant_id}.cu"
    try:
        source.parent.mkdir(parents=True, exist_ok=True)
        source.write_text(render(variant))
    except OSError as e:
        raise KgenError(f"{cache.described}: cannot write {source} for --line-info ({e.strerror})") from None

    def fix(m: re.Match) -> str:
        name = Path(m.group(2)).name
        if name == f"{variant.name}.cu":
            return f"{m.group(1)}{source}{m.group(3)}"
        if (templates_dir() / name).is_file():
            return f"{m.group(1)}{templates_dir() / name}{m.group(3)}"
        return m.group(0)

    return _LINE_FILE.sub(fix, text)


def bench_cmd(
    spec_path: Path = typer.Argument(..., metavar="SPEC", help="base spec YAML (heads, tree and page size vary over the grid)"),
    quick: bool = typer.Option(False, "--quick", help="a handful of shapes at the spec's head count (under a minute)"),
    page_size: Optional[int] = typer.Option(None, "--page-size", min=1, help="KV page size (default: the spec's)"),
    heads: str = typer.Option("8,16", "--heads", help="comma-separated head counts of the grid"),
    triton: bool = typer.Option(True, "--triton/--no-triton", help="time SGLang's Triton extend_attention_fwd too"),
    peers: str = typer.Option("auto", "--peers", help="FlashInfer / FlashMLA timed on the same inputs: auto (the "
                              "plan's: sm_90 flashinfer_fa3,flashmla; else flashinfer_fa2), none, all, or a list"),
    graph: bool = typer.Option(True, "--graph/--no-graph", help="time by CUDA-graph replay (default) or eagerly"),
    time_limit: Optional[float] = typer.Option(None, "--time-limit", min=0.0, help="start no new shape after this many seconds"),
    out: Path = typer.Option(Path("bench/results"), "--out", help="where the JSON and PNG are written"),
) -> None:
    """(GPU) Benchmark SPEC: the ceilings, the benchmark grid (docs/design.md), SGLang's Triton baseline and
    the peers (FlashInfer, FlashMLA); a table, bench/results/<spec>-<time>.json and a PNG plot. Same as
    python -m bench.run. A sparse spec (model.index_topk) runs python -m bench.sparse instead: union vs
    per-token gather on indexer-shaped lists."""
    # bench/ lives next to the package in a checkout, not inside the wheel
    for root in (Path(__file__).resolve().parents[1], Path.cwd()):
        if (root / "bench" / "run.py").is_file() and str(root) not in sys.path:
            sys.path.insert(0, str(root))
    try:
        load_spec(spec_path)
        head_counts = tuple(int(h) for h in heads.split(",")) if re.fullmatch(r"\d+(,\d+)*", heads) else None
        if not head_counts or not all(head_counts):
            raise KgenError(f"--heads {heads!r}: give comma-separated head counts >= 1, e.g. 8,16")
        writable_dir(out)
        try:
            from bench.run import BenchError, run
            from bench.sparse import main as sparse_main
        except ImportError as e:
            raise KgenError(f"kgen bench needs the bench/ folder of a kgen checkout (run it from the repository "
                            f"root): {e}") from None
        if load_spec(spec_path).model.sparse:  # sparse specs have their own benchmark (bench/sparse.py)
            raise typer.Exit(sparse_main(["--spec", str(spec_path), "--out", str(out),
                                          *(["--time-limit", str(time_limit)] if time_limit else [])]))
        try:
            code = run(spec_path, quick=quick, page_size=page_size, heads=head_counts, triton=triton, graph=graph,
                       time_limit=time_limit, out_dir=out, peers=peers)
        except (BenchError, ValueError) as e:
            raise KgenError(str(e)) from None
    except KgenError as e:
        fail(e)
    raise typer.Exit(code)


def tune_cmd(
    spec_path: Path = typer.Argument(..., metavar="SPEC", help="spec YAML file"),
    budget_s: float = typer.Option(300.0, "--budget-s", min=0.0, help="start no new shape bucket after this many seconds (>= 0)"),
    arch: Optional[str] = typer.Option(None, "--arch", help="an arch other than the GPU present: rank its candidate "
                                                           "tilings by the performance model (no GPU needed)"),
    out: Optional[Path] = typer.Option(None, "--out", help="table file (default: the user table under KGEN_CACHE_DIR/tuned)"),
    as_json: bool = typer.Option(False, "--json", help="with --arch: print the ranking as JSON"),
    only: Optional[str] = typer.Option(None, "--buckets", help="comma-separated bucket keys or their starts "
                                       "(e.g. decode or decode/9+): tune only those, keep the table's other choices"),
) -> None:
    """(GPU) Time the candidate attention tilings of SPEC per shape bucket on the GPU present and write
    the winners to a tuned table, which kgen.jit then uses for that spec, arch and kgen version.
    With --arch for an arch that is not present, rank the candidates by the model instead."""
    from .tuning import selected, table_name, user_dir

    try:
        spec = load_spec(spec_path)
        prefixes = tuple(p.strip() for p in only.split(",") if p.strip()) if only else ()
        todo = selected(prefixes)
        if out is not None and out.is_dir():
            raise KgenError(f"--out {out} is a directory; give the table's file name (e.g. {out / 'table.json'})")
        import torch

        here = None
        if torch.cuda.is_available():
            from .arch import arch_for_capability

            here = arch_for_capability(*torch.cuda.get_device_capability()).name
        if arch and arch != here:
            if prefixes:
                raise KgenError("--buckets picks the shape buckets kgen tune times on the GPU present; --arch "
                                f"{arch} ranks the tilings by the model over the whole grid: give one of the two")
            _rank_by_model(spec, get_arch(arch), as_json)
            return
        if here is None:
            raise KgenError("kgen tune times on the GPU present, and torch sees none here "
                            "(--arch ARCH ranks an arch's tilings by the performance model instead)")
        if out is not None:
            writable_dir(out.parent, "--out's folder")
        from .tuner import tune

        with Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), console=err_console) as bar:
            task = bar.add_task(f"tuning {spec.name}", total=len(todo))
            tuned = []  # the buckets timed before the budget ran out

            def done(bucket, r):
                tuned.append(bucket)
                bar.advance(task)
                bar.console.print(f"{bucket.key:20s} " + "  ".join(f"{t} {us:.1f}" for t, us in sorted(r["times"].items()))
                                  + f"  noise {100 * r['noise']:.1f}% -> {r['chosen']}", highlight=False, markup=False)
                for text, why in r["rejected"].items():
                    bar.console.print(f"{bucket.key:20s} {text} rejected, not timed: {why}", highlight=False,
                                      markup=False)

            table = tune(spec, budget_s, on_bucket=done, only=prefixes)
        path = out or user_dir() / table_name(spec, table.arch)
        try:
            table.save(path)
        except OSError as e:
            raise KgenError(f"cannot write the tuned table {path} ({e.strerror}); give --out a file kgen may "
                            f"write") from None
    except KgenError as e:
        fail(e)
    console.print(f"{len(tuned)} of {len(buckets())} buckets tuned for {spec.name} on {table.device} ({table.arch}): {path}",
                  markup=False)


def _rank_by_model(spec, a, as_json: bool) -> None:
    """kgen tune --arch for an arch that is not here: the candidates ranked (report.ranking)."""
    r = report.ranking(spec, a)
    tuned = r.pop("table")
    if as_json:
        print(json.dumps(r, indent=2))
        return
    model = f"the MODEL, not a measurement (kgen/model.py: {validation()}; over the benchmark grid)"
    how = (f"by the shape buckets each won when timed on {tuned.device} (tuned table {tuned.path}), then by {model}"
           if tuned else f"by {model}")
    console.print(f"No {a.name} GPU here: {spec.name}'s candidate tilings on {a.name} ranked {how}; no table is "
                  f"written." + (f" The model has no entry for the {', '.join(r['unmodeled'])} loop ('not modeled')."
                                 if r["unmodeled"] else ""), markup=False)
    report.print_ranking(console, r["rows"], str(tuned.path) if tuned else None)
