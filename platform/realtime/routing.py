from channels.auth import AuthMiddlewareStack
from channels.security.websocket import AllowedHostsOriginValidator
from django.urls import path

from . import consumers


def console(consumer):
    # Cookie-authenticated sockets check the Origin, so another site cannot ride a reviewer's login.
    return AllowedHostsOriginValidator(AuthMiddlewareStack(consumer.as_asgi()))


websocket_urlpatterns = [
    path("ws/api/sessions/<str:session_id>/", consumers.AppSessionStream.as_asgi()),
    path("ws/console/<slug:tenant>/calls/", console(consumers.ConsoleCallsStream)),
    path("ws/console/<slug:tenant>/calls/<str:call_id>/", console(consumers.ConsoleCallStream)),
    path("ws/console/<slug:tenant>/sessions/<str:session_id>/", console(consumers.ConsoleSessionStream)),
    path("ws/console/<slug:tenant>/inbox/", console(consumers.ConsoleInboxStream)),
]
