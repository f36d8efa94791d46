"""Large ingests run as work that reports progress: a `knowledge_ingest` call on the executor."""
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from knowledge.models import Document
from knowledge.services import BATCH_SIZE, dataset_create
from tests.tools.support import wait_terminal
from tools.calls.submit import calls_submit
from tools.catalog.services import session_create
from tools.models import CallEvent, CallStatus, Tool, ToolCall


def _documents(n: int) -> list[dict]:
    return [{"title": f"Runbook {i}", "text": f"Step {i}: restart the ingest worker number {i} and check the queue."}
            for i in range(n)]


def _progress(call) -> list[float]:
    events = CallEvent.objects.for_tenant(call.tenant_id).filter(call=call, kind="progress").order_by("seq")
    return [event.data["progress"] for event in events]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("drain_calls", "threads_share_the_database")
def test_a_large_bulk_ingest_runs_as_work_with_progress(world):
    dataset = dataset_create(tenant=world.a.tenant, name="runbooks")
    admin = world.a.client("admin")
    total = BATCH_SIZE + 50
    documents = [{"dataset": "runbooks", **doc} for doc in _documents(total)]
    response = admin.post("/api/v1/documents", documents, format="json")
    assert response.status_code == 202, response.content
    [work] = response.json()["work"]
    assert work["tool"] == "knowledge_ingest" and work["status"] in ("queued", "running", "succeeded")
    call = wait_terminal(work["id"], tenant=world.a.tenant)
    assert call.status == CallStatus.SUCCEEDED, call.error
    assert call.result["structured"]["created"] == total
    assert Document.objects.for_tenant(world.a.tenant).filter(dataset=dataset).count() == total
    # Progress was reported batch by batch, rising to done.
    assert _progress(call) == [BATCH_SIZE / total, 1.0]
    # The operator follows it through the API with the admin key, as the 202 suggests.
    detail = admin.get(f"/api/v1/calls/{work['id']}")
    assert detail.status_code == 200 and detail.json()["status"] == "succeeded"
    events = admin.get(f"/api/v1/calls/{work['id']}/events").json()["events"]
    assert [e["data"]["text"] for e in events if e["kind"] == "progress"] == [
        f"{BATCH_SIZE}/{total} documents ingested", f"{total}/{total} documents ingested"]
    # Tenant B sees neither the work nor the documents.
    assert world.b.client("admin").get(f"/api/v1/calls/{work['id']}").status_code == 404
    assert not Document.objects.for_tenant(world.b.tenant).exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("drain_calls", "threads_share_the_database")
def test_a_large_console_upload_runs_as_work_and_leads_to_its_progress(world):
    dataset = dataset_create(tenant=world.a.tenant, name="notes")
    files = [SimpleUploadedFile(f"note-{i}.md", f"# Note {i}\n\nThe ingest of note {i}.".encode())
             for i in range(BATCH_SIZE + 1)]
    response = world.a.console("operator").post(f"/t/acme/knowledge/datasets/{dataset.pk}/upload/", {"files": files})
    assert response.status_code == 302, response.content[:500]
    work = ToolCall.objects.for_tenant(world.a.tenant).get(tool_name="knowledge_ingest")
    assert response["Location"] == f"/t/acme/calls/{work.pk}/"
    call = wait_terminal(work.pk, tenant=world.a.tenant)
    assert call.status == CallStatus.SUCCEEDED, call.error
    assert Document.objects.for_tenant(world.a.tenant).filter(dataset=dataset).count() == BATCH_SIZE + 1
    assert _progress(call)[-1] == 1.0


@pytest.mark.django_db
def test_a_bad_document_in_a_large_ingest_stores_nothing_and_starts_nothing(world):
    dataset_create(tenant=world.a.tenant, name="runbooks")
    documents = [{"dataset": "runbooks", **doc} for doc in _documents(BATCH_SIZE + 5)]
    documents[-1]["text"] = ""
    response = world.a.client("admin").post("/api/v1/documents", documents, format="json")
    assert response.status_code == 400, response.content
    assert not ToolCall.objects.for_tenant(world.a.tenant).filter(tool_name="knowledge_ingest").exists()
    assert not Document.objects.for_tenant(world.a.tenant).exists()


@pytest.mark.django_db
def test_models_are_never_offered_the_ingest_work(world):
    session = session_create(tenant=world.a.tenant, agent="support-bot")
    tools = world.a.client().get(f"/api/v1/sessions/{session.pk}/tools").json()["tools"]
    assert "knowledge_ingest" not in {tool["function"]["name"] for tool in tools}
    [call] = calls_submit(session=session, calls=[{"name": "knowledge_ingest",
                                                   "input": {"dataset_id": 1, "documents": []}}])
    assert call.status == CallStatus.FAILED and call.error["errorType"] == "ToolNotAvailable"


@pytest.mark.django_db
def test_a_large_upload_with_the_ingest_tool_disabled_is_refused_on_the_page(world):
    """An operator may disable `knowledge_ingest`; a large upload then says so (400), storing nothing."""
    Tool.objects.for_tenant(world.a.tenant).filter(name="knowledge_ingest").update(enabled=False)
    dataset = dataset_create(tenant=world.a.tenant, name="notes")
    files = [SimpleUploadedFile(f"note-{i}.md", f"# Note {i}\n\nText {i}.".encode()) for i in range(BATCH_SIZE + 1)]
    response = world.a.console("operator").post(f"/t/acme/knowledge/datasets/{dataset.pk}/upload/", {"files": files})
    assert response.status_code == 400
    assert b"knowledge_ingest is not available" in response.content
    assert not ToolCall.objects.for_tenant(world.a.tenant).filter(tool_name="knowledge_ingest").exists()
    assert not Document.objects.for_tenant(world.a.tenant).exists()
