"""The cloud boundary: what the provisioner needs from a site, and its libcloud adapter.

Shaped like the Kubernetes cluster-autoscaler's cloud-provider interface: the rest of the
service sees a ``Site`` with three calls — ``launch``, ``terminate``, ``nodes`` — over
normalized ``CloudNode`` values, and never a provider's quirks. ``LibcloudSite`` maps those
calls onto any libcloud ``NodeDriver``: it finds out from ``create_node``'s signature which
idempotency and tagging features the provider has (``ex_clienttoken``, ``ex_metadata``,
``ex_tags``, ``ex_userdata``...) and reads tags back from ``extra``, so EC2, OpenStack,
the simulated cloud and the process site all carry the same tags. A site's provider extras
(``create_args``: subnet, networks, spot options, IAM profile...) are checked against the
driver's ``create_node`` when the site is built and passed through, built into the objects
libcloud wants where it wants objects (``CREATE_ARG_OBJECTS``).

Whose node is whose: every node carries this deployment's identity (``epu-deployment``) and
this store's id (``epu-store``), both made at the store's first start (``Store.claim_identity``)
and bound to the site by the provisioner (``bind``). ``nodes`` returns only nodes of this
deployment; which of them this store may sweep is ``reconcile``'s business.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from epu.common.config.provisioner import SiteConfig
from epu.services.provisioner.drivers import (
    SiteConfigError,
    check_driver_args,
    driver_class,
    driver_family,
    keyword_names,
)
from epu.services.provisioner.states import map_node_state
from libcloud.compute.base import Node, NodeDriver, NodeImage, NodeLocation, NodeSize
from libcloud.compute.types import NodeState

TAG_DEPLOYMENT = "epu-deployment"
TAG_DOMAIN = "epu-domain"
TAG_LAUNCH = "epu-launch-id"
TAG_INSTANCE = "epu-instance-id"
TAG_STORE = "epu-store"


@dataclass(frozen=True)
class CloudNode:
    """A node as a site reports it, in our terms."""

    cloud_id: str
    name: str
    state: str | None
    """Our instance state for the node's libcloud state (``None``: nothing to conclude)."""
    native_state: str
    ip: str | None
    tags: dict[str, str] = field(default_factory=dict)
    created_at: float | None = None
    preempted: bool = False
    """The cloud took the node back (a spot/preemptible reclaim), as its listing says: its jobs
    were killed by the cloud, not by us, and must be requeued (``preempted_by_cloud``)."""
    interruption_at: float | None = None
    """A live node the cloud announced it will reclaim, about when (``interruption_notice``)."""
    end_observed: bool = False
    """The driver saw this ERROR or TERMINATED itself (``extra["end_observed"]``: a local process
    that exited), so it is a fact, not a cloud API's report that a later listing may contradict
    (``reconcile._ended_unasked``)."""

    @property
    def launch_id(self) -> str | None:
        return self.tags.get(TAG_LAUNCH)

    @property
    def live(self) -> bool:
        return self.state not in ("terminated", "failed")


@dataclass(frozen=True)
class LaunchSpec:
    launch_id: str
    node_name: str
    domain: str
    userdata: str = ""
    tags: dict[str, str] = field(default_factory=dict)
    size: str = ""
    """The provider size id of the launch's instance type ("": the site's ``size``)."""
    image: str = ""
    """The image of the launch's instance type ("": the site's ``image``)."""


class Site(Protocol):
    """One cloud the provisioner launches on (see module docstring): a declared port, as
    cluster-autoscaler's ``CloudProvider`` is. Every implementation declares every member; the
    provisioner never asks a site whether it has one (no ``getattr`` probe), so what it does with
    a site is what this port says. A member marked *Implementation optional* may raise
    ``NotImplementedError``; its caller says what it does then.

    Only ``terminations`` calls ``terminate`` (the one door to destroy, with its proof)."""

    name: str
    config: SiteConfig
    deployment: str | None
    """The deployment the caller built the site for (``provisioner.deployment``), or ``None``:
    the store's own, bound by ``bind``. Sites built for different deployments are refused."""

    @property
    def idempotent_create(self) -> bool:
        """Does a repeated create with the same launch id return the same node (a client token)?
        False: a create whose outcome is unknown (a timeout, a 5xx) is never retried blindly."""
        ...

    def bind(self, deployment: str, store_id: str) -> None:
        """Tag launches with, and list the nodes of, this deployment and store (called once by
        the provisioner with its store's identity)."""
        ...

    def launch(self, spec: LaunchSpec) -> CloudNode: ...
    def terminate(self, cloud_id: str) -> None: ...
    def nodes(self) -> list[CloudNode]: ...
    def find_launch(self, launch_id: str) -> CloudNode | None: ...

    def sizes(self) -> list[NodeSize]:
        """The provider's sizes (libcloud ``list_sizes()``), for a site that ``discover``s its
        instance types. *Implementation optional*: a site that cannot list them raises
        ``NotImplementedError`` (its catalogue is then its configuration's)."""
        ...


