"""Sites from config (credentials never logged), userdata rendering, the rate limiter."""

from __future__ import annotations

import logging

import pytest
import yaml
from epu.common.config.provisioner import SiteConfig
from epu.services.provisioner.cloud import LaunchSpec, LibcloudSite, check_site
from epu.services.provisioner.drivers import SiteConfigError, make_driver, read_credentials
from epu.services.provisioner.ratelimit import TokenBucket
from epu.services.provisioner.sim import SimulatedNodeDriver
from epu.services.provisioner.userdata import UserdataError, UserdataRenderer

SECRET = "s3cr3t-do-not-log"


def test_credentials_from_file_and_environment(tmp_path) -> None:
    toml = tmp_path / "c.toml"
    toml.write_text(f'key = "k1"\nsecret = "{SECRET}"\nregion = "eu-west-1"\n')
    cfg = SiteConfig(driver="ec2", credentials_file=str(toml))
    assert read_credentials("aws", cfg, environ={}) == {"key": "k1", "secret": SECRET, "region": "eu-west-1"}
    env = {"EPU_SITE_AWS_EAST_KEY": "k2", "EPU_SITE_AWS_EAST_SECRET": "s2"}
    assert read_credentials("aws-east", cfg, environ=env)["key"] == "k2"
    js = tmp_path / "c.json"
    js.write_text('{"key": "k3", "secret": "x"}')
    assert read_credentials("x", SiteConfig(driver="ec2", credentials_file=str(js)), environ={})["key"] == "k3"
    js.write_text("{not json")
    with pytest.raises(SiteConfigError) as exc:
        read_credentials("x", SiteConfig(driver="ec2", credentials_file=str(js)), environ={})
    assert "not valid JSON" in str(exc.value)


