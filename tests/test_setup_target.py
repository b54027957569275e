"""setup.py's choice of build target, with a stand-in torch: a GPU build of torch on a machine
with neither its compiler nor a GPU installs without kernels (the CPU machine that got PyPI's
default CUDA wheel); with a GPU, or when the target is asked for, a missing compiler stops the
build with the fix."""

from __future__ import annotations

import importlib.util
import os
import sys
import types
from pathlib import Path

import pytest

SETUP = Path(__file__).resolve().parent.parent / "setup.py"


def _load_setup():
    spec = importlib.util.spec_from_file_location("rocm_attn_setup", SETUP)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # defines functions only: main() runs as __main__
    return module


def _fake_torch(monkeypatch, cuda: str = None, hip: str = None, gpu: bool = False,
                cuda_home: str = None, rocm_home: str = None) -> None:
    torch = types.ModuleType("torch")
    torch.version = types.SimpleNamespace(cuda=cuda, hip=hip)
    torch.cuda = types.SimpleNamespace(is_available=lambda: gpu)
    utils = types.ModuleType("torch.utils")
    ext = types.ModuleType("torch.utils.cpp_extension")
    ext.CUDA_HOME, ext.ROCM_HOME = cuda_home, rocm_home
    torch.utils, utils.cpp_extension = utils, ext
    for name, mod in (("torch", torch), ("torch.utils", utils), ("torch.utils.cpp_extension", ext)):
        monkeypatch.setitem(sys.modules, name, mod)


@pytest.fixture
def setup_py(monkeypatch):
    monkeypatch.delenv("ROCM_ATTN_FORCE_CPU", raising=False)
    monkeypatch.delenv("BUILD_TARGET", raising=False)
    return _load_setup()


def test_cuda_torch_without_nvcc_or_gpu_installs_cpu(setup_py, monkeypatch, capsys):
    _fake_torch(monkeypatch, cuda="12.8")
    assert setup_py.pick_target() == "cpu"
    assert "nvcc was not found" in capsys.readouterr().err


def test_cuda_torch_without_nvcc_on_a_gpu_machine_stops(setup_py, monkeypatch):
    _fake_torch(monkeypatch, cuda="12.8", gpu=True)
    with pytest.raises(SystemExit, match="nvcc was not found.*CUDA_HOME"):
        setup_py.pick_target()


def test_asked_for_target_without_compiler_stops(setup_py, monkeypatch, no_rocm, tmp_path):
    monkeypatch.setattr(setup_py, "OPT_ROCM", tmp_path / "opt_rocm")
    _fake_torch(monkeypatch, hip="6.3")
    monkeypatch.setenv("BUILD_TARGET", "rocm")
    with pytest.raises(SystemExit, match="hipcc/ROCM_HOME was not found.*ROCM_ATTN_FORCE_CPU"):
        setup_py.pick_target()


def test_cpu_torch_is_cpu(setup_py, monkeypatch):
    _fake_torch(monkeypatch)
    assert setup_py.pick_target() == "cpu"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_extension_links_the_loaded_libstdcxx():
    """The extension is linked against the shared libstdc++ torch runs with (named on the link
    line), never a static copy of its own: the GPU image's compiler ships only libstdc++.a, and a
    private copy of the stream code crashed every C++ check whose message held a number."""
    import torch  # the real one: the library it loaded is what the link must name

    args = _load_setup().loaded_libstdcxx()
    assert len(args) == 1, args
    lib = Path(args[0])
    assert lib.name.startswith("libstdc++.so") and lib.is_file(), lib
    maps = Path("/proc/self/maps").read_text()
    assert str(lib) in maps and torch.__version__


# --- where hipcc is found: ROCM_HOME, /opt/rocm, PATH, the ROCm SDK wheel ------------------

def _fake_rocm(root: Path, sub: str = "bin") -> Path:
    """A directory tree with an executable <root>/<sub>/hipcc."""
    (root / sub).mkdir(parents=True)
    hipcc = root / sub / "hipcc"
    hipcc.write_text("#!/bin/sh\nexit 0\n")
    hipcc.chmod(0o755)
    return root


