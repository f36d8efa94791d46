"""The one gate for HTTP requests the platform makes to addresses a tenant chose (MCP servers, …).

A tenant controls those URLs and may be hostile. Unguarded, the platform would fetch whatever only
the platform can reach: the cloud's metadata service and the credentials it hands out, the database,
Redis, the admin side of internal services. So every such request goes through `async_http_client()`
or `http_client()`, whose network layer (`AsyncGuardedNetworkBackend`, `GuardedNetworkBackend`, under
httpcore2's connection pool) resolves the host itself, checks every address, and connects to an
address it checked, so:

- The check is made when connecting, not only when a URL is saved: a name that resolves to a public
  address when it is saved and to 127.0.0.1 a moment later (DNS rebinding) is refused, and each
  redirect hop is a new connection, checked the same way.
- A name is refused if ANY of its addresses is forbidden, rather than connecting to one that is not: a
  name mixing public and internal answers is a rebinding attempt or a mistake, and the outcome must not
  depend on the order of the answers or on which address happens to answer.
- TLS still verifies the name in the URL: the backend only picks the address; httpcore2 passes the
  URL's host as `server_hostname` for SNI and the certificate check.
- No proxy from the environment (`trust_env=False`: a proxy would make the connection on our behalf,
  unchecked), no Unix sockets, no transport or mounts of the caller's.

Forbidden (only public addresses may be reached):

- loopback 127.0.0.0/8, ::1; unspecified 0.0.0.0/8 ("this network": 0.0.0.0 reaches the host), ::
- private 10/8, 172.16/12, 192.168/16, IPv6 unique local fc00::/7, site-local fec0::/10, local-use
  NAT64 64:ff9b:1::/48; carrier-grade NAT 100.64.0.0/10
- link-local 169.254.0.0/16, fe80::/10
- cloud metadata: 169.254.169.254 (AWS, GCP, Azure, OCI, …), 169.254.170.2 (AWS ECS), 169.254.169.253
  (AWS DNS), fd00:ec2::254 (AWS IPv6), fd20:ce::254 (GCP IPv6), 100.100.100.200 (Alibaba), 192.0.0.192
  (OCI), 168.63.129.16 (Azure's host endpoint, a public address)
- multicast 224.0.0.0/4, ff00::/8; reserved 240.0.0.0/4 (and 255.255.255.255), IETF assignments
  192.0.0.0/24 and 2001::/23 (Teredo included), benchmarking 198.18.0.0/15, discard 100::/64;
  documentation 192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24, 2001:db8::/32, 3fff::/20
- an IPv6 address that embeds an IPv4 one is judged by the IPv4 address: mapped ::ffff:0:0/96,
  compatible ::/96, translated ::ffff:0:0:0/96, NAT64 64:ff9b::/96, 6to4 2002::/16
- and, after those, whatever `ipaddress` does not call global (Python's table of special ranges)

`TOOLKEEPER_OUTBOUND_ALLOWED_HOSTS` (settings) lets the platform admin open some of these: host names
(exact, case-insensitive) whose addresses are then not checked, and IP addresses or networks (CIDR).
A metadata address stays refused under an allowed name or inside an allowed network; only an entry
naming that exact address opens it.

What comes back is bounded too: a response body over `TOOLKEEPER_OUTBOUND_MAX_MESSAGE_BYTES` (16 MiB),
or on an event stream (`text/event-stream`, which may rightly last for days) one event over it, ends
the response with `ResponseTooLarge`, before the rest is read into memory.

Messages of `OutboundRefused` are plain words safe to show the tenant; they never say which address a
name resolved to (that would map the internal network for the tenant). The log line does, for admins.
"""
import ipaddress
import logging
import select
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

import anyio
import anyio.to_thread
import httpcore2
import httpx2
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

logger = logging.getLogger("toolkeeper.outbound")

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

SCHEMES = ("http", "https")
ONLY_PUBLIC = "only public addresses may be reached"
METADATA = "a cloud metadata address"
# The MCP SDK's own defaults: 30 s to connect, write and wait for the pool, 300 s between reads of a stream.
DEFAULT_TIMEOUT = httpx2.Timeout(30.0, read=300.0)
DEFAULT_LIMITS = httpx2.Limits(max_connections=100, max_keepalive_connections=20, keepalive_expiry=5.0)  # httpx2's

