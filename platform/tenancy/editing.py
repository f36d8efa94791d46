"""Generic pages that change one thing of a tenant: a form or a button, one service call, a page to go to.

Declared per page with `as_view(...)` keywords (the Django way), e.g.

    group_create = ObjectFormView.as_view(
        form_class=GroupForm, service=tool_services.group_create, template_name="console/group_form.html",
        success_url="console:group_list", success_message="Group {object.name} created.")

- `ObjectFormView` creates or edits. When the URL names no object it creates: the service is called with
  `tenant=`; when it names one it edits: the service gets the object under its URL-object keyword (the
  keyword the services use too, e.g. `group=`). Both get `actor=` and the form's `service_values()`.
  GET shows the form. A POST that the form or the service refuses shows the form again with the errors
  and `INVALID_STATUS` (400); a POST that saves leaves a message and redirects.
- `ObjectActionView` (POST only) calls its service on the object the URL names (delete, revoke) and
  redirects; `ObjectDeleteView` adds a confirmation page (GET), which also shows a refusal (400).

The message and the page to go to are worked out from the saved object, or, for an action, from the object
before the service ran (a deleted row has no primary key any more). Every page is a `tenant_view`: `read`
is the level that opens it, `write` the level that posts to it; both default to operators. A page whose
service takes other arguments subclasses and overrides `save`; `context()` adds to what the template sees.
"""
from django import forms
from django.contrib import messages
from django.http import HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.views import View

from common.json_values import json_parse
from tenancy.web import (
    INVALID_STATUS,
    OPERATE,
    SERVICE_REFUSALS,
    acting_user,
    add_service_errors,
    service_messages,
    tenant_view,
)


class TenantPage(View):
    """A class-based tenant page: `as_view()` puts it behind `tenant_view`, allowing the methods it defines."""

    read = OPERATE
    write = OPERATE
    service = None  # the service function that makes the change (declared with as_view, so never bound)
    success_url = ""  # the URL name to go to after a change, e.g. "console:group_list"
    success_params: tuple[tuple[str, str], ...] = ()  # its parameters: (URL parameter, attribute of the object)
    success_message = ""  # str.format()-ed with `object`; empty: no message

    @classmethod
    def as_view(cls, **initkwargs):
        methods = [method.upper() for method in ("get", "post") if hasattr(cls, method)]
        levels = {"read": initkwargs.get("read", cls.read), "write": initkwargs.get("write", cls.write)}
        return tenant_view(methods=methods, **levels)(super().as_view(**initkwargs))

    def setup(self, request, *args, **objects):
        super().setup(request, *args, **objects)
        # The one object the URL names, under its view keyword; (None, None) on a create page.
        self.object_argument, self.object = next(iter(objects.items()), (None, None))

    def context(self) -> dict:
        """What the template sees besides the form (or the errors) and the object."""
        return {}

    def message(self, obj) -> str:
        return self.success_message.format(object=obj)

    def success(self, obj) -> str:
        params = {param: getattr(obj, attribute) for param, attribute in self.success_params}
        return reverse(self.success_url, kwargs={"tenant": self.request.tenant.slug, **params})

    def render(self, context: dict, status: int = 200):
        if self.object is not None:
            context[self.object_argument] = self.object
        return render(self.request, self.template_name, {**context, **self.context()}, status=status)


class ObjectFormView(TenantPage):
    """Create (the URL names no object) or edit (it names one) through a form and a service."""

    form_class = None  # a tenancy.web.TenantForm
    template_name = ""

    def get(self, request, **objects):
        return self.render({"form": self.form()})

    def post(self, request, **objects):
        form = self.form(request.POST)
        if form.is_valid():
            try:
                saved = self.save(form.service_values())
            except SERVICE_REFUSALS as exc:
                add_service_errors(form, exc)
                if self.object is not None:
                    self.object.refresh_from_db()  # the service may have changed it in memory before refusing
            else:
                message = self.message(saved)
                if message:
                    messages.success(request, message)
                return HttpResponseRedirect(self.success(saved))
        else:
            form.add_service_problems(*form.fields)
        secrets_not_kept(form)
        return self.render({"form": form}, status=INVALID_STATUS)

    def form(self, data=None):
        return self.form_class(data, tenant=self.request.tenant, instance=self.object, initial=self.initial())

    def initial(self) -> dict | None:
        """A create page's starting values (an edit page starts from the object: `TenantForm.initial_for`)."""
        return None

    def save(self, values: dict):
        """Call the service; the saved object (the edited one when the service returns nothing)."""
        target = {self.object_argument: self.object} if self.object is not None else {"tenant": self.request.tenant}
        saved = self.service(**target, actor=acting_user(self.request), **values)
        return saved if saved is not None else self.object


class ObjectActionView(TenantPage):
    """POST only: the service acts on the object the URL names, then the page goes on. A refusal comes back
    as error messages on the page it goes to, since there is no form to show it on."""

    def post(self, request, **objects):
        message, target = self.message(self.object), self.success(self.object)  # while the object is whole
        try:
            self.service(**{self.object_argument: self.object}, actor=acting_user(request))
        except SERVICE_REFUSALS as exc:
            return self.refused(exc)
        if message:
            messages.success(request, message)
        return HttpResponseRedirect(target)

    def refused(self, exc):
        for text in service_messages(exc):
            messages.error(self.request, text)
        return HttpResponseRedirect(self.success(self.object))


class ObjectDeleteView(ObjectActionView):
    """An action with a confirmation page (GET), which shows a refusal as its `errors` with `INVALID_STATUS`."""

    template_name = ""

    def get(self, request, **objects):
        return self.render({"errors": []})

    def refused(self, exc):
        return self.render({"errors": service_messages(exc)}, status=INVALID_STATUS)


# -- credentials typed into a form ------------------------------------------------------------------

class SecretTextarea(forms.Textarea):
    """A textarea that never renders a value: credentials are typed in, never shown back (not even on a form
    refused for another field)."""

    def format_value(self, value):
        return None


class SecretInput(forms.TextInput):
    """One line that is never rendered back, such as a webhook URL that holds its token."""

    def format_value(self, value):
        return None


RETYPE_HINT = "Type it again: what you typed here is never sent back to the browser."


def secrets_not_kept(form) -> None:
    """On a refused form, each secret field that held a value says it must be typed again (every other value
    is kept as typed)."""
    for name, field in form.fields.items():
        if isinstance(field.widget, SecretTextarea | SecretInput | forms.PasswordInput) and \
                form.data.get(form.add_prefix(name)):
            field.help_text = f"{RETYPE_HINT} {field.help_text}".strip()
            form[name].help_text = field.help_text  # a bound field keeps the text it was made with


def text_lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


def credentials_from_text(text: str, what: str) -> dict:
    """`Name: value` lines (or `NAME=value` for the environment), or a JSON object. Messages never quote a value."""
    text = text.strip()
    if text.startswith("{"):
        try:
            value = json_parse(text)
        except ValueError:
            raise forms.ValidationError(f"not a valid JSON object of {what}") from None
        if not isinstance(value, dict):
            raise forms.ValidationError(f"a JSON object of {what}")
        return value
    separator = "=" if what == "variables" else ":"
    found = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        name, sep, value = line.partition(separator)
        if not sep or not name.strip():
            raise forms.ValidationError(f"line {number}: write Name{separator} value (or a JSON object)")
        found[name.strip()] = value.strip()
    return found


def credentials_stored(names, what: str) -> str:
    names = sorted(names or {})
    if not names:
        return f"No {what} stored."
    return f"{len(names)} {what if len(names) != 1 else what[:-1]} set ({', '.join(names)}): values are never shown."
