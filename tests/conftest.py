"""Fixtures shared by the test files; helper functions live in the ``helpers`` package."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture
def tuning():
    """set(**values): launch tuning values (rocm_attn.tuning) for this test, restored after it."""
    import rocm_attn

    saved = {}

    def set_values(**values):
        for name, value in values.items():
            old = rocm_attn.tuning.set_value(name, value)
            saved.setdefault(name, old)

    yield set_values
    for name, value in saved.items():
        rocm_attn.tuning.set_value(name, value)


@pytest.fixture(scope="module", params=["w64", "w32"], ids=["wave64", "wave32"])
def lib(request):
    """The CPU emulation library of the HIP kernels (helpers/emu.py) at 64 and at 32 lanes;
    skips where no compiler can build it."""
    from helpers import emu

    return emu.emu_or_skip(request.param)


@pytest.fixture(scope="module")
def one_torch_thread():
    """torch on one thread beside the emulation's worker threads (2-core CI machine); the
    emulation files use it for every test (``pytest.mark.usefixtures``)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def clean_error_counter(dev):
    """The device error counter (rocm_attn.errors) reset before and after the test; the tiled
    small-seq GPU files use it for every test (``pytest.mark.usefixtures``). It takes the file's
    ``dev`` fixture first, so where that skips (no GPU, an extension without the op) the counter
    is never read."""
    from rocm_attn.errors import read_errors

    read_errors(reset=True)
    yield
    read_errors(reset=True)


def pytest_terminal_summary(terminalreporter):
    """How long the CPU emulation libraries took to build in this run (helpers/emu.py)."""
    emu = sys.modules.get("helpers.emu")
    if emu is not None and emu.BUILD_SECONDS:
        times = ", ".join(f"{name} {sec:.0f} s" for name, sec in emu.BUILD_SECONDS.items())
        terminalreporter.write_line(f"CPU emulation builds: {times}")
