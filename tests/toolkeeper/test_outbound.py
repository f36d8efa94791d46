"""The outbound guard: a tenant's URL reaches public addresses only, checked on the address actually
connected to, at connect time, for every hop; the admin's allow-list opens named exceptions."""
import asyncio
import ipaddress
import socket
import ssl
import threading
import tracemalloc
from pathlib import Path

import httpcore2
import httpx2
import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from common import outbound
from common.outbound import (
    MessageBound,
    OutboundRefused,
    ResponseTooLarge,
    async_http_client,
    check_url,
    http_client,
)
from tests.toolkeeper.conftest import serving

PUBLIC = "93.184.215.14"  # never connected to: every test that resolves it is refused before connecting


@pytest.fixture
def connections(monkeypatch):
    """The addresses the network layer under the guard was asked to connect to."""
    attempts = []
    real_async, real_sync = httpcore2.AnyIOBackend.connect_tcp, httpcore2.SyncBackend.connect_tcp

    async def connect_async(self, host, port, *args, **kwargs):
        attempts.append(host)
        return await real_async(self, host, port, *args, **kwargs)

    def connect_sync(self, host, port, *args, **kwargs):
        attempts.append(host)
        return real_sync(self, host, port, *args, **kwargs)

    monkeypatch.setattr(httpcore2.AnyIOBackend, "connect_tcp", connect_async)
    monkeypatch.setattr(httpcore2.SyncBackend, "connect_tcp", connect_sync)
    return attempts


def fetch(url: str, **options) -> httpx2.Response:
    async def run():
        async with async_http_client(timeout=5, **options) as client:
            return await client.get(url)

    return asyncio.run(run())


def fetch_sync(url: str, **options) -> httpx2.Response:
    with http_client(timeout=5, **options) as client:
        return client.get(url)


# Every class of forbidden address, as a tenant could write it; {port} is a live server on 127.0.0.1.
FORBIDDEN = [
    ("http://127.0.0.1:{port}/ok", "a loopback address"),
    ("http://127.0.0.2:{port}/ok", "a loopback address"),
    ("http://[::1]:{port}/ok", "a loopback address"),
    ("http://127.1:{port}/ok", "a loopback address"),
    ("http://2130706433:{port}/ok", "a loopback address"),
    ("http://0x7f.0.0.1:{port}/ok", "a loopback address"),
    ("http://localhost:{port}/ok", "a loopback address"),
    ("http://0.0.0.0:{port}/ok", "an unspecified address"),
    ("http://[::]:{port}/ok", "an unspecified address"),
    ("http://10.1.2.3/", "a private address"),
    ("http://172.16.0.1/", "a private address"),
    ("http://192.168.1.1/", "a private address"),
    ("http://[fd12:3456::1]/", "a private address"),
    ("http://[fc00::1]/", "a private address"),
    ("http://169.254.1.1/", "a link-local address"),
    ("http://[fe80::1]/", "a link-local address"),
    ("http://169.254.169.254/latest/meta-data/", "a cloud metadata address"),
    ("http://[fd00:ec2::254]/", "a cloud metadata address"),
    ("http://100.100.100.200/", "a cloud metadata address"),
    ("http://168.63.129.16/", "a cloud metadata address"),
    ("http://100.64.0.1/", "a carrier-grade NAT address"),
    ("http://224.0.0.1/", "a multicast address"),
    ("http://[ff02::1]/", "a multicast address"),
    ("http://240.0.0.1/", "a reserved address"),
    ("http://255.255.255.255/", "a reserved address"),
    ("http://198.18.0.1/", "a reserved address"),
    ("http://192.0.2.1/", "a documentation address"),
    ("http://[2001:db8::1]/", "a documentation address"),
    ("http://[::ffff:127.0.0.1]:{port}/ok", "a loopback address (127.0.0.1 written as IPv6)"),
    ("http://[::ffff:10.0.0.1]/", "a private address (10.0.0.1 written as IPv6)"),
    ("http://[::127.0.0.1]:{port}/ok", "a loopback address (127.0.0.1 written as IPv6)"),
    ("http://[64:ff9b::10.0.0.1]/", "a private address (10.0.0.1 written as IPv6)"),
    ("http://[64:ff9b::169.254.169.254]/", "a cloud metadata address (169.254.169.254 written as IPv6)"),
    ("http://[2002:7f00:1::1]/", "a loopback address (127.0.0.1 written as IPv6)"),
]


@pytest.mark.parametrize(("url", "kind"), FORBIDDEN, ids=[u for u, _ in FORBIDDEN])
def test_every_forbidden_address_is_refused_when_saved_and_when_connecting(url, kind, http_port, connections):
    url = url.format(port=http_port)
    with pytest.raises(OutboundRefused, match="; only public addresses may be reached$") as saved:
        check_url(url)
    assert f" is {kind};" in str(saved.value)
    for fetch_with in (fetch, fetch_sync):  # a real request through each client
        with pytest.raises(OutboundRefused, match="; only public addresses may be reached$") as connecting:
            fetch_with(url)
        assert f" {kind};" in str(connecting.value)
    assert connections == []  # refused before any connection was attempted