METADATA_ADDRESSES = frozenset(ipaddress.ip_address(a) for a in (
    "169.254.169.254", "169.254.170.2", "169.254.169.253", "fd00:ec2::254", "fd20:ce::254",
    "100.100.100.200", "192.0.0.192", "168.63.129.16",
))
FORBIDDEN_NETWORKS: tuple[tuple[IPNetwork, str], ...] = tuple((ipaddress.ip_network(net), what) for net, what in (
    ("127.0.0.0/8", "a loopback address"),
    ("::1/128", "a loopback address"),
    ("0.0.0.0/8", "an unspecified address"),
    ("::/128", "an unspecified address"),
    ("169.254.0.0/16", "a link-local address"),
    ("fe80::/10", "a link-local address"),
    ("10.0.0.0/8", "a private address"),
    ("172.16.0.0/12", "a private address"),
    ("192.168.0.0/16", "a private address"),
    ("fc00::/7", "a private address"),
    ("fec0::/10", "a private address"),
    ("64:ff9b:1::/48", "a private address"),
    ("100.64.0.0/10", "a carrier-grade NAT address"),
    ("224.0.0.0/4", "a multicast address"),
    ("ff00::/8", "a multicast address"),
    ("240.0.0.0/4", "a reserved address"),
    ("192.0.0.0/24", "a reserved address"),
    ("2001::/23", "a reserved address"),
    ("198.18.0.0/15", "a reserved address"),
    ("100::/64", "a reserved address"),
    ("192.0.2.0/24", "a documentation address"),
    ("198.51.100.0/24", "a documentation address"),
    ("203.0.113.0/24", "a documentation address"),
    ("2001:db8::/32", "a documentation address"),
    ("3fff::/20", "a documentation address"),
))
# IPv6 ranges whose last 32 bits are an IPv4 address (6to4 is handled apart: its IPv4 follows the prefix).
EMBEDDING_NETWORKS = tuple(ipaddress.ip_network(net) for net in (
    "::ffff:0:0/96", "::/96", "::ffff:0:0:0/96", "64:ff9b::/96",
))
SIX_TO_FOUR = ipaddress.ip_network("2002::/16")
LOCALHOST = "localhost"  # and its subdomains: always loopback (RFC 6761)


class OutboundRefused(Exception):
    """A request the platform will not make. The message is in plain words, safe to show the tenant."""


# -- which addresses ----------------------------------------------------------------------------------

