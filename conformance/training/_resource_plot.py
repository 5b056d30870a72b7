"""A picture of what ranks held across many saves: one panel per kind of reading, one line
per rank, each with the bound it may not climb above past the warm-up."""

from __future__ import annotations

import os
from pathlib import Path

from conformance.training._resources import KINDS, Resources

_SIZES = ("rss", "shared", "pinned")
# Where checks put their plots: the gate sets it to the ``plots`` folder beside its report
# (``ci.gate.report_files.PLOTS_DIR_ENV``, the same name).
PLOTS_DIR_ENV = "GATE_PLOTS_DIR"


def plot_path(name: str) -> Path | None:
    """``name``.png in the folder the gate gave for plots, made where missing; None where no
    folder was given (a run outside the gate)."""
    folder = os.environ.get(PLOTS_DIR_ENV)
    if not folder:
        return None
    Path(folder).mkdir(parents=True, exist_ok=True)
    return Path(folder) / f"{name}.png"


def plot_readings(
    every_rank: list[list[dict[str, int]]],
    bounds: Resources,
    warm_up: int,
    title: str,
    path: str | Path | None,
) -> None:
    """Plot each rank's readings (``Resources.as_dict`` per save) to ``path`` as a PNG; the
    dashed line of each rank is its reading after the warm-up plus the bound. None: no plot."""
    if path is None:
        return
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, panels = pyplot.subplots(2, 3, figsize=(11, 5), sharex=True)
    limits = bounds.as_dict()
    for panel, kind in zip(panels.flat, KINDS, strict=True):
        scale, unit = (2**20, " (MiB)") if kind in _SIZES else (1, "")
        for rank, readings in enumerate(every_rank):
            values = [reading[kind] / scale for reading in readings]
            (line,) = panel.plot(values, label=f"rank {rank}", linewidth=1)
            ceiling = max(values[warm_up // 2 : warm_up]) + limits[kind] / scale
            panel.axhline(ceiling, color=line.get_color(), linestyle="--", linewidth=0.8)
        panel.set_title(kind + unit, fontsize=9)
        panel.set_xlabel("save")
    panels.flat[0].legend(fontsize=7)
    figure.suptitle(f"{title} (dashed: bounds past save {warm_up - 1})", fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    pyplot.close(figure)
