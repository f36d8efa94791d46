"""The Content-Security-Policy of the HTML pages (Django 5.2 has no CSP of its own).

Console pages (the inbox, knowledge and login pages included) run only scripts and styles from this
server: files under /static/ and the inline blocks of our templates, which carry the request's nonce
(`<script nonce="{{ request.csp_nonce }}">`). No template uses inline event handlers or `style`
attributes; the live client fetches pages and swaps parts of them in, so a `style` attribute would be
refused there too. Sockets go to the same host (`ws:`/`wss:`). Nothing may frame the pages, load
plugins or change the base URL. Forms post to this server only, and to the single sign-on provider's origin when
one is set: signing out ends the provider's session too, by a redirect from the sign-out form.

Swagger UI (/api/docs/) is drf-spectacular's template, whose own inline `<style>` and the styles
Swagger UI sets at run time need inline styles; its scripts still come from this server only. The
Django admin keeps its own pages: framing, plugins and the base URL are restricted there.
"""
import secrets
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import DisallowedHost
from django.utils.deprecation import MiddlewareMixin

HEADER = "Content-Security-Policy"
DOCS_PREFIX = "/api/docs/"
ADMIN_PREFIX = "/admin/"
COMMON = "object-src 'none'; base-uri 'self'; frame-ancestors 'none'"


def console_policy(nonce: str, host: str | None, *, form_targets: tuple[str, ...] = ()) -> str:
    """`form_targets`: origins a form of this page may end up at by a redirect (an OAuth client's, from the
    consent page)."""
    # CSP 3 lets 'self' cover the same host's sockets; older browsers need them named.
    sockets = f" ws://{host} wss://{host}" if host else ""
    targets = "".join(f" {origin}" for origin in form_targets if _is_origin(origin))
    return (f"default-src 'self'; script-src 'self' 'nonce-{nonce}'; style-src 'self' 'nonce-{nonce}'; "
            f"img-src 'self' data:; connect-src 'self'{sockets}; form-action 'self'{_provider_origin()}{targets}; "
            f"{COMMON}")


def _is_origin(value: str) -> bool:
    """An http(s) origin and nothing else: no path, no quote, no space or separator that would end the source."""
    parts = urlsplit(value)
    return (parts.scheme in ("http", "https") and bool(parts.netloc) and not parts.path and not parts.query
            and not any(ch in value for ch in " ;,'\"\n\r"))


def _provider_origin() -> str:
    """The single sign-on provider's origin, which the sign-out form's redirect goes on to (Chromium holds a
    form's redirects to `form-action`), with a leading space; empty without a provider."""
    issuer = urlsplit(getattr(settings, "TOOLKEEPER_OIDC_ISSUER", ""))
    return f" {issuer.scheme}://{issuer.netloc}" if issuer.scheme in ("http", "https") and issuer.netloc else ""


DOCS_POLICY = (f"default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
               f"connect-src 'self'; form-action 'self'; {COMMON}")


def policy_for(request) -> str:
    if request.path.startswith(DOCS_PREFIX):
        return DOCS_POLICY
    if request.path.startswith(ADMIN_PREFIX):
        return COMMON
    try:
        host = request.get_host()
    except DisallowedHost:  # answered 400 already; the page still gets a policy
        host = None
    return console_policy(request.csp_nonce, host)


class ContentSecurityPolicyMiddleware(MiddlewareMixin):
    def process_request(self, request):
        request.csp_nonce = secrets.token_urlsafe(16)

    def process_response(self, request, response):
        if "text/html" in response.get("Content-Type", "") and HEADER not in response:
            response[HEADER] = policy_for(request)
        return response
