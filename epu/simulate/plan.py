"""What to simulate (a plan) and running it: one run, or a comparison of several.

A plan is a workload, a config, a cloud model and options; the command line, a named scenario
and the tests all build one, and ``run_plan`` / ``run_compare`` are the only ways they run.
"""

from __future__ import annotations

import argparse
import csv
import html
import json
import math
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from epu.common.config import EpuConfig
from epu.simulate.cloudmodel import CloudModel, load_cloud_model
from epu.simulate.report import summarize
from epu.simulate.run import Options, RunData, Simulate, default_config, pick_domain
from epu.simulate.static import static_summary
from epu.workloads import transform
from epu.workloads.generators import generate
from epu.workloads.load import load_trace
from epu.workloads.model import Workload


@dataclass
class Plan:
    label: str
    workload: Workload
    config: EpuConfig
    cloud: CloudModel
    options: Options
    extra: Callable[[RunData], dict[str, Any]] | None = None
    """Scenario-specific figures (e.g. instances running 15 minutes in)."""
    static_nodes: int | None = None
    """Size of the static baseline (default: the domain's max_nodes)."""
    compare: list[tuple[str, dict[str, Any]]] = field(default_factory=list)


SIMULATION_IGNORES = ("workers",)
"""Config sections a simulation does not use: what workers are told at boot (context secrets,
head node) reads files that exist only on the real deployment's hosts."""


