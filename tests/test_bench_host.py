"""bench/host.py's CPU-checkable parts: arguments, the table, the targets verdict."""

import argparse

import pytest
import torch

from bench import host


def row(**us):
    base = dict(B=1, T=16, L=4096, H=8, eager_us=60.0, gpu_us=40.0, sets=4)
    return base | {m: 10.0 for m in host.MODES} | us


def test_shapes_parse_as_b_t_l():
    assert host.parser().parse_args(["--shapes", "1,16,4096", "8,64,32768"]).shapes == [(1, 16, 4096), (8, 64, 32768)]
    with pytest.raises(argparse.ArgumentTypeError, match="expected B,T,L"):
        host.parse_shape("1,16")


def test_verdict_is_for_the_worst_shape():
    ok = host.verdicts([row(), row(oneshot_out=41.0)])
    assert ok == {"prepared_out": True, "oneshot_out": False, "torch_op": True}


def test_table_has_a_row_per_shape():
    t = host.table([row(), row(B=8)], "title")
    assert t.row_count == 2 and len(t.columns) == 4 + len(host.MODES) + 2


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only error path")
def test_without_gpu_it_says_so(capsys):
    assert host.main([]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
