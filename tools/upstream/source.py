"""MCP tools at run time: the source that runs a call to `mcp__{server}__{tool}` on the tenant's server, and
the jobs that keep a server's tools in the catalog (periodically, and when the server says they changed).

MCP tools enter the catalog by syncing their server (`tools.upstream.servers.mcp_server_sync`, which lists the
tools through `tools.upstream.client` and reconciles the catalog), not through `definitions`: this source offers
none, and the catalog sync of the sources (`tools.catalog.services.catalog_sync`) only creates and updates the
tools a source offers, so it never touches MCP tools.

A call goes to the tool's server over the process's pooled session (`tools.upstream.client.mcp_call_tool`):
- a server disabled or deleted: `ToolNotAvailable` (the catalog leaves such tools out already, so the call
  normally fails at Normalize; this covers a server disabled while the call waited);
- upstream progress becomes the call's progress events, in order;
- the tool's timeout: the executor settles the call `timed_out` and sets the call's stop signal, which
  cancels the request upstream (the SDK's own timeout is set a little later, as a backstop);
- a cancel: the same stop signal;
- isError: `UpstreamToolError` with the upstream text; the server unreachable or the connection lost:
  `UpstreamUnavailable`, tried again while the tool's timeout allows when the tool is idempotent.
"""
import logging
import time
from collections.abc import Callable
from datetime import timedelta

from django.conf import settings
from django.db import connections
from django.db.models import F, Q
from django.utils import timezone

from tools.accounts import vault
from tools.accounts.oauth import OAuthFailed
from tools.catalog.registry import register_periodic, register_source
from tools.models import AccountMode, McpServer
from tools.python.decorators import CallCancelled, ToolContext, ToolError, progress_numbers
from tools.upstream.client import (
    UpstreamCancelled,
    UpstreamRefused,
    UpstreamTimedOut,
    UpstreamToolError,
    UpstreamUnauthorized,
    UpstreamUnavailable,
    endpoint_of,
    endpoint_server_id,
    mcp_call_tool,
    mcp_on_tools_changed,
)

logger = logging.getLogger("toolkeeper.mcp")

BACKSTOP_S = 2.0  # the SDK's own timeout is this much later than the executor's, which settles the call
RETRY_PAUSES_S = (0.2, 0.5, 1.0, 2.0, 5.0)  # between attempts of an idempotent tool's call
SYNC_BUDGET_S = 20.0  # a periodic run starts no sync after this long, so other periodic jobs are not held up
MAX_PROGRESS_CHARS = 2000  # of an upstream progress message
SYNC_BATCH = 50  # servers looked at per periodic run


def progress_relay(ctx: ToolContext) -> Callable[[float, float | None, str | None], None]:
    """Upstream progress (progress, total, message) as the call's progress events, numbers kept
    (`ToolContext.progress`)."""

    def relay(progress: float, total: float | None, message: str | None) -> None:
        if progress_numbers(progress, total)[0] is None:
            return  # not a number: nothing to report
        ctx.progress(progress, total, (message or "")[:MAX_PROGRESS_CHARS])

    return relay


def log_relay(ctx: ToolContext) -> Callable[[str, str], None]:
    """Upstream log messages (level, text) as the call's log events (`ToolContext.log`)."""

    def relay(level: str, text: str) -> None:
        ctx.log(text, level=level)

    return relay


def _endpoint_for_call(server: McpServer, ctx: ToolContext, refused: str | None = None):
    """The tenant's endpoint, or, for a server where each person connects their own account, the call's person's
    (their token, refreshed when due, or when the server `refused` the one sent; a call without one fails saying
    what to do), and that token."""
    if server.accounts != AccountMode.PERSON:
        return endpoint_of(server), None
    try:
        token = (vault.token_refused(upstream=server, session=ctx.session, token=refused) if refused is not None
                 else vault.call_token(upstream=server, session=ctx.session))
    except vault.AccountNeeded as exc:
        raise ToolError(str(exc), error_type=exc.error_type) from None
    except OAuthFailed as exc:
        raise ToolError(f"your account at {server.name!r} could not be refreshed: {exc}",
                        error_type="UpstreamUnavailable") from None
    return endpoint_of(server, bearer=token, account=f"user:{ctx.session.person_id}"), token


