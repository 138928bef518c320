"""``epu record``: tap the whole event stream and write a results folder.

Why: an elastic run is judged by its shape over time — how fast workers came when jobs
queued, how fast they went when the queue emptied, whether anything was left behind. The
recorder writes that as ``timeline.csv`` (one row per change), ``timeline.png`` (queued jobs,
batch nodes by state and cloud instances by site over time; the seed paper's Figures 5–6)
and ``summary.json`` (the verdict). The logic lives in ``common.timeline`` (pure); this
module is the shell: AMQP in, files out.
"""

from __future__ import annotations

import argparse
import csv
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

from epu.common.timeline import NODE_STATES, Timeline, csv_header, csv_rows

RAW = argparse.RawDescriptionHelpFormatter

NODE_COLOURS = {"free": "tab:green", "busy": "tab:blue", "offline": "tab:orange", "down": "tab:red",
                "unknown": "tab:gray"}


def write_results(timeline: Timeline, out: Path, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write timeline.csv, timeline.png and summary.json into ``out``; return the summary
    (``extra`` is merged into it, e.g. process counts only the caller can make)."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "timeline.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(csv_header(timeline.sites))
        w.writerows(csv_rows(timeline.rows, timeline.sites))
    summary = {**timeline.summary(), **(extra or {})}
    try:
        plot(timeline, out / "timeline.png", summary)
    except ModuleNotFoundError as exc:  # a host installed without the 'plots' extra
        if exc.name != "matplotlib":
            raise
        summary["png"] = "not drawn: install the 'plots' extra (pip install 'epu[plots]')"
    (out / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    return summary


def _steps(rows: list[Any], value: Any) -> tuple[list[float], list[float]]:
    return [r.t for r in rows], [value(r) for r in rows]


def plot(timeline: Timeline, path: Path, summary: dict[str, Any] | None = None) -> None:
    """Three stacked panels sharing the time axis: queue, batch nodes, cloud instances."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = timeline.rows
    fig, (ax_q, ax_n, ax_i) = plt.subplots(3, 1, figsize=(10, 8.5), sharex=True)
    title = "EPU elastic run: jobs queued → workers launched and joined → drained and terminated"
    fig.suptitle(title, fontsize=12, fontweight="bold")
    if not rows:
        ax_q.text(0.5, 0.5, "no events recorded", ha="center", va="center", transform=ax_q.transAxes)
    else:
        x, q = _steps(rows, lambda r: r.queued_jobs)
        ax_q.step(x, q, where="post", color="tab:purple", label="jobs queued")
        x, run = _steps(rows, lambda r: r.running_jobs)
        ax_q.step(x, run, where="post", color="tab:blue", linestyle="--", label="jobs running")
        for state in NODE_STATES:
            x, y = _steps(rows, lambda r, s=state: r.nodes.get(s, 0))
            if any(y):
                ax_n.step(x, y, where="post", color=NODE_COLOURS[state], label=f"{state}")
        x, total = _steps(rows, lambda r: sum(r.nodes.values()))
        ax_n.step(x, total, where="post", color="black", linewidth=0.8, linestyle=":", label="all nodes")
        for site in timeline.sites:
            x, y = _steps(rows, lambda r, s=site: r.instances_by_site().get(s, 0))
            ax_i.step(x, y, where="post", linewidth=2, label=f"site {site}: live instances")
            x, booting = _steps(rows, lambda r, s=site: sum(n for (st, state), n in r.instances.items()
                                                              if st == s and state in ("requested", "pending")))
            ax_i.step(x, booting, where="post", linestyle="--", label=f"site {site}: of which booting")
    ax_q.set_title("Batch queue (from the sensor)", fontsize=10, loc="left")
    ax_q.set_ylabel("jobs")
    ax_n.set_title("Batch nodes by state (from the sensor)", fontsize=10, loc="left")
    ax_n.set_ylabel("nodes")
    ax_i.set_title("Cloud instances by site (from the provisioner: launched and not yet terminated)",
                   fontsize=10, loc="left")
    ax_i.set_ylabel("instances")
    ax_i.set_xlabel("seconds since the recording started")
    for ax in (ax_q, ax_n, ax_i):
        ax.grid(True, alpha=0.3)
        ax.set_ylim(bottom=0)
        ax.yaxis.get_major_locator().set_params(integer=True)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="upper right", fontsize=8)
    if summary:
        text = (f"jobs completed {summary.get('jobs_completed')}, peak workers {summary.get('peak_workers')}, "
                f"first job running at {_fmt(summary.get('seconds_to_first_job_running'))}, "
                f"back to zero at {_fmt(summary.get('seconds_to_zero'))}, "
                f"orphans {summary.get('orphans')}, duplicates {summary.get('duplicates')}")
        fig.text(0.5, 0.01, text, ha="center", fontsize=9)
    fig.tight_layout(rect=(0, 0.03, 1, 0.96))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _fmt(seconds: Any) -> str:
    return "never" if seconds is None else f"{float(seconds):.0f} s"


def record(config_path: str | None, out: Path, seconds: float = 0.0, *, pattern: str = "#",
           ready_file: Path | None = None) -> dict[str, Any]:
    """Tap the events exchange until ``seconds`` have passed (0: until SIGTERM/SIGINT), then
    write the results folder. ``ready_file`` is created once the tap queue is bound, so a
    caller can wait for it instead of sleeping."""
    from epu.common.cliargs import load_or_exit
    from epu.common.tap import follow

    config = load_or_exit(config_path)
    broker = config.broker_obj()
    timeline = Timeline()
    stop = False

    def on_signal(signum: int, frame: Any) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    def on_event(_rk: str, _envelope: Any, msg: Any, error: Any) -> None:
        if error is None:
            timeline.observe(msg, time.time())

    follow(broker, pattern, on_event, stop=lambda: stop, seconds=seconds,
           on_bound=(lambda: ready_file.write_text("ready\n")) if ready_file is not None else None)
    return write_results(timeline, out)


def cmd_record(args: argparse.Namespace) -> int:
    out = Path(args.out)
    summary = record(args.config, out, args.seconds, pattern=args.pattern,
                     ready_file=Path(args.ready_file) if args.ready_file else None)
    png = "" if "png" in summary else ", timeline.png"
    print(f"epu record: {summary['rows']} rows → {out}/timeline.csv{png}, summary.json", file=sys.stderr)
    if "png" in summary:
        print(f"epu record: timeline.png {summary['png']}", file=sys.stderr)
    print(json.dumps({k: v for k, v in summary.items() if not k.endswith("_list")}, sort_keys=True))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    from epu.common.cliargs import add_config_arg, nonneg_float

    p = sub.add_parser(
        "record", help="record the event stream into a results folder (CSV, PNG, summary)", formatter_class=RAW,
        description="Tap every event (like `epu tap`) and, when stopped (--seconds, SIGTERM or Ctrl-C), write:\n"
                    "  DIR/timeline.csv   one row per change: queued/running jobs, nodes by state,\n"
                    "                     live instances by site and state\n"
                    "  DIR/timeline.png   the same over time, three panels (queue, nodes, instances)\n"
                    "  DIR/summary.json   jobs completed, peak workers, seconds to first job running,\n"
                    "                     seconds to scale back to zero, orphans, duplicates",
        epilog="Examples:\n  epu record --out results/run1 --seconds 300 -c /etc/epu/epu.toml\n"
               "  epu record --out /var/tmp/run2 --pattern 'instance.state.#'   # until Ctrl-C\n\n"
               "timeline.png needs the 'plots' extra (matplotlib); without it the CSV and summary are written.\n"
               "Exit status: 0 results written; 1 RabbitMQ refused or cannot be reached, or DIR cannot be\n"
               "written; 2 bad configuration.")
    p.add_argument("--out", required=True, metavar="DIR", help="results folder (created)")
    p.add_argument("--seconds", type=nonneg_float, default=0, help="stop after S seconds (default: until SIGTERM/Ctrl-C)")
    p.add_argument("--pattern", default="#", help="topic pattern to tap (default: #, everything)")
    p.add_argument("--ready-file", metavar="FILE", help="create FILE once the tap is bound (for scripts and tests)")
    add_config_arg(p)
    p.set_defaults(func=cmd_record)
