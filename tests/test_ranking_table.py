"""tools/ranking_table.py: the ranking grid's table and target accounting from bench JSON files,
a grid run in parts joined (CPU only, synthetic rows)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import ranking_table  # noqa: E402


def _mode(floor_us, us, anchor_us, matrix_us=None, path="tiled kernels"):
    m = {"floor_ms": floor_us / 1e3, "ms": us / 1e3, "pct_floor": 100 * floor_us / us,
         "path": path, "best_anchor_ms": anchor_us / 1e3, "speedup_vs_best": anchor_us / us,
         "anchors": {"sdpa_fixed": {"ms": anchor_us / 1e3}, "varlen": {"error": "x"}}}
    if matrix_us is not None:
        m["matrix_floor_ms"] = matrix_us / 1e3
    return m


def _row(users, cands, hist, h_kv, fwd, both):
    case = f"u{users}_c{cands}_kv{hist}f_hkv{h_kv}_d128"
    return {"case": case, "users": users, "cands": cands, "hist": hist, "ragged": False,
            "h_kv": h_kv, "d": 128, "fwd": _mode(*fwd), "fwdbwd": _mode(*both)}


def _write(path, rows, bw, tflops=None):
    header = {"device": "GPU X", "torch": "2.x", "copy_bandwidth_GBps": bw, "rows": rows}
    if tflops is not None:
        header["matmul_TFLOPs"] = tflops
    path.write_text(json.dumps(header))
    return str(path)


def test_parts_join_later_rows_replace_earlier(tmp_path):
    a = _row(4096, 512, 256, 8, (4000, 7000, 5000), (12000, 39000, 32000))
    b = _row(4096, 1, 16, 8, (95, 100, 360), (280, 310, 1500))
    again = _row(4096, 512, 256, 8, (4000, 6000, 5000), (12000, 30000, 32000))
    first = _write(tmp_path / "1.json", [a, b], 3000.4)
    second = _write(tmp_path / "2.json", [again], 2960.0)
    headers, rows = ranking_table.load([first, second])
    assert [r["case"] for r in rows] == [a["case"], b["case"]]  # first place kept
    assert rows[0] is not a and rows[0]["fwd"]["ms"] == 6000 / 1e3
    lines = ranking_table.table(headers, rows)
    assert lines[0] == "GPU X, torch 2.x, copy bandwidth 3000, 2960 GB/s"
    body = [line for line in lines if line.startswith("| u")]
    assert len(body) == 2
    assert body[0].split(" | ")[1:9] == ["tiled", "4000.0", "-", "6000.0", "67%", "-",
                                          "5000.0 (sdpa_fixed)", "0.83"]


def test_summary_counts_the_targets():
    rows = [
        # forward 57% (under 85%), slower than the anchor; forward+backward 40%, 0.83x
        _row(4096, 512, 256, 8, (4000, 7000, 5000), (12000, 30000, 25000)),
        # floors at 50 us or less count for no % target
        _row(256, 1, 16, 2, (2, 4, 60), (5, 10, 400)),
        # forward 90%, 3.6x; forward+backward 75%; its anchor at 19% of the floor: under 3x?
        _row(4096, 16, 16, 2, (108, 120, 430), (336, 448, 1500)),
    ]
    lines = ranking_table.summary(rows)
    assert lines[0].startswith("forward: 1 of 2 rows whose floor exceeds 50 us reach 85%")
    assert "u4096_c512_kv256f_hkv8_d128 57%" in lines[0]
    assert lines[1].startswith("forward+backward: 1 of 2 rows")
    assert "u4096_c512_kv256f_hkv8_d128 40%" in lines[1]
    assert lines[2] == "forward slower than the best anchor: u4096_c512_kv256f_hkv8_d128 0.71x"
    assert lines[3] == ("forward+backward slower than the best anchor: "
                        "u4096_c512_kv256f_hkv8_d128 0.83x")
    # the weak-anchor rule: anchor under 30% of the floor and ours under 3x
    assert lines[4].endswith(": none")  # 3.58x forward
    assert "u4096_c16_kv16f_hkv2_d128 3.35x" not in lines[5] and lines[5].endswith(": none")
    kinds = {line.split(" (")[0]: line for line in lines[6:]}
    assert set(kinds) == {"128-512 candidates, 256 keys", "1 query, <= 16 keys",
                          "16 candidates, 2 kv heads"}
    assert "forward no floor over 50 us, 15.00-15.00x" in kinds["1 query, <= 16 keys"]
    assert "forward 90-90% of the floor" in kinds["16 candidates, 2 kv heads"]


def test_command_line_prints_table_or_summary(tmp_path, capsys, monkeypatch):
    path = _write(tmp_path / "r.json", [_row(4096, 16, 16, 2, (108, 120, 430),
                                              (336, 448, 1500))], 3000)
    monkeypatch.setattr(sys, "argv", ["ranking_table.py", path])
    ranking_table.main()
    assert ("| u4096_c16_kv16f_hkv2_d128 | tiled | 108.0 | - | 120.0 | 90% | - |"
            in capsys.readouterr().out)
    monkeypatch.setattr(sys, "argv", ["ranking_table.py", path, "--summary"])
    ranking_table.main()
    assert capsys.readouterr().out.startswith("forward: 1 of 1 rows")


def test_compare_two_builds(tmp_path, capsys, monkeypatch):
    """--base: the base build's repeats against the new build's, per row and mode; a mode that
    one build did not time (forward-only runs) is left out."""
    slow = _row(4096, 128, 256, 2, (1000, 2000, 5000), (3000, 8000, 9000))
    fast = _row(4096, 128, 256, 2, (1000, 1600, 5000), (3000, 8000, 9000))
    fast_fwd_only = dict(_row(4096, 128, 256, 2, (1000, 1500, 5000), (3000, 1, 9000)))
    del fast_fwd_only["fwdbwd"]
    base = [_write(tmp_path / f"b{i}.json", [slow], 3000) for i in (1, 2)]
    new = [_write(tmp_path / "n1.json", [fast], 3000),
           _write(tmp_path / "n2.json", [fast_fwd_only], 3000)]
    monkeypatch.setattr(sys, "argv", ["ranking_table.py", "--base", *base, "--", *new])
    ranking_table.main()
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("case")
    fwd = [line for line in lines if " fwd " in line]
    both = [line for line in lines if " fwdbwd " in line]
    assert len(fwd) == 1 and len(both) == 1
    assert fwd[0].split()[2:] == ["1000", "2000", "2000", "/", "1600", "1500", "1.290"]
    assert both[0].split()[2:] == ["3000", "8000", "8000", "/", "8000", "1.000"]


def test_page_table_reads_back_and_takes_remeasured_rows(tmp_path):
    """A page's table (a .md file) reads back as rows: printed again it is the same table, its
    accounting is the JSON rows' (the % of the floor from the times, not the rounded cell), and
    a JSON file after it replaces its rows of the same case."""
    a = _row(4096, 512, 256, 8, (4000, 7000, 5000), (12000, 39000, 32000))
    b = _row(4096, 1, 16, 8, (94.94, 111.7, 360), (280, 310, 1500))  # 84.996% of the floor
    b["fwdbwd"] = {}  # a mode without a measurement
    a["fwdbwd"]["path"] = "flash route"
    run = _write(tmp_path / "run.json", [a, b], 3000)
    table = ranking_table.table(*ranking_table.load([run]))
    page = tmp_path / "page.md"
    page.write_text("# Page\n\ntext | with | bars\n\n" + "\n".join(table) + "\n\nmore\n")
    headers, rows = ranking_table.load([str(page)])
    assert ranking_table.table(headers, rows)[2:] == table[2:]
    assert ranking_table.summary(rows)[:4] == ranking_table.summary([a, b])[:4]
    assert "u4096_c1_kv16f_hkv8_d128 85%" in ranking_table.summary(rows)[0]  # under 85%
    again = _row(4096, 512, 256, 8, (4000, 6000, 5000), (12000, 30000, 32000))
    headers, rows = ranking_table.load([str(page), _write(tmp_path / "new.json", [again], 2960)])
    lines = ranking_table.table(headers, rows)
    assert lines[0] == f"GPU X, torch 2.x, copy bandwidth 2960 GB/s, joined into the rows of {page}"
    assert [line.split(" | ")[0] for line in lines[4:]] == ["| " + a["case"], "| " + b["case"]]
    assert lines[4].split(" | ")[1:5] == ["tiled", "4000.0", "-", "6000.0"]


def test_page_with_a_table_per_device(tmp_path):
    """A page keeping one table per device: `page.md` reads its first table alone, and
    `page.md#TEXT` the table after the first heading holding TEXT; a heading no line holds is an
    error naming it."""
    first = _row(4096, 512, 256, 8, (4000, 7000, 5000), (12000, 39000, 32000))
    second = _row(4096, 512, 256, 8, (2800, 6000, 3000), (8500, 30000, 20000))
    other = _row(256, 16, 64, 2, (30, 40, 120), (90, 130, 400))
    t1 = ranking_table.table(*ranking_table.load([_write(tmp_path / "a.json", [first], 3000)]))
    t2 = ranking_table.table(*ranking_table.load([_write(tmp_path / "b.json", [second, other],
                                                         4200)]))
    page = tmp_path / "page.md"
    page.write_text("# Page\n\n## On GPU X\n\n" + "\n".join(t1) + "\nafter\n\n## On GPU Y\n\n" +
                    "\n".join(t2) + "\n")
    _, rows = ranking_table.load([str(page)])
    assert [r["case"] for r in rows] == [first["case"]]
    assert rows[0]["fwd"]["ms"] == pytest.approx(7.0)
    _, rows = ranking_table.load([f"{page}#GPU Y"])
    assert [r["case"] for r in rows] == [second["case"], other["case"]]
    assert rows[0]["fwd"]["ms"] == pytest.approx(6.0)
    with pytest.raises(SystemExit, match="GPU Z"):
        ranking_table.load([f"{page}#GPU Z"])


def test_matrix_floor_and_roof(tmp_path):
    """Rows measured with the matrix floor: its cell, % of the roof (the larger floor), the
    summary's roof notes, the count of rows the matrix floor bounds, and a page read back."""
    matrix = _row(4096, 512, 256, 2, (3200, 5400, 5000, 3100), (9800, 25000, 30000, 11000))
    bytes_ = _row(4096, 16, 16, 2, (108, 120, 430, 1.5), (336, 448, 1500, 5.0))
    run = _write(tmp_path / "m.json", [matrix, bytes_], 3000, tflops=700.0)
    headers, rows = ranking_table.load([run])
    lines = ranking_table.table(headers, rows)
    assert lines[0] == "GPU X, torch 2.x, copy bandwidth 3000 GB/s, matrix products 700 TFLOP/s"
    cells = lines[4].split(" | ")
    # forward: byte floor larger (3200 > 3100): roof = floor; forward+backward: matrix (11000)
    assert cells[1:9] == ["tiled", "3200.0", "3100.0", "5400.0", "59%", "59%",
                          "5000.0 (sdpa_fixed)", "0.93"]
    assert cells[9:14] == ["9800.0", "11000.0", "25000.0", "39%", "44%"]
    summary = ranking_table.summary(rows)
    assert "u4096_c512_kv256f_hkv2_d128 59% (roof 59%)" in summary[0]
    assert "u4096_c512_kv256f_hkv2_d128 39% (roof 44%, matrix)" in summary[1]
    assert "forward rows whose matrix floor exceeds the byte floor: 0" in summary
    assert ("forward+backward rows whose matrix floor exceeds the byte floor: 1, at 44-44% of it"
            in summary)
    # the 3x target's note: a third of the anchor's time as a % of the roof (anchor at 25% of
    # the floor, ours 2.15x it)
    weak = _row(4096, 16, 16, 2, (108, 200, 430, 1.5), (336, 448, 1500, 5.0))
    weak_lines = ranking_table.summary([weak])
    assert "u4096_c16_kv16f_hkv2_d128 2.15x (3x needs 75% of the roof, ours 54%)" in weak_lines[4]
    kinds = [line for line in summary if line.startswith("128-512 candidates")]
    assert "59-59% of the roof" in kinds[0] and "44-44% of the roof" in kinds[0]
    # read back from a page: the same table and accounting
    page = tmp_path / "m.md"
    page.write_text("\n".join(lines) + "\n")
    headers, back = ranking_table.load([str(page)])
    assert ranking_table.table(headers, back)[2:] == lines[2:]
    assert ranking_table.summary(back)[:2] == summary[:2]


def test_page_without_matrix_floor_reads_back(tmp_path):
    """A page's table from before the matrix floor (12 cells a line) still reads: its rows get
    no matrix floor, and the summary leaves the matrix lines out."""
    old = ("| u4096_c512_kv256f_hkv8_d128 | tiled / flash route | 4000.0 | 7000.0 | 57% | "
           "5000.0 (sdpa_fixed) | 0.71 | 12000.0 | 30000.0 | 40% | 25000.0 (sdpa_fixed) | 0.83 |")
    page = tmp_path / "old.md"
    page.write_text("| a | b |\n" + old + "\n")
    _, rows = ranking_table.load([str(page)])
    assert len(rows) == 1
    fwd, both = rows[0]["fwd"], rows[0]["fwdbwd"]
    assert (fwd["ms"], fwd["floor_ms"], fwd["speedup_vs_best"]) == (7.0, 4.0, 0.71)
    assert both["path"] == "flash route" and both["best_anchor_ms"] == 25.0
    assert "matrix_floor_ms" not in fwd
    summary = ranking_table.summary(rows)
    assert not any("matrix floor" in line for line in summary)
    assert "u4096_c512_kv256f_hkv8_d128 57%" in summary[0] and "roof" not in summary[0]
