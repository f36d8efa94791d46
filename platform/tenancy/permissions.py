"""Scope checks: a view declares `required_scope`; keys need that scope, console users a role.

Console users: any member may read admin endpoints; changes need an operator or admin; actions a
view lists in `reviewer_actions` (deciding an approval) are open to reviewers too. The OpenAPI
document describes each operation with `required_scopes` and `console_roles`, so it says what is
enforced here.
"""
from rest_framework import permissions

from tenancy.models import ApiKey, Membership, Role, Scope


def required_scopes(view) -> tuple[str, ...]:
    """The API key scopes that admit a request to the view: any one of them will do."""
    scope = getattr(view, "required_scope", Scope.ADMIN)
    return scope if isinstance(scope, tuple) else (scope,)


def console_requirement(view, method: str) -> str:
    """What a console member needs: "member" (any role), or the Membership ability "can_review"/"can_operate"."""
    if getattr(view, "action", None) in getattr(view, "reviewer_actions", ()):
        return "can_review"
    if Scope.ADMIN in required_scopes(view) and method in permissions.SAFE_METHODS:
        return "member"
    return "can_operate"


def console_roles(view, method: str) -> tuple[str, ...]:
    requirement = console_requirement(view, method)
    return tuple(role.value for role in Role
                 if requirement == "member" or getattr(Membership(role=role), requirement))


class HasTenant(permissions.BasePermission):
    message = "This API key lacks the scope this endpoint needs."

    def has_permission(self, request, view):
        if getattr(request, "tenant", None) is None:
            return False
        if isinstance(request.auth, ApiKey):
            return any(request.auth.has_scope(s) for s in required_scopes(view))
        membership = getattr(request, "membership", None)
        if membership is None:
            return False
        self.message = "Your role in this tenant does not allow this."
        requirement = console_requirement(view, request.method)
        return requirement == "member" or getattr(membership, requirement)


def sees_secrets(request) -> bool:
    """Bound values can be secrets: operators, admins and admin-scoped keys see them; reviewers and
    viewers see that a value is bound, not what it is (as in the console)."""
    if isinstance(request.auth, ApiKey):
        return request.auth.has_scope(Scope.ADMIN)
    membership = getattr(request, "membership", None)
    return membership is not None and membership.can_operate