def embedded_ipv4(address: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address stands for (mapped, compatible, NAT64, 6to4), if any."""
    if address.version != 6:
        return None
    if address in SIX_TO_FOUR:
        return address.sixtofour
    if int(address) <= 1:
        return None  # :: and ::1 are themselves, not IPv4 addresses in IPv6 form
    if any(address in net for net in EMBEDDING_NETWORKS):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def unzoned(address: IPAddress) -> IPAddress:
    """The address without its IPv6 zone (fe80::1%eth0): the zone does not change what it is."""
    return ipaddress.IPv6Address(str(address).split("%")[0]) if getattr(address, "scope_id", None) else address


def forbidden_class(address: IPAddress) -> str | None:
    """What kind of non-public address this is ("a loopback address"), or None for a public one."""
    address = unzoned(address)
    if (inner := embedded_ipv4(address)) is not None:
        return forbidden_class(inner)
    if address in METADATA_ADDRESSES:
        return METADATA
    for network, what in FORBIDDEN_NETWORKS:
        if address in network:
            return what
    # Python's own table: its loopback, link-local, multicast, private and unspecified ranges are all in the
    # list above; what it calls reserved (4000::/3, …) or adds in a later version is refused here.
    if address.is_reserved or not address.is_global:
        return "a reserved address"
    return None


# -- the admin's allow-list -------------------------------------------------------------------------

@dataclass(frozen=True)
class AllowList:
    names: frozenset[str]
    networks: tuple[IPNetwork, ...]

    def permits(self, host: str, address: IPAddress) -> bool:
        """Whether the admin opened this address, reached under this host name."""
        address = unzoned(address)
        candidates = [address, *filter(None, [embedded_ipv4(address)])]
        if forbidden_class(address) == METADATA:  # only an entry naming the exact address opens it
            return any(c in net for c in candidates for net in self.networks
                       if c.version == net.version and net.num_addresses == 1)
        return (normal_host(host) in self.names
                or any(c in net for c in candidates for net in self.networks if c.version == net.version))


def normal_host(host: str) -> str:
    return host.strip().lower().rstrip(".")


@lru_cache(maxsize=8)
def parse_allow_list(entries: tuple[str, ...]) -> AllowList:
    names, networks = set(), []
    for entry in (e.strip() for e in entries):
        if not entry:
            continue
        try:
            networks.append(ipaddress.ip_network(entry.strip("[]"), strict=False))
            continue
        except ValueError:
            pass
        name = normal_host(entry)
        if not name or any(not label or not all(c.isalnum() or c in "-_" for c in label) or not label.isascii()
                           for label in name.split(".")):
            raise ImproperlyConfigured(f"TOOLKEEPER_OUTBOUND_ALLOWED_HOSTS: {entry!r} is neither a host name nor "
                                       "an IP address or network")
        names.add(name)
    return AllowList(frozenset(names), tuple(networks))


def allow_list() -> AllowList:
    return parse_allow_list(tuple(getattr(settings, "TOOLKEEPER_OUTBOUND_ALLOWED_HOSTS", ())))


# -- checks -----------------------------------------------------------------------------------------

def literal_address(host: str) -> IPAddress | None:
    """The address a host written as an IP literal stands for, including the legacy IPv4 forms the
    system resolver accepts (127.1, 2130706433, 0x7f.0.0.1)."""
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        pass
    try:
        return ipaddress.IPv4Address(socket.inet_aton(host))
    except (OSError, ValueError):
        return None


def refusal(host: str, address: IPAddress, allowed: AllowList) -> str | None:
    """Why a connection to `address`, reached as `host`, is refused (a message for the tenant), or None."""
    what = forbidden_class(address)
    if what is None or allowed.permits(host, address):
        return None
    if literal_address(host) is None:
        return f"{host} resolves to {what}; {ONLY_PUBLIC}"
    inner = embedded_ipv4(address)
    written = f" ({inner} written as IPv6)" if inner is not None else ""
    return f"{host.strip('[]')} is {what}{written}; {ONLY_PUBLIC}"


def check_url(url: str, *, resolve: bool = False) -> None:
    """Check a URL a tenant gives before saving it: http or https, a host, no user name or password,
    not an address tenants may not reach. Host names are checked again at every connection, whatever
    they resolved to here; `resolve=True` also looks the name up now, for an early answer."""
    try:
        parsed = httpx2.URL(url)
    except (httpx2.InvalidURL, TypeError):
        raise OutboundRefused("not a valid URL") from None
    if parsed.scheme not in SCHEMES:
        raise OutboundRefused(f"only http and https URLs may be reached, not {parsed.scheme or 'a relative URL'}")
    if parsed.userinfo:
        raise OutboundRefused("the URL may not carry a user name or password; send credentials as headers")
    host = parsed.raw_host.decode("ascii")
    if not host:
        raise OutboundRefused("the URL has no host")
    allowed = allow_list()
    address = literal_address(host)
    if address is not None:
        if message := refusal(host, address, allowed):
            raise OutboundRefused(message)
        return
    name = normal_host(host)
    if (name == LOCALHOST or name.endswith("." + LOCALHOST)) and name not in allowed.names:
        raise OutboundRefused(f"{host} is a loopback address; {ONLY_PUBLIC}")
    if resolve:
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
        try:
            checked_addresses(host, resolved_addresses(host, port), allowed)
        except httpcore2.ConnectError as exc:
            raise OutboundRefused(str(exc)) from None


def resolved_addresses(host: str, port: int) -> list[str]:
    """Every address the system resolver gives for `host`, in its order (a literal without a lookup)."""
    try:
        return [str(ipaddress.ip_address(host.strip("[]")))]
    except ValueError:
        pass
    try:
        answers = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise httpcore2.ConnectError(f"{host} could not be resolved") from exc
    addresses = []
    for family, _type, _proto, _name, sockaddr in answers:
        if family in (socket.AF_INET, socket.AF_INET6) and sockaddr[0] not in addresses:
            addresses.append(sockaddr[0])
    if not addresses:
        raise httpcore2.ConnectError(f"{host} could not be resolved")
    return addresses


def checked_addresses(host: str, addresses: list[str], allowed: AllowList) -> list[str]:
    """`addresses`, if none of them is refused; otherwise OutboundRefused (and a log line for admins)."""
    for text in addresses:
        address = ipaddress.ip_address(text)
        if message := refusal(host, address, allowed):
            logger.warning("outbound connection refused: %s resolves to %s (%s)", host, text,
                           forbidden_class(address))
            raise OutboundRefused(message)
    return addresses


# -- the network layer under httpx2 -----------------------------------------------------------------

class AsyncGuardedNetworkBackend(httpcore2.AsyncNetworkBackend):
    """httpcore2's network backend, resolving and checking the host first and connecting to a checked
    address. TLS is started on the returned stream by the connection, with the URL's host name."""

    def __init__(self, backend: httpcore2.AsyncNetworkBackend | None = None) -> None:
        self._backend = backend or httpcore2.AnyIOBackend()

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                          socket_options: Iterable | None = None) -> httpcore2.AsyncNetworkStream:
        allowed = allow_list()
        try:
            with anyio.fail_after(timeout):
                addresses = await anyio.to_thread.run_sync(resolved_addresses, host, port, abandon_on_cancel=True)
        except TimeoutError:
            raise httpcore2.ConnectTimeout(f"{host} could not be resolved in time") from None
        failure = None
        for address in checked_addresses(host, addresses, allowed):
            try:
                return _CheckedStream(await self._backend.connect_tcp(
                    address, port, timeout=timeout, local_address=local_address, socket_options=socket_options))
            except (httpcore2.ConnectError, httpcore2.ConnectTimeout) as exc:
                failure = exc
        raise failure

    async def connect_unix_socket(self, path: str, timeout: float | None = None,
                                  socket_options: Iterable | None = None) -> httpcore2.AsyncNetworkStream:
        raise OutboundRefused("Unix sockets may not be reached")

    async def sleep(self, seconds: float) -> None:
        await self._backend.sleep(seconds)


