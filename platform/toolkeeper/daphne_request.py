"""Daphne's HTTP request with the body checks of `tenancy.entry.bodies`, applied as the bytes arrive.

Daphne receives a request's whole body (into memory, or a temporary file) before it starts the
application, and twisted parses a multipart body on the way, answering a bare 400 to one it cannot
parse. This request answers what `bodies` refuses as soon as the headers arrive (or, for a chunked
body, as soon as it grows past its limit) and closes the connection without reading the rest; it
leaves multipart bodies to Django.
"""
from urllib.parse import unquote

from daphne import http_protocol

from tenancy.entry.bodies import TOO_LARGE, Refusal, body_limit, header_map, refusal_before_body


class BodyCheckingRequest(http_protocol.WebRequest):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, parsePOSTFormSubmission=False, **kwargs)
        self.refused = False
        self.received = 0
        self.limit = 0
        self.target = "/"

    def gotLength(self, length):
        """The headers are in (the channel parsed the request line before them): refuse now, or go on."""
        super().gotLength(length)
        self.target = unquote(self.channel._path.split(b"?", 1)[0].decode("ascii", "replace"))
        headers = header_map((name, values[0]) for name, values in self.requestHeaders.getAllRawHeaders())
        self.limit = body_limit(self.target, headers)
        refusal = refusal_before_body(self.target, headers)
        if refusal is not None:
            self.refuse(refusal)

    def handleContentChunk(self, data):
        if self.refused:
            return
        self.received += len(data)
        if self.received > self.limit:
            self.refuse(TOO_LARGE)
            return
        super().handleContentChunk(data)

    def requestReceived(self, command, path, version):
        if not self.refused:
            super().requestReceived(command, path, version)

    def refuse(self, refusal: Refusal) -> None:
        self.refused = True
        self.requestHeaders.removeHeader(b"Expect")  # no "100 Continue" after the answer
        headers, body = refusal.answer(self.target)
        head = [f"HTTP/1.1 {refusal.status} {refusal.reason}".encode(), *(b"%s: %s" % pair for pair in headers),
                b"connection: close"]
        self.channel.transport.write(b"\r\n".join(head) + b"\r\n\r\n" + body)
        self.loseConnection()


def use_in_daphne() -> None:
    """Daphne's HTTP factory builds its requests from this module attribute, at each connection."""
    http_protocol.WebRequest = BodyCheckingRequest
