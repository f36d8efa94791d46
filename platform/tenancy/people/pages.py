"""The people pages: a tenant's members and invitations (admins), accepting an invitation, one's profile."""
from django.conf import settings
from django.contrib import messages
from django.contrib.auth import login
from django.contrib.auth.decorators import login_required
from django.db import transaction
from django.http import HttpResponseRedirect
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods

from common.errors import RateLimited, ServiceError
from tenancy.editing import ObjectActionView, ObjectDeleteView
from tenancy.entry.limits import requests_admit
from tenancy.models import Invitation, Membership, OAuthGrant
from tenancy.people import services
from tenancy.people.forms import AccountForm, InviteForm, ProfileForm, RoleForm
from tenancy.selectors import memberships_of
from tenancy.services import grant_revoke, membership_remove, membership_set
from tenancy.signin.provider import sso_enabled, sso_name
from tenancy.web import (
    ADMIN,
    INVALID_STATUS,
    add_service_errors,
    issued_secret_keep,
    issued_secret_take,
    rate_limited_page,
    service_messages,
    shows_issued_secret,
    tenant_redirect,
    tenant_view,
)


def _member_rows(tenant):
    memberships = (Membership.objects.for_tenant(tenant).select_related("user", "user__profile")
                   .order_by("user__username"))
    return [(membership, RoleForm(tenant=tenant, instance=membership, prefix=f"m{membership.pk}"))
            for membership in memberships]


def _pending_invitations(tenant):
    invitations = Invitation.objects.for_tenant(tenant).filter(accepted_at__isnull=True, revoked_at__isnull=True)
    return invitations.select_related("created_by").order_by("-created_at")


def _connected_clients(tenant):
    """The MCP clients members connected to the tenant with OAuth (tenancy.oauth)."""
    return (OAuthGrant.objects.for_tenant(tenant).filter(revoked_at__isnull=True)
            .select_related("client", "user", "api_key").order_by("-created_at"))


@never_cache
@tenant_view(methods=("GET", "POST"), read=ADMIN, write=ADMIN)
def member_list(request):
    """Members with their roles, the open invitations, and the form that invites someone."""
    form = InviteForm(request.POST if request.method == "POST" else None, tenant=request.tenant)
    status = 200
    if request.method == "POST":
        if form.is_valid():
            try:
                issued = services.invitation_create(tenant=request.tenant, actor=request.user, **form.cleaned_data)
            except ServiceError as exc:
                add_service_errors(form, exc)
            else:
                issued_secret_keep(request, issued.invitation, issued.link)
                request.session["console.invitation_mailed"] = issued.mailed
                return tenant_redirect(request, "console:invitation_created", invitation_id=issued.invitation.pk)
        status = INVALID_STATUS
    return render(request, "console/member_list.html", {
        "members": _member_rows(request.tenant), "invitations": _pending_invitations(request.tenant),
        "clients": _connected_clients(request.tenant),
        "form": form, "mail_is_sent": services.mail_is_sent(), "invitation_days": services.INVITATION_DAYS,
    }, status=status)


@never_cache
@tenant_view(read=ADMIN)
@shows_issued_secret
def invitation_created(request, invitation):
    return render(request, "console/invitation_created.html", {
        "invitation": invitation, "link": issued_secret_take(request, invitation),
        "mailed": request.session.pop("console.invitation_mailed", False), "mail_is_sent": services.mail_is_sent(),
    })


@tenant_view(methods=("POST",), read=ADMIN, write=ADMIN)
def member_role(request, membership):
    form = RoleForm(request.POST, tenant=request.tenant, instance=membership, prefix=f"m{membership.pk}")
    if not form.is_valid():
        messages.error(request, "Choose one of the roles.")
        return tenant_redirect(request, "console:member_list")
    role = form.cleaned_data["role"]
    if role != membership.role:
        try:
            membership_set(tenant=request.tenant, user=membership.user, role=role, actor=request.user)
        except ServiceError as exc:
            for text in service_messages(exc):
                messages.error(request, text)
        else:
            messages.success(request, f"{membership.user.get_username()} is now {role}.")
    return tenant_redirect(request, "console:member_list")


def member_remove_service(*, membership, actor=None):
    membership_remove(tenant=membership.tenant, user=membership.user, actor=actor)


