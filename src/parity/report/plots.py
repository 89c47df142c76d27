"""PNG plots of the report's numbers: matplotlib's Agg backend, no pyplot state, reproducible bytes.

Each plot takes the plain numbers a table builder returned, so a plot can never disagree with its
table. PNG metadata carries no software version or date, so the same numbers give the same file.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import matplotlib.style
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter

from parity.manifest import atomic_write_bytes

COLORS = {"vllm": "#4c72b0", "flame": "#dd8452", "study": "#b0b0b0"}
ARM_COLORS = ("#55a868", "#8172b2", "#937860", "#c44e52", "#da8bc3", "#8c8c8c")  # Flame arms, in their order


def _title(text: str, evidence: str | None) -> str:
    return f"{text} ({evidence})" if evidence and evidence != "measured" else text


def _save(fig: Figure, path: Path) -> Path:
    import io

    buffer = io.BytesIO()
    FigureCanvasAgg(fig)
    fig.savefig(buffer, format="png", dpi=100, metadata={"Software": None})
    atomic_write_bytes(path, buffer.getvalue())
    return path


def throughput(per_trace: dict, evidence: str | None, path: Path) -> Path | None:
    """Median requests/s per system and trace, with min–max bars (confirmation pairs)."""
    if not per_trace:
        return None
    with matplotlib.style.context("default"):
        fig = Figure(figsize=(3.2 * len(per_trace) + 1, 3.6))
        for i, (trace, data) in enumerate(per_trace.items()):
            ax = fig.add_subplot(1, len(per_trace), i + 1)
            for x, system in enumerate(("vllm", "flame")):
                s = data[system]
                ax.bar(x, s["median"], color=COLORS[system], width=0.6)
                ax.errorbar(x, s["median"], yerr=[[s["median"] - s["min"]], [s["max"] - s["median"]]],
                            color="black", capsize=6)
            ax.set_xticks([0, 1], ["standalone vLLM", "Flame"])
            ax.set_title(trace)
            ax.set_ylabel("requests/s (median, min–max)")
        fig.suptitle(_title("Final throughput", evidence))
        fig.tight_layout()
        return _save(fig, path)


def ratios(per_trace: dict, evidence: str | None, path: Path) -> Path | None:
    """Each pair's Flame / vLLM ratio against the 99% target, with the study's published range."""
    if not per_trace:
        return None
    with matplotlib.style.context("default"):
        fig = Figure(figsize=(2.2 * len(per_trace) + 2.5, 3.6))
        ax = fig.add_subplot(1, 1, 1)
        for x, (trace, data) in enumerate(per_trace.items()):
            if data.get("study_ratio_range"):
                low, high = (v * 100 for v in data["study_ratio_range"])
                ax.bar(x, high - low, bottom=low, width=0.5, color=COLORS["study"], alpha=0.5,
                       label="study range" if x == 0 else None)
            values = [r * 100 for r in data["ratios"]]
            ax.plot([x] * len(values), values, "o", color=COLORS["flame"], label="ours, per pair" if x == 0 else None)
        shown = [99.0, 100.0] + [r * 100 for d in per_trace.values() for r in d["ratios"]]
        shown += [v * 100 for d in per_trace.values() for v in d.get("study_ratio_range") or []]
        ax.set_ylim(min(shown) - 0.5, max(shown) + 0.5)
        ax.axhline(99, color="red", linestyle="--", label="99% target")
        ax.axhline(100, color="gray", linestyle=":", linewidth=1)
        ax.set_xticks(range(len(per_trace)), list(per_trace))
        ax.set_xlim(-0.6, len(per_trace) - 0.4)
        ax.set_ylabel("Flame / vLLM throughput (%)")
        ax.legend(loc="lower right", fontsize="small")
        ax.set_title(_title("Paired throughput ratios", evidence))
        fig.tight_layout()
        return _save(fig, path)


def _paired_bars(labels: list[str], left: tuple[str, str, list[float]], right: tuple[str, str, list[float]],
                 ylabel: str, title: str, path: Path, ylim: tuple[float, float] | None = None) -> Path:
    """Two bars per label (name, color, values each side), saved as one PNG."""
    with matplotlib.style.context("default"):
        fig = Figure(figsize=(8, 4.2))
        ax = fig.add_subplot(1, 1, 1)
        xs = range(len(labels))
        for offset, (name, color, values) in ((-0.2, left), (0.2, right)):
            ax.bar([x + offset for x in xs], values, width=0.4, color=color, label=name)
        ax.set_xticks(list(xs), labels, fontsize="small")
        ax.set_ylabel(ylabel)
        if ylim:
            ax.set_ylim(*ylim)
        ax.legend(loc="upper left", fontsize="small")
        ax.set_title(title)
        fig.tight_layout()
        return _save(fig, path)


def cached_share(per_config: dict, evidence: str | None, path: Path) -> Path | None:
    """Cached input share on the reuse trace per locality configuration, ours beside the study's."""
    rows = [(v["label"], v["ours"], v["study"]) for v in per_config.values() if v["ours"] is not None]
    if not rows:
        return None
    return _paired_bars([textwrap.fill(r[0], 20) for r in rows], ("study", COLORS["study"], [r[2] * 100 for r in rows]),
                        (f"ours ({evidence})" if evidence else "ours", COLORS["vllm"], [r[1] * 100 for r in rows]),
                        "cached input tokens on reuse (%)", _title("Cached input share by placement", evidence), path,
                        (0, 100))


