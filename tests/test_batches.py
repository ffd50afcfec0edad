"""Packed and padded batches: their layout read from the first batch's keys and shapes; their real
tokens, slots and squared sequence lengths counted per step (exact expected values), and where they
cannot be read, a warning and the config's count; a real Lightning Trainer hands them over."""

import csv
import itertools
import json
import logging
from pathlib import Path

import pytest
import torch

from conftest import read_json
from lightning_modules import tiny_lm
from nemo_throughput import ThroughputCallback
from nemo_throughput.batches import TokenCounter, batch_layout
from nemo_throughput.flops import ModelSpec, flops_terms
from nemo_throughput.progress import LOGGED_KEYS, TELEMETRY_KEYS
from nemo_throughput.report.runs import load_run
from nemo_throughput.throughput import METRIC_KEYS


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


def packed(*lengths, pack=16):
    """A NeMo 2 pack (mbs 1) of sequences of ``lengths`` in ``pack`` token slots, as nemo_packed_batch."""
    bounds = [0, *itertools.accumulate(lengths)]
    padded = [*bounds, pack] if bounds[-1] < pack else bounds  # the tail padding: a segment of cu_seqlens
    width = len(padded) + 1
    return {"tokens": torch.randint(10, 100, (1, pack)), "position_ids": torch.arange(pack).unsqueeze(0),
            "cu_seqlens": torch.tensor([padded + [-1] * (width - len(padded))], dtype=torch.int32),
            "cu_seqlens_unpadded": torch.tensor([bounds + [bounds[-1]] * (len(padded) - len(bounds))
                                                 + [-1] * (width - len(padded))], dtype=torch.int32)}


def counts(*batches):
    counter = TokenCounter()
    for batch in batches:
        counter.add_batch(batch)
    return counter.step_done().read(), counter.source


def test_a_packed_step_counts_real_tokens_slots_and_squared_lengths():
    assert counts(nemo_packed_batch()) == ((8.0, 16.0, 34.0), "cu_seqlens_unpadded")  # 5 + 3; 25 + 9
    assert counts(packed(5, 3), packed(7, 6, 2)) == ((23.0, 32.0, 34.0 + 89.0), "cu_seqlens_unpadded")
    assert counts({"tokens": torch.zeros(1, 16), "cu_seqlens": torch.tensor([[0, 10, 16, -1, -1]])}) == \
        ((16.0, 16.0, 136.0), "cu_seqlens")  # no unpadded boundaries: every segment counts
    assert counts({"tokens": torch.zeros(1, 16), "cu_seqlens_q": torch.tensor([0, 4, 16])}) == \
        ((16.0, 16.0, 160.0), "cu_seqlens_q")  # Transformer Engine's one-dimensional THD boundaries


def test_a_padded_step_counts_each_rows_mask():
    mask = torch.tensor([[1] * 5 + [0] * 3, [1] * 8])
    assert counts({"input_ids": torch.zeros(2, 8, dtype=torch.long), "attention_mask": mask}) == \
        ((13.0, 16.0, 89.0), "attention_mask")


@pytest.mark.parametrize("batch, why", [
    ({"tokens": torch.zeros(1, 16), "cu_seqlens": [0, 8, 16]}, "cu_seqlens is list"),
    ({"cu_seqlens": torch.tensor([0, 8, 16])}, "without the token rows"),
    ([torch.zeros(1, 16)], "not a mapping"),
])
def test_a_batch_whose_lengths_cannot_be_read_stops_the_count_and_says_why(batch, why):
    counter = TokenCounter()
    counter.add_batch(packed(8))
    counter.add_batch(batch)
    assert counter.step_done() is None and why in counter.unreadable
    counter.add_batch(packed(8))
    assert counter.step_done() is None  # never counted in part


PACKS = [packed(5, 3), packed(7, 6, 2), packed(16), packed(9)]  # real tokens 8, 15, 16, 9 of 16 slots
SPEC = {"num_layers": 1, "hidden_size": 16, "num_attention_heads": 2, "vocab_size": 128}


