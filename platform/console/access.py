"""The one door into a tenant's console pages.

`tenant_view` resolves the tenant (membership required) and then every object the URL names,
by parameter name, through `access_object`: missing or another tenant's → 404, before the method
or the role is even looked at. Reading needs `read`, changing (any non-GET method) needs `write`.
"""
from functools import wraps

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseNotAllowed

from tenancy.models import ApiKey, Role
from tenancy.selectors import access_object, access_tenant
from tools.models import AgentSession, BoundArgument, Tool, ToolCall, ToolGroup

# URL parameter name → (model, the view's keyword argument)
URL_OBJECTS = {
    "tool_id": (Tool, "tool"),
    "group_id": (ToolGroup, "group"),
    "binding_id": (BoundArgument, "binding"),
    "key_id": (ApiKey, "api_key"),
    "session_id": (AgentSession, "session"),
    "call_id": (ToolCall, "call"),
}

MEMBER, OPERATE, ADMIN = "member", "operate", "admin"
ISSUED_KEY = "console.issued_key"  # session entry holding a new API key until the one page that shows it
READ_METHODS = ("GET", "HEAD")


def allowed(membership, level: str) -> bool:
    if level == MEMBER:
        return True
    if level == OPERATE:
        return membership.can_operate
    if level == ADMIN:
        return membership.role == Role.ADMIN
    raise ValueError(f"unknown access level {level!r}")


def shows_issued_key(view):
    """Mark the one view that may read a new API key from the session (every other page drops it)."""
    view.shows_issued_key = True
    return view


def tenant_view(*, methods=("GET",), read=MEMBER, write=OPERATE):
    """Decorate a console view `view(request, **objects)`; `request.tenant`/`request.membership` are set."""
    methods = tuple(methods)
    if "GET" in methods:
        methods += ("HEAD",)

    def decorate(view):
        @wraps(view)
        def wrapper(request, tenant, **url_kwargs):
            request.tenant, request.membership = access_tenant(request.user, tenant)
            objects = {}
            for name, value in url_kwargs.items():
                model, argument = URL_OBJECTS[name]
                objects[argument] = access_object(model, request.tenant, value)
            if request.method not in methods:
                return HttpResponseNotAllowed(methods)
            if not allowed(request.membership, read if request.method in READ_METHODS else write):
                raise PermissionDenied("Your role in this tenant cannot do this.")
            background = request.headers.get("X-Toolkeeper-Live") == "1"  # the live client's own fetches
            if ISSUED_KEY in request.session and not background and not getattr(view, "shows_issued_key", False):
                del request.session[ISSUED_KEY]  # not followed to its page: the secret is gone for good
            return view(request, **objects)

        return login_required(wrapper)

    return decorate
