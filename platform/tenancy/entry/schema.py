"""OpenAPI descriptions of our authentication schemes."""
from drf_spectacular.extensions import OpenApiAuthenticationExtension


class ApiKeyScheme(OpenApiAuthenticationExtension):
    target_class = "tenancy.entry.authentication.ApiKeyAuthentication"
    name = "apiKey"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "description": "A tenant API key: `Bearer tk_…`."}


class ConsoleSessionScheme(OpenApiAuthenticationExtension):
    target_class = "tenancy.entry.authentication.ConsoleSessionAuthentication"
    name = "consoleSession"

    def get_security_definition(self, auto_schema):
        return {"type": "apiKey", "in": "cookie", "name": "sessionid",
                "description": "A console login; name the tenant in the X-Tenant header."}
