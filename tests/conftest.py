import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pytest  # noqa: E402


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

def pytest_terminal_summary(terminalreporter):
    """How long the CPU emulation libraries took to build in this run (tests/emu_harness.py)."""
    emu = sys.modules.get("emu_harness")
    if emu is not None and emu.BUILD_SECONDS:
        times = ", ".join(f"{name} {sec:.0f} s" for name, sec in emu.BUILD_SECONDS.items())
        terminalreporter.write_line(f"CPU emulation builds: {times}")