def routing(per_trace: dict, evidence: str | None, path: Path) -> Path | None:
    """Median requests/s per trace and path: the study's sticky router beside ours (the routing experiment)."""
    rows = [(f"{trace}\n{name}", m.get("sticky"), m.get("prefix")) for trace, by_path in per_trace.items()
            for name, m in by_path.items() if m.get("sticky") or m.get("prefix")]
    if not rows:
        return None
    # both ours: the study's router measured here, so not in the study's grey; a missing median is no bar, not 0
    return _paired_bars([r[0] for r in rows], ("sticky (the study's router, measured here)", COLORS["vllm"],
                                               [math.nan if r[1] is None else r[1] for r in rows]),
                        ("ours (prefix)", COLORS["flame"], [math.nan if r[2] is None else r[2] for r in rows]),
                        "requests/s (median)",
                        _title("Routing beyond the study", evidence), path)


def _medians(points: list[dict]) -> list[dict]:
    """One point per offered rate, each number the median of that rung's points (its seeds; None where any is)."""
    rungs: dict = {}
    for p in points:
        rungs.setdefault(p["offered"], []).append(p)
    out = []
    for offered, alike in sorted(rungs.items()):
        if len(alike) == 1:
            out.append(alike[0])
            continue
        out.append({key: None if any(p.get(key) is None for p in alike) else float(np.median([p[key] for p in alike]))
                    for key in alike[0]} | {"offered": offered})
    return out