def launch_node(nodes: list[CloudNode], launch_id: str) -> CloudNode | None:
    """The live node of a listing that carries ``launch_id``."""
    return next((n for n in nodes if n.launch_id == launch_id and n.live), None)


def client_token(launch_id: str) -> str:
    """EC2 client tokens are at most 64 ASCII characters; longer ids are hashed (stable)."""
    return launch_id if len(launch_id) <= 64 else hashlib.sha256(launch_id.encode()).hexdigest()


def _tags_of(node: Node) -> dict[str, str]:
    extra = node.extra or {}
    for key in ("tags", "metadata", "labels"):
        value = extra.get(key)
        if isinstance(value, dict) and value:
            return {str(k): str(v) for k, v in value.items()}
    return {}


#: What drivers put in a reclaimed spot node's listing: EC2's state reason code (libcloud's
#: ``extra["reason"]`` is the instance's ``reason``/state transition text).
SPOT_REASON_MARKERS = ("Server.SpotInstanceTermination", "Spot instance termination")


def preempted_by_cloud(extra: dict[str, object] | None) -> bool:
    """Does a node's listing say the cloud preempted it? EC2: the spot termination reason code;
    GCE: a preemptible node (``scheduling.preemptible``) the cloud stopped; any driver: an explicit
    ``preempted`` flag. Only meaningful for a node listed as ended."""
    extra = extra or {}
    if extra.get("preempted") is True:
        return True
    reason = extra.get("reason")
    state_reason = extra.get("state_reason")
    code = state_reason.get("code") if isinstance(state_reason, dict) else None
    if any(isinstance(text, str) and any(m in text for m in SPOT_REASON_MARKERS) for text in (reason, code)):
        return True
    scheduling = extra.get("scheduling")
    return isinstance(scheduling, dict) and scheduling.get("preemptible") is True


def interruption_notice(extra: dict[str, object] | None) -> float | None:
    """When a live node's listing says the cloud will reclaim it (a spot interruption notice),
    about when: ``extra["interruption_at"]`` (epoch seconds; what the simulated cloud lists, and
    what a driver or site integration that receives EC2's two-minute warning — instance metadata
    or EventBridge, not ``DescribeInstances`` — or GCE's preemption notice puts there). ``None``:
    no notice."""
    value = (extra or {}).get("interruption_at")
    if isinstance(value, bool) or value is None:
        return None
    try:
        at = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return at if at > 0 else None


def to_cloud_node(node: Node) -> CloudNode:
    state = node.state.value if isinstance(node.state, NodeState) else str(node.state)
    ips = [ip for ip in list(node.private_ips or []) + list(node.public_ips or []) if ip]
    created = node.created_at.timestamp() if isinstance(node.created_at, datetime) else None
    ours = map_node_state(state)  # once: a pure function of the state
    return CloudNode(cloud_id=str(node.id), name=node.name or "", state=ours, native_state=state,
                     ip=ips[0] if ips else None, tags=_tags_of(node), created_at=created,
                     preempted=ours == "terminated" and preempted_by_cloud(node.extra),
                     interruption_at=interruption_notice(node.extra) if ours in ("pending", "started") else None,
                     end_observed=ours in ("failed", "terminated") and (node.extra or {}).get("end_observed") is True)


def to_cloud_nodes(nodes: list[Node]) -> list[CloudNode]:
    """A listing's nodes, each converted (``to_cloud_node``)."""
    return [to_cloud_node(n) for n in nodes]


#: ``to_cloud_nodes``' type: ``LibcloudSite`` takes any function equal to it.
NodeConversion = Callable[[list[Node]], list[CloudNode]]


def is_not_found(exc: BaseException) -> bool:
    """Does this error say the node is already gone? (Terminate is then done.)"""
    text = str(exc)
    return any(s in text for s in ("InvalidInstanceID.NotFound", "NotFound", "not found", "does not exist",
                                   "No such process"))