@pytest.fixture
def no_rocm(monkeypatch, tmp_path):
    """No ROCm anywhere: no env, an empty PATH, no SDK wheel importable."""
    for var in ("ROCM_HOME", "ROCM_PATH"):
        monkeypatch.setenv(var, "")  # so that teardown restores what a test's build sets
        monkeypatch.delenv(var)
    empty = tmp_path / "empty_path"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name.startswith("_rocm_sdk") else
                        _real_find_spec(name, *a))
    return empty


_real_find_spec = importlib.util.find_spec


def test_rocm_found_nowhere_lists_where_it_looked(setup_py, no_rocm, tmp_path):
    home, looked = setup_py.find_rocm_home(opt_rocm=tmp_path / "opt_rocm")
    assert home is None
    text = "; ".join(looked)
    assert "opt_rocm" in text and "hipcc on PATH (none)" in text and "rocm-sdk" in text


def test_rocm_home_env_first(setup_py, no_rocm, tmp_path, monkeypatch):
    env_root = _fake_rocm(tmp_path / "env_rocm")
    _fake_rocm(tmp_path / "opt_rocm")
    monkeypatch.setenv("ROCM_HOME", str(env_root))
    assert setup_py.find_rocm_home(opt_rocm=tmp_path / "opt_rocm")[0] == str(env_root)


def test_rocm_home_env_without_hipcc_falls_through(setup_py, no_rocm, tmp_path, monkeypatch):
    monkeypatch.setenv("ROCM_PATH", str(tmp_path / "nothing_here"))
    opt = _fake_rocm(tmp_path / "opt_rocm")
    home, looked = setup_py.find_rocm_home(opt_rocm=opt)
    assert home == str(opt) and any("$ROCM_PATH" in entry for entry in looked)


def test_rocm_hipcc_on_path_resolves_symlinks(setup_py, no_rocm, tmp_path, monkeypatch):
    real = _fake_rocm(tmp_path / "rocm-7.1.0", sub="hip/bin")  # <root>/hip/bin/hipcc
    (no_rocm / "hipcc").symlink_to(real / "hip" / "bin" / "hipcc")
    assert setup_py.find_rocm_home(opt_rocm=tmp_path / "opt_rocm")[0] == str(real)


def test_rocm_sdk_wheel_through_its_command(setup_py, no_rocm, tmp_path):
    """ROCm 10 layout: hipcc lives in a Python wheel, `rocm-sdk path --root` names it."""
    sdk = _fake_rocm(tmp_path / "site-packages" / "_rocm_sdk_devel")
    cmd = no_rocm / "rocm-sdk"
    cmd.write_text(f'#!/bin/sh\n[ "$1 $2" = "path --root" ] && echo {sdk}\n')
    cmd.chmod(0o755)
    assert setup_py.find_rocm_home(opt_rocm=tmp_path / "opt_rocm")[0] == str(sdk)


def test_rocm_sdk_wheel_without_its_command(setup_py, no_rocm, tmp_path, monkeypatch):
    sdk = _fake_rocm(tmp_path / "site-packages" / "_rocm_sdk_core")
    spec = types.SimpleNamespace(submodule_search_locations=[str(sdk)])
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: spec if name == "_rocm_sdk_core" else None)
    assert setup_py.find_rocm_home(opt_rocm=tmp_path / "opt_rocm")[0] == str(sdk)


def test_rocm_torch_with_sdk_wheel_builds_rocm(setup_py, no_rocm, tmp_path, monkeypatch):
    """A ROCm torch whose own ROCM_HOME guess failed still builds: the root found here is
    handed to torch's extension build."""
    sdk = _fake_rocm(tmp_path / "_rocm_sdk_devel")
    cmd = no_rocm / "rocm-sdk"
    cmd.write_text(f"#!/bin/sh\necho {sdk}\n")
    cmd.chmod(0o755)
    _fake_torch(monkeypatch, hip="7.1")
    monkeypatch.setenv("BUILD_TARGET", "rocm")
    monkeypatch.setattr(setup_py, "OPT_ROCM", tmp_path / "opt_rocm")
    assert setup_py.pick_target() == "rocm"
    assert sys.modules["torch.utils.cpp_extension"].ROCM_HOME == str(sdk)
    assert os.environ["ROCM_HOME"] == str(sdk)