class MemberRemove(ObjectDeleteView):
    """Take someone out of the tenant after a page that says what that ends."""

    def message(self, membership) -> str:
        return f"{membership.user.get_username()} is no longer a member."

    def context(self) -> dict:
        return {"is_you": self.object.user_id == self.request.user.pk}

    def success(self, membership) -> str:
        if membership.user_id == self.request.user.pk:
            return reverse("console:home")  # one who leaves cannot see the members page any more
        return super().success(membership)


member_remove = MemberRemove.as_view(
    service=member_remove_service, template_name="console/member_remove.html", success_url="console:member_list",
    read=ADMIN, write=ADMIN)

client_disconnect = ObjectActionView.as_view(
    service=grant_revoke, success_url="console:member_list", read=ADMIN, write=ADMIN,
    success_message="{object.client.name}, connected by {object.user.username}, is disconnected: its tokens stopped "
                    "working.")

invitation_revoke = ObjectActionView.as_view(
    service=services.invitation_revoke, success_url="console:member_list", read=ADMIN, write=ADMIN,
    success_message="The invitation to {object.email} is revoked: its link no longer works.")


# --- a person's own pages (outside any tenant) -----------------------------------------------------------

@never_cache
@require_http_methods(["GET", "HEAD", "POST"])
def invitation_accept(request, token):
    """Join a tenant by an invitation's link: signed in, with one button; otherwise by signing in first or by
    creating an account here."""
    invitation = services.invitation_from_link(token)
    if invitation is None:
        return render(request, "console/invitation_accept.html", {"refused": services.LINK_REFUSED}, status=404)
    account_form = AccountForm(request.POST if request.method == "POST" and not request.user.is_authenticated
                               else None)
    context = {"invitation": invitation, "tenant": None, "invited_tenant": invitation.tenant,
               "account_form": account_form, "errors": []}
    context.update(passwords=settings.TOOLKEEPER_PASSWORD_LOGIN, sso=sso_enabled(), sso_name=sso_name())
    if request.method == "POST":
        signed_in = request.user.is_authenticated
        if not signed_in and not settings.TOOLKEEPER_PASSWORD_LOGIN:
            context["errors"] = ["Accounts with a password are turned off here: sign in with single sign-on, "
                                 "then accept the invitation."]
            return render(request, "console/invitation_accept.html", context, status=403)
        try:  # a change to the tenant: its rate limits count it, as every console change's
            requests_admit(tenant=invitation.tenant, user=request.user)
        except RateLimited as exc:
            return rate_limited_page(request, exc)
        if signed_in or account_form.is_valid():
            try:
                with transaction.atomic():  # no account is left behind by an invitation that was refused
                    user = request.user if signed_in else services.account_create(
                        email=invitation.email, **account_form.cleaned_data)
                    services.invitation_accept(token=token, user=user)
            except ServiceError as exc:
                if signed_in:
                    context["errors"] = service_messages(exc)
                else:
                    add_service_errors(account_form, exc)
            else:
                if not signed_in:
                    login(request, user)
                messages.success(request, f"Welcome to {invitation.tenant.name}: you joined as {invitation.role}.")
                return redirect("console:dashboard", tenant=invitation.tenant.slug)
        return render(request, "console/invitation_accept.html", context, status=INVALID_STATUS)
    context["member_already"] = (request.user.is_authenticated and Membership.objects.for_tenant(invitation.tenant)
                                 .filter(user=request.user).exists())
    return render(request, "console/invitation_accept.html", context)


@never_cache
@login_required
@require_http_methods(["GET", "HEAD", "POST"])
def profile(request):
    user = request.user
    current = services.profile_of(user)
    initial = {"name": current.name, "email": user.email, "time_zone": current.time_zone}
    form = ProfileForm(request.POST if request.method == "POST" else None, initial=initial)
    if request.method == "POST":
        if form.is_valid():
            try:
                services.profile_update(user=user, **form.cleaned_data)
            except ServiceError as exc:
                add_service_errors(form, exc)
            else:
                messages.success(request, "Profile saved.")
                return HttpResponseRedirect(reverse("profile"))
        return render(request, "console/profile.html", {"form": form, "memberships": memberships_of(user)},
                      status=INVALID_STATUS)
    return render(request, "console/profile.html", {"form": form, "memberships": memberships_of(user)})
