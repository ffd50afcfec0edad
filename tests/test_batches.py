"""Packed and padded batches: the run says its tokens per step count padding (batch.layout), with a
warning, from the first batch's keys and shapes alone; a real Lightning Trainer hands them over."""

import json
import logging

import pytest
import torch

from lightning_modules import tiny_lm
from nemo_throughput import ThroughputCallback
from nemo_throughput.batches import batch_layout


def nemo_packed_batch():
    """As NeMo 2's GPTSFTPackedDataset.collate_fn builds one pack of 5 + 3 real tokens in 16 (mbs 1):
    cu_seqlens padded with -1, the pack's tail padding its own segment, the unpadded lengths beside."""
    return {"tokens": torch.randint(10, 100, (1, 16)), "labels": torch.randint(10, 100, (1, 16)),
            "loss_mask": torch.ones(1, 16), "position_ids": torch.arange(16).unsqueeze(0),
            "token_count": [8], "attention_mask": torch.tensor([1]),
            "cu_seqlens": torch.tensor([[0, 5, 8, 16, -1]], dtype=torch.int32),
            "cu_seqlens_argmin": torch.tensor([[4]]), "max_seqlen": torch.tensor([[8]]),
            "cu_seqlens_unpadded": torch.tensor([[0, 5, 8, 8, -1]], dtype=torch.int32),
            "cu_seqlens_unpadded_argmin": torch.tensor([[4]])}


@pytest.mark.parametrize("batch, layout", [
    (nemo_packed_batch(), "packed"),
    ({"tokens": torch.zeros(1, 16, dtype=torch.long), "cu_seqlens_q": torch.tensor([[0, 10, 16]]),
      "cu_seqlens_kv": torch.tensor([[0, 10, 16]])}, "packed"),  # Megatron-Bridge's / TE's names
    ({"input_ids": torch.zeros(4, 32, dtype=torch.long), "attention_mask": torch.ones(4, 32, dtype=torch.long)},
     "padded"),  # rows padded to a common length
    ({"tokens": torch.zeros(4, 32, dtype=torch.long), "attention_mask": torch.ones(1, 1, 32, 32, dtype=torch.bool)},
     "fixed"),  # Megatron's 4-D causal mask says nothing of padding
    (torch.zeros(4, 33, dtype=torch.long), "fixed"),
    ((torch.zeros(4, 32), torch.zeros(4)), "fixed"),
    (iter([]), None),  # what a Megatron strategy hands the hooks: no batch to read
    ({"text": ["a", "b"]}, None),
])
def test_the_layout_is_read_from_keys_and_shapes(batch, layout):
    assert batch_layout(batch) == layout


def token_rows(batch):
    return batch["tokens"] if "tokens" in batch else batch["input_ids"]


@pytest.mark.parametrize("batch, layout", [
    (nemo_packed_batch(), "packed"),
    ({"input_ids": torch.randint(128, (1, 16)), "attention_mask": torch.ones(1, 16, dtype=torch.long)}, "padded"),
    ({"tokens": torch.randint(128, (1, 16))}, "fixed"),
])
def test_a_run_on_packed_or_padded_batches_says_its_tokens_count_padding(tmp_path, quiet_trainer_kwargs, caplog,
                                                                        batch, layout):
    pl, module = tiny_lm(data=[batch] * 8, batch_size=None, vocab_size=128, tokens=token_rows)
    callback = ThroughputCallback(output_dir=str(tmp_path / "throughput"), log_every_n_steps=2, warmup_steps=1,
                                  micro_batch_size=1, seq_length=16,
                                  model_spec={"num_layers": 1, "hidden_size": 16, "num_attention_heads": 2,
                                              "vocab_size": 128})
    with caplog.at_level(logging.WARNING, logger="nemo_throughput"):
        pl.Trainer(max_steps=4, callbacks=[callback], logger=False, **quiet_trainer_kwargs).fit(module)
    summary = json.loads(open(callback.summary_path).read())
    assert summary["batch"]["layout"] == layout and summary["batch"]["token_count"] == "config"
    assert summary["batch"]["tokens_per_step"] == 16
    warned = [r.getMessage() for r in caplog.records if "padding included" in r.getMessage()]
    assert len(warned) == (0 if layout == "fixed" else 1)
    if warned:
        assert f"the training batches are {layout}" in warned[0] and "batch.layout: " + layout in warned[0]


def test_a_data_module_that_packs_says_so_where_the_hooks_see_no_batch(tmp_path, quiet_trainer_kwargs, caplog):
    """NeMo 2's FineTuningDataModule with packed_sequence_specs has packed_sequence_size > 0, and
    NeMo's Megatron strategy hands the hooks no batch to read: the data module's word stands."""
    from types import SimpleNamespace

    import pytorch_lightning as pl

    class PackingDataModule(pl.LightningDataModule):
        packed_sequence_size, seq_length, micro_batch_size, global_batch_size = 16, 16, 1, 1

        def train_dataloader(self):  # batches the layout cannot be read from
            return torch.utils.data.DataLoader([{"sample_ids": torch.tensor([i])} for i in range(8)], batch_size=None)

    class MegatronStyleLM(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.config = SimpleNamespace(num_layers=1, hidden_size=16, num_attention_heads=2, vocab_size=128)
            self.layer = torch.nn.Linear(16, 1)

        def training_step(self, batch, batch_idx):
            return self.layer(torch.randn(1, 16)).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    callback = ThroughputCallback(output_dir=str(tmp_path / "throughput"), log_every_n_steps=2, warmup_steps=1)
    with caplog.at_level(logging.WARNING, logger="nemo_throughput"):
        pl.Trainer(max_steps=4, callbacks=[callback], logger=False, **quiet_trainer_kwargs).fit(
            MegatronStyleLM(), datamodule=PackingDataModule())
    summary = json.loads(open(callback.summary_path).read())
    assert summary["batch"]["layout"] == "packed" and summary["batch"]["tokens_per_step"] == 16
    assert sum("the training batches are packed" in r.getMessage() for r in caplog.records) == 1
