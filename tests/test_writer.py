"""The streaming shard writer: what it writes must read back through the safetensors library,
bit for bit, for every dtype and odd shape a checkpoint can hold."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from w4cli.write.writer import OutputTensor, plan_shards, write_shards


def output(name: str, value: torch.Tensor) -> OutputTensor:
    return OutputTensor(name, tuple(value.shape), value.dtype, lambda: value, value.nbytes)


def test_every_dtype_and_shape_reads_back_bit_for_bit(tmp_path):
    g = torch.Generator().manual_seed(0)
    values = {
        "f16": torch.randn(3, 5, generator=g).half(),
        "bf16": torch.randn(7, generator=g).bfloat16(),
        "f32": torch.randn(2, 3, 4, generator=g),
        "f64": torch.randn(3, generator=g).double(),
        "i32": torch.randint(-(2**31), 2**31, (4, 4), generator=g, dtype=torch.int64).to(torch.int32),
        "i64": torch.arange(5),
        "u8": torch.arange(11, dtype=torch.uint8),
        "bool": torch.tensor([True, False, True]),
        "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 4),
        "negzero": torch.tensor([-0.0, 0.0, float("nan"), float("-inf")]).half(),
    }
    plan = plan_shards([output(n, v) for n, v in values.items()], max_shard_size=64, provenance={})
    assert len(plan.files) > 1 and plan.index is not None
    produced, written = write_shards(tmp_path, plan, lambda n: None)
    assert produced >= 0 and written >= 0
    loaded = {}
    for file in plan.files:
        with safe_open(tmp_path / file, framework="pt") as handle:
            assert handle.metadata() == {"format": "pt"}
        loaded.update(load_file(tmp_path / file))
    assert loaded.keys() == values.keys()
    for name, value in values.items():
        got = loaded[name]
        assert got.dtype == value.dtype and got.shape == value.shape, name
        assert torch.equal(got.reshape(-1).view(torch.uint8), value.reshape(-1).view(torch.uint8)), name
    assert (tmp_path / "model.safetensors.index.json").is_file()


def test_a_producer_that_lies_about_its_shape_is_caught(tmp_path):
    liar = OutputTensor("x", (2, 2), torch.float16, lambda: torch.zeros(3, dtype=torch.float16), 8)
    with pytest.raises(AssertionError, match="planned"):
        write_shards(tmp_path, plan_shards([liar], max_shard_size=1000, provenance={}), lambda n: None)


def test_a_failing_write_on_the_writer_thread_is_raised(tmp_path, monkeypatch):
    import w4cli.write.writer as writer

    class FullDisk:
        def __init__(self, *args):
            self.writes = 0

        def write(self, chunk):
            self.writes += 1
            if self.writes > 1:  # the header goes through, the first tensor does not
                raise OSError("No space left on device")

        def close(self):
            pass

    monkeypatch.setattr(writer.shard_file, "open_shard", FullDisk)
    plan = plan_shards([output(f"x{i}", torch.ones(4)) for i in range(4)], max_shard_size=1000, provenance={})
    with pytest.raises(OSError, match="No space left"):
        write_shards(tmp_path, plan, lambda n: None)
