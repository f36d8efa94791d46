"""The chains of steps (tools.catalog.registry.StepChain): filled by the apps that own the steps, run in the
order of their positions, a position never taken twice (docs/architecture.md)."""
import pytest

from approvals.pipeline import External, Permission
from tools.calls.aftercare import RESULT_STEPS, Cap, Redact, ResultRules, Retry
from tools.calls.pipeline import CALL_STEPS, Bind, Normalize, Validate, pipeline_steps
from tools.calls.submit import Dispatch
from tools.catalog.registry import StepChain


class First:
    name = "first"


class Second:
    name = "second"


def test_the_installed_chains_in_their_order():
    assert CALL_STEPS.classes() == [Normalize, Validate, Bind, Permission, External, ResultRules, Dispatch]
    assert RESULT_STEPS.classes() == [Retry, Redact, Cap]
    assert [type(step) for step in pipeline_steps()] == CALL_STEPS.classes()
    assert pipeline_steps() is pipeline_steps()  # built once


def test_steps_run_by_position_whatever_the_order_of_registration():
    chain = StepChain("a test chain")
    chain.register(20, Second)
    chain.register(10, First)
    assert chain.classes() == [First, Second]
    assert [step.name for step in chain.steps()] == ["first", "second"]


def test_a_position_is_taken_once_but_the_same_step_may_register_again():
    chain = StepChain("a test chain")
    chain.register(10, First)
    chain.register(10, First)  # an app's ready() run twice (tests) changes nothing
    with pytest.raises(ValueError, match="a test chain: position 10 is taken by First"):
        chain.register(10, Second)
    assert chain.classes() == [First]


def test_a_replaced_chain_comes_back_whole():
    chain = StepChain("a test chain")
    chain.register(10, First)
    before = chain.steps()
    with chain.replaced([Second, First]) as replaced:
        assert [type(step) for step in replaced.steps()] == [Second, First]
    assert chain.classes() == [First]
    assert [type(step) for step in chain.steps()] == [First] and chain.steps() is not before
