"""What every app's console pages need from the web layer, kept low so that no app imports the console.

- `tenant_view`: the one door into a tenant page. It resolves the tenant (membership required), admits a
  change (any method but GET and HEAD) through `tenancy.entry.admission.admit` (the login's and the tenant's rate
  limits), then every object the URL names, by parameter name (`URL_OBJECTS`, filled by each app's URL conf through
  `register_url_objects`): missing or another tenant's → 404, before the method or the role is even looked
  at. Reading needs the page's `read` level, changing (any other method) its `write` level.
- `page_of`: one page of a list. `acting_user`: who a service records as the actor.
- `add_service_errors` / `service_messages`: a service's refusal (`common.errors.ServiceError`) shown on a
  form, or as plain messages: the console's one mapping of those errors.
- `TenantForm`: the base of the forms of tenant pages (the generic views in `tenancy.editing` build them).
- `ListFilterForm`: the base of a list's filters, with a range of days read in the viewer's time zone.
- `duration_text`: the one way a duration is written (instants: the console's `instant` filter).
"""
from datetime import datetime, time, timedelta
from functools import wraps

from django import forms
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ImproperlyConfigured, PermissionDenied
from django.core.paginator import Paginator
from django.http import HttpResponseNotAllowed
from django.shortcuts import redirect, render
from django.utils import timezone

from common.errors import RateLimited, ServiceError
from tenancy.entry.admission import Entry, admit
from tenancy.models import ApiKey, Role
from tenancy.selectors import access_object, access_tenant

MEMBER, OPERATE, ADMIN = "member", "operate", "admin"
READ_METHODS = ("GET", "HEAD")
PAGE_SIZE = 50
# A form the server refused (by the form's own checks or by the service) is shown again with this status,
# as the API answers invalid input with 400.
INVALID_STATUS = 400
# The refusals of a service that a form shows as its own errors. A page that answers a refusal otherwise (a
# 403 for `NotPermitted`, a 409 for `Conflict`) catches that subclass first.
SERVICE_REFUSALS = (ServiceError,)
# The session entry holding a new secret (an API key, an invitation's link) until the one page that shows it.
SHOWN_ONCE = "console.shown_once"

# URL parameter name → (tenant-owned model, the view's keyword argument), declared by each app's URL conf.
URL_OBJECTS: dict[str, tuple[type, str]] = {}


def register_url_objects(objects: dict[str, tuple[type, str]]) -> None:
    """Declare what URL parameters of tenant pages name. Two apps may declare the same parameter alike
    (both name calls `call_id`); declaring it otherwise is a configuration error, not a silent override."""
    for name, entry in objects.items():
        known = URL_OBJECTS.setdefault(name, entry)
        if known != entry:
            raise ImproperlyConfigured(f"URL parameter {name!r} already names {known}, not {entry}")


def allowed(membership, level: str) -> bool:
    if level == MEMBER:
        return True
    if level == OPERATE:
        return membership.can_operate
    if level == ADMIN:
        return membership.role == Role.ADMIN
    raise ValueError(f"unknown access level {level!r}")


def shows_issued_secret(view):
    """Mark a view that may read a new secret from the session (every other page drops it)."""
    view.shows_issued_secret = True
    return view


def issued_secret_keep(request, obj, secret: str) -> None:
    """Hold a secret just made for `obj` for the next page, which shows it once (`issued_secret_take`)."""
    request.session[SHOWN_ONCE] = {"model": obj._meta.label, "tenant": request.tenant.pk, "id": obj.pk,
                                      "secret": secret}


def issued_secret_take(request, obj) -> str | None:
    """The secret held for `obj`, once: None when it was shown already, or is another object's."""
    issued = request.session.pop(SHOWN_ONCE, None) or {}
    mine = (issued.get("model"), issued.get("tenant"), issued.get("id")) == (obj._meta.label, request.tenant.pk, obj.pk)
    return issued.get("secret") if mine else None


def tenant_view(*, methods=("GET",), read=MEMBER, write=OPERATE):
    """Decorate a tenant page `view(request, **objects)`; `request.tenant`/`request.membership` are set."""
    methods = tuple(methods)
    if "GET" in methods:
        methods += ("HEAD",)

    def decorate(view):
        @wraps(view)
        def wrapper(request, tenant, **url_kwargs):
            request.tenant, request.membership = access_tenant(request.user, tenant)
            if request.method not in READ_METHODS:
                try:
                    admit(entry=Entry.CONSOLE, user=request.user, tenant=request.tenant)
                except RateLimited as exc:
                    return rate_limited_page(request, exc)
            objects = {}
            for name, value in url_kwargs.items():
                model, argument = URL_OBJECTS[name]
                objects[argument] = access_object(model, request.tenant, value)
            if request.method not in methods:
                return HttpResponseNotAllowed(methods)
            if not allowed(request.membership, read if request.method in READ_METHODS else write):
                raise PermissionDenied("Your role in this tenant cannot do this.")
            background = request.headers.get("X-Toolkeeper-Live") == "1"  # the live client's own fetches
            if SHOWN_ONCE in request.session and not background and not getattr(view, "shows_issued_secret", False):
                del request.session[SHOWN_ONCE]  # not followed to its page: the secret is gone for good
            return view(request, **objects)

        return login_required(wrapper)

    return decorate


def rate_limited_page(request, exc: RateLimited):
    """A console change past the rate limits: the page says when to try again (429 with Retry-After)."""
    response = render(request, "429.html", {"message": exc.message}, status=429)
    response["Retry-After"] = str(exc.retry_after)
    return response


