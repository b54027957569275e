"""The `rocm-attn` command line: info, selftest, demo, bench (CPU behaviour), plots, progress,
and the README's set-up commands being the ones CI runs."""

from __future__ import annotations

import re
import runpy
import sys
from pathlib import Path

import pytest
import torch

from rocm_attn import __main__ as cli
from rocm_attn import demo
from rocm_attn.bench import SUITES
from rocm_attn.bench.progress import progress

ROOT = Path(__file__).resolve().parent.parent
NO_GPU = not torch.cuda.is_available()


def test_info_text_and_json(capsys):
    assert cli.main(["info"]) == 0
    text = capsys.readouterr().out
    for field in ("torch", "device", "kernels", "extension", "fused_attn_small_seq",
                  "attn_with_cp"):
        assert field in text
    assert cli.main(["info", "--json"]) == 0
    assert '"backends"' in capsys.readouterr().out


def test_info_arch_warning_spellings():
    """Build arch names in every spelling (TORCH_CUDA_ARCH_LIST's "9.0a", setup.py's default
    "sm_90a") match the device's compute capability; another device is warned about."""
    from rocm_attn.info import arch_mismatch

    for built in (["sm_90a"], ["9.0a"], ["9.0"], ["9.0+PTX"], ["sm_90"]):
        assert arch_mismatch("sm_90", built) is None, built
    warning = arch_mismatch("sm_100", ["sm_90a"])
    assert warning and "TORCH_CUDA_ARCH_LIST=10.0" in warning
    assert arch_mismatch("gfx942", ["gfx90a"]) and arch_mismatch("gfx90a", ["gfx90a"]) is None


def test_selftest_passes(capsys):
    assert cli.main(["selftest"]) == 0
    out = capsys.readouterr().out
    assert "selftest passed" in out and "FAIL" not in out
    for op in ("fused_attn_small_seq", "nn.TargetAttention", "thd.merge_partial", "attn_with_cp"):
        assert op in out


def test_demo_small_cpu_batch(capsys):
    assert cli.main(["demo", "--device", "cpu", "--batch", "64", "--iters", "1"]) == 0
    out = capsys.readouterr().out
    assert "candidates/s" in out and "PASS" in out and "torch path" in out
    # the batch of pairs and the ranking request, each checked against float64
    assert out.count("PASS") == 2 and "8 users x 64 candidates" in out, out
    assert "histories of 1..200 items" in out and "once per user" in out