def expected_step(packs, formula="megatron"):
    """The mean step of ``packs`` (one per step) counted by hand: real tokens, slots, sum of squared lengths,
    FLOPs (GEMMs on every slot, attention on the squares)."""
    lengths = [[int(b) - int(a) for a, b in itertools.pairwise(p["cu_seqlens_unpadded"][0].tolist())
                if b >= 0 and b > a] for p in packs]
    tokens = sum(map(sum, lengths)) / len(packs)
    squares = sum(n * n for row in lengths for n in row) / len(packs)
    per_token, per_token_pair = flops_terms(ModelSpec(seq_length=16, **SPEC), formula)
    return tokens, 16.0, squares, per_token * 16 + per_token_pair * squares


def test_a_run_on_packed_batches_counts_what_its_batches_held(tmp_path, quiet_trainer_kwargs, caplog):
    """Steps 2-8 (step 1 is warm-up) train on PACKS[1], [2], [3], [0], [1], [2], [3]."""
    pl, module = tiny_lm(data=PACKS * 2, batch_size=None, vocab_size=128, tokens=token_rows)
    callback = ThroughputCallback(output_dir=str(tmp_path / "throughput"), log_every_n_steps=3, warmup_steps=1,
                                  micro_batch_size=1, seq_length=16, model_spec=SPEC, peak_tflops=1.0)
    logger = pl.loggers.CSVLogger(tmp_path / "csv")
    with caplog.at_level(logging.WARNING, logger="nemo_throughput"):
        pl.Trainer(max_steps=8, callbacks=[callback], logger=logger, **quiet_trainer_kwargs).fit(module)
    summary = read_json(callback.summary_path)
    tokens, slots, squares, flops = expected_step([*PACKS[1:], PACKS[0], *PACKS[1:]])
    assert summary["batch"]["token_count"] == "batch" and summary["batch"]["uncounted"] is None
    counted = summary["batch"]["counted"]
    assert counted.pop("source") == "cu_seqlens_unpadded"
    assert counted == pytest.approx({"tokens_per_step": tokens, "slots_per_step": slots,
                                     "padding_share": 1 - tokens / slots, "seqlen_sq_per_step": squares}, rel=1e-12)
    assert summary["model"]["flops_count"] == "batch"
    assert summary["model"]["flops_per_step"] == pytest.approx(flops, rel=1e-12)
    step_s, throughput = summary["timing"]["step_time_s"]["mean"], summary["throughput"]
    assert throughput["tokens_per_s"] == pytest.approx(tokens / step_s, rel=1e-12)
    assert throughput["tokens_per_s_with_padding"] == pytest.approx(slots / step_s, rel=1e-12)
    assert throughput["model_tflops_per_gpu"] == pytest.approx(flops / step_s / 1e12, rel=1e-12)
    assert throughput["mfu"] == pytest.approx(flops / step_s / 1e12, rel=1e-12)  # peak 1 TFLOPS
    # Every documented key reaches the logger (MFU far below the peak; a CPU has no telemetry), nothing else.
    with open(Path(logger.log_dir) / "metrics.csv") as file:
        rows = list(csv.DictReader(file))
    logged = {key for row in rows for key, value in row.items() if value and key.startswith("throughput/")}
    assert logged == {f"throughput/{key}" for key in set(LOGGED_KEYS) - TELEMETRY_KEYS - {"mfu_above_peak"}}
    last = rows[-1]
    assert float(last["throughput/padding_share"]) == pytest.approx(1 - tokens / slots, rel=1e-12)
    reported = load_run(Path(callback.summary_path)).workload.metrics(step_s)  # what `report` shows
    assert {key: reported[key] for key in METRIC_KEYS} == {key: throughput[key] for key in METRIC_KEYS}
    assert not [r for r in caplog.records if "padding included" in r.getMessage()]


