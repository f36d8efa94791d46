from tenancy.selectors import memberships_of


def navigation(request):
    """The tenant switcher: every tenant the logged-in user belongs to."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    return {"memberships": memberships_of(user)}
