from sr.worker.batching import padded_tokens, plan_batches


def lengths(batches):
    return [[len(r) for r in b] for b in batches]


def test_rows_are_sorted_by_length_to_minimise_padding():
    rows = [[0] * n for n in (9, 2, 5, 2, 9, 5)]
    batches = plan_batches(rows, len, max_num_seqs=2, max_num_batched_tokens=1000)
    assert lengths(batches) == [[2, 2], [5, 5], [9, 9]]


def test_token_budget_counts_rows_times_longest_row():
    rows = [[0] * n for n in (4, 4, 4, 10)]
    batches = plan_batches(rows, len, max_num_seqs=64, max_num_batched_tokens=20)
    # three 4-token rows pad to 12 tokens; adding the 10-token row would pad to 40 > 20
    assert lengths(batches) == [[4, 4, 4], [10]]
    assert all(padded_tokens([len(r) for r in b]) <= 20 for b in batches)


def test_a_row_over_the_budget_runs_alone():
    rows = [[0] * 50, [0] * 3]
    assert lengths(plan_batches(rows, len, max_num_seqs=8, max_num_batched_tokens=16)) == [
        [3],
        [50],
    ]


def test_equal_lengths_keep_arrival_order():
    rows = [[1, 1], [2, 2], [3, 3]]
    assert plan_batches(rows, len, max_num_seqs=2, max_num_batched_tokens=100) == [
        [[1, 1], [2, 2]],
        [[3, 3]],
    ]
