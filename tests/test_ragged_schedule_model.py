"""tools/diag/ragged_schedule_model.py, the replay of the ragged rows' work items onto a grid that
the plan's segment order rests on (docs/kernels.md#segment-order), on the CPU."""

from __future__ import annotations

import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location(
    "ragged_schedule_model", os.path.join(ROOT, "tools", "diag", "ragged_schedule_model.py"))
M = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(M)


def test_list_schedule_and_grid_stride():
    assert M.list_schedule([3, 1, 1, 1], 2) == 3
    assert M.list_schedule([1, 1, 1, 3], 2) == 4          # the long job started last
    # 4 blocks on 2 slots: shares [1+5, 1, 1, 1] -> block 0 on one slot, 1..3 on the other
    assert M.grid_stride([1, 1, 1, 1, 5], 2, 2) == 6


def test_item_costs_follow_the_kernels_items():
    # 3 candidates x group 2 = 6 rows in items of 4 rows: 2 items per kv head, 2 kv heads;
    # 130 keys: 3 steps + 1; no candidates: no item
    assert M.item_costs([3, 0], [130, 50], 2, 2, 4) == [[4, 4, 4, 4], []]
    assert M.item_costs([1], [0], 1, 1, 64) == [[2]]      # an empty history still costs a step


def test_longest_first_evens_out_late_long_histories():
    """One item per segment, the long ones last: in segment order their blocks start last and
    end long after the rest; longest first they start first and the short items fill in."""
    keys = [64] * 200 + [64 * 32] * 10
    segments = M.item_costs([1] * len(keys), keys, 1, 1, 64)
    s = M.spread(segments, keys, slots=8, grid_factor=4)
    assert s["segment order"] > 1.1 and s["longest first"] < 1.05
    assert s["longest first, queue"] < 1.01
    even = M.spread(M.item_costs([1] * 64, [64] * 64, 1, 1, 64), [64] * 64, 8, 4)
    assert even["segment order"] == pytest.approx(1.0) == even["longest first"]


def test_cli_prints_every_row(capsys):
    M.main(["--cases", "u256_c512_k256_h8kv8_d128_bf16,u4096_c1_kln200s1:1-4096_h8kv2_d128_bf16"])
    out = capsys.readouterr().out.splitlines()
    assert out[2].startswith("u256_c512_k256_h8kv8_d128_bf16") and len(out) == 4
    order, longest = map(float, out[3].split()[2:4])
    assert longest < order


def test_block_pass_costs_follow_the_backward_items():
    # 3 candidates x group 2 = 6 rows, 100 keys, 2 kv heads: dK / dV items of 32 keys (4 per kv
    # head) walking one 16-row tile (+1); dQ items of 16 rows (1 per kv head) walking 7 key
    # tiles (+1); one key tile has no dQ item, no rows no item at all
    assert M.block_pass_costs([3, 0], [100, 50], 2, 2, True) == [[2] * 8, []]
    assert M.block_pass_costs([3, 4], [100, 16], 2, 2, False) == [[8, 8], []]


def test_cli_backward_prints_both_passes(capsys):
    M.main(["--backward", "--cases", "u4096_c1_kln200s1:1-4096_h8kv2_d128_bf16"])
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 3 and out[2].startswith("u4096_c1_kln200s1")
    dq_order, dq_ordered = float(out[2].split()[-3]), float(out[2].split()[-1])
    assert dq_ordered < dq_order
