from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render

from tenancy.selectors import memberships_of


@login_required
def home(request, tenant=None):
    memberships = memberships_of(request.user)
    if len(memberships) == 1:
        return redirect("console:dashboard", tenant=memberships[0].tenant.slug)
    return render(request, "console/home.html", {"memberships": memberships})