class McpSource:
    kinds = ("mcp",)

    def definitions(self, tenant):
        return ()  # MCP tools come in by syncing their server (module docstring)

    def invoke(self, tool, arguments, ctx: ToolContext):
        server = tool.mcp_server
        if server is None or not server.enabled:
            state = "disabled" if server is not None else "removed"
            raise ToolError(f"{tool.name} is not available: its MCP server was {state}", error_type="ToolNotAvailable")
        try:
            endpoint, token = _endpoint_for_call(server, ctx)
        except UpstreamUnavailable as exc:
            raise ToolError(str(exc), error_type="UpstreamUnavailable") from None
        deadline = time.monotonic() + tool.timeout_s
        relay = progress_relay(ctx)
        renewed = False
        attempt = 0  # transient failures so far (a renewed token is not one)
        while True:
            try:
                return mcp_call_tool(endpoint, tool.source_ref, arguments,
                                     timeout_s=max(0.1, deadline - time.monotonic()) + BACKSTOP_S,
                                     on_progress=relay, on_log=log_relay(ctx), cancelled=ctx.cancel_signal)
            except UpstreamUnauthorized as exc:
                # A person's token refused before its recorded end (revoked or replaced upstream): renewed once
                # and the call sent again, which is safe whatever the tool: a 401 means the server did nothing.
                if token is None or renewed:
                    raise ToolError(str(exc), error_type="UpstreamUnavailable") from None
                endpoint, fresh = _endpoint_for_call(server, ctx, refused=token)
                if fresh == token:  # not renewed (it was, moments ago): the server's refusal stands
                    raise ToolError(str(exc), error_type="UpstreamUnavailable") from None
                token, renewed = fresh, True
            except UpstreamCancelled:
                raise CallCancelled("the call was cancelled") from None
            except UpstreamToolError as exc:
                raise ToolError(str(exc), error_type="UpstreamToolError") from None
            except UpstreamTimedOut as exc:
                raise ToolError(str(exc), error_type="TimedOut") from None
            except UpstreamRefused as exc:  # the address or the command is refused: no use trying again
                raise ToolError(str(exc), error_type="UpstreamUnavailable") from None
            except UpstreamUnavailable as exc:
                pause = RETRY_PAUSES_S[min(attempt, len(RETRY_PAUSES_S) - 1)]
                if not tool.idempotent or attempt == len(RETRY_PAUSES_S) or time.monotonic() + pause >= deadline:
                    raise ToolError(str(exc), error_type="UpstreamUnavailable") from None
                logger.info("call %s: %s; trying again (idempotent tool)", ctx.call_id, exc)
                ctx.sleep(pause)  # raises CallCancelled when the call is stopped meanwhile
                attempt += 1


register_source(McpSource())


# -- keeping the catalog in line with the servers ---------------------------------------------------

_last_attempts: dict[int, float] = {}  # server id → when this process last tried to sync it (monotonic)


def mcp_servers_due(*, interval_s: float | None = None, limit: int = SYNC_BATCH) -> list[McpServer]:
    """Enabled servers (of every tenant) never synced, or not within `interval_s`; the longest waiting first."""
    interval_s = settings.TOOLKEEPER_MCP_SYNC_INTERVAL_S if interval_s is None else interval_s
    cutoff = timezone.now() - timedelta(seconds=interval_s)
    return list(McpServer.all_tenants.filter(enabled=True).filter(
        Q(last_synced_at__isnull=True) | Q(last_synced_at__lt=cutoff),
    ).order_by(F("last_synced_at").asc(nulls_first=True), "pk")[:limit])


def mcp_sync_due(*, sync, budget_s: float = SYNC_BUDGET_S) -> dict:
    """Periodic: sync the servers that are due (`mcp_servers_due`) with `sync(server=…)`. A server this process
    tried within the interval is left alone (its last attempt may have failed without a sync time)."""
    interval_s = settings.TOOLKEEPER_MCP_SYNC_INTERVAL_S
    started = time.monotonic()
    counts = {"synced": 0, "failed": 0, "skipped": 0}
    for server in mcp_servers_due(interval_s=interval_s):
        now = time.monotonic()
        if now - started > budget_s:
            break
        if now - _last_attempts.get(server.pk, -interval_s) < interval_s:
            counts["skipped"] += 1
            continue
        _last_attempts[server.pk] = now
        try:
            sync(server=server)
        except Exception:
            logger.exception("periodic sync of MCP server %s failed", server.pk)
            counts["failed"] += 1
        else:
            counts["synced"] += 1
    return counts


def mcp_tools_changed_handler(*, sync) -> Callable[[str], None]:
    """What to do when a server with an open session says its tools changed (`mcp_on_tools_changed`): sync
    that server, if it is still enabled and still configured as the session was opened."""

    def handle(key: str) -> None:
        server_id = endpoint_server_id(key)
        if server_id is None:
            return
        try:
            server = McpServer.all_tenants.filter(pk=server_id, enabled=True).first()
            if server is not None and endpoint_of(server).key == key:
                sync(server=server)
        except Exception:
            logger.exception("sync of MCP server %s after its tools changed failed", server_id)
        finally:
            connections.close_all()  # a worker thread of the MCP loop: its connection must not linger

    return handle


def mcp_sync_register(*, sync) -> None:
    """Keep every enabled server's tools synced with `sync(server=…)` (tools.upstream.servers.mcp_server_sync):
    periodically (a job of the runtime: Celery beat or the embedded timer) and when an open session hears
    that the server's tools changed."""
    interval_s = settings.TOOLKEEPER_MCP_SYNC_INTERVAL_S
    register_periodic("tools.mcp_sync", lambda: mcp_sync_due(sync=sync), every_s=min(60.0, max(5.0, interval_s / 5)))
    mcp_on_tools_changed(mcp_tools_changed_handler(sync=sync))