def test_any_libcloud_provider_by_name_and_no_secret_in_errors(tmp_path, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    cfg = SiteConfig(driver="openstack", driver_args={"ex_force_auth_url": "http://127.0.0.1:5000",
                                                      "ex_force_auth_version": "3.x_password",
                                                      "ex_tenant_name": "t"})
    driver = make_driver("os", cfg, environ={"EPU_SITE_OS_KEY": "user", "EPU_SITE_OS_SECRET": SECRET})
    assert driver.type == "openstack"
    with pytest.raises(SiteConfigError) as exc:
        make_driver("bad", SiteConfig(driver="no-such-cloud"), environ={"EPU_SITE_BAD_SECRET": SECRET})
    assert "unknown libcloud provider 'no-such-cloud'" in str(exc.value)
    with pytest.raises(SiteConfigError) as exc:
        make_driver("os", SiteConfig(driver="openstack", driver_args={"bogus_arg": 1}),
                    environ={"EPU_SITE_OS_KEY": "u", "EPU_SITE_OS_SECRET": SECRET})
    assert SECRET not in str(exc.value)
    assert SECRET not in caplog.text
    sim = make_driver("sim", SiteConfig(driver="epu-sim", driver_args={"api_latency": 0.0}))
    assert isinstance(sim, SimulatedNodeDriver)


def test_create_kwargs_follow_the_provider(tmp_path) -> None:
    sim = SimulatedNodeDriver(path=str(tmp_path / "c.db"))
    site = LibcloudSite("sim", SiteConfig(driver="epu-sim", image="sim-image", size="sim.1core",
                                          tags={"owner": "hpc"}), sim, "epu")
    site.bind("epu", "store-1")
    kw = site.create_kwargs(LaunchSpec(launch_id="x" * 100, node_name="w1", domain="alpha", userdata="#cloud-config"))
    assert len(kw["ex_clienttoken"]) == 64 and kw["ex_userdata"] == "#cloud-config"
    assert kw["ex_metadata"] == {"owner": "hpc", "epu-deployment": "epu", "epu-store": "store-1", "epu-domain": "alpha",
                                 "epu-launch-id": "x" * 100, "epu-instance-id": "x" * 100}


def test_userdata_is_valid_yaml_quoted_and_bounded() -> None:
    r = UserdataRenderer.from_path()
    doc = r.render({"instance_id": "i-1", "node_name": "w1", "context_uri": 'https://c/1"\nevil: true',
                    "context_key": "k", "context_secret": "s", "head_node": "head", "batch_system": "slurm"})
    assert doc.startswith("#cloud-config\n")
    parsed = yaml.safe_load(doc)
    assert parsed["hostname"] == "w1" and "evil" not in parsed
    env = parsed["write_files"][1]["content"]
    assert 'EPU_CONTEXT_URI="https://c/1\\"\\nevil: true"' in env
    with pytest.raises(UserdataError) as exc:
        UserdataRenderer(r.template_text, max_bytes=100).render({})
    assert "over the provider limit of 100" in str(exc.value)
    with pytest.raises(UserdataError):
        UserdataRenderer.from_path("/nonexistent/template.yaml")


def test_token_bucket_limits_rate() -> None:
    now = [0.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    bucket = TokenBucket(rate=10, burst=2, monotonic=lambda: now[0], sleep=sleep)
    for _ in range(12):
        bucket.acquire()
    assert now[0] == pytest.approx(1.0, abs=0.01)  # 2 at once, then 10 more at 10/s


@pytest.mark.parametrize("driver,args,key", [
    ("epu-sim", {"boot_time_mni": 5}, "boot_time_mni"),         # was swallowed by the simulated driver
    ("epu-process", {"argv": ["true"], "stop_timeot": 1}, "stop_timeot"),
    ("ec2", {"regoin": "eu-west-1"}, "regoin"),                 # libcloud's base driver drops it
    ("openstack", {"ex_force_auth_ulr": "http://x"}, "ex_force_auth_ulr"),
])
def test_unknown_driver_args_are_refused_by_name(driver, args, key, tmp_path) -> None:
    if driver == "epu-process":
        args = {**args, "path": str(tmp_path / "p.db")}
    with pytest.raises(SiteConfigError) as exc:
        make_driver("s1", SiteConfig(driver=driver, driver_args=args),
                    environ={"EPU_SITE_S1_KEY": "k", "EPU_SITE_S1_SECRET": SECRET})
    assert f"driver_args key '{key}'" in str(exc.value) and "site s1" in str(exc.value)
    assert SECRET not in str(exc.value)


def test_credentials_file_keys_are_checked_too_without_their_values(tmp_path) -> None:
    creds = tmp_path / "c.toml"
    creds.write_text(f'key = "k"\nsecret = "{SECRET}"\nregoin = "{SECRET}"\n')
    with pytest.raises(SiteConfigError) as exc:
        make_driver("aws", SiteConfig(driver="ec2", credentials_file=str(creds)), environ={})
    assert "credentials_file key 'regoin'" in str(exc.value) and SECRET not in str(exc.value)


def test_known_libcloud_arguments_pass(tmp_path) -> None:
    driver = make_driver("aws", SiteConfig(driver="ec2", driver_args={
        "region": "eu-west-1", "signature_version": "4", "timeout": 5, "token": "t"}),
        environ={"EPU_SITE_AWS_KEY": "k", "EPU_SITE_AWS_SECRET": "s"})
    assert driver.region_name == "eu-west-1"


def test_simulated_cloud_fault_knobs_from_config(tmp_path, clock) -> None:
    """client_tokens, injected faults, partial listings and the seed are driver_args like the rest."""
    cfg = SiteConfig(driver="epu-sim", image="sim-image", size="sim.1core", driver_args={
        "path": str(tmp_path / "c.db"), "client_tokens": False, "seed": 7, "partial_listing_rate": 0.0,
        "faults": [{"kind": "lost", "count": 1, "call": "create"}, {"kind": "partial", "count": 1, "call": "list"}]})
    sim = make_driver("sim", cfg, clock=clock)
    assert isinstance(sim, SimulatedNodeDriver) and sim.client_tokens is False
    site = LibcloudSite("sim", cfg, sim)
    site.bind("dep", "st")
    assert site.idempotent_create is False  # the provisioner then looks the tag up before a retry
    with pytest.raises(Exception) as exc:
        site.launch(LaunchSpec("l1", "w1", "alpha"))
    assert "GatewayTimeout" in str(exc.value) and sim.ex_count() == 1  # made, answer lost
    assert site.nodes() == []  # the partial listing: half of one node
    assert [n.launch_id for n in site.nodes()] == ["l1"]


@pytest.mark.parametrize("faults,message", [
    ([{"kind": "meteor", "count": 1}], "unknown fault kind 'meteor'"),
    ([{"kind": "transient", "call": "reboot"}], "unknown fault call 'reboot'"),
    ([{"kind": "partial", "call": "create"}], "call='list' only"),
    ([{"kind": "lost", "cuont": 2}], "faults[0]"),
])
def test_bad_fault_knobs_are_refused(faults, message, tmp_path) -> None:
    with pytest.raises(SiteConfigError) as exc:
        make_driver("sim", SiteConfig(driver="epu-sim", driver_args={"path": str(tmp_path / "c.db"),
                                                                     "faults": faults}))
    assert "site sim: driver_args" in str(exc.value) and message in str(exc.value)


def test_extras_and_security_groups_are_checked_against_the_driver(tmp_path) -> None:
    sim = SimulatedNodeDriver(path=str(tmp_path / "c.db"))
    with pytest.raises(SiteConfigError) as exc:  # was: silently dropped for every driver but EC2
        LibcloudSite("sim", SiteConfig(driver="epu-sim", security_groups=["workers"]), sim)
    assert "security_groups is set but the epu-sim driver's create_node takes no security groups" in str(exc.value)
    with pytest.raises(SiteConfigError) as exc:
        LibcloudSite("sim", SiteConfig(driver="epu-sim", create_args={"ex_spot": True}), sim)
    assert "create_args key 'ex_spot'" in str(exc.value)


def test_check_site_without_credentials_or_connection() -> None:
    """What `epu config check` can use: the shipped examples pass, a misspelt key is named."""
    from pathlib import Path

    from epu.common.config import load_config

    for path in sorted((Path(__file__).resolve().parents[2] / "deploy" / "examples").glob("*.toml")):
        for name, cfg in load_config(path, environ={}).sites.items():
            check_site(name, cfg)
    check_site("os", SiteConfig(driver="openstack", security_groups=["w"], create_args={"networks": ["n"]}))
    check_site("aws", SiteConfig(driver="ec2", create_args={"ex_subnet": "s", "ex_spot": True}))
    for cfg, key in [(SiteConfig(driver="ec2", create_args={"ex_spott": True}), "ex_spott"),
                     (SiteConfig(driver="gce", driver_args={"projcet": "p"}), "projcet"),
                     (SiteConfig(driver="openstack", create_args={"ex_userdata": "x"}), "ex_userdata")]:
        with pytest.raises(SiteConfigError) as exc:
            check_site("s", cfg)
        assert f"'{key}'" in str(exc.value)
