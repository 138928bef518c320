"""Small HTTPS clients for the broker: admin (the CLI) and node (the agent).

Errors come back as ``BrokerError`` with the HTTP status and the broker's message, so the
CLI prints something an operator can act on and the agent can tell "retry later" (network,
5xx) from "give up" (401, 404).
"""

from __future__ import annotations

from typing import Any

import httpx


class BrokerError(Exception):
    def __init__(self, status: int | None, message: str, retry_after: float | None = None) -> None:
        super().__init__(f"{status}: {message}" if status else message)
        self.status = status
        self.message = message
        self.retry_after = retry_after
        """Seconds the broker asked to wait before retrying (``Retry-After``; a held join)."""

    @property
    def retryable(self) -> bool:
        return self.status is None or self.status >= 500 or self.status == 429


def _verify(ca_file: str | None, insecure: bool) -> Any:
    if insecure:
        return False
    if ca_file:
        import ssl

        return ssl.create_default_context(cafile=ca_file)
    return True


def _retry_after(value: str | None) -> float | None:
    """``Retry-After`` in seconds (the HTTP-date form is not used by the broker: None)."""
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


def _check(resp: httpx.Response) -> Any:
    if resp.status_code >= 400:
        try:
            detail = resp.json().get("detail", resp.text)
        except ValueError:
            detail = resp.text
        raise BrokerError(resp.status_code, str(detail), _retry_after(resp.headers.get("retry-after")))
    if resp.status_code == 204 or not resp.content:
        return None
    return resp.json()


class _Base:
    def __init__(self, base_url: str, *, ca_file: str | None = None, insecure: bool = False,
                 timeout: float = 10.0) -> None:
        self.http = httpx.Client(base_url=base_url.rstrip("/"), verify=_verify(ca_file, insecure),
                                 timeout=timeout)

    def _call(self, method: str, path: str, **kw: Any) -> Any:
        try:
            resp = self.http.request(method, path, **kw)
        except httpx.HTTPError as exc:
            raise BrokerError(None, f"{type(exc).__name__}: {exc}") from None
        return _check(resp)

    def close(self) -> None:
        self.http.close()


class AdminClient(_Base):
    """``base_url`` is the broker's root (https://host:port)."""

    def __init__(self, base_url: str, token: str, **kw: Any) -> None:
        super().__init__(base_url, **kw)
        self.http.headers["Authorization"] = f"Bearer {token}"

    def create(self, name: str, domain: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"name": name}
        if domain:
            body["domain"] = domain
        return self._call("POST", "/v1/contexts", json=body)

    def list(self) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/contexts")

    def show(self, context_id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/contexts/{context_id}")

    def nodes(self, context_id: str) -> list[dict[str, Any]]:
        return self._call("GET", f"/v1/contexts/{context_id}/nodes")

    def delete(self, context_id: str) -> None:
        self._call("DELETE", f"/v1/contexts/{context_id}")

    def credential(self, context_id: str, hostname: str, instance_id: str | None = None) -> dict[str, Any]:
        """A node's own credential (``{uri, key, secret}``), for a machine EPU does not launch."""
        body: dict[str, Any] = {"hostname": hostname}
        if instance_id:
            body["instance_id"] = instance_id
        return self._call("POST", f"/v1/contexts/{context_id}/credentials", json=body)

    def remove_node(self, context_id: str, hostname: str) -> dict[str, Any]:
        return self._call("DELETE", f"/v1/contexts/{context_id}/nodes/{hostname}")


class NodeClient(_Base):
    """``uri`` is the context URI returned at creation (https://host:port/v1/contexts/ID);
    ``key``/``secret`` a node's own credential (or, to read only, the context's)."""

    def __init__(self, uri: str, key: str, secret: str, **kw: Any) -> None:
        super().__init__(uri, **kw)
        self.http.auth = httpx.BasicAuth(key, secret)

    def join(self, node: dict[str, Any]) -> dict[str, Any]:
        return self._call("POST", "/nodes", json=node)

    def leave(self, hostname: str) -> dict[str, Any]:
        return self._call("DELETE", f"/nodes/{hostname}")

    def updates(self, after: int, wait: float = 0.0) -> dict[str, Any]:
        timeout = httpx.Timeout(self.http.timeout.read or 10.0)
        if wait:
            timeout = httpx.Timeout(10.0, read=wait + 15.0)
        return self._call("GET", "/updates", params={"after": after, "wait": wait}, timeout=timeout)
