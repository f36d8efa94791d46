"""The audit log page: entries filtered by actor, action, target and date, each linked to what it names, the
chain's integrity (with the first bad entry when there is one), and the filtered view as CSV or JSON lines.

What a target such as `tool:12` or `mcp_server:docs` links to is declared by the app that owns it
(`register_target_links`, from its URL conf, as `tenancy.web.register_url_objects` is): a page resolves the
targets it shows with one query per kind, whatever the number of rows.
"""
import csv
import io
import json
from dataclasses import dataclass
from urllib.parse import urlencode

from asgiref.sync import sync_to_async
from django import forms
from django.core.cache import cache
from django.core.exceptions import ImproperlyConfigured, ValidationError
from django.http import StreamingHttpResponse
from django.shortcuts import render
from django.urls import NoReverseMatch, reverse
from django.utils import timezone
from django.views.decorators.cache import never_cache

from audit.models import Event
from audit.selectors import audit_check, audit_check_recent
from tenancy.web import OPERATE, ListFilterForm, page_of, search_field, tenant_redirect, tenant_view

EXPORT_CHUNK = 2000  # entries read at a time while an export streams
EXPORT_FIELDS = ("id", "at", "actor", "verb", "target", "data", "hash", "strand")
SPREADSHEET_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


@dataclass(frozen=True)
class TargetLink:
    model: type  # the tenant-owned model a target of this kind names
    lookup: str  # the model's field the target holds after "kind:" (its pk, or a name)
    url_name: str
    url_param: str  # the URL's parameter, given the row's pk ("" when the page names no object)


TARGET_LINKS: dict[str, TargetLink] = {}


def register_target_links(links: dict[str, TargetLink]) -> None:
    for kind, link in links.items():
        known = TARGET_LINKS.setdefault(kind, link)
        if known != link:
            raise ImproperlyConfigured(f"audit target {kind!r} already links to {known.url_name}")


class AuditFilterForm(ListFilterForm):
    actor = search_field("Actor", "A user name or an API key's name (apikey:…); part of it is enough.",
                         max_length=150)
    action = search_field("Action", "An action, or the start of one: membership. finds every membership change.",
                          max_length=64)
    target = search_field("Target", "What it changed, or the start of it: tool:12, or tool: for every tool.")
    entry = forms.IntegerField(required=False, min_value=1, widget=forms.HiddenInput)
    field_order = ["actor", "action", "target", "since", "until", "entry"]
    date_field = "at"

    def narrow(self, queryset, values: dict):
        if values.get("entry"):
            queryset = queryset.filter(pk=values["entry"])
        if values.get("actor"):
            queryset = queryset.filter(actor_label__icontains=values["actor"])
        if values.get("action"):
            queryset = queryset.filter(verb__startswith=values["action"])
        if values.get("target"):
            queryset = queryset.filter(target__startswith=values["target"])
        return queryset


def filtered_events(tenant, form: AuditFilterForm):
    """The tenant's entries that the filter form asks for, newest first."""
    return form.filtered(Event.objects.for_tenant(tenant).order_by("-id"))


def target_links(tenant, events) -> dict[str, str]:
    """target → URL for the targets of `events` that name a row that still exists: one query per kind."""
    wanted: dict[str, set[str]] = {}
    for event in events:
        kind, _, ident = event.target.partition(":")
        if kind in TARGET_LINKS and ident:
            wanted.setdefault(kind, set()).add(ident)
    links = {}
    for kind, idents in wanted.items():
        link = TARGET_LINKS[kind]
        if link.lookup == "pk":
            idents = {ident for ident in idents if _is_pk(link.model, ident)}
        rows = link.model._base_manager.filter(tenant=tenant, **{f"{link.lookup}__in": idents}).values_list(
            link.lookup, "pk")
        for ident, pk in rows:
            params = {"tenant": tenant.slug, **({link.url_param: pk} if link.url_param else {})}
            try:
                links[f"{kind}:{ident}"] = reverse(link.url_name, kwargs=params)
            except NoReverseMatch:
                continue
    return links