def test_messages_name_what_the_tenant_wrote():
    for url, message in (
        ("http://127.0.0.1:8000/", "127.0.0.1 is a loopback address; only public addresses may be reached"),
        ("http://[::ffff:127.0.0.1]/", "::ffff:127.0.0.1 is a loopback address (127.0.0.1 written as IPv6); "
                                       "only public addresses may be reached"),
        ("http://169.254.169.254/", "169.254.169.254 is a cloud metadata address; "
                                    "only public addresses may be reached"),
        ("http://LocalHost./", "localhost. is a loopback address; only public addresses may be reached"),
        # ::2 is an IPv4-compatible address (0.0.0.2); only :: and ::1 are themselves
        ("http://[::2]/", "::2 is an unspecified address (0.0.0.2 written as IPv6); "
                          "only public addresses may be reached"),
        # reserved by the IETF, which Python still calls global: refused by its reserved flag alone
        ("http://[4000::1]/", "4000::1 is a reserved address; only public addresses may be reached"),
        ("http://[e000::1]/", "e000::1 is a reserved address; only public addresses may be reached"),
    ):
        with pytest.raises(OutboundRefused) as refused:
            check_url(url)
        assert str(refused.value) == message


def test_public_addresses_pass_the_check():
    for url in ("https://8.8.8.8/", "http://[2606:4700:4700::1111]/mcp", "http://[64:ff9b::8.8.8.8]/",
                "https://mcp.example.com/mcp", "http://example.com:8080/sse"):
        check_url(url)


@pytest.mark.parametrize(("url", "message"), [
    ("ftp://example.com/", "only http and https URLs may be reached, not ftp"),
    ("file:///etc/passwd", "only http and https URLs may be reached"),
    ("http://user:pass@example.com/", "may not carry a user name or password"),
    ("http:///path", "no host"),
    ("/relative", "only http and https URLs may be reached"),
    ("http://0177.0.0.1/", "not a valid URL"),
])
def test_malformed_urls_are_refused(url, message):
    with pytest.raises(OutboundRefused, match=message):
        check_url(url)


@pytest.mark.parametrize(("url", "message"), [
    ("ftp://example.com/", "only http and https URLs may be reached, not ftp"),
    ("/relative", "only http and https URLs may be reached, not a relative URL"),
    ("http://user:pass@example.com/", "the URL may not carry a user name or password; send credentials as headers"),
    ("http:///path", "the URL has no host"),
    ("http://0177.0.0.1/", "not a valid URL"),
])
def test_a_malformed_url_is_refused_in_exact_words(url, message):
    with pytest.raises(OutboundRefused) as refused:
        check_url(url)
    assert str(refused.value) == message


def test_a_name_resolving_to_loopback_is_refused_at_connect(http_port, resolver, connections):
    resolver["evil.test"] = ["127.0.0.1"]
    check_url(f"http://evil.test:{http_port}/ok")  # a name is not looked up when saved, unless asked
    with pytest.raises(OutboundRefused) as refused:
        fetch(f"http://evil.test:{http_port}/ok")
    # the tenant learns the kind of address, not the address (that would map the internal network)
    assert str(refused.value) == "evil.test resolves to a loopback address; only public addresses may be reached"
    with pytest.raises(OutboundRefused, match="evil.test resolves to a loopback address"):
        check_url(f"http://evil.test:{http_port}/ok", resolve=True)
    assert connections == []


def test_a_name_with_any_forbidden_address_is_refused(resolver, connections):
    resolver["mixed.test"] = [PUBLIC, "10.0.0.7"]
    with pytest.raises(OutboundRefused, match="mixed.test resolves to a private address"):
        fetch("http://mixed.test/")
    assert connections == []  # not even the public address: the outcome must not depend on the order


def test_dns_rebinding_is_refused_at_connect(http_port, resolver, connections):
    """Public when the URL is checked, loopback when the connection is made."""
    resolver["rebind.test"] = [[PUBLIC], ["127.0.0.1"]]
    url = f"http://rebind.test:{http_port}/ok"
    check_url(url, resolve=True)
    with pytest.raises(OutboundRefused, match="rebind.test resolves to a loopback address"):
        fetch(url)
    assert resolver.lookups["rebind.test"] == 2
    assert connections == []


def test_the_connection_goes_to_the_address_that_was_checked(http_port, resolver, connections):
    """One lookup per connection; the address it gave is the one connected to, not the name again."""
    resolver["mcp.test"] = [["127.0.0.1"], [PUBLIC]]
    with override_settings(TOOLKEEPER_OUTBOUND_ALLOWED_HOSTS=["127.0.0.1"]):
        response = fetch(f"http://mcp.test:{http_port}/ok")
    assert response.status_code == 200 and response.text == "hello"
    assert resolver.lookups["mcp.test"] == 1
    assert connections == ["127.0.0.1"]


def test_an_allow_listed_address_is_reachable_and_only_then(http_port, connections):
    url = f"http://127.0.0.1:{http_port}/ok"
    with pytest.raises(OutboundRefused):
        fetch(url)
    with override_settings(TOOLKEEPER_OUTBOUND_ALLOWED_HOSTS=["127.0.0.1"]):
        check_url(url)
        assert fetch(url).text == "hello"
        assert fetch_sync(url).text == "hello"
    with override_settings(TOOLKEEPER_OUTBOUND_ALLOWED_HOSTS=["127.0.0.0/8", "10.0.0.0/8"]):
        assert fetch(url).text == "hello"
        assert fetch(f"http://localhost:{http_port}/ok").text == "hello"  # a name is judged by its addresses
    with override_settings(TOOLKEEPER_OUTBOUND_ALLOWED_HOSTS=["10.0.0.0/8"]), pytest.raises(OutboundRefused):
        fetch(url)
    assert connections == ["127.0.0.1"] * 4