#: ``create_node`` arguments EPU sets itself (from the launch and the site's other keys): a
#: site's ``create_args`` may not set them.
RESERVED_CREATE_ARGS = frozenset({
    "name", "size", "image", "location", "auth", "ex_clienttoken", "ex_metadata", "ex_tags", "ex_labels",
    "ex_userdata", "ex_user_data", "ex_customdata", "ex_keyname", "ex_security_groups", "ex_securitygroup",
    "ex_mincount", "ex_maxcount"})


def _ec2_subnet(driver: NodeDriver, value: Any) -> Any:
    from libcloud.compute.drivers.ec2 import EC2NetworkSubnet

    return EC2NetworkSubnet(id=str(value), name=str(value), state="available")


def _openstack_networks(driver: NodeDriver, value: Any) -> Any:
    from libcloud.compute.drivers.openstack import OpenStackNetwork

    return [OpenStackNetwork(id=str(v), name=str(v), cidr=None, driver=driver) for v in _as_list(value)]


def _openstack_security_groups(driver: NodeDriver, value: Any) -> Any:
    from libcloud.compute.drivers.openstack import OpenStackSecurityGroup

    return [OpenStackSecurityGroup(id=None, tenant_id=None, name=str(v), description="", driver=driver)
            for v in _as_list(value)]


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else [value]


#: Extras libcloud wants as objects, built from the ids a config holds: (provider type, argument).
CREATE_ARG_OBJECTS: dict[tuple[str, str], Callable[[NodeDriver, Any], Any]] = {
    ("ec2", "ex_subnet"): _ec2_subnet,
    ("openstack", "networks"): _openstack_networks,
    ("openstack", "ex_security_groups"): _openstack_security_groups,
}


def check_site(name: str, config: SiteConfig) -> None:
    """What can be checked of a site without its credentials or a connection — the provider
    exists, every ``driver_args`` key is read by its driver, every ``create_args`` key is taken by
    its ``create_node`` (any of the provider's classes) and none is EPU's own — raising
    ``SiteConfigError`` naming the key. For ``epu config check``; building the site checks the
    same against the driver itself, and the credentials too."""
    cls = driver_class(name, config.driver)
    check_driver_args(name, config, cls, {})
    params: set[str] = set()
    takes_any = False
    for c in driver_family(cls):
        if "create_node" in c.__dict__:
            names, var = keyword_names(c.__dict__["create_node"])
            params |= names
            takes_any = takes_any or var
    create_extras(name, config, None, params, takes_any)


def create_extras(site: str, config: SiteConfig, driver: NodeDriver | None, params: set[str],
                  takes_any: bool) -> dict[str, Any]:
    """The site's ``create_args`` and ``security_groups`` as ``create_node`` keywords, checked
    against the driver's signature (names the key that does not fit)."""
    provider = str(getattr(driver, "type", "") or "") if driver is not None else ""  # no driver: check only
    extras: dict[str, Any] = {}
    for key, value in config.create_args.items():
        if key in RESERVED_CREATE_ARGS:
            raise SiteConfigError(f"site {site}: create_args key {key!r} is set by EPU, not by a site "
                                  "(security groups: the site's security_groups key)")
        if key not in params and not takes_any:
            raise SiteConfigError(f"site {site}: create_args key {key!r} is not an argument of the "
                                  f"{config.driver} driver's create_node (it takes: "
                                  f"{', '.join(sorted(params - RESERVED_CREATE_ARGS))})")
        convert = CREATE_ARG_OBJECTS.get((provider, key))
        extras[key] = convert(driver, value) if convert else value
    if config.security_groups:
        if "ex_security_groups" not in params:
            raise SiteConfigError(f"site {site}: security_groups is set but the {config.driver} driver's "
                                  "create_node takes no security groups")
        convert = CREATE_ARG_OBJECTS.get((provider, "ex_security_groups"))
        groups = list(config.security_groups)
        extras["ex_security_groups"] = convert(driver, groups) if convert else groups
    return extras


