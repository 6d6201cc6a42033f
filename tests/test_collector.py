"""sr.collector: the collector is off inside the block, and on again after it, with what the
block made frozen, however the block ends."""

from __future__ import annotations

import gc

import pytest

from sr.collector import imports_uncollected


@pytest.fixture(autouse=True)
def unfrozen():
    yield
    gc.unfreeze()  # the test process's objects go back to the collector
    assert gc.isenabled()


def test_the_block_runs_with_the_collector_off_and_what_it_made_is_frozen():
    frozen_before = gc.get_freeze_count()
    with imports_uncollected():
        collecting = gc.isenabled()
        made = [[] for _ in range(1000)]
    assert not collecting
    assert gc.isenabled()
    assert gc.get_freeze_count() >= frozen_before + len(made)


def test_a_block_that_raises_leaves_the_collector_on():
    with pytest.raises(ImportError), imports_uncollected():
        raise ImportError("no such module")
    assert gc.isenabled()
