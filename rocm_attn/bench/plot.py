"""Optional PNG of a benchmark's results (``--plot out.png``): one bar per case and series.

matplotlib is not a dependency of the package; :func:`require_matplotlib` is called before a
sweep starts, so a missing install fails in a second with the fix, not after the sweep.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Dict, Optional, Sequence


class PlotUnavailable(RuntimeError):
    """--plot was asked for but matplotlib cannot be imported."""


def matplotlib_problem() -> Optional[str]:
    """Why --plot cannot work here, with the install command (None when it can)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        return (f"--plot needs matplotlib ({exc}). Install it with `python3 -m pip install "
                "matplotlib`, or drop --plot (the table and --json do not need it).")
    return None


def check_plot_arg(parser: argparse.ArgumentParser, path: Optional[Path]) -> None:
    """Before a sweep: exit with a usage error when --plot was given and cannot be honoured."""
    problem = matplotlib_problem() if path else None
    if problem:
        parser.error(problem)


def require_matplotlib() -> None:
    """Raise PlotUnavailable, with the install command, when matplotlib is missing."""
    problem = matplotlib_problem()
    if problem:
        raise PlotUnavailable(problem)


def bar_chart(path: Path, labels: Sequence[str], series: Dict[str, Sequence[Optional[float]]],
              title: str, xlabel: str, reference: Optional[float] = 100.0) -> Path:
    """Horizontal grouped bars: one group per label, one bar per series; returns ``path``.

    ``reference`` draws a dashed line (100 = the floor / ideal scaling). None values (a case
    without that series) leave a gap.
    """
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")  # files only; no display on GPU machines
    import matplotlib.pyplot as plt

    n, k = len(labels), max(len(series), 1)
    height = 0.8 / k
    fig, ax = plt.subplots(figsize=(8, 1.0 + 0.28 * n * k + 0.2 * n))
    for j, (name, values) in enumerate(series.items()):
        ys = [i + (j - (k - 1) / 2) * height for i in range(n)]
        vals = [float("nan") if v is None else v for v in values]
        ax.barh(ys, vals, height=height, label=name)
    if reference is not None:
        ax.axvline(reference, color="black", linestyle="--", linewidth=1)
    ax.set_yticks(range(n))
    ax.set_yticklabels(labels, fontsize=8)
    ax.invert_yaxis()  # first case on top, as in the printed table
    ax.set_xlabel(xlabel)
    ax.set_title(title, fontsize=10)
    if len(series) > 1:
        ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