def test_demo_request_size_options(capsys):
    argv = ["demo", "--device", "cpu", "--batch", "8", "--iters", "1", "--users", "3",
            "--candidates", "5"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "3 users x 5 candidates" in out and out.count("PASS") == 2, out


def test_demo_exits_nonzero_when_the_check_fails(capsys, monkeypatch):
    monkeypatch.setitem(demo.TOLERANCE, torch.float32, 0.0)
    assert cli.main(["demo", "--device", "cpu", "--batch", "16", "--iters", "1"]) == 1
    assert "FAIL" in capsys.readouterr().out


@pytest.mark.skipif(not NO_GPU, reason="checks the message on a machine without a GPU")
@pytest.mark.parametrize("suite", list(SUITES))
def test_bench_without_gpu_fails_with_a_clear_message(suite, capsys):
    assert cli.main(["bench", suite]) != 0
    err = capsys.readouterr().err
    assert f"rocm-attn bench {suite}: benchmarks need a GPU" in err and "rocm-attn demo" in err


@pytest.mark.skipif(not NO_GPU, reason="checks the message on a machine without a GPU")
def test_small_seq_bench_without_gpu_names_its_cpu_mode(capsys):
    assert cli.main(["bench", "small-seq"]) == 1
    assert "`rocm-attn bench small-seq --device cpu`" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--device", "cpu", "--dtype", "float16"], "--dtype is not used by --device cpu"),
    (["--device", "cpu", "--ranking"], "--ranking times the GPU kernels"),
    (["--device", "cpu", "--batch", "64"], "--batch is not used by --device cpu"),
    (["--device", "cpu", "--no-anchors"], "--no-anchors is not used by --device cpu"),
    (["--device", "cpu", "--ab", "small_seq_mma=0"], "--ab is not used by --device cpu"),
    (["--ranking", "--batch", "64"], "--batch is not used by --ranking (GPU)"),
    (["--ranking", "--plot", "x.png"], "--plot is not used by --ranking (GPU)"),
    (["--threads", "2"], "--threads is not used by the GPU case grid"),
    (["--reps", "3"], "--reps is not used by the GPU case grid"),
    (["--fwd-only"], "--fwd-only is not used by the GPU case grid"),
])
def test_small_seq_bench_flag_its_mode_ignores_is_a_usage_error(argv, message, capsys):
    """Checked before anything runs, on any machine: exit 2 naming the flag and its modes."""
    with pytest.raises(SystemExit) as exc:
        cli.main(["bench", "small-seq"] + argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "usage: rocm-attn bench small-seq" in err, err


def test_small_seq_bench_mode_table_names_real_flags(monkeypatch):
    from rocm_attn.bench import small_seq

    seen = {}

    class Stop(Exception):
        pass

    def capture(parser, args):  # the parsed namespace holds every flag's dest
        seen.update(vars(args))
        raise Stop

    monkeypatch.setattr(small_seq, "_check_mode_flags", capture)
    with pytest.raises(Stop):
        small_seq.main([])
    assert set(small_seq.MODE_FLAGS) <= set(seen)
    assert {m for modes in small_seq.MODE_FLAGS.values() for m in modes} <= set(
        small_seq.MODE_NAMES)


@pytest.mark.skipif(not NO_GPU, reason="checks the message on a machine without a GPU")
def test_tools_shim_keeps_working(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["tools/bench_small_seq.py", "--json", "x.json"])
    with pytest.raises(SystemExit) as exc:
        runpy.run_path(str(ROOT / "tools" / "bench_small_seq.py"), run_name="__main__")
    assert exc.value.code == 1 and "benchmarks need a GPU" in capsys.readouterr().err


def test_bench_forwards_flags_and_help(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["bench", "small-seq", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "rocm-attn bench small-seq" in out and "--plot" in out and "--cases" in out
    assert cli.main(["bench", "nonsense"]) == 2
    assert "unknown suite" in capsys.readouterr().err


def test_bench_plot_without_matplotlib_says_how_to_install(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import now raises ImportError
    with pytest.raises(SystemExit) as exc:
        cli.main(["bench", "thd", "--plot", "out.png"])
    assert exc.value.code == 2
    assert "pip install matplotlib" in capsys.readouterr().err


def test_progress_plain_lines_on_a_log(capsys):
    assert list(progress(["a", "b"], "suite")) == ["a", "b"]
    err = capsys.readouterr().err
    if "it/s" in err or "case/s" in err:  # tqdm drew the bar instead
        return
    assert "suite [1/2] a" in err and "suite [2/2] b" in err and "done in" in err


def test_plot_reports_of_each_suite(tmp_path):
    pytest.importorskip("matplotlib")
    from rocm_attn.bench import cp, small_seq, thd

    mode = {"pct_floor": 80.0, "efficiency": 0.7}
    small = {"device": "X", "rows": [{"case": "c1", "dtype": "torch.bfloat16", "batch": 8,
                                      "fwd": mode, "fwdbwd": mode}]}
    thd_report = {"device": "X", "h": 16, "d": 64, "dtype": "bf16",
                  "rows": [{"case": "c1", "helper": "partition", "pct_floor": 50.0},
                           {"case": "c2", "helper": "partition", "pct_floor": 60.0}]}
    cp_report = {"device": "X", "cp": 2, "tokens": 1024, "mask": "causal",
                 "rows": [{"comm": "p2p", "mask": "causal", "fwd": mode, "fwdbwd": mode}]}
    for module, report in ((small_seq, small), (thd, thd_report), (cp, cp_report)):
        path = module.plot_report(report, tmp_path / f"{module.__name__}.png")
        assert path.stat().st_size > 1000


def _readme_setup_commands() -> list:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Set-up", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.*?)\n```", section, flags=re.S)


def test_ci_runs_exactly_the_readme_setup_commands():
    commands = _readme_setup_commands()
    assert len(commands) == 2, commands
    assert "rocm-attn demo" in commands[0] and "pytest" in commands[1]
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    for command in commands:
        assert command.strip() in ci_lines, f"{command!r} is not a line of .ci/run"


def test_console_script_is_declared():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["rocm-attn"] == "rocm_attn.__main__:main"


@pytest.mark.parametrize("argv,match", [
    (["--batch", "0"], "--batch: must be >= 1, got 0"),
    (["--batch", "-5"], "--batch: must be >= 1, got -5"),
    (["--batch", "many"], "--batch: expected a positive integer"),
    (["--iters", "0"], "--iters: must be >= 1, got 0"),
    (["--iters", "-1"], "--iters: must be >= 1, got -1"),
    (["--device", "gpu0"], "--device: expected cpu, cuda or cuda:N, got 'gpu0'"),
    (["--device", "cuda:x"], "--device: expected cpu, cuda or cuda:N"),
    (["--users", "0"], "--users: must be >= 1, got 0"),
    (["--candidates", "-3"], "--candidates: must be >= 1, got -3"),
], ids=["batch0", "batch-5", "batch_word", "iters0", "iters-1", "device_gpu0", "device_cuda_x",
        "users0", "candidates-3"])
def test_demo_bad_arguments_are_usage_errors(argv, match, capsys):
    """A wrong value is argparse's usage error (exit 2), never a traceback or the default."""
    with pytest.raises(SystemExit) as exc:
        cli.main(["demo"] + argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert match in err and "Traceback" not in err, err


def _one_line_failure(argv, capsys) -> str:
    assert cli.main(["demo"] + argv) == 1
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert err.startswith("rocm-attn demo: ") and "\n" not in err, err
    assert "candidates/s" not in captured.out  # nothing ran
    return err


def test_demo_kernel_backend_on_cpu_is_one_line(capsys):
    err = _one_line_failure(["--device", "cpu", "--backend", "kernel"], capsys)
    assert "--backend kernel needs a GPU" in err


@pytest.mark.skipif(not NO_GPU, reason="checks the message on a machine without a GPU")
def test_demo_cuda_without_gpu_is_one_line(capsys):
    err = _one_line_failure(["--device", "cuda", "--batch", "8"], capsys)
    assert "torch sees no GPU" in err and "--device cpu" in err


@pytest.mark.parametrize("kwargs,match", [
    (dict(batch=0), "batch"), (dict(batch=-5), "batch"), (dict(iters=0), "iters"),
    (dict(device="gpu0"), "device"), (dict(device="cpu", backend="kernel"), "backend kernel"),
    (dict(users=0), "users"), (dict(candidates=-1), "candidates"),
], ids=["batch0", "batch-5", "iters0", "device_gpu0", "kernel_on_cpu", "users0", "candidates-1"])
def test_demo_main_rejects_bad_values(kwargs, match):
    """The Python entry point: 0 is an error, not "the default"."""
    with pytest.raises(ValueError, match=match):
        demo.main(**kwargs)


def test_version_flag_prints_the_package_version(capsys):
    import rocm_attn

    tomllib = pytest.importorskip("tomllib")
    with pytest.raises(SystemExit) as exc:
        cli.main(["--version"])
    assert exc.value.code == 0
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert capsys.readouterr().out.strip() == f"rocm_attn {project['version']}"
    assert rocm_attn.__version__ == project["version"]


@pytest.mark.skipif(not NO_GPU, reason="checks the refusal on a machine without kernels")
def test_info_require_kernels_fails_clearly_without_them(capsys):
    assert cli.main(["info", "--require-kernels"]) == 1
    err = capsys.readouterr().err
    assert "compiled kernels are required but not loaded" in err
