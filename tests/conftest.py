import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def pytest_terminal_summary(terminalreporter):
    """How long the CPU emulation libraries took to build in this run (tests/emu_harness.py)."""
    emu = sys.modules.get("emu_harness")
    if emu is not None and emu.BUILD_SECONDS:
        times = ", ".join(f"{name} {sec:.0f} s" for name, sec in emu.BUILD_SECONDS.items())
        terminalreporter.write_line(f"CPU emulation builds: {times}")
