"""The submit endpoint reads the common body (one well-formed call) without DRF's serializers; whatever it
takes, it takes exactly as CallBatchSerializer does, and whatever else it leaves to the serializer."""
import math

from hypothesis import example, given, settings
from hypothesis import strategies as st

from tools.api.serializers import CallBatchSerializer, one_call_validated

TEXT = st.one_of(
    st.text(max_size=140),
    st.sampled_from(["", " ", "\t\n", "a\x00b", "\ud800", "x" * 128, "x" * 129, "é" * 128, "call_1", "echo"]),
)
JSON_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), TEXT)
JSON_VALUES = st.recursive(JSON_SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
    st.text(max_size=5), inner, max_size=3), max_leaves=8)
WAITS = st.one_of(st.integers(-5, 100), st.floats(allow_nan=True, allow_infinity=True), st.booleans(), TEXT,
                  st.none(), st.sampled_from([0, 60, 60.0, 60.000001, 10**30, -0.0]))
BODIES = st.fixed_dictionaries({}, optional={
    "name": st.one_of(TEXT, JSON_VALUES), "id": st.one_of(TEXT, JSON_VALUES),
    "input": st.one_of(st.dictionaries(st.text(max_size=5), JSON_VALUES, max_size=3), JSON_VALUES),
    "wait": WAITS, "calls": st.lists(st.fixed_dictionaries({"name": TEXT}), max_size=2), "extra": JSON_VALUES,
})


def drf(body):
    serializer = CallBatchSerializer(data=body)
    return serializer.validated_data if serializer.is_valid() else None


@settings(max_examples=1500, deadline=None)
@given(BODIES)
@example({"name": "echo"})
@example({"name": "echo", "id": "call_7", "input": {"a": [1, {"b": None}]}, "wait": 10})
@example({"name": "echo", "wait": 60})
@example({"name": "echo", "wait": 0.5})
@example({"name": " echo "})
def test_the_fast_reading_agrees_with_the_serializer(body):
    fast = one_call_validated(body)
    if fast is None:
        return  # left to the serializer
    assert fast == drf(body)
    assert type(fast["wait"]) is type(drf(body)["wait"])


def test_the_common_bodies_take_the_fast_reading():
    for body in ({"name": "echo"}, {"name": "echo", "input": {"q": 1}, "wait": 10},
                 {"name": "echo", "id": "call_1", "input": {}, "wait": 0.5}, {"name": "é" * 128}):
        assert one_call_validated(body) is not None, body
    for body in ({"calls": [{"name": "a"}]}, {"name": "echo", "extra": 1}, {"name": ""}, {"name": "x" * 129},
                 {"name": "echo", "wait": math.nan}, {"name": "echo", "wait": True}, {"name": "echo", "wait": "5"},
                 {"name": "echo", "input": []}, {"name": "a\x00"}, {"name": "\ud800"}, {"name": "  "}, [],
                 {"name": "echo", "wait": 61}):
        assert one_call_validated(body) is None, body


MOSTLY_VALID = st.fixed_dictionaries({"name": TEXT}, optional={
    "id": TEXT, "input": st.dictionaries(st.text(max_size=5), JSON_VALUES, max_size=3),
    "wait": st.one_of(st.integers(0, 60), st.floats(0, 60), st.floats(59.9, 60.1)),
})


@settings(max_examples=1500, deadline=None)
@given(MOSTLY_VALID)
@example({"name": "echo", "input": {"x": math.inf}})  # a JSON body can carry it: 1e999 parses as infinity
def test_on_bodies_that_are_mostly_right_both_readings_agree(body):
    fast, slow = one_call_validated(body), drf(body)
    assert fast == slow or fast is None and slow is None
