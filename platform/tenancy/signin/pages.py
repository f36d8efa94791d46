"""The sign-in pages: the login page (a password, single sign-on, or both), the provider's way in and back, and
signing out (docs/identity.md, "Single sign-on").

The way back checks what the provider sent (the state against the session, the code with its PKCE verifier, the
ID token's signature, issuer, audience, expiry and nonce) before the person is looked at. A person the provider
vouched for but whom no tenant has as a member is not signed in: a page tells them whom to ask, unless they came
to accept an invitation, which needs them signed in.
"""
from __future__ import annotations

import logging
from urllib.parse import urlencode

import requests
from authlib.integrations.base_client import OAuthError
from django.conf import settings
from django.contrib.auth import login
from django.contrib.auth import views as auth_views
from django.http import HttpResponse, HttpResponseRedirect, JsonResponse
from django.shortcuts import render, resolve_url
from django.urls import resolve, reverse
from django.urls.exceptions import Resolver404
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST
from joserfc.errors import JoseError

from common.errors import RateLimited
from tenancy.entry.limits import address_admit
from tenancy.signin.provider import (
    LogoutTokenRefused,
    ProviderUnreachable,
    id_token_options,
    logout_token_claims,
    provider,
    sso_enabled,
    sso_name,
)
from tenancy.signin.services import (
    SignInRefused,
    person_sign_in,
    provider_session_note,
    provider_sign_out,
    sign_in_record,
)

logger = logging.getLogger("toolkeeper.signin")

NEXT_KEY = "signin.next"  # where the person was going, kept in the session while they are at the provider
METHOD_KEY = "signin.method"  # how this console session signed in: "oidc" signs out at the provider too
BACKEND = "tenancy.signin.backends.AccountBackend"
UNREACHABLE = ("{name} could not be reached just now, so nobody can sign in with it. Try again in a minute; if it "
               "goes on, tell a Toolkeeper admin.")
PASSWORDS_OFF = "Signing in with a password is turned off here: use single sign-on."


def _callback_url() -> str:
    return settings.TOOLKEEPER_PUBLIC_URL.rstrip("/") + reverse("signin_callback")


def _safe_next(request, value: str) -> str:
    if value and url_has_allowed_host_and_scheme(value, allowed_hosts={request.get_host()},
                                                 require_https=request.is_secure()):
        return value
    return ""


def _is_invitation(path: str) -> bool:
    try:
        return resolve(path.split("?", 1)[0]).url_name == "invitation_accept"
    except Resolver404:
        return False


def _refusal(request, message: str, status: int):
    return render(request, "console/signin_refused.html",
                  {"refusal": message, "sso_name": sso_name(), "passwords": settings.TOOLKEEPER_PASSWORD_LOGIN},
                  status=status)


def _vouched_claims(client, request) -> dict | None:
    """The person's claims from the ID token (verified), completed from the user info endpoint when the token
    leaves some out, as many providers do; None without an ID token."""
    token = client.authorize_access_token(request, claims_options=id_token_options())
    claims = dict(token.get("userinfo") or {})
    if not claims.get("sub"):
        return None
    if "email" not in claims and client.server_metadata.get("userinfo_endpoint"):
        more = dict(client.userinfo(token=token))
        if more.get("sub") == claims["sub"]:  # OpenID Connect Core 5.3.2: another subject's answer is ignored
            claims = {**more, **claims}
    return claims


class SignInView(auth_views.LoginView):
    """The login page: the password form while passwords are allowed, and the single sign-on button."""

    template_name = "console/login.html"

    def get_context_data(self, **kwargs):
        context = super().get_context_data(**kwargs)
        context.update(passwords=settings.TOOLKEEPER_PASSWORD_LOGIN, sso=sso_enabled(), sso_name=sso_name())
        return context

    def post(self, request, *args, **kwargs):
        if not settings.TOOLKEEPER_PASSWORD_LOGIN:
            return _refusal(request, PASSWORDS_OFF, 403)
        return super().post(request, *args, **kwargs)

    def form_valid(self, form):
        response = super().form_valid(form)
        self.request.session[METHOD_KEY] = "password"
        sign_in_record(user=form.get_user(), data={"method": "password"})
        return response


@never_cache
@require_GET
def signin_start(request):
    """Off to the provider, with a fresh state, nonce and PKCE verifier kept in the session."""
    if not sso_enabled():
        return _refusal(request, "Single sign-on is not set up on this Toolkeeper.", 404)
    request.session[NEXT_KEY] = _safe_next(request, request.GET.get("next", ""))
    try:
        return provider().authorize_redirect(request, _callback_url())
    except ProviderUnreachable as exc:
        logger.warning("the identity provider could not be reached: %s", exc)
        return _refusal(request, UNREACHABLE.format(name=sso_name()), 503)