class _CheckedStream(httpcore2.AsyncNetworkStream):
    """A checked connection's stream, its socket looked up once: the pool asks whether each idle connection's
    socket is readable at every request, and anyio builds its attribute table anew for each such question."""

    def __init__(self, stream: httpcore2.AsyncNetworkStream) -> None:
        self._stream = stream
        self._socket = stream.get_extra_info("socket")

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return await self._stream.read(max_bytes, timeout)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        await self._stream.write(buffer, timeout)

    async def aclose(self) -> None:
        await self._stream.aclose()

    async def start_tls(self, ssl_context, server_hostname: str | None = None,
                        timeout: float | None = None) -> httpcore2.AsyncNetworkStream:
        return _CheckedStream(await self._stream.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str):
        if info == "is_readable":
            return _readable(self._socket)
        if info == "socket":
            return self._socket
        return self._stream.get_extra_info(info)


def _readable(sock: socket.socket | None) -> bool:
    """Whether reading would not block: on an idle keep-alive connection, the peer closed it (or sent junk)."""
    if sock is None or sock.fileno() == -1:
        return True
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


class GuardedNetworkBackend(httpcore2.NetworkBackend):
    """The blocking twin of `AsyncGuardedNetworkBackend`."""

    def __init__(self, backend: httpcore2.NetworkBackend | None = None) -> None:
        self._backend = backend or httpcore2.SyncBackend()

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options: Iterable | None = None) -> httpcore2.NetworkStream:
        failure = None
        for address in checked_addresses(host, resolved_addresses(host, port), allow_list()):
            try:
                return self._backend.connect_tcp(address, port, timeout=timeout, local_address=local_address,
                                                 socket_options=socket_options)
            except (httpcore2.ConnectError, httpcore2.ConnectTimeout) as exc:
                failure = exc
        raise failure

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Iterable | None = None) -> httpcore2.NetworkStream:
        raise OutboundRefused("Unix sockets may not be reached")

    def sleep(self, seconds: float) -> None:
        self._backend.sleep(seconds)


