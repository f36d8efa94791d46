"""How a stream's route is declared; each app lists its own routes (`websocket_urlpatterns`)."""
from channels.auth import AuthMiddlewareStack
from channels.security.websocket import AllowedHostsOriginValidator
from django.urls import path


def console_socket(route: str, consumer):
    """A console stream: cookie-authenticated, so it checks the Origin, and another site cannot ride a
    reviewer's login."""
    return path(route, AllowedHostsOriginValidator(AuthMiddlewareStack(consumer.as_asgi())))
