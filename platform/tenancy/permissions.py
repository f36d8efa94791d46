"""Scope checks: a view declares `required_scope`; keys need that scope, console users a role.

Console users: any member may read admin endpoints; changes need an operator or admin; actions a
view lists in `reviewer_actions` (deciding an approval) are open to reviewers too.
"""
from rest_framework import permissions

from .models import ApiKey, Scope


class HasTenant(permissions.BasePermission):
    message = "This API key lacks the scope this endpoint needs."

    def has_permission(self, request, view):
        if getattr(request, "tenant", None) is None:
            return False
        scope = getattr(view, "required_scope", Scope.ADMIN)
        scopes = scope if isinstance(scope, tuple) else (scope,)  # any one of them will do
        if isinstance(request.auth, ApiKey):
            return any(request.auth.has_scope(s) for s in scopes)
        membership = getattr(request, "membership", None)
        if membership is None:
            return False
        self.message = "Your role in this tenant does not allow this."
        if getattr(view, "action", None) in getattr(view, "reviewer_actions", ()):
            return membership.can_review
        if Scope.ADMIN in scopes and request.method in permissions.SAFE_METHODS:
            return True
        return membership.can_operate


def sees_secrets(request) -> bool:
    """Bound values can be secrets: operators, admins and admin-scoped keys see them; reviewers and
    viewers see that a value is bound, not what it is (as in the console)."""
    if isinstance(request.auth, ApiKey):
        return request.auth.has_scope(Scope.ADMIN)
    membership = getattr(request, "membership", None)
    return membership is not None and membership.can_operate
