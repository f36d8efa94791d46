"""`calculate` bounds the size of what it computes, so no expression can hold the GIL past its timeout."""
import pytest

from tools.catalog.services import session_create
from tools.models import CallStatus
from tools.python.decorators import ToolError, python_tool

TOWER = "(((10**100)**100)**100)**8"


def calculate(expression: str):
    return python_tool("calculate")({"expression": expression})["value"]


@pytest.mark.parametrize("expression", [
    TOWER,
    "10**4000",
    "7**7**7",
    "(10**100)**(10**100)",
    "(10**2000)*(10**2000)",  # one multiplication past the bound
    "(10**1000)*(10**1000)*(10**1000)*(10**1000)*10",  # nested multiplications that each stay below it
    "-(10**3999)*100",
])
def test_integers_beyond_the_bound_are_refused(expression):
    with pytest.raises(ToolError) as raised:
        calculate(expression)
    assert raised.value.error_type == "InvalidInput"
    assert "4000 digits" in str(raised.value)


@pytest.mark.parametrize(("expression", "message"), [
    ("1e308*10", "floating-point"),
    ("10.0**400", "floating-point"),
    ("1e999", "floating-point"),
    ("(10**400)/3", "floating-point"),  # a huge integer as a float
    ("(10**3000)*1.5", "floating-point"),
    ("(-8)**0.5", "not a real number"),
    ("1//0", "division by zero"),
    ("(10**3999)%0", "division by zero"),
])
def test_overflows_are_clear_errors(expression, message):
    with pytest.raises(ToolError) as raised:
        calculate(expression)
    assert raised.value.error_type == "InvalidInput"
    assert message in str(raised.value)


def test_results_up_to_the_bound_are_exact():
    assert calculate("10**3999") == 10**3999
    assert len(str(calculate("2**13287"))) == 4000
    assert calculate("(10**3999 + 7) // (10**3990)") == 10**9
    assert calculate("(10**3999 + 7) % (10**3990)") == 7
    assert calculate("(9**4000) // 9**3999") == 9
    assert calculate("1**(10**400)") == 1
    assert calculate("2**-2") == 0.25
    assert calculate("(2 + 3) * 4") == 20


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("drain_calls")
def test_the_tower_of_powers_fails_as_invalid_input_through_the_executor(world):
    session = session_create(tenant=world.a.tenant, agent="calc-bot")
    response = world.a.client().post(f"/api/v1/sessions/{session.pk}/calls", {"calls": [
        {"name": "reset_tools", "input": {"math": True}},
        {"name": "calculate", "input": {"expression": TOWER}},
    ], "wait": 30}, format="json")
    assert response.status_code == 200, response.content
    call = response.json()["calls"][1]
    assert call["status"] == CallStatus.FAILED, call
    assert call["error"]["errorType"] == "InvalidInput"
    assert "4000 digits" in call["error"]["error"]
