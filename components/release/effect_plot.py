"""Each limit's interval plotted against the limit, as the gate's, the canary's and the quality reports show it."""

from __future__ import annotations

import base64
from pathlib import Path

from components.release.effects import Effect

PLOT_FILE = "limits.png"  # the gate's and the canary's


def plot(effects: list[Effect], title: str, path: Path) -> bool:
    """Each limit's interval against the limit (the gate's and the canary's); False when there is nothing to plot."""
    if not effects:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(effects), 1, figsize=(6.4, 1.3 + 1.1 * len(effects)), dpi=110, squeeze=False)
    for ax, effect in zip(axes[:, 0], effects, strict=True):
        scale = 100 if effect.unit == "%" else 1
        est, low, high, limit = (v * scale for v in (effect.estimate, effect.low, effect.high, effect.limit))
        colour = {"within": "tab:green", "beyond": "tab:red"}.get(effect.status, "tab:orange")
        ax.errorbar([est], [0], xerr=[[est - low], [high - est]], fmt="o", color=colour, capsize=6, lw=2)
        ax.axvline(limit, color="black", ls="--", lw=1)
        span = max(abs(high - low), abs(limit - est), 1e-9)
        left, right = min(low, limit) - 0.3 * span, max(high, limit) + 0.3 * span
        bad = (limit, right) if effect.higher_is_worse else (left, limit)
        ax.axvspan(*bad, color="tab:red", alpha=0.08)
        ax.set_xlim(left, right)
        ax.set_yticks([])
        unit = "%" if effect.unit == "%" else f" {effect.unit}".rstrip()
        spec = {"%": "+.1f", "": ".4f"}.get(effect.unit, ",.2f")
        # a relative limit is signed; an absolute one says which side is good
        bound, limit_spec = ("", "+g") if effect.unit == "%" else ("≤ " if effect.higher_is_worse else "≥ ", "g")
        ax.set_title(
            f"{effect.name}: {est:{spec}}{unit} [{low:{spec}}, {high:{spec}}], limit {bound}{limit:{limit_spec}}{unit} "
            f"— {effect.status}",
            fontsize=9,
        )
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def embedded_image(png: Path | None) -> str:
    """An <img> of the plot inside the page itself (the KFP UI shows one HTML file), or nothing."""
    if png is None or not png.exists():
        return ""
    encoded = base64.b64encode(png.read_bytes()).decode()
    return f'<img alt="the interval of each limit against the limit" src="data:image/png;base64,{encoded}">'
