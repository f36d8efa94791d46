def test_world_builds_two_separate_tenants(world):
    assert world.a.tenant.pk != world.b.tenant.pk
    response = world.a.client().get(f"/api/v1/sessions/{world.a.session.pk}")
    assert response.status_code == 200
    assert response.json()["agent"] == "support-bot"
    foreign = world.a.client().get(f"/api/v1/sessions/{world.b.session.pk}")
    assert foreign.status_code == 404
    assert foreign.json() == {"error": {"code": "not_found", "message": "Not found.", "fields": {}}}
