"""Shared fixtures: tiny seeded-random BERT checkpoints (real MiniLM tokenizer)."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from sr.models.testing import write_tiny_bert

TINY_HEAD_LABELS = ["negative", "neutral", "positive"]


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A tiny BERT: mean pooling + Normalize, no classification head."""
    return write_tiny_bert(tmp_path_factory.mktemp("tiny-bert"), seed=0)


@pytest.fixture(scope="session")
def tiny_head_model_dir(tmp_path_factory) -> Path:
    """A tiny BERT with a 3-label BertForSequenceClassification head."""
    return write_tiny_bert(
        tmp_path_factory.mktemp("tiny-bert-head"), seed=1, with_head=True, labels=TINY_HEAD_LABELS
    )


# The kernel probe's answer is kept on disk (sr.models.probe_cache): the suite keeps its own,
# for this run only, and every process it starts inherits the setting.
if "SR_CACHE_DIR" not in os.environ:
    os.environ["SR_CACHE_DIR"] = tempfile.mkdtemp(prefix="sr-test-cache-")
    atexit.register(shutil.rmtree, os.environ["SR_CACHE_DIR"], True)


# The clients the e2e tests drive stay off the network: litellm reads its model cost map
# from its own package instead of fetching it, haystack sends no telemetry, and
# huggingface_hub does not fetch its agent registry from the Hub for its user agent. Each is
# read when the library is imported, so set here, before any test module imports them.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
