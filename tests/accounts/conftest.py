import pytest

from tests.accounts.stand_in import StandIn


@pytest.fixture
def stand_in():
    served = StandIn()
    yield served
    served.stop()
