"""The results folder of a run: what an operator opens.

* ``summary.json`` — the figures (``report.summarize``), without the machine's timings, so two
  runs of the same seed write the same file;
* ``timeline.csv`` — one row per sample: queued and running jobs, cores in use, batch nodes by
  state, live and booting instances per site and instance type;
* ``timeline.png`` — three panels over time: the queue, batch nodes by state, instances by site
  and type (the seed paper's Figures 5–6);
* ``waits.png`` — the distribution of job waits (histogram and cumulative share);
* ``report.html`` — one page: the figures, both plots, the workload, the config and the
  cloud model, and how to reproduce the run.
"""

from __future__ import annotations

import csv
import html
import json
from pathlib import Path
from typing import Any

from epu.simulate.report import TIMING_KEYS
from epu.simulate.run import RunData

NODE_STATES = ("free", "busy", "offline", "down")
NODE_COLOURS = {"free": "tab:green", "busy": "tab:blue", "offline": "tab:orange", "down": "tab:red"}


def _agg() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def site_labels(d: RunData) -> dict[str, str]:
    return {s: f"{s}/{d.sizes.get(s, '')}" for s in d.vms}


def write_timeline_csv(d: RunData, path: Path) -> None:
    labels = site_labels(d)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["t_seconds", "queued_jobs", "running_jobs", "cores_used"]
                   + [f"nodes_{s}" for s in NODE_STATES]
                   + [f"{labels[s]}:{k}" for s in labels for k in ("live", "booting")])
        for r in d.samples:
            w.writerow([round(r.t, 3), r.queued_jobs, r.running_jobs, r.cores_used]
                       + [r.nodes.get(s, 0) for s in NODE_STATES]
                       + [v for s in labels for v in r.instances.get(s, (0, 0))])


def _time_axis(seconds: float) -> tuple[float, str]:
    if seconds > 3 * 86400:
        return 86400.0, "days"
    if seconds > 3 * 3600:
        return 3600.0, "hours"
    return 60.0, "minutes"


def plot_timeline(d: RunData, path: Path, title: str) -> None:
    plt = _agg()
    rows = d.samples
    unit, uname = _time_axis(rows[-1].t if rows else 0.0)
    x = [r.t / unit for r in rows]
    fig, (aq, an, ai) = plt.subplots(3, 1, figsize=(11, 8.5), sharex=True)
    fig.suptitle(title, fontsize=11, fontweight="bold")
    aq.step(x, [r.queued_jobs for r in rows], where="post", color="tab:purple", label="jobs queued")
    aq.step(x, [r.running_jobs for r in rows], where="post", color="tab:blue", linestyle="--", label="jobs running")
    for s in NODE_STATES:
        y = [r.nodes.get(s, 0) for r in rows]
        if any(y):
            an.step(x, y, where="post", color=NODE_COLOURS[s], label=s)
    for site, label in site_labels(d).items():
        ai.step(x, [r.instances.get(site, (0, 0))[0] for r in rows], where="post", linewidth=1.8,
                label=f"{label}: live")
        ai.step(x, [r.instances.get(site, (0, 0))[1] for r in rows], where="post", linestyle="--",
                label=f"{label}: booting")
    aq.set_title("Batch queue", fontsize=10, loc="left")
    an.set_title("Batch nodes by state", fontsize=10, loc="left")
    ai.set_title("Cloud instances by site/instance type (live = paid)", fontsize=10, loc="left")
    aq.set_ylabel("jobs")
    an.set_ylabel("nodes")
    ai.set_ylabel("instances")
    ai.set_xlabel(f"{uname} since the start of the workload (virtual time)")
    for ax in (aq, an, ai):
        ax.grid(True, alpha=0.3)
        ax.set_ylim(bottom=0)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_waits(waits: list[float], path: Path, title: str) -> None:
    plt = _agg()
    fig, (ah, ac) = plt.subplots(1, 2, figsize=(11, 3.8))
    fig.suptitle(title, fontsize=11, fontweight="bold")
    w = sorted(waits)
    if w:
        top = max(w[-1], 1.0)
        bins = [0.0] + [10 ** (i / 4) for i in range(0, int(4 * (len(str(int(top))) + 1)))]
        bins = [b for b in bins if b <= top * 1.8] or [0.0, 1.0]
        ah.hist([max(v, 0.0) for v in w], bins=bins, color="tab:purple")
        ah.set_xscale("symlog", linthresh=1.0)
        ac.step([max(v, 0.0) for v in w], [(i + 1) / len(w) for i in range(len(w))], where="post",
                color="tab:purple")
        ac.set_xscale("symlog", linthresh=1.0)
    ah.set_title("jobs by wait", fontsize=10, loc="left")
    ah.set_xlabel("wait (s, log scale; 0 = started at once)")
    ah.set_ylabel("jobs")
    ac.set_title("share of jobs started within", fontsize=10, loc="left")
    ac.set_xlabel("wait (s, log scale)")
    ac.set_ylim(0, 1.02)
    for ax in (ah, ac):
        ax.grid(True, alpha=0.3)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    fig.savefig(path, dpi=100)
    plt.close(fig)


