"""Sites from config (credentials never logged), userdata rendering, the rate limiter."""

from __future__ import annotations

import logging

import pytest
import yaml

from common.config.provisioner import SiteConfig
from services.provisioner.cloud import LaunchSpec, LibcloudSite
from services.provisioner.drivers import SiteConfigError, make_driver, read_credentials
from services.provisioner.ratelimit import TokenBucket
from services.provisioner.sim import SimulatedNodeDriver
from services.provisioner.userdata import UserdataError, UserdataRenderer

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
    kw = site.create_kwargs(LaunchSpec(launch_id="x" * 100, node_name="w1", domain="alpha", userdata="#cloud-config"))
    assert len(kw["ex_clienttoken"]) == 64 and kw["ex_userdata"] == "#cloud-config"
    assert kw["ex_metadata"] == {"owner": "hpc", "epu-deployment": "epu", "epu-domain": "alpha",
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