def _ssl_context(verify, cert):
    """TLS as httpx2 sets it up, trusting also the deployment's own certificate authority
    (`TOOLKEEPER_OUTBOUND_CA_FILE`, for servers on a company network) when the caller verifies as usual."""
    context = httpx2.create_ssl_context(verify=verify, cert=cert, trust_env=False)
    extra = getattr(settings, "TOOLKEEPER_OUTBOUND_CA_FILE", "")
    if verify is True and extra:
        context.load_verify_locations(cafile=extra)
    return context


def _pool_options(verify, cert, http1: bool, http2: bool, limits: httpx2.Limits, retries: int) -> dict:
    return {
        "ssl_context": _ssl_context(verify, cert),
        "max_connections": limits.max_connections,
        "max_keepalive_connections": limits.max_keepalive_connections,
        "keepalive_expiry": limits.keepalive_expiry,
        "http1": http1,
        "http2": http2,
        "retries": retries,
    }


class ResponseTooLarge(httpx2.ReadError):
    """A response (or one event of an event stream) went over the size limit; what was read is dropped."""


# An event of an event stream ends at an empty line, whichever line ending the server uses.
EVENT_ENDS = (b"\n\n", b"\r\r", b"\r\n\r\n")


class MessageBound:
    """Counts what a response delivers: its whole body, or for an event stream each event on its own."""

    def __init__(self, limit: int, *, events: bool):
        self.limit = limit
        self.events = events
        self.taken = 0  # bytes of the body, or of the event under way
        self._tail = b""  # the last bytes seen, for an event end split across two chunks

    def take(self, chunk: bytes) -> None:
        if not self.events:
            self.taken += len(chunk)
            self._check(self.taken)
            return
        seen = self._tail + chunk
        counted = len(self._tail)  # bytes of `seen` already in `taken` (or in an event already ended)
        position = 0
        while True:
            ends = [(found, mark) for mark in EVENT_ENDS if (found := seen.find(mark, position)) >= 0]
            if not ends:
                break
            found, mark = min(ends)
            end = found + len(mark)
            position = end
            if end <= counted:
                continue  # an end within the tail: that event was ended with the previous chunk
            self._check(self.taken + end - counted)
            self.taken, counted = 0, end
        self.taken += len(seen) - counted
        self._check(self.taken)
        self._tail = seen[-3:]

    def _check(self, size: int) -> None:
        if size > self.limit:
            what = "one event of its stream" if self.events else "its answer"
            raise ResponseTooLarge(f"the server sent more than {self.limit} bytes in {what}")


def _bound_of(response: httpx2.Response, on_too_large) -> MessageBound:
    limit = settings.TOOLKEEPER_OUTBOUND_MAX_MESSAGE_BYTES
    events = response.headers.get("content-type", "").split(";")[0].strip().lower() == "text/event-stream"
    declared = response.headers.get("content-length", "")
    if not events and declared.isdigit() and int(declared) > limit:
        _refuse(ResponseTooLarge(f"the server announced an answer of {declared} bytes, over {limit}"), on_too_large)
    return MessageBound(limit, events=events)


def _refuse(exc: ResponseTooLarge, on_too_large):
    if on_too_large is not None:
        on_too_large(exc)  # the caller may not see the exception itself (a library reading the stream)
    raise exc


class _BoundedAsyncStream(httpx2.AsyncByteStream):
    def __init__(self, stream: httpx2.AsyncByteStream, bound: MessageBound, on_too_large):
        self._stream, self._bound, self._on_too_large = stream, bound, on_too_large

    async def __aiter__(self):
        async for chunk in self._stream:
            try:
                self._bound.take(chunk)
            except ResponseTooLarge as exc:
                _refuse(exc, self._on_too_large)
            yield chunk

    async def aclose(self) -> None:
        await self._stream.aclose()


class _BoundedStream(httpx2.SyncByteStream):
    def __init__(self, stream: httpx2.SyncByteStream, bound: MessageBound, on_too_large):
        self._stream, self._bound, self._on_too_large = stream, bound, on_too_large

    def __iter__(self):
        for chunk in self._stream:
            try:
                self._bound.take(chunk)
            except ResponseTooLarge as exc:
                _refuse(exc, self._on_too_large)
            yield chunk

    def close(self) -> None:
        self._stream.close()