def sustained(per_trace: dict, evidence: str | None, path: Path) -> Path | None:
    """Latency against achieved rate (TTFT and end to end at the client, p50 and p99) and goodput against the
    offered rate (the whole objective, and dashed its first-token part alone), both paths, one row of panels per
    trace (the sustained experiment)."""
    if not per_trace:
        return None
    names = {"standalone": "standalone vLLM", "flame": "Flame, bursts",
             "standalone-bounded": "standalone vLLM, bounded admission (ours)",
             "flame-bounded": "Flame, harvested, bounded admission (ours)",
             "standalone-unbounded": "standalone vLLM, unbounded, the bounded arm's comparator (ours)"}
    colors = {"standalone": COLORS["vllm"], "flame": COLORS["flame"], "standalone-bounded": "#17becf",
              "flame-bounded": "#000000", "standalone-unbounded": "#7f7f7f"}
    # an arm's own standalone reference repeats the standalone curve: not drawn (the bounded arm is its own path)
    per_trace = {trace: {k: v for k, v in by_path.items() if k in names or not k.startswith("standalone-")}
                 for trace, by_path in per_trace.items()}
    for by_path in per_trace.values():
        for key in by_path:
            if key.startswith("flame-") and key not in colors:
                colors[key] = ARM_COLORS[(len(colors) - 5) % len(ARM_COLORS)]
                names[key] = f"Flame, {key.removeprefix('flame-')} arm (ours)"
    drawn = list(dict.fromkeys(system for by_path in per_trace.values() for system in by_path))
    rows = -(-(len(drawn) + 2) // 2)  # the one legend, below the panels, two entries a row
    legend_in = 0.3 + 0.2 * rows
    with matplotlib.style.context("default"):
        fig = Figure(figsize=(13, 3.6 * len(per_trace) + legend_in))
        for row, (trace, by_path) in enumerate(per_trace.items()):
            axes = [fig.add_subplot(len(per_trace), 3, 3 * row + k + 1) for k in range(3)]
            for system, points in by_path.items():
                color, name = colors.get(system), names.get(system, system)
                line = _medians(points)  # one point a rung: several seeds of a rung drawn as dots about it
                for ax, x, key, mark, style, label in (
                        (axes[0], "achieved", "ttft_p50", "o", "-", f"{name} p50"),
                        (axes[0], "achieved", "ttft_p99", "s", "--", f"{name} p99"),
                        (axes[1], "achieved", "e2e_p50", "o", "-", f"{name} p50"),
                        (axes[1], "achieved", "e2e_p99", "s", "--", f"{name} p99"),
                        (axes[2], "offered", "goodput", "o", "-", name),
                        (axes[2], "offered", "goodput_ttft", "s", "--", f"{name}, first token only")):
                    if key == "goodput_ttft" and not all(key in p for p in points):
                        continue  # the first-token part alone, dashed, where every point has it
                    zero = key.startswith("goodput")  # a window all refused: no goodput, drawn at 0
                    ax.plot([p[x] for p in line], [p[key] or 0 if zero else p[key] for p in line], mark + style,
                            color=color, label=label)
                    if len(line) < len(points):
                        ax.plot([p[x] for p in points], [p[key] or 0 if zero else p[key] for p in points], mark,
                                color=color, alpha=0.35, markersize=4, linestyle="none")
            for ax, title, xlabel, ylabel in (
                    (axes[0], f"{trace}: time to first token (client)", "achieved requests/s", "seconds (log)"),
                    (axes[1], f"{trace}: end to end", "achieved requests/s", "seconds (log)"),
                    (axes[2], f"{trace}: goodput", "offered requests/s", "requests/s meeting the objective")):
                ax.set_title(textwrap.fill(title, 48), fontsize=10)  # a long case name wraps, never overlaps
                ax.set_xlabel(xlabel)
                ax.set_ylabel(ylabel)
            for ax in axes[:2]:  # past saturation an unbounded p99 is ten times a bounded one: both stay readable
                ax.set_yscale("log")
                low, high = ax.get_ylim()
                ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))  # 10, not 10^1
                ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _, few=high / low < 20: f"{v:g}" if few
                                                           and f"{v:e}"[0] in "25" else ""))  # 2 and 5 between
        # one legend for every panel, below them, so no curve is hidden under it: a colour per path, a style per
        # statistic
        handles = [Line2D([], [], color=colors.get(system), linewidth=3, label=names.get(system, system))
                   for system in drawn]
        handles += [Line2D([], [], color="gray", marker="o", linestyle="-", label="p50; goodput: the whole objective"),
                    Line2D([], [], color="gray", marker="s", linestyle="--", label="p99; goodput: first token only")]
        fig.legend(handles=handles, loc="lower center", ncol=2, fontsize=8, frameon=False)
        fig.suptitle(_title("Sustained load", evidence))
        fig.tight_layout(rect=(0, legend_in / fig.get_figheight(), 1, 1))
        return _save(fig, path)


def sustained_steps(per_trace: dict, evidence: str | None, path: Path) -> Path | None:
    """What each Flame configuration buys, against the offered rate: achieved rate, and client TTFT p50 and p99
    (log scale), standalone beside every Flame configuration, one row of panels per trace (medians per rung)."""
    if not per_trace:
        return None
    with matplotlib.style.context("default"):
        fig = Figure(figsize=(11, 3.8 * len(per_trace)))
        for row, (trace, by_config) in enumerate(per_trace.items()):
            axes = [fig.add_subplot(len(per_trace), 2, 2 * row + k + 1) for k in range(2)]
            arms = 0
            for key, points in by_config.items():
                if key == "standalone":
                    color, name = COLORS["vllm"], "standalone vLLM"
                elif key == "flame-bursts":
                    color, name = COLORS["flame"], "Flame, bursts"
                else:
                    color, name = ARM_COLORS[arms % len(ARM_COLORS)], f"Flame, {key.removeprefix('flame-')}"
                    arms += 1
                offered = [p["offered"] for p in points]
                axes[0].plot(offered, [p["achieved"] for p in points], "o-", color=color, label=name)
                axes[1].plot(offered, [p["ttft_p50"] for p in points], "o-", color=color, label=f"{name} p50")
                axes[1].plot(offered, [p["ttft_p99"] for p in points], "s--", color=color, label=f"{name} p99")
            top = max(p["offered"] for points in by_config.values() for p in points)
            axes[0].plot([0, top], [0, top], ":", color="gray", linewidth=1, label="achieved = offered")
            axes[1].set_yscale("log")
            for ax, title, ylabel in ((axes[0], f"{trace}: achieved rate", "achieved requests/s"),
                                      (axes[1], f"{trace}: time to first token (client)", "seconds")):
                ax.set_title(title, fontsize=10)
                ax.set_xlabel("offered requests/s")
                ax.set_ylabel(ylabel)
                ax.legend(fontsize=7)
        fig.suptitle(_title("Sustained load: what each Flame configuration buys", evidence))
        fig.tight_layout()
        return _save(fig, path)