def _is_pk(model, ident: str) -> bool:
    try:
        model._meta.pk.to_python(ident)
    except ValidationError:
        return False
    return True


def _check_key(tenant) -> str:
    return f"tk:audit-check:{tenant.pk}"


@never_cache
@tenant_view(methods=("GET", "POST"), read=OPERATE, write=OPERATE)
def audit_log(request):
    """GET: the filtered entries. POST: verify the whole chain now (the page otherwise shows a check at most
    a few minutes old, as the dashboard does)."""
    if request.method == "POST":
        cache.set(_check_key(request.tenant), (audit_check(tenant=request.tenant), timezone.now()))
        return tenant_redirect(request, "console:audit_log")
    form = AuditFilterForm(request.GET or None)
    page = page_of(request, filtered_events(request.tenant, form))
    check, checked_at = audit_check_recent(tenant=request.tenant)
    filters = form.filters()
    links = target_links(request.tenant, page.object_list)
    return render(request, "console/audit_log.html", {
        "form": form, "page": page, "rows": [(event, links.get(event.target)) for event in page.object_list],
        "check": check, "checked_at": checked_at, "filters": filters, "query": urlencode(filters),
    }, status=200 if form.is_valid() or not request.GET else 400)


def _spreadsheet_safe(value: str) -> str:
    """A cell a spreadsheet shows as text: a leading = + - @ would make it a formula."""
    return "'" + value if value.startswith(SPREADSHEET_FORMULA_STARTS) else value


def export_row(event: Event) -> dict:
    return {"id": event.pk, "at": event.at.isoformat(), "actor": event.actor_label, "verb": event.verb,
            "target": event.target, "data": event.data, "hash": event.hash, "strand": event.strand}


def _csv_line(values: list) -> str:
    buffer = io.StringIO()
    csv.writer(buffer).writerow(values)
    return buffer.getvalue()


def _as_csv(row: dict) -> str:
    values = [json.dumps(row[name], sort_keys=True) if name == "data" else str(row[name]) for name in EXPORT_FIELDS]
    return _csv_line([_spreadsheet_safe(value) for value in values])


def _as_json_line(row: dict) -> str:
    return json.dumps(row, sort_keys=True) + "\n"


def _chunk(events, after: int | None) -> list[dict]:
    if after is not None:
        events = events.filter(pk__lt=after)
    return [export_row(event) for event in events[:EXPORT_CHUNK]]


async def _stream(events, line, header: str):
    """The export, a chunk of rows at a time (by id, newest first): never the whole log in memory, and no
    thread held while the client reads."""
    if header:
        yield header
    after = None
    while True:
        rows = await sync_to_async(_chunk)(events, after)
        for row in rows:
            yield line(row)
        if len(rows) < EXPORT_CHUNK:
            return
        after = rows[-1]["id"]


def _export(request, fmt: str):
    form = AuditFilterForm(request.GET or None)
    if request.GET and not form.is_valid():
        return tenant_redirect(request, "console:audit_log")
    events = filtered_events(request.tenant, form)
    if fmt == "csv":
        response = StreamingHttpResponse(_stream(events, _as_csv, _csv_line(list(EXPORT_FIELDS))),
                                         content_type="text/csv; charset=utf-8")
    else:
        response = StreamingHttpResponse(_stream(events, _as_json_line, ""), content_type="application/x-ndjson")
    stamp = timezone.now().strftime("%Y%m%d-%H%M%S")
    response["Content-Disposition"] = f'attachment; filename="audit-{request.tenant.slug}-{stamp}.{fmt}"'
    return response


@tenant_view(read=OPERATE)
def audit_export_csv(request):
    return _export(request, "csv")


@tenant_view(read=OPERATE)
def audit_export_jsonl(request):
    return _export(request, "jsonl")