def test_micro_batches_of_one_step_add_up(tmp_path, quiet_trainer_kwargs):
    pl, module = tiny_lm(data=PACKS * 2, batch_size=None, vocab_size=128, tokens=token_rows)
    callback = ThroughputCallback(output_dir=str(tmp_path / "throughput"), log_every_n_steps=2, warmup_steps=1,
                                  micro_batch_size=1, seq_length=16, model_spec=SPEC)
    pl.Trainer(max_steps=4, accumulate_grad_batches=2, callbacks=[callback], logger=False,
               **quiet_trainer_kwargs).fit(module)
    counted = read_json(callback.summary_path)["batch"]["counted"]
    tokens, _, squares, _ = expected_step(PACKS[2:] + PACKS * 1)  # steps 2-4: PACKS[2]+[3], [0]+[1], [2]+[3]
    assert counted["tokens_per_step"] == pytest.approx(2 * tokens, rel=1e-12)
    assert counted["slots_per_step"] == 32 and counted["seqlen_sq_per_step"] == pytest.approx(2 * squares, rel=1e-12)


def test_a_run_on_padded_batches_counts_each_rows_mask(tmp_path, quiet_trainer_kwargs):
    rows = [torch.tensor([[1] * n + [0] * (16 - n)]) for n in (4, 16, 10)]
    batches = [{"input_ids": torch.randint(128, (1, 16)), "attention_mask": mask} for mask in rows]
    pl, module = tiny_lm(data=batches * 3, batch_size=None, vocab_size=128, tokens=token_rows)
    callback = ThroughputCallback(output_dir=str(tmp_path / "throughput"), log_every_n_steps=3, warmup_steps=3,
                                  micro_batch_size=1, seq_length=16, model_spec=SPEC)
    pl.Trainer(max_steps=9, callbacks=[callback], logger=False, **quiet_trainer_kwargs).fit(module)
    counted = read_json(callback.summary_path)["batch"]["counted"]
    assert counted.pop("source") == "attention_mask"
    assert counted == pytest.approx({"tokens_per_step": 10.0, "slots_per_step": 16.0,
                                     "padding_share": 0.375, "seqlen_sq_per_step": (16 + 256 + 100) / 3}, rel=1e-12)


def test_a_run_whose_packed_lengths_cannot_be_read_says_so_and_counts_the_config(tmp_path, quiet_trainer_kwargs,
                                                                                 caplog):
    batch = {"tokens": torch.randint(128, (1, 16)), "cu_seqlens": [0, 8, 16]}
    pl, module = tiny_lm(data=[batch] * 4, batch_size=None, vocab_size=128, tokens=token_rows)
    callback = ThroughputCallback(output_dir=str(tmp_path / "throughput"), log_every_n_steps=2, warmup_steps=1,
                                  micro_batch_size=1, seq_length=16, model_spec=SPEC)
    with caplog.at_level(logging.WARNING, logger="nemo_throughput"):
        pl.Trainer(max_steps=4, callbacks=[callback], logger=False, **quiet_trainer_kwargs).fit(module)
    batch_section = read_json(callback.summary_path)["batch"]
    assert batch_section["layout"] == "packed" and batch_section["token_count"] == "config"
    assert batch_section["counted"] is None and "cu_seqlens is list" in batch_section["uncounted"]
    warned = [r.getMessage() for r in caplog.records if "padding included" in r.getMessage()]
    assert len(warned) == 1 and "cu_seqlens is list" in warned[0]


def test_fixed_length_batches_are_counted_from_the_config(tmp_path, quiet_trainer_kwargs):
    pl, module = tiny_lm(data=[{"tokens": torch.randint(128, (1, 16))}] * 4, batch_size=None, vocab_size=128,
                         tokens=token_rows)
    callback = ThroughputCallback(output_dir=str(tmp_path / "throughput"), log_every_n_steps=2, warmup_steps=1,
                                  micro_batch_size=1, seq_length=16, model_spec=SPEC)
    pl.Trainer(max_steps=4, callbacks=[callback], logger=False, **quiet_trainer_kwargs).fit(module)
    summary = read_json(callback.summary_path)
    assert summary["batch"]["layout"] == "fixed" and summary["batch"]["token_count"] == "config"
    assert summary["batch"]["counted"] is None and summary["throughput"]["tokens_per_s_with_padding"] is None
    assert summary["model"]["flops_count"] == "config"
    assert summary["model"]["flops_per_step"] == summary["model"]["flops_per_sample"]  # global batch 1


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