def tenant_redirect(request, url_name: str, **kwargs):
    """A redirect to another page of the request's tenant (`url_name` with its namespace)."""
    return redirect(url_name, tenant=request.tenant.slug, **kwargs)


def page_of(request, queryset, size: int = PAGE_SIZE):
    """The page of a list that `?page=` asks for (the last one when past the end, the first when malformed)."""
    return Paginator(queryset, size).get_page(request.GET.get("page"))


def acting_user(request):
    """Who a service records as the actor: the logged-in user, or `apikey:<name>` for an API key's request."""
    auth = getattr(request, "auth", None)
    return f"apikey:{auth.name}" if isinstance(auth, ApiKey) else request.user


def service_errors(exc: ServiceError) -> list[tuple[str | None, str]]:
    """A service's refusal as (field, message) pairs; field None when it concerns the whole request."""
    return [(None, message) for message in exc.messages] + [
        (field, message) for field, messages in exc.fields.items() for message in messages]


def add_service_errors(form: forms.Form, exc: ServiceError) -> None:
    """Show a service's refusal on the form: field errors on their fields, anything else on top."""
    for field, message in service_errors(exc):
        form.add_error(field if field in form.fields else None, message)


def service_messages(exc: ServiceError) -> list[str]:
    """A service's refusal as plain messages (for pages without a form)."""
    return [message for _, message in service_errors(exc)]


class TenantForm(forms.Form):
    """A form of a tenant page. It knows its tenant (so its choices are the tenant's own) and, on an edit
    page, the object it edits: an edit starts from `initial_for(instance)`. `service_values()` gives the
    cleaned data as the page's service takes it."""

    def __init__(self, *args, tenant, instance=None, **kwargs):
        self.tenant = tenant
        self.instance = instance
        if instance is not None and kwargs.get("initial") is None:
            kwargs["initial"] = self.initial_for(instance)
        super().__init__(*args, **kwargs)

    def initial_for(self, instance) -> dict:
        return {}

    def service_values(self) -> dict:
        return dict(self.cleaned_data)

    def service_check(self, values: dict) -> None:
        """The service's own check of the values the form took (raises its ServiceError); none by default."""

    def add_service_problems(self, *names: str) -> None:
        """On a form refused for some fields, what the service would also refuse of the others, so every error
        comes in one answer (the service is not reached until the form is valid). `names`: the fields checked."""
        values = {name: self.cleaned_data[name] for name in names
                  if name in self.cleaned_data and name not in self.errors and not self.fields[name].disabled}
        try:
            self.service_check(values)
        except SERVICE_REFUSALS as exc:
            for field, message in service_errors(exc):
                if field in values:
                    self.add_error(field, message)


def _day_start(day) -> datetime:
    return timezone.make_aware(datetime.combine(day, time.min))  # in the zone the page is shown in


def search_field(label: str, help_text: str = "", *, max_length: int = 200, **attrs) -> forms.CharField:
    """A list filter's text: optional, typed as a search."""
    return forms.CharField(required=False, max_length=max_length, label=label, help_text=help_text,
                           widget=forms.TextInput(attrs={"type": "search", **attrs}))


class ListFilterForm(forms.Form):
    """A list's filters, read from the query string: the first and last day shown (both included, in the
    viewer's time zone), then each subclass's fields. An invalid filter lists nothing rather than everything."""

    since = forms.DateField(required=False, label="From", widget=forms.DateInput(attrs={"type": "date"}))
    until = forms.DateField(required=False, label="To", widget=forms.DateInput(attrs={"type": "date"}),
                            help_text="Both days included, in your time zone.")

    def clean(self):
        cleaned = super().clean()
        if cleaned.get("since") and cleaned.get("until") and cleaned["since"] > cleaned["until"]:
            self.add_error("until", "the last day comes after the first")
        return cleaned

    date_field = "created_at"  # what the range of days is about

    def filtered(self, queryset):
        """The rows the filters ask for: all of them with no filter, none with an invalid one."""
        if not self.is_bound:
            return queryset
        if not self.is_valid():
            return queryset.none()
        values = self.cleaned_data
        if values.get("since"):
            queryset = queryset.filter(**{f"{self.date_field}__gte": _day_start(values["since"])})
        if values.get("until"):
            queryset = queryset.filter(**{f"{self.date_field}__lt": _day_start(values["until"] + timedelta(days=1))})
        return self.narrow(queryset, values)

    def narrow(self, queryset, values: dict):
        """The subclass's own filters (`values` are valid)."""
        return queryset

    def filters(self) -> dict[str, str]:
        """The filters given, as the query string had them: kept by the pager, the exports and live rows."""
        return {name: value for name, value in self.data.items() if name in self.fields and value}


DURATION_UNITS = (("d", 86400), ("h", 3600), ("min", 60), ("s", 1))


def duration_text(value) -> str:
    """A duration (a timedelta or seconds) in its two largest units: "0.35 s", "45 s", "1 min 5 s", "2 h",
    "3 d 4 h". Below 10 s with its hundredths, since a call's steps take fractions of a second."""
    seconds = abs(value.total_seconds() if isinstance(value, timedelta) else float(value))
    if seconds < 10:
        return f"{seconds:.2f}".rstrip("0").rstrip(".") + " s"
    left = int(seconds) if seconds >= 60 else round(seconds)
    parts = []
    for unit, size in DURATION_UNITS:
        if left >= size or parts:
            count, left = divmod(left, size)
            parts.append((count, unit))
        if len(parts) == 2:
            break
    return " ".join(f"{count} {unit}" for count, unit in parts if count or (count, unit) == parts[0])
