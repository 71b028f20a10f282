"""The bench's PNGs: drafting time per draft token by share and decode tok/s for every row; and a bench
beside the paper's Table 11 and the profile's prediction (``coordinator plan --check-bench --plot``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from coordinator.bench.summary import RowSummary
from specwire.errors import InvalidArgumentError


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise InvalidArgumentError("a plot needs matplotlib: pip install 'specwire[plot]'") from err
    return plt


def write_check_plot(rows: list[dict[str, Any]], title: str, path: Path) -> None:
    """Measured decode tok/s of every row, with the paper's figure and the profile's prediction beside."""
    plt = _pyplot()
    rows = list(reversed(rows))
    y = list(range(len(rows)))
    fig, ax = plt.subplots(figsize=(10, 0.42 * len(rows) + 1.6))
    ax.barh(y, [r["measured_tok_s"] for r in rows], color="#4c72b0", label="measured (emulated Macs)")
    ax.scatter([r["predicted_tok_s"] for r in rows], y, marker="|", s=260, color="#222222", label="planned")
    papers = [(r["paper_tok_s"], i) for i, r in enumerate(rows) if r["paper_tok_s"] is not None]
    ax.scatter(
        [p for p, _ in papers],
        [i for _, i in papers],
        marker="D",
        color="#c44e52",
        label="the paper's Table 11",
    )
    for i, r in enumerate(rows):
        ax.text(r["measured_tok_s"] + 0.6, i, f"{r['measured_tok_s']:.1f}", va="center", fontsize=8)
    ax.set_yticks(y, [r["label"] for r in rows], fontsize=8)
    ax.set_xlabel("decode tok/s")
    ax.set_title(title, fontsize=10)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_plot(rows: list[RowSummary], path: Path) -> None:
    """Stacked compute/network/protocol ms per draft token for remote rows, and tok/s for all rows."""
    plt = _pyplot()
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
    shown = [s for s in rows if s.measured]  # a row a worker failed has no figure (summary.measured_share)
    ax_tps.bar([s.spec.label for s in shown], [s.decode_tps for s in shown], color="#8172b2")
    for s in rows:
        if not s.measured:
            ax_tps.bar([s.spec.label], [0.0])
            ax_tps.annotate("not measured", (s.spec.label, 0.0), rotation=90, ha="center", va="bottom")
    ax_tps.set_ylabel("decode tok/s")
    ax_tps.set_title("Throughput")
    for ax in (ax_time, ax_tps):
        ax.tick_params(axis="x", labelrotation=35)
        for tick in ax.get_xticklabels():
            tick.set_horizontalalignment("right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
