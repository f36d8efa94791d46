"""Four-eyes compares the session's user with the reviewer: by username or e-mail, whatever the case or the
spaces around it; an empty name is nobody."""
import pytest
from django.contrib.auth import get_user_model

from approvals.services import _same_person

DORA = get_user_model()(username="Dora.Smith", email="Dora@Example.com")
NO_EMAIL = get_user_model()(username="eve", email="")


@pytest.mark.parametrize("reviewer,session_user,same", [
    (DORA, "Dora.Smith", True),
    (DORA, "dora.smith", True),
    (DORA, "  DORA.SMITH\t", True),
    (DORA, "dora@example.com", True),
    (DORA, " DORA@EXAMPLE.COM ", True),
    (DORA, "dora", False),
    (DORA, "dora.smith@example.com", False),
    (DORA, "", False),
    (NO_EMAIL, "", False),
    (NO_EMAIL, "   ", False),
    (NO_EMAIL, "Eve", True),
])
def test_four_eyes_knows_the_reviewer_by_username_or_email(reviewer, session_user, same):
    assert _same_person(reviewer, session_user) is same
