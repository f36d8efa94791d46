"""Real servers on 127.0.0.1 and a resolver that maps test names, for the outbound guard's tests."""
import datetime
import http.server
import socket
import ssl
import threading
from contextlib import contextmanager
from urllib.parse import parse_qs, urlsplit

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

TLS_NAME = "mcp.test"


class Handler(http.server.BaseHTTPRequestHandler):
    """`/ok` answers "hello"; `/redirect?to=URL` redirects there; `/bytes?n=N[&length=0]` answers N bytes
    (without a Content-Length: the body ends with the connection); `/events?count=C&size=S` an event stream
    of C events of S bytes of data each."""

    protocol_version = "HTTP/1.0"

    def do_GET(self):  # noqa: N802 (http.server's name)
        url = urlsplit(self.path)
        query = {name: values[0] for name, values in parse_qs(url.query).items()}
        if url.path == "/bytes":
            size = int(query["n"])
            self.send_response(200)
            if query.get("length") != "0":
                self.send_header("Content-Length", str(size))
            self.end_headers()
            for start in range(0, size, 65536):
                self.wfile.write(b"x" * min(65536, size - start))
            return
        if url.path == "/events":
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for _ in range(int(query["count"])):
                self.wfile.write(b"data: " + b"y" * int(query["size"]) + b"\n\n")
            return
        if url.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", parse_qs(url.query)["to"][0])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = b"hello"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@contextmanager
def serving(ssl_context: ssl.SSLContext | None = None):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    if ssl_context is not None:
        server.socket = ssl_context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture
def http_port():
    """The port of a plain HTTP server on 127.0.0.1."""
    with serving() as port:
        yield port


@pytest.fixture
def tls_server(tmp_path):
    """An HTTPS server on 127.0.0.1 whose self-signed certificate names only `mcp.test` (no IP), and the
    server names (SNI) its clients asked for."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, TLS_NAME)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(TLS_NAME)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_path, key_path)
    names = []
    context.sni_callback = lambda sock, server_name, ctx: names.append(server_name)
    with serving(context) as port:
        yield {"port": port, "cafile": str(cert_path), "sni": names}


@pytest.fixture
def resolver(monkeypatch):
    """Maps test names to addresses for the system resolver: `resolver["a.test"] = ["127.0.0.1"]`, or a list
    of answers given in turn (`[["93.184.215.14"], ["127.0.0.1"]]`). Other names resolve as usual.
    `resolver.lookups` counts the lookups of each mapped name."""
    real = socket.getaddrinfo

    class Resolver(dict):
        lookups: dict

    names = Resolver()
    names.lookups = {}

    def getaddrinfo(host, port, *args, **kwargs):
        key = host.decode() if isinstance(host, bytes) else host
        if key not in names:
            return real(host, port, *args, **kwargs)
        answers = names[key]
        if answers and isinstance(answers[0], list):  # one answer per lookup, the last one repeated
            answers = answers[min(names.lookups.get(key, 0), len(answers) - 1)]
        names.lookups[key] = names.lookups.get(key, 0) + 1
        return [(socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "",
                 (a, port or 0, 0, 0) if ":" in a else (a, port or 0)) for a in answers]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return names
