"""Rate limits are shared by the server processes of a deployment: two daphne processes count requests
into the same windows (Redis), so a client cannot get more by spreading its requests over them."""
import time

import httpx
import pytest

pytestmark = [pytest.mark.live, pytest.mark.postgres, pytest.mark.xdist_group("distributed")]

TENANT_LIMIT = 6
SEED = f"""
import json
from tenancy.services import apikey_create, tenant_create

tenant = tenant_create(slug="metered", key_requests_per_minute=0, tenant_requests_per_minute={TENANT_LIMIT})
keys = [apikey_create(tenant=tenant, name=f"admin {{n}}", scopes=["admin"]).key for n in range(2)]
print(json.dumps({{"keys": keys}}))
"""
MIN_LEFT_IN_WINDOW_S = 20  # the few requests below take well under this


def start_of_a_fresh_window() -> None:
    """Bounded wait, so that the requests below fall into one one-minute window."""
    left = 60 - time.time() % 60
    if left < MIN_LEFT_IN_WINDOW_S:
        time.sleep(left + 0.5)


def test_two_server_processes_share_the_tenants_count(deployment):
    keys = deployment.stack.shell(SEED)["keys"]
    with deployment.stack.another_daphne() as second:
        first_url, second_url = deployment.url, second.url
        clients = [httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=30)
                   for url, key in ((first_url, keys[0]), (second_url, keys[1]))]
        try:
            start_of_a_fresh_window()
            window = int(time.time() // 60)
            answers = [clients[n % 2].get("/api/v1/tools").status_code for n in range(TENANT_LIMIT)]
            assert answers == [200] * TENANT_LIMIT
            refused = [client.get("/api/v1/tools") for client in clients]
            assert int(time.time() // 60) == window, "precondition: every request in one window"
        finally:
            for client in clients:
                client.close()
    for response in refused:
        assert response.status_code == 429, response.text
        assert 1 <= int(response.headers["Retry-After"]) <= 60
        assert response.json()["error"]["code"] == "rate_limited"
