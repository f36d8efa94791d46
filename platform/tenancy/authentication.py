"""API authentication: tenant API keys (apps) and console sessions (operators)."""
from rest_framework import authentication, exceptions

from .models import Tenant
from .selectors import apikey_from_token, membership_of


class ApiKeyPrincipal:
    """The request.user of an API-key request: the key speaks for its tenant, not for a person."""

    is_authenticated = True
    is_anonymous = False
    is_staff = False
    is_superuser = False

    def __init__(self, api_key):
        self.api_key = api_key
        self.username = f"apikey:{api_key.name}"

    def __str__(self):
        return self.username


class ApiKeyAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        keyword, _, token = header.partition(" ")
        if keyword.lower() != self.keyword.lower() or not token.strip():
            raise exceptions.AuthenticationFailed("Use 'Authorization: Bearer <api key>'.")
        api_key = apikey_from_token(token.strip())
        if api_key is None:
            raise exceptions.AuthenticationFailed("Invalid or revoked API key.")
        api_key.touch()
        request.tenant = api_key.tenant
        request.membership = None
        return ApiKeyPrincipal(api_key), api_key

    def authenticate_header(self, request):
        return self.keyword


class ConsoleSessionAuthentication(authentication.SessionAuthentication):
    """A logged-in console user; the tenant comes from the X-Tenant header and needs a membership."""

    def authenticate(self, request):
        result = super().authenticate(request)
        if result is None:
            return None
        user, _ = result
        slug = request.META.get("HTTP_X_TENANT", "")
        tenant = Tenant.objects.filter(slug=slug).first() if slug else None
        membership = membership_of(user, tenant) if tenant else None
        if membership is None:
            raise exceptions.PermissionDenied("Name a tenant you belong to in the X-Tenant header.")
        request.tenant = tenant
        request.membership = membership
        return user, None
