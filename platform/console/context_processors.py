"""The navigation every console page shows: the tenant switcher and the inbox badge."""
from django.urls import NoReverseMatch, reverse

from approvals.selectors import inbox_count
from tenancy.models import Role
from tenancy.selectors import memberships_of


def _switch_url(request, slug: str) -> str:
    """The same list page in another tenant when there is one, else that tenant's dashboard."""
    match = getattr(request, "resolver_match", None)
    if match is not None and match.namespace == "console" and set(match.kwargs) == {"tenant"}:
        try:
            return reverse(f"console:{match.url_name}", kwargs={"tenant": slug})
        except NoReverseMatch:
            pass
    return reverse("console:dashboard", kwargs={"tenant": slug})


def navigation(request):
    """The tenant switcher (every tenant the user belongs to) and, on tenant pages, the current one
    with the pending approvals count of its nav badge."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    memberships = memberships_of(user)
    context = {
        "memberships": memberships,
        "tenant_links": [(m, _switch_url(request, m.tenant.slug)) for m in memberships],
    }
    membership = getattr(request, "membership", None)
    if membership is not None:
        context.update(
            tenant=request.tenant,
            membership=membership,
            can_operate=membership.can_operate,
            is_tenant_admin=membership.role == Role.ADMIN,
            inbox_count=inbox_count(tenant=request.tenant),  # the nav badge, which the inbox socket keeps current
        )
    return context
