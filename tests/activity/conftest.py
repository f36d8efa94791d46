import pytest
from django.contrib.auth import get_user_model

from tenancy.services import tenant_create


@pytest.fixture
def quiet(db):
    """A tenant with no calls yet (the shared world's tenants have some, made when it was built)."""
    admin = get_user_model().objects.create_user(username="quiet-admin", password="x" * 20)
    return tenant_create(slug="quiet", name="Quiet", admin=admin, default_behavior="allow")