class LibcloudSite:
    """A ``Site`` over one libcloud driver."""

    def __init__(self, name: str, config: SiteConfig, driver: NodeDriver, deployment: str | None = None,
                 convert: NodeConversion = to_cloud_nodes) -> None:
        self.name = name
        self.config = config
        self.driver = driver
        self.convert = convert
        """How libcloud ``Node``s become ``CloudNode``s: ``to_cloud_nodes``. A caller may pass an
        equal function (the simulator passes one that remembers the conversion of each very Node
        object its driver hands out again, ``epu.sim.node_memo``)."""
        self.deployment = deployment
        """Set here only by callers that name the deployment explicitly; else by ``bind``."""
        self.store_id: str | None = None
        self._create_params, takes_any = keyword_names(driver.create_node)
        self._extras = create_extras(name, config, driver, self._create_params, takes_any)
        self._image = NodeImage(id=config.image, name=config.image, driver=driver)
        self._size = NodeSize(id=config.size, name=config.size, ram=0, disk=0, bandwidth=None, price=None,
                              driver=driver)
        self._location = (NodeLocation(id=config.location, name=config.location, country="", driver=driver)
                          if config.location else None)

    def describe(self) -> dict[str, Any]:
        """What an operator may see about the site (never credentials)."""
        return {"site": self.name, "driver": self.config.driver, "image": self.config.image,
                "size": self.config.size, "quota": self.config.quota}

    def bind(self, deployment: str, store_id: str) -> None:
        if self.deployment not in (None, deployment):
            raise ValueError(f"site {self.name} was built for deployment {self.deployment!r}, "
                             f"the store belongs to {deployment!r}")
        self.deployment, self.store_id = deployment, store_id

    def _identity(self) -> tuple[str, str]:
        if self.deployment is None or self.store_id is None:
            raise RuntimeError(f"site {self.name}: no deployment identity bound (Provisioner binds it)")
        return self.deployment, self.store_id

    def tags_for(self, spec: LaunchSpec) -> dict[str, str]:
        deployment, store_id = self._identity()
        tags = dict(self.config.tags)
        tags.update(spec.tags)
        tags.update({TAG_DEPLOYMENT: deployment, TAG_STORE: store_id, TAG_DOMAIN: spec.domain,
                     TAG_LAUNCH: spec.launch_id, TAG_INSTANCE: spec.launch_id})
        return tags

    def create_kwargs(self, spec: LaunchSpec) -> dict[str, Any]:
        p = self._create_params
        tags = self.tags_for(spec)
        size = self._size if spec.size in ("", self.config.size) else NodeSize(
            id=spec.size, name=spec.size, ram=0, disk=0, bandwidth=None, price=None, driver=self.driver)
        image = self._image if spec.image in ("", self.config.image) else NodeImage(
            id=spec.image, name=spec.image, driver=self.driver)
        kw: dict[str, Any] = {"name": spec.node_name, "size": size, "image": image}
        if self._location is not None:
            kw["location"] = self._location
        if "ex_clienttoken" in p:
            kw["ex_clienttoken"] = client_token(spec.launch_id)
        if "ex_metadata" in p:
            kw["ex_metadata"] = tags
        if "ex_tags" in p:
            kw["ex_tags"] = tags
        if "ex_labels" in p:  # GCE labels: lowercase, no dots
            kw["ex_labels"] = {k.lower(): v.lower().replace(".", "-") for k, v in tags.items()}
        if spec.userdata:
            for name in ("ex_userdata", "ex_user_data", "ex_customdata"):
                if name in p:
                    kw[name] = spec.userdata
                    break
            else:
                if "ex_metadata" in p:
                    kw["ex_metadata"] = {**tags, "user-data": spec.userdata}
        if self.config.keypair and "ex_keyname" in p:
            kw["ex_keyname"] = self.config.keypair
        kw.update(self._extras)
        return kw

    @property
    def idempotent_create(self) -> bool:
        """Does a repeated create with the same launch id return the same node (client token)?"""
        return "ex_clienttoken" in self._create_params and getattr(self.driver, "client_tokens", True)

    def sizes(self) -> list[NodeSize]:
        """The provider's sizes (libcloud ``list_sizes()``), for sites that ``discover`` them."""
        if self._location is not None:
            return self.driver.list_sizes(location=self._location)
        return self.driver.list_sizes()

    def launch(self, spec: LaunchSpec) -> CloudNode:
        return self.convert([self.driver.create_node(**self.create_kwargs(spec))])[0]

    def terminate(self, cloud_id: str) -> None:
        node = Node(id=cloud_id, name="", state=NodeState.UNKNOWN, public_ips=[], private_ips=[],
                    driver=self.driver)
        self.driver.destroy_node(node)

    def find_launch(self, launch_id: str) -> CloudNode | None:
        """The live node carrying ``launch_id``, whatever deployment tag it has. Only for a
        terminate the engine asked for by that launch id while this store does not know it (the
        store was replaced: its nodes carry the old store's identity)."""
        return launch_node(self.convert(self.driver.list_nodes()), launch_id)

    def nodes(self) -> list[CloudNode]:
        """This deployment's nodes (tagged with it); others' are none of our business."""
        deployment, _ = self._identity()
        return [cn for cn in self.convert(self.driver.list_nodes()) if cn.tags.get(TAG_DEPLOYMENT) == deployment]
