import pytest
from worker_fakes import FakeModel, passing_golden, running

from sr.worker.options import WorkerOptions
from sr.worker.state import WorkerState


@pytest.fixture
def fake_model() -> FakeModel:
    return FakeModel()


@pytest.fixture
async def worker(tiny_model_dir):
    """A ready in-process WorkerService on the tiny checkpoint, default options."""
    opts = WorkerOptions(artifact=str(tiny_model_dir))
    async with running(opts, golden_check_fn=passing_golden) as service:
        assert service.state is WorkerState.READY, service.reason
        yield service
