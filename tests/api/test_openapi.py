"""The OpenAPI schema and Swagger UI are served, self-contained (no CDN at page load)."""
from django.test import Client


def test_schema_documents_the_app_facing_routes(db):
    response = Client().get("/api/schema/", HTTP_ACCEPT="application/json")
    assert response.status_code == 200
    paths = response.json()["paths"]
    for path in ("/api/v1/sessions", "/api/v1/sessions/{session_id}/calls", "/api/v1/calls/{call_id}",
                 "/api/v1/calls/{call_id}/events", "/api/v1/calls/{call_id}/cancel", "/api/v1/rules/evaluate"):
        assert path in paths, path
    assert "apiKey" in response.json()["components"]["securitySchemes"]


def test_swagger_ui_loads_its_files_from_this_server(db):
    page = Client().get("/api/docs/").content.decode()
    assert "/static/drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js" in page
    assert "cdn." not in page and "jsdelivr" not in page
