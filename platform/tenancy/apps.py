from django.apps import AppConfig


class TenancyConfig(AppConfig):
    name = "tenancy"

    def ready(self):
        from tenancy.entry import schema  # noqa: F401  (registers the OpenAPI auth schemes)