def load_simulation_config(path: str | Path) -> EpuConfig:
    """The operator's config file, validated as the services do, minus ``SIMULATION_IGNORES``."""
    import tomllib

    from epu.common.config import ConfigError, parse_config

    try:
        data = tomllib.loads(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    for key in SIMULATION_IGNORES:
        data.pop(key, None)
    return parse_config(data, str(path))


def shape_workload(w: Workload, args: argparse.Namespace) -> Workload:
    if args.window_days is not None or args.start_day:
        w = transform.window(w, args.start_day or 0.0, args.window_days)
    if args.time_scale is not None:
        w = transform.scale_time(w, args.time_scale)
    if args.size_scale is not None:
        w = transform.scale_size(w, args.size_scale)
    if args.max_jobs is not None:
        w = transform.limit(w, args.max_jobs)
    return w


def from_args(args: argparse.Namespace) -> Plan:
    from epu.simulate.cli import parse_params

    params = parse_params(args.param) or None
    if args.scenario:
        from epu.simulate.scenarios import get

        plan = get(args.scenario).build(args.seed)
        if args.policy or params:
            plan.options = replace(plan.options, policy=args.policy or plan.options.policy,
                                   params={**(plan.options.params or {}), **(params or {})})
        plan.options.skip_idle = not args.no_skip
        return plan
    w = load_trace(args.trace, args.format) if args.trace else generate(args.generator, seed=args.seed)
    w = shape_workload(w, args)
    if args.config:
        config = load_simulation_config(args.config)
    else:
        config = default_config(w, cores_per_node=args.cores_per_node, max_nodes=args.max_nodes, price=args.price)
    cloud = load_cloud_model(args.cloud)
    options = Options(seed=args.seed, domain=args.domain, policy=args.policy, params=params,
                      estimate=args.estimate, skip_idle=not args.no_skip)
    return Plan(w.name, w, config, cloud, options)


BASELINE_KEYS = ("policy", "peak_nodes", "wait_mean_s", "wait_p50_s", "wait_p95_s", "wait_max_s",
                 "bounded_slowdown", "node_hours", "cost", "utilization", "jobs_completed")
"""What a single run's report says of the static cluster beside its own figures."""


def run_plan(plan: Plan, out: Path | None = None, progress: Any = None, command: str = "",
             options: Options | None = None, with_baseline: bool = True) -> dict[str, Any]:
    """One run; with ``with_baseline`` its summary carries the static cluster's cost and waits
    (``baseline``: what the same workload costs and waits on a fixed cluster of its size)."""
    opts = replace(options or plan.options, progress=progress)
    w = plan.workload
    if plan.label and w.name != plan.label:  # a named experiment: its name on every title
        w = w.copy(list(w.jobs), name=plan.label)
    data = Simulate(plan.config, w, plan.cloud, opts).run()
    summary = summarize(data)
    extra = plan.extra(data) if plan.extra else {}
    if extra:
        summary["scenario"] = extra
    if with_baseline:
        static = baseline(plan)
        summary["baseline"] = {k: static[k] for k in BASELINE_KEYS if k in static}
    if out is not None:
        from epu.simulate.output import write_results

        write_results(data, summary, out, command=command, extra=extra)
    return summary


def baseline(plan: Plan) -> dict[str, Any]:
    domain = pick_domain(plan.config, plan.options.domain)
    d = plan.config.domains[domain]
    site = (d.sites or list(plan.config.sites))[0]
    model = plan.cloud.site(site)
    price = model.price_per_hour if model.price_per_hour is not None else (plan.config.sites[site].price_per_hour or 0.0)
    nodes = plan.static_nodes or d.max_nodes
    return static_summary(plan.workload, nodes, d.cores_per_node, price, model.period)


def variant_labels(variants: list[tuple[str, dict[str, Any]]]) -> tuple[list[str], dict[str, Any]]:
    """Each run's label — its policy and the parameters that set it apart (those whose value is
    not the same in every run) — and the parameters every run shares. Why: two runs of one
    policy that differ in ``idle_seconds`` must not both read ``queue-demand``, and ten runs
    sharing a long parameter list should not repeat it in every label."""
    missing = object()
    keys = list(dict.fromkeys(k for _, params in variants for k in params))  # as the operator wrote them
    varying = [k for k in keys if len({repr(params.get(k, missing)) for _, params in variants}) > 1]
    common = {k: variants[0][1][k] for k in keys if k not in varying}
    labels = []
    for policy, params in variants:
        own = [f"{k}={params[k]}" for k in varying if k in params]
        labels.append(policy + (":" + ",".join(own) if own else ""))
    seen: dict[str, int] = {}
    twice = {x for x in labels if labels.count(x) > 1}  # the same variant twice: number them
    for i, label in enumerate(labels):
        if label in twice:
            seen[label] = seen.get(label, 0) + 1
            labels[i] = f"{label} #{seen[label]}"
    return labels, common


def _slug(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", label).strip("_")[:80]


_FORKED: tuple[Plan, list[Options], list[Path | None], str] | None = None
"""What forked workers of ``run_compare`` run: set before the pool forks, inherited, never pickled
(a scenario's ``extra`` is a closure)."""


def _run_forked(i: int) -> dict[str, Any]:
    assert _FORKED is not None
    plan, opts, subs, command = _FORKED
    return run_plan(plan, subs[i], None, command, options=opts[i], with_baseline=False)


def compare_jobs(requested: int | None, runs: int) -> int:
    """How many runs at once: ``requested``, else one per core; never more than the runs."""
    import os

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(runs, requested or cores))


def run_compare(plan: Plan, variants: list[tuple[str, dict[str, Any]]], out: Path | None = None,
                progress: bool = True, command: str = "", jobs: int | None = None) -> dict[str, Any]:
    """Every variant on the same workload, and the static baseline. Runs go in parallel over
    ``jobs`` processes (default: one per core): each run is deterministic on its own, so the
    figures are those of running them one after another."""
    global _FORKED
    from epu.simulate.cli import Progress

    labels, common = variant_labels(variants)
    opts = [replace(plan.options, policy=policy, params=params or None) for policy, params in variants]
    subs = [out / f"{i + 1:02d}-{_slug(label)}" if out else None for i, label in enumerate(labels)]
    workers = compare_jobs(jobs, len(variants))
    summaries: list[dict[str, Any]] = []
    if workers > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        _FORKED = (plan, opts, subs, command)
        try:
            with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
                pending = [pool.submit(_run_forked, i) for i in range(len(variants))]
                for label, f in zip(labels, pending, strict=True):
                    summaries.append(f.result())
                    if progress and sys.stderr.isatty():
                        print(f"{label}: done", file=sys.stderr, flush=True)
        finally:
            _FORKED = None
    else:
        for label, o, sub in zip(labels, opts, subs, strict=True):
            bar = Progress(f"{label}", progress)
            summaries.append(run_plan(plan, sub, bar, command, options=o, with_baseline=False))
            bar.close()
    runs = []
    for (_policy, params), label, s in zip(variants, labels, summaries, strict=True):
        s["policy"] = label
        s["params"] = dict(params)
        runs.append(s)
    result = {"workload": plan.workload.name, "baseline": baseline(plan), "runs": runs, "common_params": common}
    if out is not None:
        write_compare(result, out)
    return result


def write_compare(result: dict[str, Any], out: Path) -> None:
    from epu.simulate.cli import COLUMNS, compare_rows
    from epu.simulate.output import _agg

    out.mkdir(parents=True, exist_ok=True)
    rows = [result["baseline"], *result["runs"]]
    with open(out / "compare.csv", "w", newline="") as f:
        w = csv.writer(f)
        keys = ["policy", "jobs", "jobs_completed", "wait_mean_s", "wait_p50_s", "wait_p95_s", "wait_max_s",
                "bounded_slowdown", "node_hours", "cost", "utilization", "launches", "failures", "replacements",
                "peak_nodes"]
        w.writerow(keys)
        for r in rows:
            w.writerow([r.get(k, "") for k in keys])
    plt = _agg()
    fig, ax = plt.subplots(figsize=(9, 5.5))
    markers = "osD^v<>p*h"
    for i, r in enumerate(rows):
        static = r is result["baseline"]
        ax.scatter([r["wait_p95_s"]], [r["cost"]], s=70, marker="s" if static else markers[i % len(markers)],
                   color="black" if static else f"C{i}", label=r["policy"], zorder=3)
        ax.annotate(r["policy"], (r["wait_p95_s"], r["cost"]), textcoords="offset points",
                    xytext=(7, -3 + 9 * (i % 3 - 1)), fontsize=8)
    ax.set_xlabel("95th percentile wait (s)")
    ax.set_ylabel("cost")
    ax.set_xscale("symlog", linthresh=10.0)
    ax.set_title(f"{result['workload']}: cost against p95 wait (lower left is better)", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2, frameon=False)
    fig.tight_layout()
    fig.savefig(out / "compare.png", dpi=100)
    plt.close(fig)
    head = "".join(f"<th>{html.escape(h)}</th>" for _, h, _ in COLUMNS)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in compare_rows(result))
    (out / "compare.html").write_text(
        f"<!doctype html><meta charset=utf-8><title>epu simulate --compare</title>"
        f"<style>body{{font-family:sans-serif;max-width:1000px;margin:1em auto}}td,th{{border:1px solid #ccc;"
        f"padding:3px 8px;text-align:right}}table{{border-collapse:collapse}}</style>"
        f"<h1>{html.escape(result['workload'])}: policies compared</h1><table><tr>{head}</tr>{body}</table>"
        f"<img src=compare.png style='max-width:100%'><p>The first row is a static cluster of the domain's "
        f"max_nodes, always on, under the same batch model. Each policy's own report is in its folder.</p>")
    (out / "compare.json").write_text(json.dumps(result, indent=2, sort_keys=True, default=str) + "\n")


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan
