import pytest
from worker_fakes import FakeModel


@pytest.fixture
def fake_model() -> FakeModel:
    return FakeModel()
