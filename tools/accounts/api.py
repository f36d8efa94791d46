"""`/api/v1/oauth-providers`: HTTP tools' OAuth providers, for admin keys and admins (docs/accounts.md). The client
is write-only: answers say whether one is stored, and its id."""
from django.core.validators import RegexValidator
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import serializers

from common import serializers as strict
from common.secrets import secret_readable
from tenancy.api.base import TenantModelViewSet
from tenancy.web import acting_user
from toolkeeper.openapi import CONFLICT
from tools.accounts import providers
from tools.models import OAuthProvider


def _address(help_text: str) -> serializers.CharField:
    return serializers.CharField(max_length=providers.URL_MAX, required=False, allow_blank=True,
                                 trim_whitespace=False, help_text=help_text)


class OAuthProviderSerializer(strict.ModelSerializer):
    name = serializers.CharField(max_length=24, help_text=providers.NAME_RULE, validators=[
        RegexValidator(r"^(?:" + providers.NAME.pattern + r")\Z", providers.NAME_RULE)])
    accounts = serializers.ChoiceField(
        choices=providers.MODES, required=False,
        help_text="`person`: each person connects their own account (authorization code with PKCE) on the "
                  "console's accounts page; `service`: one service account (client credentials)")
    api_url = serializers.CharField(max_length=providers.URL_MAX, trim_whitespace=False,
                                    help_text="the API's base URL (https): HTTP tools that name the provider must "
                                              "call under it, and its tokens go nowhere else")
    issuer = _address("optional: an authorization answer naming another issuer is refused")
    authorization_endpoint = _address("`person`: where people sign in (https)")
    token_endpoint = serializers.CharField(max_length=providers.URL_MAX, trim_whitespace=False,
                                           help_text="where tokens are got (https)")
    revocation_endpoint = _address("optional: a disconnect revokes the grant there")
    resource = _address("optional: sent as the resource parameter (RFC 8707)")
    scopes = serializers.CharField(max_length=500, required=False, allow_blank=True,
                                   help_text="space-separated scopes to ask for")
    client = serializers.JSONField(write_only=True, required=False,
                                   help_text='write-only: {"client_id", "client_secret"?} registered for Toolkeeper '
                                             "there; a service account's needs its secret. Absent on an update: "
                                             "the stored one stays")
    client_id = serializers.SerializerMethodField(help_text="the stored client's id (its secret is never shown)")

    class Meta:
        model = OAuthProvider
        fields = ["id", "name", "accounts", "api_url", "issuer", "authorization_endpoint", "token_endpoint",
                  "revocation_endpoint", "resource", "scopes", "client", "client_id", "created_at", "updated_at"]
        read_only_fields = ["created_at", "updated_at"]
        validators = []  # the service checks the name's uniqueness in the tenant

    def get_client_id(self, provider) -> str | None:
        return (secret_readable(provider, "client") or {}).get("client_id")


@extend_schema_view(destroy=extend_schema(responses={204: None, 409: CONFLICT}))
class OAuthProviderViewSet(TenantModelViewSet):
    """A tenant's OAuth providers of HTTP tools. Changing what grants were made for ends the accounts connected
    through it; one that HTTP tools name cannot be deleted (409)."""

    serializer_class = OAuthProviderSerializer

    def perform_create(self, serializer):
        serializer.instance = providers.provider_create(tenant=self.tenant, actor=acting_user(self.request),
                                                        **serializer.validated_data)

    def perform_update(self, serializer):
        serializer.instance = providers.provider_update(provider=serializer.instance,
                                                        actor=acting_user(self.request),
                                                        **serializer.validated_data)

    def perform_destroy(self, instance):
        providers.provider_delete(provider=instance, actor=acting_user(self.request))
