"""setup.py's choice of build target, with a stand-in torch: a GPU build of torch on a machine
with neither its compiler nor a GPU installs without kernels (the CPU machine that got PyPI's
default CUDA wheel); with a GPU, or when the target is asked for, a missing compiler stops the
build with the fix."""

from __future__ import annotations

import importlib.util
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


def test_asked_for_target_without_compiler_stops(setup_py, monkeypatch):
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
