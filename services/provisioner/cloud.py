"""The cloud boundary: what the provisioner needs from a site, and its libcloud adapter.

Shaped like the Kubernetes cluster-autoscaler's cloud-provider interface: the rest of the
service sees a ``Site`` with three calls — ``launch``, ``terminate``, ``nodes`` — over
normalized ``CloudNode`` values, and never a provider's quirks. ``LibcloudSite`` maps those
calls onto any libcloud ``NodeDriver``: it finds out from ``create_node``'s signature which
idempotency and tagging features the provider has (``ex_clienttoken``, ``ex_metadata``,
``ex_tags``, ``ex_userdata``...) and reads tags back from ``extra``, so EC2, OpenStack,
the simulated cloud and the process site all carry the same four tags.
"""

from __future__ import annotations

import hashlib
import inspect
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from libcloud.compute.base import Node, NodeDriver, NodeImage, NodeLocation, NodeSize
from libcloud.compute.types import NodeState

from common.config.provisioner import SiteConfig
from services.provisioner.states import map_node_state

TAG_DEPLOYMENT = "epu-deployment"
TAG_DOMAIN = "epu-domain"
TAG_LAUNCH = "epu-launch-id"
TAG_INSTANCE = "epu-instance-id"


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


class Site(Protocol):
    """One cloud the provisioner launches on (see module docstring)."""

    name: str
    config: SiteConfig

    def launch(self, spec: LaunchSpec) -> CloudNode: ...
    def terminate(self, cloud_id: str) -> None: ...
    def nodes(self) -> list[CloudNode]: ...


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


def to_cloud_node(node: Node) -> CloudNode:
    state = node.state.value if isinstance(node.state, NodeState) else str(node.state)
    ips = [ip for ip in list(node.private_ips or []) + list(node.public_ips or []) if ip]
    created = node.created_at.timestamp() if isinstance(node.created_at, datetime) else None
    return CloudNode(cloud_id=str(node.id), name=node.name or "", state=map_node_state(state), native_state=state,
                     ip=ips[0] if ips else None, tags=_tags_of(node), created_at=created)


def is_not_found(exc: BaseException) -> bool:
    """Does this error say the node is already gone? (Terminate is then done.)"""
    text = str(exc)
    return any(s in text for s in ("InvalidInstanceID.NotFound", "NotFound", "not found", "does not exist",
                                   "No such process"))


class LibcloudSite:
    """A ``Site`` over one libcloud driver."""

    def __init__(self, name: str, config: SiteConfig, driver: NodeDriver, deployment: str) -> None:
        self.name = name
        self.config = config
        self.driver = driver
        self.deployment = deployment
        self._create_params = set(inspect.signature(driver.create_node).parameters)
        self._image = NodeImage(id=config.image, name=config.image, driver=driver)
        self._size = NodeSize(id=config.size, name=config.size, ram=0, disk=0, bandwidth=None, price=None,
                              driver=driver)
        self._location = (NodeLocation(id=config.location, name=config.location, country="", driver=driver)
                          if config.location else None)

    def describe(self) -> dict[str, Any]:
        """What an operator may see about the site (never credentials)."""
        return {"site": self.name, "driver": self.config.driver, "image": self.config.image,
                "size": self.config.size, "quota": self.config.quota}

    def tags_for(self, spec: LaunchSpec) -> dict[str, str]:
        tags = dict(self.config.tags)
        tags.update(spec.tags)
        tags.update({TAG_DEPLOYMENT: self.deployment, TAG_DOMAIN: spec.domain, TAG_LAUNCH: spec.launch_id,
                     TAG_INSTANCE: spec.launch_id})
        return tags

    def create_kwargs(self, spec: LaunchSpec) -> dict[str, Any]:
        p = self._create_params
        tags = self.tags_for(spec)
        kw: dict[str, Any] = {"name": spec.node_name, "size": self._size, "image": self._image}
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
        if self.config.security_groups and "ex_security_groups" in p and self.config.driver in ("ec2", "epu-ec2"):
            kw["ex_security_groups"] = list(self.config.security_groups)
        return kw

    @property
    def idempotent_create(self) -> bool:
        """Does a repeated create with the same launch id return the same node (client token)?"""
        return "ex_clienttoken" in self._create_params and getattr(self.driver, "client_tokens", True)

    def launch(self, spec: LaunchSpec) -> CloudNode:
        return to_cloud_node(self.driver.create_node(**self.create_kwargs(spec)))

    def terminate(self, cloud_id: str) -> None:
        node = Node(id=cloud_id, name="", state=NodeState.UNKNOWN, public_ips=[], private_ips=[],
                    driver=self.driver)
        self.driver.destroy_node(node)

    def nodes(self) -> list[CloudNode]:
        """This deployment's nodes (tagged with it); others' are none of our business."""
        out = []
        for node in self.driver.list_nodes():
            cn = to_cloud_node(node)
            if cn.tags.get(TAG_DEPLOYMENT) == self.deployment:
                out.append(cn)
        return out