class AsyncGuardedTransport(httpx2.AsyncHTTPTransport):
    """httpx2's transport on the guarded backend. httpx2 offers no way to pass a network backend, so
    this builds the connection pool its parent would build (the parent's `__init__` only builds it),
    with the guard as the pool's `network_backend`; no proxy, no Unix socket, no local address.
    Responses are bounded (`MessageBound`); `on_too_large(exc)` hears of a response refused for its size."""

    def __init__(self, *, verify=True, cert=None, http1: bool = True, http2: bool = False,
                 limits: httpx2.Limits = DEFAULT_LIMITS,
                 retries: int = 0, on_too_large=None) -> None:
        self._pool = httpcore2.AsyncConnectionPool(network_backend=AsyncGuardedNetworkBackend(),
                                                   **_pool_options(verify, cert, http1, http2, limits, retries))
        self._on_too_large = on_too_large

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await super().handle_async_request(request)
        try:
            response.stream = _BoundedAsyncStream(response.stream, _bound_of(response, self._on_too_large),
                                                  self._on_too_large)
        except ResponseTooLarge:
            await response.aclose()
            raise
        return response


class GuardedTransport(httpx2.HTTPTransport):
    """The blocking twin of `AsyncGuardedTransport`."""

    def __init__(self, *, verify=True, cert=None, http1: bool = True, http2: bool = False,
                 limits: httpx2.Limits = DEFAULT_LIMITS,
                 retries: int = 0, on_too_large=None) -> None:
        self._pool = httpcore2.ConnectionPool(network_backend=GuardedNetworkBackend(),
                                              **_pool_options(verify, cert, http1, http2, limits, retries))
        self._on_too_large = on_too_large

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        response = super().handle_request(request)
        try:
            response.stream = _BoundedStream(response.stream, _bound_of(response, self._on_too_large),
                                             self._on_too_large)
        except ResponseTooLarge:
            response.close()
            raise
        return response


TRANSPORT_OPTIONS = frozenset({"verify", "cert", "http1", "http2", "limits", "retries", "on_too_large"})
GUARD_OPTIONS = frozenset({"transport", "mounts", "proxy", "trust_env"})


def _client_options(headers, timeout, auth, options: dict) -> tuple[dict, dict]:
    if taken := GUARD_OPTIONS & options.keys():
        raise TypeError(f"the guarded client sets {', '.join(sorted(taken))} itself")
    transport = {k: options.pop(k) for k in TRANSPORT_OPTIONS & options.keys()}
    options.setdefault("follow_redirects", False)  # every hop would be checked anyway; callers may opt in
    return transport, {"headers": headers, "auth": auth, "timeout": DEFAULT_TIMEOUT if timeout is None else timeout,
                       "trust_env": False, **options}


def async_http_client(*, headers=None, timeout: httpx2.Timeout | float | None = None, auth: httpx2.Auth | None = None,
                      **options) -> httpx2.AsyncClient:
    """An `httpx2.AsyncClient` whose every connection goes through the guard. It fits the MCP SDK both
    ways: `streamable_http_client(url, http_client=async_http_client(headers=...))` and
    `sse_client(url, httpx_client_factory=async_http_client)`. `timeout=None` means `DEFAULT_TIMEOUT`;
    other options are httpx2's (`verify`, `follow_redirects`, …), except those that would bypass the
    guard (`transport`, `mounts`, `proxy`, `trust_env`), which raise TypeError; and `on_too_large(exc)`,
    called when a response is refused for its size (`ResponseTooLarge`)."""
    transport, client = _client_options(headers, timeout, auth, options)
    return httpx2.AsyncClient(transport=AsyncGuardedTransport(**transport), **client)


def http_client(*, headers=None, timeout: httpx2.Timeout | float | None = None, auth: httpx2.Auth | None = None,
                **options) -> httpx2.Client:
    """The blocking twin of `async_http_client`."""
    transport, client = _client_options(headers, timeout, auth, options)
    return httpx2.Client(transport=GuardedTransport(**transport), **client)
