"""Declared test cases for the pages that change one thing of a tenant (`tenancy.editing`), in the spirit of
NetBox's view test cases: a page gets its permission and validation tests by declaring data.

Subclass the base that fits the page, name the class `Test…`, and declare what the page is:

    class TestGroupCreate(CreateCases):
        url_name = "console:group_create"
        model = ToolGroup
        audit_verb = "group.created"
        success_url = "console:group_list"

        def valid(self, world):
            return {"name": "research"}, {"name": "research"}  # what is posted, what the saved row then has

        def invalid(self, world):
            return [({"name": "not a slug!"}, "Enter a valid")]  # posted, a message the page must show

The bases: `CreateCases`, `EditCases`, `SwitchCases` (an edit with nothing invalid to send), `ActionCases`
(a button: POST only), `DeleteCases` (with a confirmation page) and `RefusingDeleteCases`.
Edit, delete and action pages also declare `param` (the URL parameter naming the object) and `target(tw)`,
which makes that object in a tenant (`world.a` or `world.b`). Data methods receive the whole `world` and
give data for tenant A, so a case may name tenant B's rows on purpose.

Every page is then checked for:
- roles in `refused` answered `refusal` on a POST of valid data (and on GET, unless they are `readers`),
  with nothing changed; `readers` (by default the roles `allowed` to change) open the page;
- another tenant: the page under tenant B's slug is 404 for A's admin, and B's object through A's URL is
  404 on every method, with B's rows unchanged;
- invalid data (`invalid`): `INVALID_STATUS` with the message on the page, nothing saved;
- valid data: saved as declared, audited under the user who posted (the lowest allowed role), and a
  redirect to `success_url` (with `success_params` taken from the object, as the view declares them).
`RefusingDeleteCases` adds `refused_target(tw)` with `refused_message`: an object the service refuses to
delete, answered with the confirmation page, its message and `INVALID_STATUS`, the object kept.
"""
from django.urls import reverse

from audit.models import Event
from tenancy.web import INVALID_STATUS

REDIRECT = 302


def _rows(model, tenant) -> list[dict]:
    return list(model.objects.for_tenant(tenant).order_by("pk").values())


class PageCases:
    """What every declared page gets: role refusals and tenant isolation."""

    url_name = ""
    param = None  # the URL parameter naming the object (edit, delete and action pages)
    model = None  # the tenant-owned model the page changes
    methods = ("get", "post")
    allowed = ("admin", "operator")  # roles that may change; the last (the lowest) posts the data
    refused = ("reviewer", "viewer")  # roles refused a change
    readers = None  # roles that may open the page; None: the same as `allowed`
    refusal = 403
    audit_verb = ""
    success_url = ""
    success_params: tuple[tuple[str, str], ...] = ()

    def target(self, tw):
        """The object the URL names, made in tenant `tw` (pages with a `param`)."""
        raise NotImplementedError

    def valid(self, world) -> tuple[dict, dict]:
        """Data the page accepts, and the attributes the saved object then has."""
        return {}, {}

    def rows(self, tw) -> list[dict]:
        """What must not change when a request is refused."""
        return _rows(self.model, tw.tenant)

    def url(self, tw, obj=None, *, slug=None) -> str:
        kwargs = {"tenant": slug or tw.tenant.slug}
        if self.param is not None:
            kwargs[self.param] = obj.pk
        return reverse(self.url_name, kwargs=kwargs)

    def location(self, tw, obj) -> str:
        params = {param: getattr(obj, attribute) for param, attribute in self.success_params}
        return reverse(self.success_url, kwargs={"tenant": tw.tenant.slug, **params})

    def send(self, client, method: str, url: str, data=None):
        return client.get(url) if method == "get" else client.post(url, data or {})

    def object_of(self, tw):
        return self.target(tw) if self.param is not None else None

    def readers_of(self) -> tuple:
        return self.allowed if self.readers is None else self.readers

    def test_refused_roles_change_nothing(self, world):
        a = world.a
        obj = self.object_of(a)
        data, _ = self.valid(world)
        before = self.rows(a)
        for role in self.refused:
            client = a.console(role)
            if "get" in self.methods and role not in self.readers_of():
                assert client.get(self.url(a, obj)).status_code == self.refusal, role
            assert client.post(self.url(a, obj), data).status_code == self.refusal, role
        assert self.rows(a) == before

    def test_readers_open_the_page(self, world):
        obj = self.object_of(world.a)
        if "get" not in self.methods:
            response = world.a.console(self.allowed[0]).get(self.url(world.a, obj))
            assert response.status_code == 405  # a button's target, never a page
            return
        for role in self.readers_of():
            response = world.a.console(role).get(self.url(world.a, obj))
            assert response.status_code == 200, role
            assert world.a.tenant.name in response.content.decode()

    def test_another_tenants_page_and_objects_are_404(self, world):
        a, b = world.a, world.b
        client = a.console("admin")
        data, _ = self.valid(world)
        obj = self.object_of(a)
        for method in self.methods:
            assert self.send(client, method, self.url(a, obj, slug=b.tenant.slug), data).status_code == 404, method
        if self.param is None:
            return
        theirs = self.target(b)
        before = self.rows(b)
        for method in self.methods:
            response = self.send(client, method, self.url(a, theirs), data)
            assert response.status_code == 404, method
            assert b.tenant.name not in response.content.decode()
        assert self.rows(b) == before

    def audited(self, tw, user) -> int:
        return Event.objects.for_tenant(tw.tenant).filter(verb=self.audit_verb, actor_label=user.username).count()


