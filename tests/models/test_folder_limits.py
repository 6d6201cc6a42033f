"""A folder's own input limit (sr.models.limits), read from its JSON files alone."""

from __future__ import annotations

import json
import shutil

import pytest

from sr.config.schema import Deployment, InputLimits, Replica, SrConfig
from sr.errors import UsageError
from sr.models.limits import settle_input_limits, token_limits
from sr.models.testing import TINY_MAX_POSITIONS


def _edited(src, dst, **changes):
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**config, **changes}))
    return dst


def test_the_position_table_bounds_a_bert_folder(tiny_model_dir):
    limits = token_limits(tiny_model_dir)
    assert (limits.default, limits.ceiling) == (TINY_MAX_POSITIONS, TINY_MAX_POSITIONS)


@pytest.mark.parametrize("model_type", ["roberta", "xlm-roberta", "mpnet"])
def test_families_that_count_positions_from_padding_lose_pad_plus_one(
    tiny_model_dir, tmp_path, model_type
):
    folder = _edited(
        tiny_model_dir, tmp_path / "m", model_type=model_type, max_position_embeddings=514,
        pad_token_id=1,
    )  # fmt: skip
    assert token_limits(folder).ceiling == 512


def test_sentence_bert_config_sets_the_default_within_the_ceiling(tiny_model_dir, tmp_path):
    folder = _edited(tiny_model_dir, tmp_path / "m")
    (folder / "sentence_bert_config.json").write_text('{"max_seq_length": 100}')
    assert (token_limits(folder).default, token_limits(folder).ceiling) == (100, 128)
    (folder / "sentence_bert_config.json").write_text('{"max_seq_length": 4096}')
    assert token_limits(folder).default == 128  # never past what the model takes


def _config(artifact, max_tokens=None) -> SrConfig:
    cfg = SrConfig()
    cfg.deployments["primary"] = Deployment(
        artifact=str(artifact), input=InputLimits(max_tokens=max_tokens),
        replicas=[Replica(device="cpu")],
    )  # fmt: skip
    return cfg


def test_settling_fills_what_is_unset_keeps_what_is_set_and_skips_the_unresolved(
    tiny_model_dir,
):
    cfg = _config(tiny_model_dir)
    cfg.deployments["later"] = Deployment(artifact="/not/here/yet")
    cfg.deployments["mine"] = Deployment(artifact=str(tiny_model_dir), input=InputLimits(32))
    settle_input_limits(cfg)
    assert cfg.deployments["primary"].input.max_tokens == TINY_MAX_POSITIONS
    assert cfg.deployments["mine"].input.max_tokens == 32
    assert cfg.deployments["later"].input.max_tokens is None


def test_a_limit_above_the_model_is_refused_naming_both_numbers(tiny_model_dir):
    with pytest.raises(UsageError) as refused:
        settle_input_limits(_config(tiny_model_dir, max_tokens=129))
    assert str(refused.value) == (
        "global.model_catalog.deployments.primary.input.max_tokens 129 is above what the model"
        " takes (128 tokens, from its max_position_embeddings)"
    )
