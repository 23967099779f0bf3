"""ShardReader.scan reads `chunk_bytes` of stored states at a time, whatever their dtype."""

import pytest
import torch
from safetensors.torch import save_file

from drafter_lab.data.shards import ShardReader


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_scan_reads_chunk_bytes_of_rows_in_the_shards_own_dtype(tmp_path, dtype):
    """Sized for 4-byte floats, a bf16 shard was scanned in chunks of half the bytes asked for."""
    T, H = 12, 2
    path = tmp_path / "train-00000.safetensors"
    save_file({"input_ids": torch.ones(T, dtype=torch.int32), "loss_mask": torch.ones(T, dtype=torch.uint8),
               "aux_hidden": torch.zeros(T, 3 * H, dtype=dtype), "final_hidden": torch.zeros(T, H, dtype=dtype),
               "offsets": torch.tensor([0, T], dtype=torch.int64)}, str(path), metadata={"seq_ids": '["a"]'})
    reader, spans = ShardReader(), []
    rows = reader.rows

    def recorded(p, key, a, b, f=None):
        spans.append((key, a, min(b, T)))
        return rows(p, key, a, b, f)

    reader.rows = recorded
    itemsize = torch.empty((), dtype=dtype).element_size()
    reader.scan(path, chunk_bytes=4 * itemsize * 3 * H)  # four aux rows, twelve final rows
    chunks = {key: [(a, b) for k, a, b in spans if k == key] for key in ("aux_hidden", "final_hidden")}
    # a row first, for the dtype's size
    assert chunks == {"aux_hidden": [(0, 1), (0, 4), (4, 8), (8, 12)], "final_hidden": [(0, 1), (0, 12)]}


def test_scan_of_a_shard_without_rows_reads_nothing(tmp_path):
    path = tmp_path / "train-00000.safetensors"
    save_file({"input_ids": torch.ones(0, dtype=torch.int32), "loss_mask": torch.ones(0, dtype=torch.uint8),
               "aux_hidden": torch.zeros(0, 6), "final_hidden": torch.zeros(0, 2),
               "offsets": torch.tensor([0], dtype=torch.int64)}, str(path), metadata={"seq_ids": "[]"})
    ShardReader().scan(path, vocab_size=8)