@never_cache
@require_GET
def signin_callback(request):
    """Back from the provider: the person signed in, or a page that says why not."""
    if not sso_enabled():
        return _refusal(request, "Single sign-on is not set up on this Toolkeeper.", 404)
    try:
        claims = _vouched_claims(provider(), request)
    except ProviderUnreachable as exc:
        logger.warning("the identity provider could not be reached: %s", exc)
        return _refusal(request, UNREACHABLE.format(name=sso_name()), 503)
    except requests.RequestException as exc:
        logger.warning("the identity provider failed during a sign-in: %s", type(exc).__name__)
        return _refusal(request, UNREACHABLE.format(name=sso_name()), 503)
    except (OAuthError, JoseError, ValueError, KeyError, TypeError) as exc:
        # refused at the provider, a state that is not this session's, a token that does not verify
        logger.info("a sign-in did not complete: %s", getattr(exc, "error", None) or type(exc).__name__)
        return _refusal(request, "The sign-in did not complete: start again from the sign-in page.", 400)
    if claims is None:
        return _refusal(request, "Your identity provider sent no ID token: ask its admins to check the client.",
                        400)
    try:
        signed = person_sign_in(issuer=settings.TOOLKEEPER_OIDC_ISSUER, claims=claims)
    except SignInRefused as exc:
        logger.info("a sign-in was refused: %s", exc.message)
        return _refusal(request, exc.message, 403)
    next_url = request.session.pop(NEXT_KEY, "")
    if not signed.memberships and not signed.user.is_staff and not _is_invitation(next_url):
        return render(request, "console/signin_not_invited.html",
                      {"email": signed.user.email, "sso_name": sso_name()}, status=403)
    login(request, signed.user, backend=BACKEND)
    request.session[METHOD_KEY] = "oidc"
    request.session.save()  # its key now, for the provider's logout to find
    provider_session_note(identity=signed.identity, sid=str(claims.get("sid") or ""),
                          session_key=request.session.session_key)
    return HttpResponseRedirect(next_url or resolve_url(settings.LOGIN_REDIRECT_URL))


@csrf_exempt  # the provider posts, not a browser: the logout token's signature is the check
@never_cache
@require_POST
def signin_backchannel_logout(request):
    """The provider says the person's session there ended (OpenID Connect Back-Channel Logout 1.0): they signed
    out, or were disabled. Their console sessions and connected MCP clients end here too."""
    if not sso_enabled():
        return JsonResponse({"error": "not_found"}, status=404)
    try:
        address_admit(address=request.META.get("REMOTE_ADDR", ""))
        claims = logout_token_claims(request.POST.get("logout_token", ""))
    except RateLimited as exc:
        return JsonResponse({"error": "rate_limited", "error_description": exc.message}, status=429,
                            headers={"Retry-After": str(exc.retry_after)})
    except ProviderUnreachable as exc:
        logger.warning("the identity provider could not be reached for a logout: %s", exc)
        return JsonResponse({"error": "temporarily_unavailable"}, status=503)
    except LogoutTokenRefused as exc:
        logger.info("a back-channel logout was refused: %s", exc)
        return JsonResponse({"error": "invalid_request", "error_description": str(exc)}, status=400)
    ended = provider_sign_out(issuer=settings.TOOLKEEPER_OIDC_ISSUER, subject=claims.get("sub") or "",
                              sid=claims.get("sid") or "")
    logger.info("the identity provider signed a person out: %s console sessions ended", ended)
    return HttpResponse(status=200, headers={"Cache-Control": "no-store"})


class SignOutView(auth_views.LogoutView):
    """Signing out ends the console session; one that began at the provider ends there too (its end-session
    page, which returns to the sign-in page)."""

    def post(self, request, *args, **kwargs):
        method = request.session.get(METHOD_KEY)
        response = super().post(request, *args, **kwargs)
        if method != "oidc" or not sso_enabled():
            return response
        try:
            end_session = provider().server_metadata.get("end_session_endpoint")
        except ProviderUnreachable:
            return response
        if not end_session:
            return response
        back = settings.TOOLKEEPER_PUBLIC_URL.rstrip("/") + reverse("login")
        query = urlencode({"client_id": settings.TOOLKEEPER_OIDC_CLIENT_ID, "post_logout_redirect_uri": back})
        return HttpResponseRedirect(f"{end_session}?{query}")
