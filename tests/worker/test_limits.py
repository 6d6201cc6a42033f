import pytest
from worker_fakes import FakeModel

from sr.errors import UsageError
from sr.worker.options import WorkerOptions
from sr.worker.warmup import CPU_MAX_NUM_BATCHED_TOKENS, CPU_MAX_NUM_SEQS, resolve_limits


def test_cpu_worker_uses_the_documented_defaults():
    limits = resolve_limits(WorkerOptions(artifact="a"), FakeModel())
    assert (limits.max_num_seqs, limits.max_num_batched_tokens, limits.source) == (
        CPU_MAX_NUM_SEQS,
        CPU_MAX_NUM_BATCHED_TOKENS,
        "cpu_default",
    )
    assert limits.max_input_tokens == 64  # no --max-tokens: the model's 64 positions


def test_configured_caps_win_everywhere():
    opts = WorkerOptions(artifact="a", device="cuda:0", max_num_seqs=4, max_num_batched_tokens=512)
    limits = resolve_limits(opts, FakeModel(), mem_get_info=lambda device: pytest.fail("probed"))
    assert (limits.max_num_seqs, limits.max_num_batched_tokens, limits.source) == (
        4,
        512,
        "configured",
    )


def test_gpu_worker_calibrates_from_free_memory():
    free = [2**20]  # tiny: the fake model has 4 dims

    def mem_get_info(device):
        return free[0], 80 * 2**30

    opts = WorkerOptions(artifact="a", device="cuda:0")
    small = resolve_limits(opts, FakeModel(), mem_get_info=mem_get_info)
    free[0] = 40 * 2**20
    large = resolve_limits(opts, FakeModel(), mem_get_info=mem_get_info)
    assert small.source == large.source == "calibrated"
    assert 64 <= small.max_num_batched_tokens < large.max_num_batched_tokens <= 65536
    assert 1 <= small.max_num_seqs <= large.max_num_seqs <= 256


@pytest.mark.parametrize(
    ("kwargs", "flag"),
    [
        ({"threads": 0}, "--threads"),
        ({"profile": "fast"}, "--profile"),
        ({"overflow": "drop"}, "--overflow"),
        ({"max_num_batched_tokens": 100, "max_tokens": 256}, "--max-num-batched-tokens"),
        ({"device": "tpu:0"}, "--device"),
    ],
)
def test_bad_options_name_the_flag(kwargs, flag):
    with pytest.raises(UsageError, match=flag):
        WorkerOptions(artifact="a", **kwargs).validate()


def test_the_input_cap_is_max_tokens_else_the_folders_own():
    model = FakeModel()
    assert resolve_limits(WorkerOptions(artifact="a", max_tokens=32), model).max_input_tokens == 32
    model.max_seq_length = 48  # sentence_bert_config.json's
    assert resolve_limits(WorkerOptions(artifact="a"), model).max_input_tokens == 48
    model.max_seq_length = 500  # beyond the positions: they bound it
    assert resolve_limits(WorkerOptions(artifact="a"), model).max_input_tokens == 64


def test_a_cap_the_model_cannot_take_is_refused_naming_both_numbers():
    with pytest.raises(UsageError) as refused:
        resolve_limits(WorkerOptions(artifact="a", max_tokens=256), FakeModel())
    assert str(refused.value) == (
        "--max-tokens 256 is above what the model takes (64 tokens, from its "
        "max_position_embeddings)"
    )
    opts = WorkerOptions(artifact="a", max_num_seqs=2, max_num_batched_tokens=32)
    with pytest.raises(UsageError, match=r"^--max-num-batched-tokens: must be >= the input cap"):
        resolve_limits(opts, FakeModel())