def test_an_allow_listed_name_is_reachable_and_no_other_name(http_port, resolver):
    resolver["internal-mcp.corp"] = ["127.0.0.1"]
    resolver["other.corp"] = ["127.0.0.1"]
    with override_settings(TOOLKEEPER_OUTBOUND_ALLOWED_HOSTS=["Internal-MCP.corp."]):
        check_url(f"http://internal-mcp.corp:{http_port}/ok", resolve=True)
        assert fetch(f"http://internal-mcp.corp:{http_port}/ok").text == "hello"
        with pytest.raises(OutboundRefused, match="other.corp resolves to a loopback address"):
            fetch(f"http://other.corp:{http_port}/ok")
        with pytest.raises(OutboundRefused):
            fetch(f"http://127.0.0.1:{http_port}/ok")


def test_metadata_stays_refused_unless_its_exact_address_is_allowed(resolver):
    resolver["internal.corp"] = ["169.254.169.254"]
    with override_settings(TOOLKEEPER_OUTBOUND_ALLOWED_HOSTS=["169.254.0.0/16", "100.64.0.0/10", "internal.corp"]):
        check_url("http://169.254.10.10/")  # the network is open…
        check_url("http://100.64.1.1/")
        for url in ("http://169.254.169.254/", "http://100.100.100.200/", "http://[::ffff:169.254.169.254]/",
                    "http://internal.corp/"):
            with pytest.raises(OutboundRefused, match="a cloud metadata address"):  # …but not its metadata
                check_url(url, resolve=True)
        with pytest.raises(OutboundRefused, match="internal.corp resolves to a cloud metadata address"):
            fetch("http://internal.corp/")
    with override_settings(TOOLKEEPER_OUTBOUND_ALLOWED_HOSTS=["169.254.169.254"]):
        check_url("http://169.254.169.254/latest/meta-data/")


def test_a_redirect_to_a_forbidden_address_is_refused(http_port, resolver, connections):
    resolver["mcp.test"] = ["127.0.0.1"]
    resolver["internal.test"] = ["127.0.0.1"]
    with override_settings(TOOLKEEPER_OUTBOUND_ALLOWED_HOSTS=["mcp.test"]):
        start = f"http://mcp.test:{http_port}/redirect?to="
        for target, message in ((f"http://internal.test:{http_port}/ok", "internal.test resolves to a loopback"),
                                ("http://169.254.169.254/latest/meta-data/", "169.254.169.254 is a cloud metadata"),
                                (f"http://[::1]:{http_port}/ok", "::1 is a loopback")):
            with pytest.raises(OutboundRefused, match=message):
                fetch(start + target, follow_redirects=True)
            with pytest.raises(OutboundRefused, match=message):
                fetch_sync(start + target, follow_redirects=True)
        # by default redirects are not followed: the caller gets the redirect itself
        assert fetch(start + "http://169.254.169.254/").status_code == 302
        assert fetch(start + f"http://mcp.test:{http_port}/ok", follow_redirects=True).text == "hello"
    assert set(connections) == {"127.0.0.1"}  # only the allowed server was ever connected to


