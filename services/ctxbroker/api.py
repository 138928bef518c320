"""The broker's HTTP adapter: FastAPI routes for admin and node APIs, plus a lean updates path.

Three kinds of caller:

* the administrator (``Authorization: Bearer <admin token>``): create, list, show, delete
  contexts, see their nodes, issue a node credential, remove a node;
* a node, with its own credential (HTTP Basic ``node/HOSTNAME/INSTANCE_ID`` and its secret,
  see ``epu.common.nodecred``): join and leave as itself only, read updates;
* a holder of the context's own key and secret (the operator, the provisioner): read updates.

Credentials are compared in constant time and never logged.

Why a lean path for ``GET /v1/contexts/{id}/updates``: it is the one request every agent
keeps open, and when an entry lands all of them return at once. ``UpdatesFastPath`` answers
it straight from ASGI (no routing, no dependency injection, no pydantic) with the cached
encoded body. The FastAPI route of the same name exists for the OpenAPI spec and answers
identically (both call ``updates_answer``). The wrapper also reads every other request's body
first, up to ``MAX_BODY_BYTES``: a larger one (declared or chunked) is answered 413 and the
connection closed, before FastAPI or any credential check sees it. Header size is bounded
below this layer (``server.BoundedHttp``, 431).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import json
import logging
import math
import re
from collections.abc import Callable
from typing import Annotated, Any
from urllib.parse import parse_qsl

from epu.common import nodecred
from epu.services.ctxbroker.core import (
    MAX_WAIT_SECONDS,
    AddressUnknown,
    Caller,
    ContextName,
    Entry,
    Forbidden,
    Fqdn,
    InstanceId,
    NodeFields,
    ShortHostname,
    authorize_join,
    check_credentials,
    hash_secret,
    new_context_id,
    new_key,
    new_secret,
)
from epu.services.ctxbroker.hub import CtxState, Hub
from fastapi import Depends, FastAPI, Path, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPBasic, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field

log = logging.getLogger("epu.ctxbroker.api")

MAX_BODY_BYTES = 64 * 1024
CONTEXT_ID_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"
HOSTNAME_PATTERN = r"^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$"
_CONTEXT_ID_RE = re.compile(CONTEXT_ID_PATTERN)
ContextId = Annotated[str, Path(pattern=CONTEXT_ID_PATTERN, description="context id")]

MembershipHook = Callable[[str, Entry], None]
#: ``Retry-After`` of a join held until the provisioner reports the instance's address.
ADDRESS_RETRY_SECONDS = 5
JOIN_HELD = ("the provisioner has not reported this instance's address yet: the join is held, "
             "retry after Retry-After seconds")


# --------------------------------------------------------------------------- API models
class CreateContext(BaseModel):
    name: ContextName = Field(description="a name for operators (lowercase letters, digits, '-', '_')")
    domain: Fqdn | None = Field(
        None, description="DNS domain of the cluster's names: a member's fqdn must then be its host name "
                          "or its host name under this domain (without one, any name whose first label is "
                          "its host name)", examples=["cluster.example.org"])


class ContextCreated(BaseModel):
    id: str
    name: str
    uri: str = Field(description="what agents use: the context's base URL")
    key: str
    secret: str = Field(description="shown once; the broker keeps only its SHA-256 digest and a signing key "
                                    "derived from it. Give it to the provisioner, which derives each node's "
                                    "own credential from it; never put it in userdata")


class IssueCredential(BaseModel):
    model_config = ConfigDict(extra="forbid")

    hostname: ShortHostname = Field(description="the short host name the node will join as", examples=["head"])
    instance_id: InstanceId | None = Field(
        None, description="bind the credential to this instance too (what the provisioner does for each "
                          "launch); omit for a machine EPU did not launch, such as the batch head node")


class CredentialIssued(BaseModel):
    uri: str
    key: str = Field(description="HTTP Basic user: node/HOSTNAME/INSTANCE_ID")
    secret: str = Field(description="HTTP Basic password")


class ContextInfo(BaseModel):
    id: str
    name: str
    uri: str
    key: str
    created_at: float
    last_id: int = Field(description="id of the newest entry of the ordered list (0: none yet)")
    nodes: int
    domain: str = Field("", description="DNS domain of the cluster's names (\"\": none given)")


class NodeOut(BaseModel):
    hostname: str
    fqdn: str
    ip: str
    ssh_host_key: str
    data: str
    instance_id: str | None = None


class JoinResult(BaseModel):
    changed: bool = Field(description="false when the node was already a member with the same fields")
    entry_id: int | None = None
    last_id: int


class EntryOut(BaseModel):
    id: int
    kind: str
    hostname: str
    fqdn: str
    ip: str
    ssh_host_key: str
    data: str
    instance_id: str | None = None
    reason: str
    at: float


class Updates(BaseModel):
    context_id: str
    last_id: int = Field(description="newest entry id; send it back as 'after' next time")
    snapshot: bool = Field(description="true: 'entries' are the current members (the joins that made them), "
                                       "to replace whatever the agent had, as of last_id; false: the entries "
                                       "after 'after', in order")
    entries: list[EntryOut]


class Problem(BaseModel):
    detail: Any


ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": Problem, "description": "missing or wrong credentials"},
    403: {"model": Problem, "description": "valid credentials that may not do this (another node's entry, "
                                           "name or address, a terminated instance, the context secret "
                                           "writing)"},
    404: {"model": Problem, "description": "unknown context or node"},
    413: {"model": Problem, "description": "request body too large"},
    422: {"model": Problem, "description": "malformed JSON or invalid field, with a message"},
    431: {"model": Problem, "description": "request header fields too large"},
}


# --------------------------------------------------------------------------- credentials
def basic_credentials(header: str | None) -> tuple[str, str] | None:
    if not header or header[:6].lower() != "basic ":
        return None
    try:
        raw = base64.b64decode(header[6:].strip(), validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        return None
    key, sep, secret = raw.partition(":")
    return (key, secret) if sep else None


def context_caller(st: CtxState, header: str | None) -> Caller | None:
    """Who an ``Authorization: Basic`` header proves to be in this context (None: nobody)."""
    creds = basic_credentials(header)
    if creds is None:
        return None
    user, password = creds
    if user.startswith(nodecred.NODE_USER_PREFIX):
        ident = nodecred.verify(st.row.signing_key, st.row.id, user, password)
        return Caller("node", ident) if ident is not None else None
    if check_credentials(user, password, st.row.key, st.row.secret_hash):
        return Caller("context")
    return None


def _problem(status: int, detail: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"detail": detail}, status_code=status, headers=headers)


UNAUTHORIZED_NODE = {"WWW-Authenticate": 'Basic realm="epu-context"'}
UNAUTHORIZED_ADMIN = {"WWW-Authenticate": 'Bearer realm="epu-admin"'}


def parse_updates_query(after: Any, wait: Any) -> tuple[int, float] | str:
    """Validate ``after`` and ``wait``; return them or an error message."""
    try:
        a = int(after) if after is not None else 0
    except (TypeError, ValueError):
        return "after must be a non-negative integer (the last entry id applied; 0 for none)"
    if a < 0 or a > 2**62:
        return "after must be a non-negative integer (the last entry id applied; 0 for none)"
    try:
        w = float(wait) if wait is not None else 0.0
    except (TypeError, ValueError):
        return f"wait must be a number of seconds between 0 and {MAX_WAIT_SECONDS:g}"
    if not math.isfinite(w) or w < 0 or w > MAX_WAIT_SECONDS:
        return f"wait must be a number of seconds between 0 and {MAX_WAIT_SECONDS:g}"
    return a, w


UNAUTHORIZED_NODE_BODY = b'{"detail":"missing or wrong credentials for this context"}'


async def updates_answer(hub: Hub, context_id: str, auth: str | None, after: Any,
                         wait: Any) -> tuple[int, bytes, dict[str, str]]:
    """The one implementation of "read updates", shared by the fast path and the FastAPI route."""
    hub.requests += 1
    parsed = parse_updates_query(after, wait)
    if isinstance(parsed, str):
        return 422, json.dumps({"detail": parsed}).encode(), {}
    st = await hub.get(context_id)
    if st is None:
        return 404, b'{"detail":"unknown context"}', {}
    if context_caller(st, auth) is None:
        return 401, UNAUTHORIZED_NODE_BODY, UNAUTHORIZED_NODE
    body = await hub.wait_after(st, parsed[0], parsed[1])
    if st.deleted:
        return 404, b'{"detail":"unknown context"}', {}
    return 200, body, {}


# --------------------------------------------------------------------------- ASGI wrapper
class UpdatesFastPath:
    """ASGI middleware: the lean updates path and the request body cap (see module docstring)."""

    PREFIX = "/v1/contexts/"
    SUFFIX = "/updates"

    def __init__(self, app: Any, hub: Hub) -> None:
        self.app = app
        self.hub = hub

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        if scope["method"] == "GET" and path.startswith(self.PREFIX) and path.endswith(self.SUFFIX):
            cid = path[len(self.PREFIX):-len(self.SUFFIX)]
            if "/" not in cid and 0 < len(cid) <= 64:
                await self._updates(scope, cid, send)
                return
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > MAX_BODY_BYTES):
            await _too_large(send)
            return
        body = await _read_body(receive, MAX_BODY_BYTES)
        if body is None:
            await _too_large(send)
            return
        await self.app(scope, _replay(body, receive), send)

    async def _updates(self, scope: dict[str, Any], cid: str, send: Any) -> None:
        if not _CONTEXT_ID_RE.match(cid):
            await _send(send, 404, b'{"detail":"unknown context"}', {})
            return
        auth = None
        for k, v in scope.get("headers") or []:
            if k == b"authorization":
                auth = v.decode("latin-1")
                break
        q = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True))
        status, body, extra = await updates_answer(self.hub, cid, auth, q.get("after"), q.get("wait"))
        await _send(send, status, body, extra)


async def _send(send: Any, status: int, body: bytes, extra: dict[str, str]) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in extra.items()]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _too_large(send: Any) -> None:
    """413, and close the connection: the rest of an oversized body is never read."""
    await _send(send, 413, json.dumps({"detail": f"request body larger than {MAX_BODY_BYTES} bytes"}).encode(),
                {"Connection": "close"})


async def _read_body(receive: Any, limit: int) -> bytes | None:
    """The whole request body, or None as soon as it exceeds ``limit`` (a chunked body has no
    Content-Length to refuse it by)."""
    parts: list[bytes] = []
    size = 0
    while True:
        msg = await receive()
        if msg["type"] != "http.request":  # the client went away: hand the app an empty body
            break
        chunk = msg.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        parts.append(chunk)
        if not msg.get("more_body", False):
            break
    return b"".join(parts)


def _replay(body: bytes, receive: Any) -> Any:
    """A ``receive`` that yields the already-read body once, then defers to the server's."""
    sent = False

    async def wrapped() -> Any:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return wrapped


