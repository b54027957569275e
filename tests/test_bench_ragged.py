"""The ragged-request benchmark's flow (rocm_attn/bench/small_seq_ragged.py) on CPU: the GPU
anchors are stood in for by the torch path, the clocks by counters, so that what a row records
(every column on one clock, the float64 check, the speed-ups, skipped and failing columns) is
tested without a GPU; and tools/ragged_table.py on the rows such a run writes."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest
import torch

import rocm_attn
from rocm_attn import __main__ as cli
from rocm_attn.bench import ragged_rows as R
from rocm_attn.bench import small_seq_ragged as S

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import ragged_table  # noqa: E402

ROWS = [R.Row(6, R.Dist("uniform", 1, 12), R.Dist("lognormal", 1, 40, median=10, sigma=1.0),
              h_kv=2, d=64),
        R.Row(4, R.Dist("fixed", 3, 3), R.Dist("zipf", 1, 20, exponent=1.2), h_kv=1,
              dtype="fp16")]
RATES = {"bf16": 1e12, "fp16": 1e12}


def _torch_path(q, k, v, cu_q, cu_kv, max_q, max_kv, **_):
    return rocm_attn.fused_attn_small_seq(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_kv=cu_kv,
                                          max_seqlen_q=max_q, max_seqlen_kv=max_kv,
                                          backend="torch")


class Clocks:
    """Stand-ins of graph_ms / eager_ms: each call runs the step and records (clock, column);
    a column in ``refuse`` raises from the graph clock as a failed capture does."""

    def __init__(self):
        self.calls, self.refuse = [], set()

    def graph(self, fn, reps, warmup, calls):
        fn()
        self.calls.append(("graph", fn.column))
        if fn.column in self.refuse:
            raise RuntimeError("operation not permitted when stream is capturing")
        return {"ours": 1.0}.get(fn.column, 2.0)

    def eager(self, fn, reps, warmup):
        fn()
        self.calls.append(("eager", fn.column))
        return {"ours": 1.5}.get(fn.column, 3.0)


@pytest.fixture
def clocks(monkeypatch):
    c = Clocks()
    monkeypatch.setattr(S, "graph_ms", c.graph)
    monkeypatch.setattr(S, "eager_ms", c.eager)
    monkeypatch.setattr(S, "flash_varlen_forward", _torch_path)
    monkeypatch.setattr(S, "varlen_attn_fn", lambda: (_torch_path, True))
    # the CPU has no cuDNN: that column fails as it does where cuDNN refuses the inputs
    monkeypatch.setattr(S, "SDPA_COLUMNS", (("sdpa_cudnn", "CUDNN_ATTENTION"),
                                            ("sdpa_efficient", "MATH")))
    monkeypatch.setattr(S, "free_bytes", lambda device: 2**34)
    monkeypatch.setattr(S, "_incapturable", {"fwd": set(), "fwdbwd": set()})
    return c


def _bench(row, **kw):
    return S.bench_row(row, 1e9, RATES, 0, device="cpu", **kw)


def test_row_times_every_column_on_one_clock_and_checks_them(clocks):
    out = _bench(ROWS[0])
    n = R.draw_lengths(ROWS[0], 0)
    assert (out["total_q"], out["total_kv"], out["max_kv"]) == (n.total_q, n.total_kv, n.max_kv)
    fwd, fb = out["fwd"], out["fwdbwd"]
    assert list(fwd["columns"]) == ["ours", "flash_varlen", "varlen_attn", "sdpa_cudnn",
                                    "sdpa_efficient"]
    assert "flash_varlen" not in fb["columns"]  # no autograd: forward only
    for m, timed in ((fwd, ("flash_varlen", "varlen_attn", "sdpa_efficient")),
                     (fb, ("varlen_attn", "sdpa_efficient"))):
        assert m["clock"] == "graph" and m["path"] == "torch"
        assert m["sdpa_default"] in ("FLASH_ATTENTION", "MATH")  # what the CPU's SDPA takes
        assert m["ms"] == 1.0 and m["speedup"] == {name: 2.0 for name in timed}
        assert "No viable backend" in m["columns"]["sdpa_cudnn"]["error"]
        assert m["speedup_vs_best"] == 2.0
        checks = {name: c["check"] for name, c in m["columns"].items() if "check" in c}
        assert set(checks) == set(m["columns"]) - {"sdpa_cudnn"}
        assert all(c["ok"] and c["rel_err"] < 1e-2 for c in checks.values())
    assert fb["columns"]["ours"]["check"]["grads"]["ok"]
    assert fb["columns"]["varlen_attn"]["check"]["grads"]["ok"]
    floor_fwd, floor_fb = R.floors(ROWS[0], n, 1e9, 1e12)
    assert fwd["floor_ms"] == floor_fwd.ms and fb["floor_ms"] == floor_fb.ms
    assert fwd["pct_floor"] == pytest.approx(100 * floor_fwd.ms / 1.0)
    assert S.checks_failed(out) == []
    # every timed column went through the one clock, each once per mode
    assert {c for c, _ in clocks.calls} == {"graph"}
    assert sorted(col for _, col in clocks.calls) == sorted(
        ["ours", "flash_varlen", "varlen_attn", "sdpa_efficient"] +
        ["ours", "varlen_attn", "sdpa_efficient"])


def test_ab_columns_run_ours_under_the_setting_on_the_same_clock(clocks, monkeypatch):
    settings = []

    def with_tuning(setting, fn):
        settings.append(setting)
        return fn()

    monkeypatch.setattr(S, "with_tuning", with_tuning)
    out = _bench(ROWS[0], anchors=False, ab=("small_seq_tiled_fwd_grid=2",))
    for m in (out["fwd"], out["fwdbwd"]):
        col = m["columns"]["ab small_seq_tiled_fwd_grid=2"]
        assert m["clock"] == "graph" and col["ms"] == 2.0 and col["check"]["ok"]
        assert m["ab"] == {"small_seq_tiled_fwd_grid=2": {"ms": 2.0, "x_ours": 0.5,
                                                          "path": "torch"}}
        assert m["speedup"] == {} and "best_anchor" not in m  # an A/B column is no anchor
    assert out["fwdbwd"]["columns"]["ab small_seq_tiled_fwd_grid=2"]["check"]["grads"]["ok"]
    # every call of the column (probe and timing, both modes) ran under the setting
    assert settings and set(settings) == {"small_seq_tiled_fwd_grid=2"}
    assert sorted(col for _, col in clocks.calls) == sorted(
        ["ours", "ab small_seq_tiled_fwd_grid=2"] * 2)


def test_a_column_that_does_not_capture_puts_its_row_on_the_eager_clock(clocks):
    clocks.refuse = {"varlen_attn"}
    out = _bench(ROWS[1], fwd_only=True)
    m = out["fwd"]
    assert m["clock"] == "eager" and "fwdbwd" not in out
    assert {n: c["ms"] for n, c in m["columns"].items() if "ms" in c} == {
        "ours": 1.5, "flash_varlen": 3.0, "varlen_attn": 3.0, "sdpa_efficient": 3.0}
    assert m["speedup_vs_best"] == 2.0
    # the next row of the mode goes to the eager clock without trying a capture again
    clocks.calls.clear()
    assert _bench(ROWS[0], fwd_only=True)["fwd"]["clock"] == "eager"
    assert {c for c, _ in clocks.calls} == {"eager"}


def test_forced_clocks(clocks):
    clocks.refuse = {"varlen_attn"}
    m = _bench(ROWS[1], fwd_only=True, clock="graph")["fwd"]
    assert m["clock"] == "graph" and "not capturable" in m["columns"]["varlen_attn"]["error"]
    assert m["columns"]["flash_varlen"]["ms"] == 2.0
    assert "varlen_attn" not in m["speedup"]
    clocks.calls.clear()
    assert _bench(ROWS[1], fwd_only=True, clock="eager")["fwd"]["clock"] == "eager"
    assert {c for c, _ in clocks.calls} == {"eager"}


def test_padded_columns_are_skipped_where_they_do_not_fit(clocks, monkeypatch):
    monkeypatch.setattr(S, "free_bytes", lambda device: 1000)
    m = _bench(ROWS[0], fwd_only=True)["fwd"]
    for name in ("sdpa_cudnn", "sdpa_efficient"):
        assert m["columns"][name]["error"].startswith("skipped: padded tensors")
    assert set(m["speedup"]) == {"flash_varlen", "varlen_attn"}


def test_a_wrong_output_fails_the_check_and_the_run(clocks, monkeypatch, tmp_path):
    real = S.ours_column

    def wrong(row, n, x, backward):
        col = real(row, n, x, backward)
        fwd = col.fwd
        col.fwd = lambda: fwd() * 1.1
        return col

    monkeypatch.setattr(S, "ours_column", wrong)
    monkeypatch.setattr(S, "copy_bandwidth", lambda: 1e9)
    monkeypatch.setattr(S, "matmul_throughput", lambda dtype: 1e12)
    monkeypatch.setattr(S, "device_name", lambda: "cpu")
    real_row = S.bench_row
    monkeypatch.setattr(S, "bench_row", lambda *a, **kw: real_row(*a, **kw, device="cpu"))
    args = argparse.Namespace(cases=ROWS[0].name, seed=0, no_anchors=False, fwd_only=False,
                              clock="auto", json=tmp_path / "r.json", no_progress=True, ab=[])
    assert S.main_ragged(args, ["--ranking", "--ragged", "--json", "x.json"]) == 1
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["command"] == "rocm-attn bench small-seq --ranking --ragged"
    assert S.checks_failed(report["rows"][0]) == ["fwd/ours", "fwdbwd/ours"]
    lines = ragged_table.table([report], report["rows"])
    assert lines[-1].startswith("Failed float64 checks: " + ROWS[0].name + " fwd/ours")
    assert any(line.startswith(f"| {ROWS[0].name} |") and " | 1000.0! | " in line
               for line in lines)


def test_bad_row_names_and_flags(capsys):
    args = argparse.Namespace(cases="u8_c1-4_k1-4_h8kv3_d128_bf16")
    assert S.main_ragged(args) == 2
    assert "multiple of h_kv" in capsys.readouterr().err
    assert [r.name for r in S.parse_cases(None)] == [r.name for r in R.ROWS]
    with pytest.raises(SystemExit):
        cli.main(["bench", "small-seq", "--ragged"])
    assert "--ranking --ragged" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert cli.main(["bench", "small-seq", "--ranking", "--ragged"]) == 1
        assert "benchmarks need a GPU" in capsys.readouterr().err


def test_path_codes():
    assert S.path_code(["fused_attn_small_seq: compiled tiled kernels (cuda:0, bf16, head dim "
                        "128)"]) == "tiled"
    assert S.path_code(["fused_attn_small_seq: compiled one-query kernels (x)"]) == "one-query"
    assert S.path_code(["fused_attn_small_seq: flash route (up to 8 rows ...)"]) == "flash"
    assert S.path_code(["fused_attn_small_seq: max_seqlen_kv 5000 > 4096 (the tiled kernels' "
                        "limit): rocm_attn.attention (varlen) serves the call"]) == "varlen"
    assert S.path_code([]) == "?"


def _report(tmp_path, name, rows, bw=4200.0):
    report = {"device": "GPU X", "torch": "2.x", "copy_bandwidth_GBps": bw,
              "matmul_TFLOPs": {"bf16": 680.0}, "seed": 0, "date": "2026-01-01",
              "command": "rocm-attn bench small-seq --ranking --ragged", "rows": rows}
    path = tmp_path / name
    path.write_text(json.dumps(report))
    return str(path)


def _mode(floor_us, ours_us, anchors_us, bound="bytes", clock="graph"):
    cols = {"ours": {"ms": ours_us / 1e3, "check": {"ok": True, "rel_err": 1e-3}}}
    for name, us in anchors_us.items():
        cols[name] = ({"error": us} if isinstance(us, str) else
                      {"ms": us / 1e3, "check": {"ok": True, "rel_err": 1e-3}})
    timed = {n: c["ms"] for n, c in cols.items() if n != "ours" and "ms" in c}
    best = min(timed, key=timed.get)
    return {"floor_ms": floor_us / 1e3, "bytes_floor_ms": floor_us / 1e3, "matrix_floor_ms": 0.0,
            "bound": bound, "path": "tiled", "clock": clock, "columns": cols,
            "sdpa_default": "CUDNN_ATTENTION",
            "ms": ours_us / 1e3, "pct_floor": 100 * floor_us / ours_us,
            "speedup": {n: t / (ours_us / 1e3) for n, t in timed.items()},
            "best_anchor": best, "best_anchor_ms": timed[best],
            "speedup_vs_best": timed[best] / (ours_us / 1e3)}


def _row(case, fwd, fb, label="issue: x"):
    return {"case": case, "label": label, "fwd": fwd, "fwdbwd": fb}


def test_table_summary_and_page(tmp_path):
    a = _row("u512_c64-512_k16-512_h8kv8_d128_bf16",
             _mode(268, 700, {"flash_varlen": 700, "varlen_attn": 720, "sdpa_cudnn": "n/a: x",
                              "sdpa_efficient": 2000}),
             _mode(804, 2000, {"varlen_attn": 2100, "sdpa_cudnn": "skipped: padded",
                               "sdpa_efficient": 5000}))
    b = _row("u2048_c8-64_k4-16_h8kv8_d128_bf16",
             _mode(92, 100, {"flash_varlen": 180, "varlen_attn": 200, "sdpa_cudnn": 400,
                             "sdpa_efficient": 300}),
             _mode(275, 400, {"varlen_attn": 900, "sdpa_cudnn": 1000, "sdpa_efficient": 950}),
             label="drawn")
    again = _row(b["case"], _mode(92, 95, {"flash_varlen": 180, "varlen_attn": 200,
                                           "sdpa_cudnn": 400, "sdpa_efficient": 300}),
                 _mode(275, 380, {"varlen_attn": 900, "sdpa_cudnn": 1000,
                                  "sdpa_efficient": 950}), label="drawn")
    headers, rows = ragged_table.load([_report(tmp_path, "1.json", [a, b]),
                                       _report(tmp_path, "2.json", [again], bw=4100)])
    assert [r["case"] for r in rows] == [a["case"], b["case"]] and rows[1] is not b
    lines = ragged_table.table(headers, rows)
    assert lines[0] == ("GPU X, torch 2.x, copy bandwidth 4200, 4100 GB/s, matrix products bf16 "
                        "680; bf16 680 TFLOP/s, seed 0; 2026-01-01: `rocm-attn bench small-seq "
                        "--ranking --ragged`; 2026-01-01: `rocm-attn bench small-seq --ranking "
                        "--ragged`")
    fwd_a = next(line for line in lines if line.startswith(f"| {a['case']} |"))
    assert fwd_a.split(" | ")[1:] == ["issue: x", "tiled", "graph", "268.0 b", "700.0", "38%",
                                      "1.00", "1.03", "n/a", "2.86", "cudnn",
                                      "700.0 (flash_varlen)", "1.00 |"]
    fb_a = [line for line in lines if line.startswith(f"| {a['case']} |")][1]
    assert fb_a.split(" | ")[7:10] == ["1.05", "skip", "2.50"]
    summary = ragged_table.summary(rows + [dict(a, case="u256_c512_k256_h8kv8_d128_bf16",
                                                ragged=False)])  # equal lengths: no target
    assert summary[-1] == "clocks: graph; rows 3, of them 2 ragged"
    assert summary[0] == "forward slower than the best anchor: none"
    assert summary[1].endswith(f": {a['case']} 1.00x (flash varlen at 38% of the floor)")
    assert summary[2].endswith(f": {a['case']} 38% (bytes)")  # b: 97% of a floor over 50 us
    assert summary[3].endswith(f": {a['case']} 1.05x")  # b: 2.37x varlen_attn
    assert summary[4].endswith(f": {a['case']} 40% (bytes)")
    # into a page: under the heading, markers added once, replaced on the next write
    page = tmp_path / "perf.md"
    page.write_text("# P\n\n## Op\n\n### Ragged requests\n\nProse stays.\n\n## THD\n\nmore\n")
    ragged_table.write_page(page, lines)
    text = page.read_text()
    assert text.index("Prose stays.") < text.index(ragged_table.BEGIN) < text.index(
        fwd_a) < text.index(ragged_table.END) < text.index("## THD")
    ragged_table.write_page(page, ["new table"])
    text = page.read_text()
    assert text.count(ragged_table.BEGIN) == 1 and "new table" in text and fwd_a not in text
    assert text.endswith("## THD\n\nmore\n")
    page.write_text("# P\n\n## Other\n")
    with pytest.raises(SystemExit, match="Ragged requests"):
        ragged_table.write_page(page, lines)


def test_padded_set_is_the_thd_set_per_user():
    row = R.Row(5, R.Dist("uniform", 1, 6), R.Dist("uniform", 1, 9), h_q=4, h_kv=2, d=64)
    n = R.draw_lengths(row, 1)
    x = S.make_set(row, n, "cpu", 3)
    p = S.padded_set(row, n, x)
    assert p["q"].shape == (5, 4, n.max_q, 64) and p["k"].shape == (5, 4, n.max_kv, 64)
    assert p["mask"].shape == (5, 1, 1, n.max_kv) and p["q"].is_contiguous()
    for u in range(5):
        rq, rk = slice(int(x["cu_q_cpu"][u]), int(x["cu_q_cpu"][u + 1])), slice(
            int(x["cu_kv_cpu"][u]), int(x["cu_kv_cpu"][u + 1]))
        c, k = int(n.cands[u]), int(n.keys[u])
        assert torch.equal(p["q"][u, :, :c], x["q"][rq].transpose(0, 1))
        assert torch.equal(p["dout"][u, :, :c], x["dout"][rq].transpose(0, 1))
        assert torch.equal(p["k"][u, :, :k], x["k"][rk].repeat_interleave(2, 1).transpose(0, 1))
        assert torch.equal(p["v"][u, 3, :k], x["v"][rk][:, 1])  # q head 3 reads kv head 1
        assert not p["q"][u, :, c:].any() and not p["k"][u, :, k:].any()
        assert p["mask"][u, 0, 0].tolist() == [i < k for i in range(n.max_kv)]


def test_a_row_that_fails_is_reported_and_the_run_goes_on(clocks, monkeypatch, tmp_path):
    monkeypatch.setattr(S, "copy_bandwidth", lambda: 1e9)
    monkeypatch.setattr(S, "matmul_throughput", lambda dtype: 1e12)
    monkeypatch.setattr(S, "device_name", lambda: "cpu")
    real_row = S.bench_row

    def first_fails(row, *a, **kw):
        if row == ROWS[0]:
            raise torch.OutOfMemoryError("CUDA out of memory")
        return real_row(row, *a, **kw, device="cpu")

    monkeypatch.setattr(S, "bench_row", first_fails)
    report = S.run(ROWS, fwd_only=True, json_path=tmp_path / "r.json", show_progress=False)
    assert report["rows"][0] == {"case": ROWS[0].name, "label": "",
                                 "error": "OutOfMemoryError: CUDA out of memory"}
    assert report["rows"][1]["fwd"]["ms"] == 1.0
    assert json.loads((tmp_path / "r.json").read_text()) == report
    lines = ragged_table.table([report], report["rows"])
    assert lines[-1] == (f"Rows that did not run: {ROWS[0].name} (OutOfMemoryError: CUDA out "
                         "of memory).")
    assert ragged_table.summary(report["rows"])[-1] == "clocks: graph; rows 2, of them 2 ragged"
    assert report["rows"][1]["ragged"]


def test_list_prints_the_rows_without_a_gpu(capsys):
    assert cli.main(["bench", "small-seq", "--ranking", "--ragged", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 + len(R.ROWS)
    row = R.ISSUE_ROWS[7]
    n = R.draw_lengths(row, 0)
    line = next(x for x in lines if x.startswith(row.name))
    assert f" {n.total_kv} " in line and f"{n.max_q}/{n.max_kv}" in line
    assert cli.main(["bench", "small-seq", "--ranking", "--ragged", "--list", "--cases",
                     ROWS[0].name]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2
    with pytest.raises(SystemExit):
        cli.main(["bench", "small-seq", "--ranking", "--list"])


def test_out_of_memory_in_a_capture_is_that_columns_error_not_a_clock_change(clocks,
                                                                             monkeypatch):
    graph = clocks.graph

    def oom_for_sdpa(fn, reps, warmup, calls):
        if fn.column == "sdpa_efficient":
            raise torch.OutOfMemoryError("CUDA out of memory")
        return graph(fn, reps, warmup, calls)

    monkeypatch.setattr(S, "graph_ms", oom_for_sdpa)
    m = _bench(ROWS[1], fwd_only=True)["fwd"]
    assert m["clock"] == "graph" and m["columns"]["sdpa_efficient"]["error"].startswith(
        "OutOfMemoryError")
    assert set(m["speedup"]) == {"flash_varlen", "varlen_attn"}
    assert S._incapturable["fwd"] == set()
