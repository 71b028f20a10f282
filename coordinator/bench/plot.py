"""The bench's PNG: drafting time per draft token by share, and decode tok/s, for every row."""

from __future__ import annotations

from pathlib import Path

from coordinator.bench.summary import RowSummary
from specwire.errors import InvalidArgumentError


def write_plot(rows: list[RowSummary], path: Path) -> None:
    """Stacked compute/network/protocol ms per draft token for remote rows, and tok/s for all rows."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise InvalidArgumentError("--plot needs matplotlib: pip install 'specwire[plot]'") from err
    remote = [s for s in rows if s.attribution is not None]
    fig, (ax_time, ax_tps) = plt.subplots(1, 2, figsize=(13, 5.5))
    labels = [s.spec.label for s in remote]
    bottom = [0.0] * len(remote)
    for share, color in (("compute_ms", "#4c72b0"), ("network_ms", "#55a868"), ("protocol_ms", "#c44e52")):
        values = [max(0.0, s.attribution.per("draft").get(share, 0.0)) for s in remote]  # type: ignore[union-attr]
        ax_time.bar(labels, values, bottom=bottom, label=share.replace("_ms", ""), color=color)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax_time.set_ylabel("ms per draft token")
    ax_time.set_title("Where drafting time goes")
    ax_time.set_yscale("log" if max(bottom, default=1) / max(min(bottom, default=1), 1e-9) > 50 else "linear")
    ax_time.legend()
    ax_tps.bar([s.spec.label for s in rows], [s.decode_tps for s in rows], color="#8172b2")
    ax_tps.set_ylabel("decode tok/s")
    ax_tps.set_title("Throughput")
    for ax in (ax_time, ax_tps):
        ax.tick_params(axis="x", labelrotation=35)
        for tick in ax.get_xticklabels():
            tick.set_horizontalalignment("right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
