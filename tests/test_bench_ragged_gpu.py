"""Smoke test of `rocm-attn bench small-seq --ranking --ragged` on a GPU: two tiny ragged rows
end to end (copy bandwidth and matrix rate measured, every column timed on one clock, the
float64 check), and tools/ragged_table.py on the JSON it writes. Marked gpu; skipped without a
GPU and the compiled extension."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from helpers.gpu import gpu_marks  # noqa: E402

pytestmark = gpu_marks()

ROOT = Path(__file__).resolve().parent.parent
ROWS = ("u16_c1-24_kln20s1:1-100_h8kv2_d64_bf16", "u8_czipf1.2:1-40_k5-300_h4kv1_d128_fp16")


def test_two_tiny_ragged_rows_end_to_end(tmp_path, capsys):
    from rocm_attn.bench import small_seq

    out = tmp_path / "ragged.json"
    rc = small_seq.main(["--ranking", "--ragged", "--cases", ",".join(ROWS), "--json", str(out),
                         "--no-progress"])
    printed = capsys.readouterr().out
    report = json.loads(out.read_text())
    assert [r["case"] for r in report["rows"]] == list(ROWS)
    assert report["copy_bandwidth_GBps"] > 0 and set(report["matmul_TFLOPs"]) == {"bf16", "fp16"}
    for row in report["rows"]:
        for mode in ("fwd", "fwdbwd"):
            m = row[mode]
            assert m["clock"] in ("graph", "eager")
            ours = m["columns"]["ours"]
            assert ours["ms"] > 0 and ours["check"]["ok"], (row["case"], mode, ours)
            if mode == "fwdbwd":
                assert ours["check"]["grads"]["ok"], ours["check"]
            assert m["floor_ms"] == max(m["bytes_floor_ms"], m["matrix_floor_ms"]) > 0
            # torch's own flash varlen forward runs on any CUDA build of torch
            anchor = "flash_varlen" if mode == "fwd" else "sdpa_efficient"
            assert "ms" in m["columns"][anchor], m["columns"][anchor]
            assert m["columns"][anchor]["check"]["ok"]
            assert m["speedup"][anchor] == m["columns"][anchor]["ms"] / ours["ms"]
    assert rc == 0
    assert "forward+backward" in printed and ROWS[0] in printed
    sys.path.insert(0, str(ROOT / "tools"))
    import ragged_table

    lines = ragged_table.table(*ragged_table.load([str(out)]))
    assert sum(line.startswith(f"| {ROWS[1]} |") for line in lines) == 2