def test_https_to_a_name_verifies_the_name_not_the_address(tls_server, resolver):
    port, sni = tls_server["port"], tls_server["sni"]
    resolver["mcp.test"] = ["127.0.0.1"]
    trusted = ssl.create_default_context(cafile=tls_server["cafile"])
    with override_settings(TOOLKEEPER_OUTBOUND_ALLOWED_HOSTS=["127.0.0.1"]):
        assert fetch(f"https://mcp.test:{port}/ok", verify=trusted).text == "hello"
        assert fetch_sync(f"https://mcp.test:{port}/ok", verify=trusted).text == "hello"
        assert sni == ["mcp.test", "mcp.test"]
        # the certificate names mcp.test only: reaching the same server by its address fails verification
        with pytest.raises(httpx2.ConnectError, match="CERTIFICATE_VERIFY_FAILED|match"):
            fetch(f"https://127.0.0.1:{port}/ok", verify=trusted)
        # and an untrusted certificate is refused: verification is on by default
        with pytest.raises(httpx2.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            fetch(f"https://mcp.test:{port}/ok")
        with pytest.raises(httpx2.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            fetch_sync(f"https://mcp.test:{port}/ok")


def test_the_clients_speak_http1_even_to_a_server_that_prefers_http2(tls_server, resolver):
    """HTTP/2 only when a caller asks for it: a server that offers it first is answered in HTTP/1.1."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tls_server["cafile"], Path(tls_server["cafile"]).with_name("key.pem"))
    context.set_alpn_protocols(["h2", "http/1.1"])
    resolver["mcp.test"] = ["127.0.0.1"]
    trusted = ssl.create_default_context(cafile=tls_server["cafile"])
    with serving(context) as port, override_settings(TOOLKEEPER_OUTBOUND_ALLOWED_HOSTS=["127.0.0.1"]):
        assert fetch(f"https://mcp.test:{port}/ok", verify=trusted).text == "hello"
        assert fetch_sync(f"https://mcp.test:{port}/ok", verify=trusted).text == "hello"


def test_tls_starts_on_the_checked_address_with_the_name_as_server_hostname(tls_server, resolver):
    resolver["mcp.test"] = ["127.0.0.1"]

    class Recording(httpcore2.AsyncNetworkBackend):
        def __init__(self):
            self.inner, self.hosts, self.server_hostnames = httpcore2.AnyIOBackend(), [], []

        async def connect_tcp(self, host, port, **kwargs):
            self.hosts.append(host)
            stream, recording = await self.inner.connect_tcp(host, port, **kwargs), self

            class Stream(httpcore2.AsyncNetworkStream):
                read, write, aclose = stream.read, stream.write, stream.aclose
                get_extra_info = stream.get_extra_info

                async def start_tls(self, ssl_context, server_hostname=None, timeout=None):
                    recording.server_hostnames.append(server_hostname)
                    return await stream.start_tls(ssl_context, server_hostname=server_hostname, timeout=timeout)

            return Stream()

    recording = Recording()

    async def run():
        context = ssl.create_default_context(cafile=tls_server["cafile"])
        network_backend = outbound.AsyncGuardedNetworkBackend(recording)
        async with httpcore2.AsyncConnectionPool(ssl_context=context, network_backend=network_backend) as pool:
            return await pool.request("GET", f"https://mcp.test:{tls_server['port']}/ok")

    with override_settings(TOOLKEEPER_OUTBOUND_ALLOWED_HOSTS=["127.0.0.1"]):
        response = asyncio.run(run())
    assert response.status == 200
    assert recording.hosts == ["127.0.0.1"] and recording.server_hostnames == ["mcp.test"]


def test_proxies_from_the_environment_are_not_used(http_port, monkeypatch, connections):
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "all_proxy"):
        monkeypatch.setenv(name, "http://10.9.9.9:3128")
    monkeypatch.setenv("NO_PROXY", "")
    with override_settings(TOOLKEEPER_OUTBOUND_ALLOWED_HOSTS=["127.0.0.1"]):
        assert fetch(f"http://127.0.0.1:{http_port}/ok").text == "hello"
    assert connections == ["127.0.0.1"]


class RecordingBackend(httpcore2.NetworkBackend):
    """The blocking network layer under the guard: the connections it was asked for; the first `failing` fail."""

    def __init__(self, failing: int):
        self.asked = []
        self.failing = failing

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        self.asked.append((host, port, timeout, local_address, socket_options))
        if len(self.asked) <= self.failing:
            raise httpcore2.ConnectError(f"{host} refused the connection")
        return f"stream to {host}"


def test_the_blocking_backend_tries_each_checked_address_with_the_callers_options(resolver):
    resolver["two.test"] = [PUBLIC, "93.184.215.15"]
    options = {"timeout": 3.0, "local_address": "10.1.2.3", "socket_options": [(6, 1, 1)]}
    network = RecordingBackend(failing=1)
    assert outbound.GuardedNetworkBackend(network).connect_tcp("two.test", 8443, **options) == "stream to 93.184.215.15"
    assert network.asked == [(PUBLIC, 8443, *options.values()), ("93.184.215.15", 8443, *options.values())]
    network = RecordingBackend(failing=2)
    with pytest.raises(httpcore2.ConnectError, match="^93.184.215.15 refused the connection$"):
        outbound.GuardedNetworkBackend(network).connect_tcp("two.test", 8443, **options)


def test_options_that_would_bypass_the_guard_are_refused():
    for option in ({"proxy": "http://10.9.9.9:3128"}, {"transport": httpx2.AsyncHTTPTransport()},
                   {"mounts": {}}, {"trust_env": True}):
        with pytest.raises(TypeError, match="the guarded client sets"):
            async_http_client(**option)
        with pytest.raises(TypeError):
            http_client(**option)
    client = async_http_client(headers={"Authorization": "Bearer t"})
    assert client.trust_env is False and client.follow_redirects is False
    assert client.timeout == outbound.DEFAULT_TIMEOUT


@pytest.mark.parametrize("make", [async_http_client, http_client], ids=["async", "sync"])
def test_the_clients_carry_the_callers_headers_timeout_and_auth(make):
    client = make(headers={"X-Probe": "1"}, timeout=7, auth=("user", "secret"))
    assert client.headers["X-Probe"] == "1"
    assert client.timeout == httpx2.Timeout(7)
    assert isinstance(client.auth, httpx2.BasicAuth)
    assert make().timeout == outbound.DEFAULT_TIMEOUT


@pytest.mark.parametrize("get", [fetch, fetch_sync], ids=["async", "sync"])
def test_a_refused_connection_is_not_tried_again_unless_asked(connections, get):
    """Retrying is the caller's decision (an HTTP tool's retry policy, say), not the transport's."""
    closed = socket.create_server(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    with override_settings(TOOLKEEPER_OUTBOUND_ALLOWED_HOSTS=["127.0.0.1"]):
        with pytest.raises(httpx2.ConnectError):
            get(f"http://127.0.0.1:{port}/")
        assert connections == ["127.0.0.1"]
        with pytest.raises(httpx2.ConnectError):
            get(f"http://127.0.0.1:{port}/", retries=1)
        assert connections == ["127.0.0.1"] * 3


@pytest.mark.filterwarnings("ignore:`cert=...` is deprecated:DeprecationWarning")  # httpx2 still honours it
def test_a_client_certificate_is_presented_when_given(tls_server, resolver):
    """mTLS: a server that requires a client certificate gets the one the caller gave."""
    cert, key = tls_server["cafile"], str(Path(tls_server["cafile"]).with_name("key.pem"))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    context.verify_mode = ssl.CERT_REQUIRED
    context.load_verify_locations(cafile=cert)  # the test certificate is its own authority
    resolver["mcp.test"] = ["127.0.0.1"]
    with serving(context) as port, override_settings(TOOLKEEPER_OUTBOUND_ALLOWED_HOSTS=["127.0.0.1"]):
        for get in (fetch, fetch_sync):
            trusted = ssl.create_default_context(cafile=cert)
            assert get(f"https://mcp.test:{port}/ok", verify=trusted, cert=(cert, key)).text == "hello"
            with pytest.raises((httpx2.HTTPError, ssl.SSLError)):  # TLS 1.3 may report it on the first read
                get(f"https://mcp.test:{port}/ok", verify=ssl.create_default_context(cafile=cert))


def test_unix_sockets_are_refused():
    with pytest.raises(OutboundRefused, match="^Unix sockets may not be reached$"):
        asyncio.run(outbound.AsyncGuardedNetworkBackend().connect_unix_socket("/var/run/docker.sock"))
    with pytest.raises(OutboundRefused, match="^Unix sockets may not be reached$"):
        outbound.GuardedNetworkBackend().connect_unix_socket("/var/run/docker.sock")


def test_the_guarded_backends_sleep_as_long_as_asked():
    slept = []

    class AsyncBackend(httpcore2.AsyncNetworkBackend):
        async def sleep(self, seconds: float) -> None:
            slept.append(seconds)

    class SyncBackend(httpcore2.NetworkBackend):
        def sleep(self, seconds: float) -> None:
            slept.append(seconds)

    asyncio.run(outbound.AsyncGuardedNetworkBackend(AsyncBackend()).sleep(0.25))
    outbound.GuardedNetworkBackend(SyncBackend()).sleep(0.5)
    assert slept == [0.25, 0.5]


class FakeStream(httpcore2.AsyncNetworkStream):
    """A connection's stream as the network layer hands it to the guard: its socket, and what TLS was asked."""

    def __init__(self, sock: socket.socket | None = None):
        self.sock = sock
        self.tls = []

    def get_extra_info(self, info: str):
        return self.sock if info == "socket" else None

    async def start_tls(self, ssl_context, server_hostname=None, timeout=None):
        self.tls.append((ssl_context, server_hostname, timeout))
        return FakeStream(self.sock)


def test_tls_is_started_within_the_callers_timeout():
    stream = FakeStream()
    started = asyncio.run(outbound._CheckedStream(stream).start_tls("context", "mcp.test", 7.5))
    assert stream.tls == [("context", "mcp.test", 7.5)]
    assert isinstance(started, outbound._CheckedStream)


def test_an_idle_connection_is_readable_only_once_the_peer_sent_or_closed():
    """What the pool asks before reusing a kept-alive connection: readable means the peer closed it (or sent
    something unasked), so the pool drops it."""
    assert outbound._CheckedStream(FakeStream(None)).get_extra_info("is_readable") is True
    mine, peer = socket.socketpair()
    stream = outbound._CheckedStream(FakeStream(mine))
    try:
        assert stream.get_extra_info("is_readable") is False
        assert stream.get_extra_info("socket") is mine
        peer.sendall(b"x")
        assert stream.get_extra_info("is_readable") is True
    finally:
        mine.close()
        peer.close()
    assert stream.get_extra_info("is_readable") is True  # closed here: fileno() is -1


def test_a_name_that_does_not_resolve_is_a_connect_error(resolver):
    resolver["nowhere.test"] = []
    with pytest.raises(httpx2.ConnectError, match="nowhere.test could not be resolved"):
        fetch("http://nowhere.test/")
    with pytest.raises(OutboundRefused, match="nowhere.test could not be resolved"):
        check_url("http://nowhere.test/", resolve=True)


def test_a_bad_allow_list_entry_is_a_configuration_error():
    with override_settings(TOOLKEEPER_OUTBOUND_ALLOWED_HOSTS=["10.0.0.0/33"]), \
            pytest.raises(ImproperlyConfigured, match="10.0.0.0/33"):
        check_url("http://example.com/")


def test_the_allow_list_is_empty_by_default():
    assert settings.TOOLKEEPER_OUTBOUND_ALLOWED_HOSTS == []


# -- what comes back is bounded ---------------------------------------------------------------------

LIMIT = 100_000


@pytest.fixture
def small_limit(settings):
    settings.TOOLKEEPER_OUTBOUND_ALLOWED_HOSTS = ["127.0.0.1"]
    settings.TOOLKEEPER_OUTBOUND_MAX_MESSAGE_BYTES = LIMIT


@pytest.mark.parametrize("get", [fetch, fetch_sync], ids=["async", "sync"])
def test_a_body_over_the_limit_is_refused_whether_announced_or_not(http_port, small_limit, get):
    base = f"http://127.0.0.1:{http_port}"
    assert len(get(f"{base}/bytes?n={LIMIT}").content) == LIMIT
    assert len(get(f"{base}/bytes?n={LIMIT}&length=0").content) == LIMIT
    with pytest.raises(ResponseTooLarge, match="announced"):
        get(f"{base}/bytes?n={LIMIT + 1}")
    with pytest.raises(ResponseTooLarge, match=f"more than {LIMIT} bytes in its answer"):
        get(f"{base}/bytes?n={LIMIT * 5}&length=0")


@pytest.mark.parametrize("get", [fetch, fetch_sync], ids=["async", "sync"])
def test_the_caller_hears_of_a_body_refused_for_its_size(http_port, small_limit, get):
    base = f"http://127.0.0.1:{http_port}"
    for url in (f"{base}/bytes?n={LIMIT + 1}", f"{base}/bytes?n={LIMIT * 5}&length=0"):  # announced, or not
        heard = []
        with pytest.raises(ResponseTooLarge) as refused:
            get(url, on_too_large=heard.append)
        assert [str(exc) for exc in heard] == [str(refused.value)]


@pytest.mark.parametrize("get", [fetch, fetch_sync], ids=["async", "sync"])
def test_an_event_stream_is_bounded_event_by_event(http_port, small_limit, get):
    base = f"http://127.0.0.1:{http_port}"
    many = get(f"{base}/events?count=50&size={LIMIT // 10}")  # five times the limit in all, each event small
    assert many.content.count(b"\n\n") == 50
    with pytest.raises(ResponseTooLarge, match=f"^the server sent more than {LIMIT} bytes in one event of its stream$"):
        get(f"{base}/events?count=1&size={LIMIT + 10}")


def test_an_event_end_split_across_chunks_still_ends_the_event():
    bound = MessageBound(10, events=True)
    for chunk in (b"data: 12\n", b"\n", b"data:3\r", b"\n\r", b"\ndata: 5\n\ndata: 6\n", b"\n"):
        bound.take(chunk)  # no event over 10 bytes, its end included
    assert bound.taken == 0
    with pytest.raises(ResponseTooLarge):
        MessageBound(10, events=True).take(b"data: 1\n\ndata: 123456\n\ndata: 1\n\n")  # the middle one is over
    bound.take(b"data: 123")
    with pytest.raises(ResponseTooLarge):
        bound.take(b"45")  # 11 bytes with no end: over
    whole = MessageBound(10, events=False)
    whole.take(b"x" * 10)
    with pytest.raises(ResponseTooLarge):
        whole.take(b"\n\n")  # a plain body counts every byte


def test_several_events_in_one_chunk_are_each_bounded():
    bound = MessageBound(10, events=True)
    bound.take(b"data: 1\n\ndata: 2\n\ndata: 3\n\n")  # three events of 9 bytes, 27 together
    assert bound.taken == 0
    bound.take(b"data: 4\n\ndata: 5\n\n")  # after a chunk that ended an event, every end still counts
    assert bound.taken == 0


def test_event_ends_cut_across_many_chunks_each_end_an_event():
    bound = MessageBound(10, events=True)
    for chunk in (b"\r\r", b"\r", b"\r", b"\r", b"\r"):  # three ends, two of them cut in half
        bound.take(chunk)
    assert bound.taken == 0


def test_an_empty_chunk_changes_no_count():
    bound = MessageBound(10, events=True)
    for chunk in (b"\r", b"\n", b"\r", b"\n\n"):
        bound.take(chunk)
    taken = bound.taken
    bound.take(b"")
    assert bound.taken == taken


def test_an_event_stream_is_not_kept_in_memory_by_its_bound():
    bound = MessageBound(1024 * 1024, events=True)
    chunk = b"data: " + b"y" * 65536 + b"\n\n"
    tracemalloc.start()
    try:
        for _ in range(100):  # 6.5 MB in all
            bound.take(chunk)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1024 * 1024


def test_a_pooled_connection_the_server_closed_is_not_reused(settings, connections):
    """The guarded stream answers the pool's "is this idle socket readable" itself (the socket looked up once):
    a keep-alive connection the server has closed meanwhile is dropped and a new one made."""
    settings.TOOLKEEPER_OUTBOUND_ALLOWED_HOSTS = ["127.0.0.1"]
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    accepted: list[socket.socket] = []

    def serve() -> None:
        for _ in range(2):
            conn, _ = listener.accept()
            accepted.append(conn)
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    server = threading.Thread(target=serve, daemon=True)
    server.start()

    async def run() -> list[str]:
        async with async_http_client(timeout=5) as client:
            first = await client.get(f"http://127.0.0.1:{port}/")
            while not accepted:
                await asyncio.sleep(0.01)
            accepted[0].close()  # the server ends the idle keep-alive connection
            await asyncio.sleep(0.1)
            second = await client.get(f"http://127.0.0.1:{port}/")
            return [first.text, second.text]

    try:
        assert asyncio.run(run()) == ["ok", "ok"]
    finally:
        server.join(timeout=5)
        listener.close()
    assert connections == ["127.0.0.1", "127.0.0.1"]  # a second connection: the closed one was not used


class RecordingStream(httpcore2.AsyncNetworkStream):
    """An inner stream that records what the checked stream hands it."""

    def __init__(self):
        self.calls = []

    async def read(self, max_bytes, timeout=None):
        self.calls.append(("read", max_bytes, timeout))
        return b"data"

    async def write(self, buffer, timeout=None):
        self.calls.append(("write", buffer, timeout))

    async def aclose(self):
        self.calls.append(("aclose",))

    def get_extra_info(self, info):
        self.calls.append(("info", info))
        return {"socket": None, "server_addr": ("198.51.100.7", 443)}.get(info)


def test_a_checked_stream_passes_the_timeouts_on_and_looks_its_socket_up_once():
    inner = RecordingStream()
    checked = outbound._CheckedStream(inner)
    assert asyncio.run(checked.read(10, 2.5)) == b"data"
    asyncio.run(checked.write(b"x", 1.5))
    assert checked.get_extra_info("socket") is None and checked.get_extra_info("server_addr") == ("198.51.100.7", 443)
    assert inner.calls == [("info", "socket"), ("read", 10, 2.5), ("write", b"x", 1.5), ("info", "server_addr")]


class AsyncRecordingBackend(httpcore2.AsyncNetworkBackend):
    """The async network layer under the guard: the connections it was asked for; the first `failing` fail."""

    def __init__(self, failing: int = 0):
        self.asked = []
        self.failing = failing

    async def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        self.asked.append((host, port, timeout, local_address, socket_options))
        if len(self.asked) <= self.failing:
            raise httpcore2.ConnectError(f"{host} refused the connection")
        return RecordingStream()


def test_the_async_backend_tries_each_checked_address_with_the_callers_options(resolver):
    resolver["two.test"] = [PUBLIC, "93.184.215.15"]
    options = {"timeout": 3.0, "local_address": "10.1.2.3", "socket_options": [(6, 1, 1)]}
    network = AsyncRecordingBackend(failing=1)
    stream = asyncio.run(outbound.AsyncGuardedNetworkBackend(network).connect_tcp("two.test", 8443, **options))
    assert isinstance(stream, outbound._CheckedStream)
    assert network.asked == [(PUBLIC, 8443, *options.values()), ("93.184.215.15", 8443, *options.values())]
    network = AsyncRecordingBackend(failing=2)
    with pytest.raises(httpcore2.ConnectError, match="^93.184.215.15 refused the connection$"):
        asyncio.run(outbound.AsyncGuardedNetworkBackend(network).connect_tcp("two.test", 8443, **options))

def test_a_lookup_past_the_timeout_is_abandoned(monkeypatch):
    release, finished = threading.Event(), threading.Event()

    def slow_lookup(host, port):
        release.wait(10)
        finished.set()
        return ["93.184.215.14"]

    monkeypatch.setattr(outbound, "resolved_addresses", slow_lookup)
    with pytest.raises(httpcore2.ConnectTimeout) as caught:
        asyncio.run(outbound.AsyncGuardedNetworkBackend(AsyncRecordingBackend()).connect_tcp("slow.test", 443,
                                                                                    timeout=0.1))
    assert str(caught.value) == "slow.test could not be resolved in time"
    assert not finished.is_set()  # not waited for: the lookup's thread is left to end on its own
    release.set()


@override_settings(TOOLKEEPER_OUTBOUND_MAX_MESSAGE_BYTES=100)
@pytest.mark.parametrize(("headers", "events"), [
    ({"Content-Type": "text/event-stream; charset=utf-8", "Content-Length": "5000"}, True),  # counted by event
    ({"Content-Type": " Text/Event-Stream "}, True),
    ({"Content-Type": "application/json", "Content-Length": "100"}, False),
    ({}, False),
])
def test_what_is_counted_follows_the_media_type_and_a_declared_length(headers, events):
    bound = outbound._bound_of(httpx2.Response(200, headers=headers), None)
    assert (bound.events, bound.limit) == (events, 100)


@override_settings(TOOLKEEPER_OUTBOUND_MAX_MESSAGE_BYTES=100)
def test_a_declared_length_over_the_limit_is_refused_before_reading():
    heard = []
    with pytest.raises(outbound.ResponseTooLarge) as caught:
        outbound._bound_of(httpx2.Response(200, headers={"Content-Length": "101"}), heard.append)
    assert str(caught.value) == "the server announced an answer of 101 bytes, over 100" and heard == [caught.value]


def test_an_address_literal_is_its_own_answer_brackets_and_all(monkeypatch):
    def no_lookup(*args, **kwargs):
        raise AssertionError("a literal is not looked up")

    monkeypatch.setattr(socket, "getaddrinfo", no_lookup)
    assert outbound.resolved_addresses("[::1]", 443) == ["::1"]
    assert outbound.resolved_addresses("[fe80::1]", 443) == ["fe80::1"]
    assert outbound.resolved_addresses("127.0.0.1", 443) == ["127.0.0.1"]


def test_a_name_is_looked_up_as_it_is_written(monkeypatch):
    """Only brackets come off: a name that ends in an address once other letters are cut off is a name."""
    asked = []

    def getaddrinfo(host, port, *args, **kwargs):
        asked.append(host)
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    for host in ("X127.0.0.1X", " 127.0.0.1", "x.test"):
        with pytest.raises(httpcore2.ConnectError) as failed:
            outbound.resolved_addresses(host, 80)
        assert str(failed.value) == f"{host} could not be resolved"
    assert asked == ["X127.0.0.1X", " 127.0.0.1", "x.test"]


def test_each_address_is_tried_once_in_the_resolvers_order_and_only_ip_ones(monkeypatch):
    answers = [
        (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.215.14", 443)),
        (socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("2606:2800:21f::1", 443, 0, 0)),
        (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.215.14", 443)),
        (socket.AF_UNIX, socket.SOCK_STREAM, 0, "", "/run/x.sock"),
        (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.215.15", 443)),
    ]
    monkeypatch.setattr(socket, "getaddrinfo", lambda *args, **kwargs: answers)
    assert outbound.resolved_addresses("many.test", 443) == ["93.184.215.14", "2606:2800:21f::1", "93.184.215.15"]


def test_a_refused_address_is_logged_for_admins_with_the_name_the_address_and_its_class(caplog):
    with caplog.at_level("WARNING", logger="toolkeeper.outbound"), pytest.raises(OutboundRefused):
        outbound.checked_addresses("inner.test", [PUBLIC, "10.0.0.7"], outbound.allow_list())
    assert [r.getMessage() for r in caplog.records] == [
        "outbound connection refused: inner.test resolves to 10.0.0.7 (a private address)"]


def test_the_tls_context_ignores_certificate_locations_from_the_environment(monkeypatch, tmp_path):
    """SSL_CERT_FILE and SSL_CERT_DIR would let the process's environment choose whom the platform trusts."""
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "missing.pem"))
    monkeypatch.setenv("SSL_CERT_DIR", str(tmp_path / "missing"))
    options = outbound._pool_options(True, None, True, False, httpx2.Limits(), 0)
    assert isinstance(options["ssl_context"], ssl.SSLContext)
    http_client().close()  # a client is built without reading them either


def test_the_refusal_of_a_bypassing_option_names_each_option_taken():
    with pytest.raises(TypeError) as refused:
        async_http_client(proxy="http://10.9.9.9:3128", trust_env=True)
    assert str(refused.value) == "the guarded client sets proxy, trust_env itself"


def test_a_literal_is_read_in_brackets_and_a_name_never_as_one():
    assert outbound.literal_address("[::1]") == outbound.literal_address("::1") is not None
    assert str(outbound.literal_address("[fd00::7]")) == "fd00::7"
    for name in ("X10.0.0.1", "10.0.0.1X", " 10.0.0.1", "[ ::1 ]"):
        assert outbound.literal_address(name) is None, name


# -- the fourth look: zones, the last of Python's table, the lookup's port, an absent setting -------

def test_a_zoned_address_is_judged_and_opened_without_its_zone():
    """A zone (fe80::1%eth0, as the resolver answers for link-local names) does not change what an address
    is: a metadata address with a zone is still one, and a network entry still does not open it."""
    zoned_metadata = ipaddress.ip_address("fd00:ec2::254%eth0")
    assert outbound.forbidden_class(zoned_metadata) == outbound.METADATA
    assert outbound.unzoned(zoned_metadata) == ipaddress.ip_address("fd00:ec2::254")
    assert outbound.unzoned(ipaddress.ip_address("10.0.0.1")) == ipaddress.ip_address("10.0.0.1")
    opened = outbound.parse_allow_list(("fd00::/8",))
    assert opened.permits("inner.test", ipaddress.ip_address("fd00::7%eth0"))
    assert not opened.permits("inner.test", zoned_metadata)
    with pytest.raises(OutboundRefused) as refused:
        outbound.checked_addresses("inner.test", ["fd00:ec2::254%eth0"], opened)
    assert str(refused.value) == "inner.test resolves to a cloud metadata address; only public addresses may be reached"


def test_a_literal_in_brackets_is_named_without_them():
    """The network layer may be handed a literal host in its URL form; the tenant is told the address."""
    assert outbound.refusal("[::1]", ipaddress.ip_address("::1"), outbound.allow_list()) == (
        "::1 is a loopback address; only public addresses may be reached")


def test_an_early_lookup_asks_for_the_urls_port(monkeypatch):
    asked = []

    def resolved(host, port):
        asked.append((host, port))
        return [PUBLIC]

    monkeypatch.setattr(outbound, "resolved_addresses", resolved)
    for url in ("http://pub.test/", "https://pub.test/", "http://pub.test:8080/"):
        check_url(url, resolve=True)
    assert asked == [("pub.test", 80), ("pub.test", 443), ("pub.test", 8080)]


def test_without_the_setting_nothing_is_opened(settings):
    del settings.TOOLKEEPER_OUTBOUND_ALLOWED_HOSTS
    assert outbound.allow_list() == outbound.AllowList(frozenset(), ())
    with pytest.raises(OutboundRefused):
        check_url("http://10.0.0.1/")
