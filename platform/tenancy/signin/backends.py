"""The console's authentication backend: Django's accounts, whose passwords work only while the deployment allows
them (`TOOLKEEPER_PASSWORD_LOGIN`). A person signed in by their provider is logged in through it too, so a
disabled account's session ends at its next request either way."""
from django.conf import settings
from django.contrib.auth.backends import ModelBackend


class AccountBackend(ModelBackend):
    def authenticate(self, request, username=None, password=None, **kwargs):
        if not settings.TOOLKEEPER_PASSWORD_LOGIN:
            return None
        return super().authenticate(request, username=username, password=password, **kwargs)
