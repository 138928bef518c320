"""The simulated provisioner's listing conversion, without converting the same Node twice.

The service's ``LibcloudSite.nodes`` converts every Node of every listing (``to_cloud_nodes``):
libcloud's drivers build new Node objects at each listing, so nothing could be reused there.
The simulator's driver (``SimNodeDriver``) hands out the very same Node object for a VM whose
listed state did not change, and a new one whenever it did (``SimNodeDriver._node``,
``_shown_as``); it never changes a Node it handed out. ``NodeMemo`` — passed to
``LibcloudSite`` as its ``convert`` — hands out the ``CloudNode`` it already made from that very
object, looked up for a whole listing at once.

What it skips: only the conversion of a Node it converted before. ``to_cloud_node`` is a pure
function of the Node's fields, a ``CloudNode`` is frozen and no caller changes its ``tags``, so
every listing the service sees is equal, node for node and in order, to the one the plain
conversion gives; everything else — which Nodes the driver lists, the deployment filter, the
poll — runs the service's own code. ``tests/sim/test_node_memo.py`` compares the two over random
listings of a simulated cloud with its faults on.
"""

from __future__ import annotations

from libcloud.compute.base import Node

from epu.services.provisioner.cloud import CloudNode, to_cloud_node

#: The memo is emptied when it holds this many entries: the Nodes of VMs that changed or are gone
#: are never listed again, and emptying costs one conversion per Node listed next.
MIN_CLEAR = 4096


class NodeMemo:
    """``LibcloudSite``'s ``convert`` for the simulator: ``to_cloud_nodes(nodes)``, with each
    Node's conversion taken again while it is the very object converted. One per provisioner
    boot and site."""

    def __init__(self) -> None:
        self._converted: dict[int, CloudNode] = {}
        """By ``id(node)``: its conversion."""
        self._nodes: dict[int, Node] = {}
        """By ``id(node)``: the Node itself, kept so that its id is not reused while converted."""
        self.converted = 0
        """Conversions made (a test checks that the memo is used)."""

    def __call__(self, nodes: list[Node]) -> list[CloudNode]:
        out: list[CloudNode | None] = list(map(self._converted.get, map(id, nodes)))
        if not all(out):  # a CloudNode is always true: only a miss (None) is false
            for k, node in enumerate(nodes):
                if out[k] is None:
                    out[k] = self._convert(node)
        return out  # type: ignore[return-value]

    def _convert(self, node: Node) -> CloudNode:
        if len(self._converted) >= MIN_CLEAR:
            self._converted.clear()
            self._nodes.clear()
        cn = self._converted[id(node)] = to_cloud_node(node)
        self._nodes[id(node)] = node
        self.converted += 1
        return cn


__all__ = ["NodeMemo"]