def stable(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary without the machine's timings (identical for two runs of one seed)."""
    return {k: v for k, v in summary.items() if k not in TIMING_KEYS}


def write_results(d: RunData, summary: dict[str, Any], out: Path, *, command: str = "",
                  extra: dict[str, Any] | None = None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(stable(summary), indent=2, sort_keys=True) + "\n")
    write_timeline_csv(d, out / "timeline.csv")
    title = f"{d.workload.name} — policy {d.policy} (seed {d.seed})"
    plot_timeline(d, out / "timeline.png", title)
    waits = [j.start - j.submit for j in d.jobs if j.start is not None]
    plot_waits(waits, out / "waits.png", f"Job waits — {title}")
    (out / "report.html").write_text(html_report(d, summary, command, extra or {}))


FIGURES = [
    ("jobs", "jobs in the workload (fitting the domain)"), ("jobs_completed", "jobs completed"),
    ("jobs_killed", "running jobs killed (lost their node; must be 0)"),
    ("wait_mean_s", "mean wait (s)"), ("wait_p50_s", "median wait (s)"), ("wait_p95_s", "95th percentile wait (s)"),
    ("wait_max_s", "longest wait (s)"), ("bounded_slowdown", "mean bounded slowdown (τ = 10 s)"),
    ("node_hours", "node-hours (instance lifetimes)"), ("cost", "cost (billing granularity applied)"),
    ("utilization", "utilization of paid cores"), ("launches", "instances launched"),
    ("launches_per_job", "instances launched per job (above 1: churn)"), ("failures", "instances that never ran"), ("replacements", "instances given up and replaced"),
    ("api_errors", "transient cloud API errors"), ("peak_nodes", "most instances at once"),
    ("simulated_hours", "simulated hours"), ("engine_iterations", "engine iterations run"),
    ("engine_iterations_skipped", "engine iterations skipped (nothing to decide)"),
]


def html_report(d: RunData, summary: dict[str, Any], command: str, extra: dict[str, Any]) -> str:
    e = html.escape
    rows = "".join(f"<tr><td>{e(label)}</td><td class=n>{e(str(summary.get(k, '')))}</td></tr>"
                   for k, label in FIGURES if k in summary)
    rows += "".join(f"<tr><td>{e(str(k))}</td><td class=n>{e(json.dumps(v))}</td></tr>" for k, v in extra.items())
    sites = "".join(f"<tr><td>{e(s)}</td><td class=n>{v['launches']}</td><td class=n>{v['node_hours']}</td>"
                    f"<td class=n>{v['cost']}</td></tr>" for s, v in summary.get("sites", {}).items())
    accounts = "".join(f"<tr><td>{e(k or '(none)')}</td><td class=n>{v}</td></tr>"
                       for k, v in summary.get("attribution", {}).get("by_account", {}).items())
    dom = d.config.domains[d.domain]
    cfg = {"policy": dom.policy, "params": dom.params, "min_nodes": dom.min_nodes, "max_nodes": dom.max_nodes,
           "cores_per_node": dom.cores_per_node, "sites": {s: d.config.sites[s].model_dump(
               include={"quota", "price_per_hour", "cores", "size"}) for s in d.vms},
           "iteration_seconds": d.config.decision.iteration_seconds,
           "sensor_poll_seconds": d.config.sensor.poll_seconds}
    cloud = summary.get("cloud_model") or {s: d.cloud.site(s).model_dump(mode="json") for s in d.vms}
    b = summary.get("baseline")
    static = ("" if not b else
              f"<h2>Against a static cluster</h2><p>The same workload on {b['peak_nodes']} always-on nodes "
              "(the batch model of the run, no elasticity):</p><table><tr><th></th><th>this run</th>"
              "<th>static</th></tr>" + "".join(
                  f"<tr><td>{e(label)}</td><td class=n>{e(str(summary.get(k, '')))}</td>"
                  f"<td class=n>{e(str(b.get(k, '')))}</td></tr>"
                  for k, label in (("cost", "cost"), ("node_hours", "node-hours"), ("wait_p50_s", "median wait (s)"),
                                   ("wait_p95_s", "95th percentile wait (s)"), ("wait_max_s", "longest wait (s)"),
                                   ("utilization", "utilization of paid cores"))) + "</table>")
    warnings = "".join(f"<li>{e(w)}</li>" for w in summary.get("warnings", []))
    warnings = f"<h2>Warnings</h2><ul class=warn>{warnings}</ul>" if warnings else ""
    wl = d.workload.describe()
    return f"""<!doctype html><html><head><meta charset="utf-8">
<title>epu simulate — {e(d.workload.name)} — {e(d.policy)}</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:1em auto;color:#222}}
table{{border-collapse:collapse;margin:.5em 0}}td,th{{border:1px solid #ccc;padding:3px 8px}}
td.n{{text-align:right;font-family:monospace}}pre{{background:#f6f6f6;padding:.6em;overflow-x:auto}}
img{{max-width:100%}}h2{{margin-top:1.2em}}ul.warn{{color:#a40}}</style></head><body>
<h1>epu simulate: {e(d.workload.name)} under policy <code>{e(d.policy)}</code></h1>
<p>The real decision engine and provisioner cores ran this workload in virtual time against simulated
clouds (seed {d.seed}). Same seed, same figures: <code>{e(command or 'epu simulate ...')}</code></p>
{warnings}<h2>Figures</h2><table>{rows}</table>{static}
<h2>Per site</h2><table><tr><th>site</th><th>launches</th><th>node-hours</th><th>cost</th></tr>{sites}</table>
<h2>Cost by account</h2><p>Each paid node-second shared among the jobs on the node then; time with no
job, and billing rounding, to (idle) (docs/deploy.md, "Money").</p>
<table><tr><th>account</th><th>cost</th></tr>{accounts}</table>
<h2>Over time</h2><img src="timeline.png" alt="queue, nodes and instances over time">
<h2>Waits</h2><img src="waits.png" alt="wait distribution">
<h2>Workload</h2><pre>{e(json.dumps(wl, indent=2))}</pre>
<h2>Domain and sites (from the config)</h2><pre>{e(json.dumps(cfg, indent=2, default=str))}</pre>
<h2>Cloud model</h2><p>Per site, every knob the run used and where it came from (<code>cli</code>:
the --cloud file; <code>config</code>: the site's driver_args; <code>default</code>: the default model).</p>
<pre>{e(json.dumps(cloud, indent=2, default=str))}</pre>
<p>Data: <a href="timeline.csv">timeline.csv</a>, <a href="summary.json">summary.json</a>.
Definitions of every figure: docs/experiments.md.</p></body></html>
"""