class SavingCases(PageCases):
    """Pages whose form saves: valid data is saved, audited, and the page goes on."""

    def saved(self, tw, before: list[dict], obj):
        """The object valid data saved (`before`: the rows before the post; `obj`: the object the URL names)."""
        obj.refresh_from_db()
        return obj

    def test_valid_data_is_saved_audited_and_redirects(self, world):
        a = world.a
        obj = self.object_of(a)
        data, expected = self.valid(world)
        user = a.users[self.allowed[-1]]
        audited = self.audited(a, user)
        before = self.rows(a)
        response = a.console(self.allowed[-1]).post(self.url(a, obj), data)
        assert response.status_code == REDIRECT, response.content.decode()[:2000]
        saved = self.saved(a, before, obj)
        assert {name: getattr(saved, name) for name in expected} == expected
        assert response["Location"] == self.location(a, saved)
        assert self.audited(a, user) == audited + 1


class FormCases(SavingCases):
    """Create and edit pages: invalid data is refused whole."""

    def invalid(self, world) -> list[tuple[dict, str]]:
        """Data the form or the service refuses, each with a message the page shows."""
        raise NotImplementedError

    def test_invalid_data_is_refused_and_saves_nothing(self, world):
        a = world.a
        obj = self.object_of(a)
        cases = self.invalid(world)
        assert cases, "declare the data this page refuses"
        client = a.console(self.allowed[-1])
        before = self.rows(a)
        for data, message in cases:
            response = client.post(self.url(a, obj), data)
            assert response.status_code == INVALID_STATUS, (data, response.status_code)
            assert message in response.content.decode(), (data, message)
        assert self.rows(a) == before


class CreateCases(FormCases):
    """Create pages: the URL names no object; valid data makes exactly one row."""

    def saved(self, tw, before, obj):
        known = {row["id"] for row in before}
        (created,) = [obj for obj in self.model.objects.for_tenant(tw.tenant).order_by("pk") if obj.pk not in known]
        return created  # exactly one new row


class EditCases(FormCases):
    """Edit pages: the URL names the object (`param`, `target`), or `object_of` gives it (the tenant itself)."""


class SwitchCases(SavingCases):
    """An edit whose form has nothing that can be invalid (a switch): permissions, isolation and the save."""


class ActionCases(PageCases):
    """Buttons that act on one object (POST only): delete, revoke."""

    methods = ("post",)

    def done(self, tw, obj) -> bool:
        """Whether the action happened (default: the object is gone)."""
        return not self.model.objects.for_tenant(tw.tenant).filter(pk=obj.pk).exists()

    def test_the_action_is_done_audited_and_redirects(self, world):
        a = world.a
        obj = self.target(a)
        user = a.users[self.allowed[-1]]
        audited = self.audited(a, user)
        response = a.console(self.allowed[-1]).post(self.url(a, obj))
        assert response.status_code == REDIRECT
        assert response["Location"] == self.location(a, obj)
        assert self.done(a, obj)
        assert self.audited(a, user) == audited + 1


class DeleteCases(ActionCases):
    """Deletes with a confirmation page."""

    methods = ("get", "post")


class RefusingDeleteCases(DeleteCases):
    """Deletes whose service refuses some objects: declare one (`refused_target`) and the reason shown."""

    refused_message = ""

    def refused_target(self, tw):
        raise NotImplementedError

    def test_a_refused_delete_shows_why_and_keeps_the_object(self, world):
        a = world.a
        obj = self.refused_target(a)
        response = a.console(self.allowed[-1]).post(self.url(a, obj))
        assert response.status_code == INVALID_STATUS
        assert self.refused_message in response.content.decode()
        assert self.model.objects.for_tenant(a.tenant).filter(pk=obj.pk).exists()
