#!/usr/bin/env python
"""What acting as someone's own account costs a call, over acting with the tenant's credential (docs/accounts.md).

In-process, on a fresh embedded database (a temporary data dir, migrated): one tenant, an HTTP tool with a stored
secret (the tenant credential), an OAuth provider of HTTP tools in each mode and a person's account at it, with
tokens that are valid (no renewal is due: that is the common case; a renewal is a round trip to the authorization
server, measured by nobody here). Each is what `tools.http_tools.services.HttpSource.invoke` does before it sends
the request:

- tenant:  read the endpoint and its stored secrets (one query, decrypt)       → the baseline
- service: the same, then `vault.call_token` for a service-account provider (one query, decrypt)
- person:  the same, then `vault.call_token` for a person-mode provider (the membership check, one query,
           decrypt)

Prints p50/p99 in µs and the ratio to the baseline of the same run; `--json PATH` writes the figures.

    .venv/bin/python bench/account_token.py [--quick] [--json PATH]
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "platform")]
os.environ["TOOLKEEPER_DATA_DIR"] = tempfile.mkdtemp(prefix="tk-bench-accounts-")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "toolkeeper.settings")

import django  # noqa: E402

django.setup()

from django.contrib.auth import get_user_model  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.utils import timezone  # noqa: E402

from tenancy.models import Membership, Role, Tenant  # noqa: E402
from tools.accounts import vault  # noqa: E402
from tools.catalog.services import session_create  # noqa: E402
from tools.models import HttpEndpoint, OAuthProvider, Tool, ToolSource, UpstreamAccount  # noqa: E402

AS = "https://93.184.215.14"


def world():
    call_command("migrate", verbosity=0)
    tenant = Tenant.objects.create(slug="bench", name="Bench")
    person = get_user_model().objects.create_user(username="bench-person", email="p@example.com")
    Membership.objects.create(tenant=tenant, user=person, role=Role.OPERATOR)
    tool = Tool.objects.create(tenant=tenant, name="bench_http", source=ToolSource.HTTP, trusted=True)
    endpoint = HttpEndpoint.objects.create(tenant=tenant, tool=tool, url_template=AS + "/x",
                                           headers={"Authorization": "Bearer {secret:t}"}, secrets={"t": "x" * 40})
    later = timezone.now() + timedelta(days=1)
    providers = {}
    for mode in ("service", "person"):
        provider = OAuthProvider.objects.create(
            tenant=tenant, name=mode, accounts=mode, api_url=AS + "/x", token_endpoint=AS + "/token",
            authorization_endpoint=AS + "/authorize" if mode == "person" else "",
            client={"client_id": "bench", "client_secret": "s" * 32})
        UpstreamAccount.objects.create(
            tenant=tenant, oauth_provider=provider, user=person if mode == "person" else None,
            tokens={"access_token": "a" * 800, "refresh_token": "r" * 40}, token_endpoint=provider.token_endpoint,
            client_id="bench", expires_at=later)
        providers[mode] = provider
    session = session_create(tenant=tenant, agent="bench", user=person.username, user_verified=True, person=person)
    return endpoint, providers, session


def measure(fn, rounds: int) -> list[float]:
    for _ in range(min(200, rounds)):
        fn()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e6)
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json")
    args = parser.parse_args()
    rounds = 2_000 if args.quick else 20_000
    endpoint, providers, session = world()

    def tenant_credential():
        return dict(HttpEndpoint.objects.for_tenant(endpoint.tenant_id).get(pk=endpoint.pk).secrets)

    cases = {
        "tenant": tenant_credential,
        "service": lambda: (tenant_credential(), vault.call_token(upstream=providers["service"], session=session)),
        "person": lambda: (tenant_credential(), vault.call_token(upstream=providers["person"], session=session)),
    }
    # interleaved in rounds of a tenth, so a slow moment of the machine falls on every case alike
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(10):
        for name, fn in cases.items():
            times[name] += measure(fn, rounds // 10)
    base = statistics.median(times["tenant"])
    report = {}
    print(f"{'case':8} {'p50 µs':>9} {'p99 µs':>9} {'× tenant':>9}")
    for name, values in times.items():
        values.sort()
        p50, p99 = statistics.median(values), values[int(len(values) * 0.99) - 1]
        report[name] = {"p50_us": round(p50, 1), "p99_us": round(p99, 1), "ratio_p50": round(p50 / base, 2)}
        print(f"{name:8} {p50:9.1f} {p99:9.1f} {p50 / base:9.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
