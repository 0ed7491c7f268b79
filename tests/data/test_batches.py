import numpy as np
import pytest
import torch

from attnlab.data import SequentialBatches, random_batch, rank_shard

STREAM = np.arange(10_000, dtype=np.uint16)  # token value == position: windows are checkable


def test_random_batch_shapes_shift_and_contiguity():
    x, y = random_batch(STREAM, batch_size=8, seq_len=32, seed=1, step=5)
    assert x.shape == y.shape == (8, 32) and x.dtype == y.dtype == torch.int64
    assert torch.equal(y[:, :-1], x[:, 1:])
    assert torch.equal(y, x + 1)  # y is the next token of x in the stream
    assert torch.equal(x, x[:, :1] + torch.arange(32))  # each row is one contiguous window


def test_random_batch_is_a_pure_function_of_seed_step_rank():
    a = random_batch(STREAM, 8, 32, seed=1, step=5)
    assert all(torch.equal(u, v) for u, v in zip(a, random_batch(STREAM, 8, 32, 1, 5), strict=True))
    for other in (
        random_batch(STREAM, 8, 32, 1, 6),
        random_batch(STREAM, 8, 32, 2, 5),
        random_batch(STREAM, 8, 32, 1, 5, rank=1, world_size=2),
    ):
        assert not torch.equal(a[0], other[0])
    torch.manual_seed(123)  # the global RNG plays no part
    assert torch.equal(a[0], random_batch(STREAM, 8, 32, seed=1, step=5)[0])


def test_ranks_draw_from_disjoint_contiguous_shards():
    seen = []
    for rank in range(4):
        values = set()
        for step in range(20):
            x, y = random_batch(STREAM, 16, 8, seed=0, step=step, rank=rank, world_size=4)
            values |= set(x.flatten().tolist()) | set(y.flatten().tolist())
        assert min(values) >= rank * 2500 and max(values) < (rank + 1) * 2500
        seen.append(values)
    assert all(not seen[i] & seen[j] for i in range(4) for j in range(i + 1, 4))


def test_sequential_chunks_continue_each_lane():
    batches = SequentialBatches(STREAM[:1001], batch_size=4, seq_len=10)
    assert len(batches) == (250 - 1) // 10 == 24
    for i in range(len(batches) - 1):
        (x0, y0), (x1, _) = batches.get(i), batches.get(i + 1)
        assert torch.equal(x1[:, 0], y0[:, -1])  # chunk i+1 starts where chunk i ended
        assert torch.equal(x1[:, 0], x0[:, -1] + 1)
        assert torch.equal(y0, x0 + 1) and x0.shape == (4, 10)
    first_x, _ = batches.get(0)
    assert first_x[:, 0].tolist() == [0, 250, 500, 750]  # lanes are contiguous quarters
    assert torch.equal(batches.get(len(batches) + 3)[0], batches.get(3)[0])  # wraps


def test_sequential_iteration_covers_each_chunk_once():
    batches = SequentialBatches(STREAM[:1001], batch_size=4, seq_len=10)
    chunks = list(batches)
    assert len(chunks) == len(batches)
    inputs = torch.cat([x for x, _ in chunks], dim=1)
    assert torch.equal(inputs, torch.arange(1000).reshape(4, 250)[:, :240])


def test_sequential_rank_shards_are_disjoint():
    a = SequentialBatches(STREAM, 2, 16, rank=0, world_size=2)
    b = SequentialBatches(STREAM, 2, 16, rank=1, world_size=2)
    values_a = torch.cat([torch.cat(pair) for pair in a]).unique()
    values_b = torch.cat([torch.cat(pair) for pair in b]).unique()
    assert values_a.max() < 5000 <= values_b.min()


def test_too_short_streams_and_bad_ranks_raise():
    with pytest.raises(ValueError, match="too short for 4 lanes of seq_len \\+ 1 = 11"):
        SequentialBatches(STREAM[:40], batch_size=4, seq_len=10)
    with pytest.raises(ValueError, match="too short for windows"):
        random_batch(STREAM[:10], 2, 10, seed=0, step=0)
    with pytest.raises(ValueError, match="rank < world_size"):
        rank_shard(STREAM, rank=2, world_size=2)
    with pytest.raises(ValueError, match="must be >= 1"):
        random_batch(STREAM, 0, 10, seed=0, step=0)
