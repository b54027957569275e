"""The examples run on a CPU: examples/recsys_inference.py (small sizes) with its two models
agreeing; examples/torchrec_ranking.py (with torchrec installed) in every mode, each agreeing
with eager mode and eager mode with a float64 loop."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest
import torch

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
EXAMPLE = EXAMPLES / "recsys_inference.py"


def _load(path: Path = EXAMPLE):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_recsys_example_cpu_path(capsys):
    example = _load()
    # compile with the "eager" backend: dynamo traces both models (fullgraph) without needing
    # a C++ toolchain or minutes of inductor codegen
    rc = example.main(["--device", "cpu", "--batch", "48", "--iters", "1",
                       "--compile-backend", "eager"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "eager (inference_mode)" in out and "torch.compile (eager)" in out
    assert "graphs need a GPU" in out and "check:" in out and "PASS" in out
    assert "batch: 48 (user, candidate) pairs" in out
    assert "request: 8 users x 64 candidates, histories of 1..200 items" in out
    assert "failed" not in out, out


def test_compile_failure_is_reported_not_fatal(capsys, monkeypatch):
    example = _load()

    def broken_compile(*args, **kwargs):
        raise RuntimeError("no C++ compiler found")

    monkeypatch.setattr(torch, "compile", broken_compile)
    rc = example.main(["--device", "cpu", "--batch", "16", "--iters", "1"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "failed: RuntimeError: no C++ compiler found" in out and "--no-compile" in out


def test_models_share_weights():
    example = _load()
    models = example.build_models(50, 256, torch.device("cpu"), torch.float32)
    a, b = (dict(m.named_parameters()) for m in models.values())
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_request_models_agree_with_ragged_candidates_and_histories():
    """The request form of both models on a small request: same logits, one per candidate."""
    example = _load()
    models = example.build_models(50, 256, torch.device("cpu"), torch.float32,
                                  example.REQUEST_HISTORY)
    inputs = example.make_request(3, 5, 50, torch.device("cpu"), seed=7)
    with torch.inference_mode():
        a, b = (example.RequestRanker(m, 5)(*inputs) for m in models.values())
    assert a.shape == (15,) and torch.isfinite(a).all()
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_bad_request_sizes_are_usage_errors(capsys):
    example = _load()
    for argv in (["--users", "0"], ["--candidates", "-2"]):
        try:
            example.main(["--device", "cpu"] + argv)
        except SystemExit as exc:
            assert exc.code == 2
        else:
            raise AssertionError(f"{argv} was accepted")
    assert "must be >= 1" in capsys.readouterr().err


def test_torchrec_ranking_example_every_mode(capsys):
    """KeyedJaggedTensor -> EmbeddingCollection -> TargetAttention -> head: eager (against a
    float64 loop), torch.compile, AOTInductor and ONNX (onnxruntime) agree on two requests of
    different sizes; ONNX is reported as skipped where onnxruntime is not installed."""
    pytest.importorskip("torchrec")
    example = _load(EXAMPLES / "torchrec_ranking.py")
    threads = torch.get_num_threads()
    try:
        rc = example.main(["--threads", "1"])
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "check: every mode within 1e-04: PASS" in out, out
    rows = {m.group(1): m.group(2) for m in
            re.finditer(r"^(eager|compile|aoti|onnx) +(.*)$", out, re.M)}
    assert set(rows) == set(example.MODES), out
    for mode, row in rows.items():
        if mode == "onnx" and "skipped: needs" in row:
            continue
        diff = float(row.split()[2])
        assert diff <= 1e-4, (mode, row)  # a NaN would print nan and fail here
    assert rows["eager"].endswith("float64 loop"), rows["eager"]


def test_torchrec_ranking_example_reports_a_failing_mode(capsys, monkeypatch):
    pytest.importorskip("torchrec")
    example = _load(EXAMPLES / "torchrec_ranking.py")

    def broken(model, requests, workdir):
        raise RuntimeError("no C++ compiler found")

    monkeypatch.setitem(example.RUNNERS, "aoti", broken)
    assert example.main(["--modes", "eager,aoti", "--users", "2"]) == 1
    out = capsys.readouterr().out
    assert "failed: RuntimeError: no C++ compiler found" in out and "FAIL" in out


def test_torchrec_ranking_example_without_torchrec_names_the_install(monkeypatch):
    example = _load(EXAMPLES / "torchrec_ranking.py")
    for name in ("torchrec", "torchrec.sparse.jagged_tensor", "torchrec.modules.embedding_modules",
                 "torchrec.modules.embedding_configs"):
        monkeypatch.setitem(sys.modules, name, None)  # import now raises ImportError
    with pytest.raises(SystemExit, match=r"rocm_attn\[torchrec\]"):
        example.main(["--modes", "eager"])


def test_torchrec_ranking_example_usage_errors(capsys):
    example = _load(EXAMPLES / "torchrec_ranking.py")
    for argv in (["--modes", "eager,tpu"], ["--modes", "compile"], ["--users", "0"],
                 ["--threads", "0"]):
        with pytest.raises(SystemExit) as exc:
            example.main(argv)
        assert exc.value.code == 2, argv
