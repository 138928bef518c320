"""libcloud's EC2 driver, accepting EC2 XML with or without the namespace's trailing slash.

Why: libcloud parses EC2 responses with XPath in the namespace
``http://ec2.amazonaws.com/doc/2016-11-15/`` (trailing slash, as AWS sends it). moto — the
EC2 we test against — answers some calls (``DescribeInstances`` among them) in
``http://ec2.amazonaws.com/doc/2016-11-15`` without the slash, so every lookup misses and
``list_nodes`` silently returns ``[]``. That would blind the poll loop and the orphan sweep.
The fix is the smallest honest one: before parsing, a response in the slash-less form of
the same namespace is rewritten to the canonical form. Responses already canonical (real
AWS) pass through untouched. Nothing else of the driver changes.

Also: moto picks the service from the SigV4 credential scope, so sites pointing at moto
must set ``signature_version = "4"`` in ``driver_args``.
"""

from __future__ import annotations

from typing import Any

from libcloud.compute.drivers.ec2 import NAMESPACE, EC2Connection, EC2NodeDriver, EC2Response

_BARE = NAMESPACE.rstrip("/")


def canonical_namespace(body: str | bytes) -> str | bytes:
    """Rewrite ``xmlns="…/2016-11-15"`` to ``xmlns="…/2016-11-15/"``; leave anything else alone."""
    if isinstance(body, bytes):
        return body.replace(f'xmlns="{_BARE}"'.encode(), f'xmlns="{NAMESPACE}"'.encode())
    return body.replace(f'xmlns="{_BARE}"', f'xmlns="{NAMESPACE}"')


class EpuEC2Response(EC2Response):
    def parse_body(self) -> Any:
        if self.body:
            self.body = canonical_namespace(self.body)
        return super().parse_body()


class EpuEC2Connection(EC2Connection):
    responseCls = EpuEC2Response


class EpuEC2NodeDriver(EC2NodeDriver):
    """``EC2NodeDriver`` with the namespace-tolerant response (see module docstring)."""

    connectionCls = EpuEC2Connection
