"""What a simulation assumes about each site, where that came from, and what an operator should know.

Why: a run's figures are only as good as its cloud model, and an operator reading a report must
see it. Each site of the domain is modelled, in order of precedence, from ``--cloud FILE``
(``cli``), else from the knobs of an ``epu-sim`` site in the operator's own config (its
``driver_args``: ``boot_time_min``/``boot_time_max``, ``boot_failure_rate``, ``api_error_rate``,
``api_latency`` — what the demo and a test bed run with; ``config``), else the default model
(``default``: uniform 60–180 s boots, no failure).

The warning that matters most: a domain's ``stall_seconds`` shorter than a site's slow boots plus
the sensor's poll. The engine then gives up on instances that are still booting, counts each as
a failure, replaces it and backs the site off — with one site, jobs wait with no instance at all.
``epu config check`` gives the same warning for ``epu-sim`` sites (``config_warnings``): real
clouds state no boot time in the config.
"""

from __future__ import annotations

from typing import Any

from epu.simulate.cloudmodel import CloudModel, Dist, SiteModel

SOURCES = {"cli": "--cloud file", "config": "the site's driver_args in the config", "default": "the default model"}

SIM_DRIVER = "epu-sim"
SIM_BOOT_DEFAULTS = (5.0, 15.0)
"""The ``epu-sim`` driver's own boot times when only one bound is given (services/provisioner/sim.py)."""
CHURN_LAUNCHES_PER_JOB = 1.0
"""More instances launched than jobs ran: instances come and go faster than the work does."""


def site_model_from_config(site: Any) -> SiteModel | None:
    """The cloud model an ``epu-sim`` site's ``driver_args`` describe; None when it sets no knob
    a model has (or the site is a real cloud)."""
    if site.driver != SIM_DRIVER:
        return None
    args = site.driver_args
    update: dict[str, Any] = {}
    if "boot_time_min" in args or "boot_time_max" in args:
        lo = float(args.get("boot_time_min", SIM_BOOT_DEFAULTS[0]))
        hi = max(lo, float(args.get("boot_time_max", max(lo, SIM_BOOT_DEFAULTS[1]))))
        update["boot"] = Dist(dist="uniform", min=lo, max=hi)
    if "boot_failure_rate" in args:
        update["boot_failure_rate"] = float(args["boot_failure_rate"])
    if "api_error_rate" in args:
        update["api_error_rate"] = min(0.99, float(args["api_error_rate"]))
    if "api_latency" in args:
        update["api_latency"] = Dist(dist="constant", seconds=float(args["api_latency"]))
    if not update:
        return None
    return SiteModel.model_validate({**SiteModel().model_dump(), **{k: v for k, v in update.items()}})


def effective_model(config: Any, sites: list[str], cloud: CloudModel) -> tuple[CloudModel, dict[str, str]]:
    """The model every site of ``sites`` runs with, each named, and where each came from."""
    models: dict[str, SiteModel] = {}
    sources: dict[str, str] = {}
    for name in sites:
        if name in cloud.sites:
            models[name], sources[name] = cloud.sites[name], "cli"
            continue
        from_config = site_model_from_config(config.sites[name]) if name in config.sites else None
        if from_config is not None:
            models[name], sources[name] = from_config, "config"
        else:
            models[name], sources[name] = cloud.default, "default"
    return CloudModel(sites={**cloud.sites, **models}, default=cloud.default), sources


def describe_site(m: SiteModel, price: float) -> dict[str, Any]:
    """A site's model in full (every knob, defaults included): what the report shows."""
    doc = m.model_dump(mode="json")
    doc["boot"] = _dist(m.boot)
    doc["api_latency"] = _dist(m.api_latency)
    doc["boot_slow_seconds"] = round(m.boot.high_seconds(), 3)
    doc["price_per_hour"] = price
    return doc


def _dist(d: Dist) -> dict[str, Any]:
    keys = {"constant": ("seconds",), "uniform": ("min", "max"), "normal": ("mean", "std"),
            "lognormal": ("median", "sigma"), "empirical": ("file",)}[d.dist]
    out: dict[str, Any] = {"dist": d.dist, **{k: getattr(d, k) for k in keys}}
    if d.dist == "empirical":
        out["values"] = len(d.values)
    return out


def stall_warning(domain: str, stall: float, poll: float, site: str, slow: float, where: str) -> str | None:
    """One line when ``stall`` cannot cover a slow boot of ``site`` plus a sensor poll."""
    needed = slow + poll
    if stall >= needed:
        return None
    return (f"domains.{domain}.params.stall_seconds={stall:g} is shorter than a slow boot of site {site} "
            f"({slow:g} s, {where}) plus the sensor's poll ({poll:g} s): instances still booting will be "
            f"given up as stalled, counted as failures and replaced, and the site backed off; set "
            f"stall_seconds above {needed:g}")


def stall_seconds(config: Any, domain: str) -> float:
    from epu.services.decision.policies import validate_params

    d = config.domains[domain]
    return float(validate_params(d.policy, d.params).stall_seconds)


def run_warnings(config: Any, domain: str, model: CloudModel, sources: dict[str, str]) -> list[str]:
    """What an operator should know before trusting a run's figures."""
    stall, poll = stall_seconds(config, domain), config.sensor.poll_seconds
    out = []
    for site, where in sources.items():
        line = stall_warning(domain, stall, poll, site, model.site(site).boot.high_seconds(), SOURCES[where])
        if line:
            out.append(line)
    return out


def churn_warning(launches: int, jobs: int, never_ran: int) -> str | None:
    """More instances than jobs: say so, and which cause the figures point at."""
    if not jobs or launches / jobs <= CHURN_LAUNCHES_PER_JOB:
        return None
    why = (f"{never_ran} of them never ran (failed boots, or given up while booting: see stall_seconds)"
           if never_ran else "instances are dropped and launched again between jobs (see idle_seconds)")
    return f"churn: {launches} instances launched for {jobs} jobs ({launches / jobs:.2f} per job): {why}"


def config_warnings(config: Any) -> list[str]:
    """``epu config check``'s warnings: for each domain, its ``epu-sim`` sites whose boot knobs
    outlast its ``stall_seconds`` (a policy that does not validate is reported as an error elsewhere)."""
    from epu.services.decision.policies import PolicyError

    out = []
    for name, d in config.domains.items():
        try:
            stall = stall_seconds(config, name)
        except (PolicyError, KeyError):
            continue
        for site in d.sites or list(config.sites):
            if site not in config.sites:
                continue
            m = site_model_from_config(config.sites[site])
            if m is None:
                continue
            line = stall_warning(name, stall, config.sensor.poll_seconds, site, m.boot.high_seconds(),
                                 "its driver_args")
            if line:
                out.append(line)
    return out