# --------------------------------------------------------------------------- the app
def create_app(hub: Hub, admin_token: str, public_url: str | Callable[[], str],
               on_membership: MembershipHook | None = None,
               health: Callable[[], dict[str, Any]] | None = None) -> Any:
    """The broker's ASGI application (FastAPI inside ``UpdatesFastPath``).

    ``health`` reports on what else the process owns (its AMQP consumer): ``/healthz`` is ok
    only if that says ``healthy`` too."""
    app = FastAPI(
        title="EPU context broker",
        version="1.0.0",
        description="Keeps every node's view of an elastic cluster current. Admin endpoints take "
                    "`Authorization: Bearer <admin token>`; node endpoints take HTTP Basic with a "
                    "node's own credential (user `node/HOSTNAME/INSTANCE_ID`; it joins and leaves only "
                    "as that host) or, to read only, the context's key and secret. Each context has an "
                    "ordered list of joins and leaves (ids 1, 2, ...; 0 means none): agents ask for the "
                    "entries after the last id they applied, optionally long-polling with `wait`; a new "
                    "agent, or one far behind, gets the current members as one snapshot instead.",
    )
    basic = HTTPBasic(auto_error=False, description="a node's credential (user node/HOSTNAME/INSTANCE_ID) "
                                                    "or the context's key and secret (read only)")
    bearer = HTTPBearer(auto_error=False, description="the broker's admin token")
    base_of: Callable[[], str] = public_url if callable(public_url) else (lambda: str(public_url))
    hook = on_membership or (lambda _cid, _e: None)

    def context_uri(cid: str) -> str:
        return f"{base_of().rstrip('/')}/v1/contexts/{cid}"

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = []
        for err in exc.errors():
            loc = ".".join(str(p) for p in err.get("loc", ()))
            errors.append({"loc": loc, "msg": str(err.get("msg", ""))})
        return JSONResponse({"detail": errors}, status_code=422)

    def is_admin(request: Request) -> bool:
        header = request.headers.get("authorization", "")
        token = header[7:].strip() if header[:7].lower() == "bearer " else ""
        return hmac.compare_digest(token.encode("utf-8", "surrogatepass"), admin_token.encode())

    async def admin(request: Request, _cred: Any = Depends(bearer)) -> None:
        if not is_admin(request):
            raise _Unauthorized(UNAUTHORIZED_ADMIN, "missing or wrong admin token")

    async def node_context(context_id: ContextId, request: Request,
                           _cred: Any = Depends(basic)) -> tuple[CtxState, Caller]:
        st = await hub.get(context_id)
        if st is None:
            raise _NotFound("unknown context")
        caller = context_caller(st, request.headers.get("authorization"))
        if caller is None:
            raise _Unauthorized(UNAUTHORIZED_NODE, "missing or wrong credentials for this context")
        return st, caller

    async def node_or_admin(context_id: ContextId, request: Request,
                            _cred: Any = Depends(basic)) -> tuple[CtxState, Caller]:
        if is_admin(request):
            st = await hub.get(context_id)
            if st is None:
                raise _NotFound("unknown context")
            return st, Caller("admin")
        return await node_context(context_id, request)

    @app.exception_handler(_Unauthorized)
    async def _unauth(_request: Request, exc: _Unauthorized) -> JSONResponse:
        return _problem(401, exc.detail, exc.headers)

    @app.exception_handler(_NotFound)
    async def _notfound(_request: Request, exc: _NotFound) -> JSONResponse:
        return _problem(404, exc.detail)

    @app.exception_handler(_Conflict)
    async def _conflict(_request: Request, exc: _Conflict) -> JSONResponse:
        return _problem(409, exc.detail)

    @app.exception_handler(Forbidden)
    async def _forbidden(_request: Request, exc: Forbidden) -> JSONResponse:
        return _problem(403, str(exc))

    # ------------------------------------------------------------ admin
    @app.post("/v1/contexts", status_code=201, response_model=ContextCreated, tags=["admin"],
              dependencies=[Depends(admin)], summary="Create a context",
              responses={**ERRORS, 409: {"model": Problem, "description": "a context of this name exists "
                                                                           "already (nothing created)"}})
    async def create_context(body: CreateContext) -> ContextCreated:
        cid, key, secret = new_context_id(), new_key(), new_secret()
        from epu.services.ctxbroker.store import NameTaken

        try:
            await asyncio.to_thread(hub.store.create_context, cid, body.name, key, hash_secret(secret), None,
                                    nodecred.signing_key(secret), body.domain or "")
        except NameTaken as exc:  # a second context of one name would split a cluster's nodes
            raise _Conflict(f"{exc}: use it, or delete it first; nothing created") from None
        await hub.refresh(cid)
        log.info("context created", extra={"context": cid, "context_name": body.name})
        return ContextCreated(id=cid, name=body.name, uri=context_uri(cid), key=key, secret=secret)

    @app.get("/v1/contexts", response_model=list[ContextInfo], tags=["admin"],
             dependencies=[Depends(admin)], responses=ERRORS, summary="List contexts")
    async def list_contexts() -> list[ContextInfo]:
        rows = await asyncio.to_thread(hub.store.list_contexts)
        out = []
        for r in rows:
            n = len(await asyncio.to_thread(hub.store.members, r.id))
            out.append(ContextInfo(id=r.id, name=r.name, uri=context_uri(r.id), key=r.key,
                                   created_at=r.created_at, last_id=r.last_id, nodes=n, domain=r.domain))
        return out

    @app.get("/v1/contexts/{context_id}", response_model=ContextInfo, tags=["admin"],
             dependencies=[Depends(admin)], responses=ERRORS, summary="Show a context")
    async def show_context(context_id: ContextId) -> ContextInfo:
        r = await asyncio.to_thread(hub.store.get_context, context_id)
        if r is None:
            raise _NotFound("unknown context")
        n = len(await asyncio.to_thread(hub.store.members, r.id))
        return ContextInfo(id=r.id, name=r.name, uri=context_uri(r.id), key=r.key, created_at=r.created_at,
                           last_id=r.last_id, nodes=n, domain=r.domain)

    @app.delete("/v1/contexts/{context_id}", status_code=204, tags=["admin"],
                dependencies=[Depends(admin)], responses=ERRORS, summary="Delete a context")
    async def delete_context(context_id: ContextId) -> Response:
        gone = await asyncio.to_thread(hub.store.delete_context, context_id)
        hub.drop(context_id)
        if not gone:
            raise _NotFound("unknown context")
        log.info("context deleted", extra={"context": context_id})
        return Response(status_code=204)

    @app.get("/v1/contexts/{context_id}/nodes", response_model=list[NodeOut], tags=["admin"],
             dependencies=[Depends(admin)], responses=ERRORS, summary="Current members of a context")
    async def list_nodes(context_id: ContextId) -> list[NodeOut]:
        if await asyncio.to_thread(hub.store.get_context, context_id) is None:
            raise _NotFound("unknown context")
        nodes = await asyncio.to_thread(hub.store.members, context_id)
        return [NodeOut(**n.__dict__) for n in nodes]

    @app.post("/v1/contexts/{context_id}/credentials", status_code=201, response_model=CredentialIssued,
              tags=["admin"], dependencies=[Depends(admin)], responses=ERRORS,
              summary="Issue a node's own credential")
    async def issue_credential(context_id: ContextId, body: IssueCredential) -> CredentialIssued:
        """For a machine EPU does not launch (the batch head node, a static worker): a credential
        that joins and leaves only as ``hostname``. The provisioner derives the same for each
        instance it launches, from the context secret, without asking."""
        st = await hub.get(context_id)
        if st is None:
            raise _NotFound("unknown context")
        if not st.row.signing_key:
            raise Forbidden("this context predates per-node credentials: create a new one")
        cred = nodecred.issue(st.row.signing_key, st.row.id, body.hostname, body.instance_id)
        log.info("node credential issued", extra={"context": context_id, "hostname": body.hostname,
                                                  "instance": body.instance_id})
        return CredentialIssued(uri=context_uri(context_id), key=cred.key, secret=cred.secret)

    # ------------------------------------------------------------ nodes
    @app.exception_handler(AddressUnknown)
    async def _address_unknown(_request: Request, exc: AddressUnknown) -> JSONResponse:
        log.info("join held: instance address not reported yet", extra={"error": str(exc)})
        return _problem(503, str(exc), {"Retry-After": str(ADDRESS_RETRY_SECONDS)})

    @app.post("/v1/contexts/{context_id}/nodes", response_model=JoinResult, tags=["node"],
              responses={**ERRORS, 503: {"model": Problem, "description": JOIN_HELD}},
              summary="Join (or update) this node")
    async def join(node: NodeFields, auth: tuple[CtxState, Caller] = Depends(node_context)) -> JoinResult:
        """Only with the node's own credential, only as the host (and instance) it names, with
        only that host's names (its host name, or its host name under the context's domain)
        and only its own address: for an instance EPU launched, the one the provisioner reports;
        never an address another member holds (403 with the reason)."""
        from epu.services.ctxbroker.store import ContextNotFound, Revoked

        st, caller = auth
        node = authorize_join(caller, node, st.row.domain)
        try:
            entry, last = await asyncio.to_thread(hub.store.join, st.row.id, node)
        except ContextNotFound:
            raise _NotFound("unknown context") from None
        except Revoked as exc:
            raise Forbidden(str(exc)) from None
        if entry is not None:
            await hub.refresh(st.row.id)
            hook(st.row.id, entry)
            log.info("node joined", extra={"context": st.row.id, "hostname": node.hostname, "entry": last})
        return JoinResult(changed=entry is not None, entry_id=entry.entry_id if entry else None, last_id=last)

    @app.delete("/v1/contexts/{context_id}/nodes/{hostname}", response_model=JoinResult, tags=["node"],
                responses=ERRORS, summary="Leave: remove this node")
    async def leave(hostname: Annotated[str, Path(pattern=HOSTNAME_PATTERN, max_length=63)],
                    auth: tuple[CtxState, Caller] = Depends(node_or_admin)) -> JoinResult:
        """A node removes itself (while the entry is its own instance's); the admin token removes any."""
        from epu.services.ctxbroker.store import ContextNotFound

        st, caller = auth
        reason = "removed by the administrator" if caller.kind == "admin" else "agent left"
        try:
            entry, last = await asyncio.to_thread(hub.store.leave, st.row.id, hostname.lower(), reason, None, caller)
        except ContextNotFound:
            raise _NotFound("unknown context") from None
        if entry is not None:
            await hub.refresh(st.row.id)
            hook(st.row.id, entry)
            log.info("node left", extra={"context": st.row.id, "hostname": hostname, "entry": last})
        return JoinResult(changed=entry is not None, entry_id=entry.entry_id if entry else None, last_id=last)

    @app.get("/v1/contexts/{context_id}/updates", tags=["node"], summary="Entries after an id (long-poll)",
             responses={200: {"model": Updates}, **ERRORS})
    async def updates(context_id: ContextId, request: Request,
                      after: Annotated[int, Query(ge=0, le=2**62, description="last entry id applied (0: none)")] = 0,
                      wait: Annotated[float, Query(ge=0, le=MAX_WAIT_SECONDS,
                                                   description="seconds to wait for a new entry")] = 0.0,
                      _cred: Any = Depends(basic)) -> Response:
        status, body, extra = await updates_answer(hub, context_id, request.headers.get("authorization"),
                                                   after, wait)
        return Response(body or b"", status_code=status, media_type="application/json", headers=extra)

    @app.get("/healthz", tags=["ops"], summary="Health: 200 when serving and every consumer consumes, else 503")
    async def healthz() -> JSONResponse:
        doc: dict[str, Any] = {"ok": not hub.closing, "contexts": len(hub.contexts), "waiting": hub.waiting,
                               "last_wake": hub.last_wake}
        if health is not None:
            try:
                amqp = health()
            except Exception as exc:  # a broken probe is an unhealthy process, not a 500
                amqp = {"healthy": False, "error": f"{type(exc).__name__}: {exc}"}
            doc["amqp"] = amqp
            doc["ok"] = bool(doc["ok"] and amqp.get("healthy"))
        return JSONResponse(doc, status_code=200 if doc["ok"] else 503)

    wrapped = UpdatesFastPath(app, hub)
    wrapped.fastapi = app  # type: ignore[attr-defined]
    return wrapped


class _Unauthorized(Exception):
    def __init__(self, headers: dict[str, str], detail: str) -> None:
        self.headers, self.detail = headers, detail


class _NotFound(Exception):
    def __init__(self, detail: str) -> None:
        self.detail = detail


class _Conflict(Exception):
    def __init__(self, detail: str) -> None:
        self.detail = detail


def openapi_document(app: Any) -> dict[str, Any]:
    fastapi_app: FastAPI = app.fastapi if hasattr(app, "fastapi") else app
    return fastapi_app.openapi()


