"""Packed and padded batches: their layout read from the first batch's keys and shapes and checked on
every micro-batch; their real tokens, slots and squared sequence lengths counted per step (exact
expected values), segment-id masks included; their values checked on the device without a sync; and
where a micro-batch cannot be counted, one warning and the config's count for the whole run, the
summary saying why and how many; a real Lightning Trainer hands them over."""

import csv
import itertools
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import read_json
from lightning_modules import tiny_lm
from nemo_throughput import ThroughputCallback
from nemo_throughput import batch_checks
from nemo_throughput.batch_checks import (BEYOND, HOST, IDS_NEGATIVE, IDS_ORDER, NEGATIVE, ORDER, PAD, START,
                                          problems_text)
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
    ({"input_ids": torch.zeros(1, 7, dtype=torch.long), "attention_mask": torch.tensor([[1, 1, 1, 2, 2, 0, 0]])},
     "padded"),  # multipack segment ids: read on the device, as the padding mask is
    ({"input_ids": torch.zeros(4, 32, dtype=torch.long), "attention_mask": torch.ones(4, 31, dtype=torch.long)},
     "padded"),  # a 2-D mask unlike the tokens: padded, and refused when counted
    ({"tokens": torch.zeros(1, 16, dtype=torch.long), "attention_mask": torch.tensor([1])}, "fixed"),  # a dummy
    ({"input_ids": torch.zeros(1, 13, dtype=torch.long), "position_ids": torch.zeros(1, 13, dtype=torch.long),
      "cu_seq_lens_q": torch.tensor([[0, 6, 13]], dtype=torch.int32),
      "cu_seq_lens_k": torch.tensor([[0, 6, 13]], dtype=torch.int32)}, "packed"),  # HF DataCollatorWithFlattening
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


def step_of(*batches):
    """(tokens, slots, seqlen_sq, bad micro-batches, problems) of one step of ``batches``, and the counter."""
    counter = TokenCounter()
    for batch in batches:
        counter.add_batch(batch)
    return counter.step_done().read(), counter


def counts(*batches):
    """(tokens, slots, seqlen_sq) of one step of good ``batches``, and their source."""
    (*counted, bad, problems), counter = step_of(*batches)
    assert (bad, problems, counter.unreadable) == (0.0, 0.0, None)
    return tuple(counted), counter.source


def test_a_packed_step_counts_real_tokens_slots_and_squared_lengths():
    assert counts(nemo_packed_batch()) == ((8.0, 16.0, 34.0), "cu_seqlens_unpadded")  # 5 + 3; 25 + 9
    assert counts(packed(5, 3), packed(7, 6, 2)) == ((23.0, 32.0, 34.0 + 89.0), "cu_seqlens_unpadded")
    assert counts({"tokens": torch.zeros(1, 16), "cu_seqlens": torch.tensor([[0, 10, 16, -1, -1]])}) == \
        ((16.0, 16.0, 136.0), "cu_seqlens")  # no unpadded boundaries: every segment counts
    assert counts({"tokens": torch.zeros(1, 16), "cu_seqlens_q": torch.tensor([0, 4, 16])}) == \
        ((16.0, 16.0, 160.0), "cu_seqlens_q")  # Transformer Engine's one-dimensional THD boundaries
    assert counts({"tokens": torch.zeros(2, 8), "cu_seqlens_q": torch.tensor([0, 4, 9, 16])}) == \
        ((16.0, 16.0, 16.0 + 25 + 49), "cu_seqlens_q")  # a flat row of bounds runs over all the rows' tokens
    assert counts({"tokens": torch.zeros(1, 16), "cu_seqlens": torch.tensor([[0, 10, 10, 10, 16, 16]])}) == \
        ((16.0, 16.0, 136.0), "cu_seqlens")  # zero-length sequences (NeMo's pad_cu_seqlens for CUDA graphs)
    hf = {"input_ids": torch.zeros(1, 13, dtype=torch.long), "cu_seq_lens_q": torch.tensor([[0, 6, 13]]),
          "cu_seq_lens_k": torch.tensor([[0, 6, 13]]), "position_ids": torch.zeros(1, 13, dtype=torch.long)}
    assert counts(hf) == ((13.0, 13.0, 36.0 + 49), "cu_seq_lens_q")  # HF's flattened batch, one row of 13


def test_a_padded_step_counts_each_rows_mask():
    mask = torch.tensor([[1] * 5 + [0] * 3, [1] * 8])
    assert counts({"input_ids": torch.zeros(2, 8, dtype=torch.long), "attention_mask": mask}) == \
        ((13.0, 16.0, 89.0), "attention_mask")


@pytest.mark.parametrize("mask, expected", [
    ([[1, 1, 1, 2, 2, 0, 0]], (5, 7, 9 + 4)),  # two sequences and padding (axolotl's multipack numbering)
    ([[0, 0, 1, 1, 1]], (3, 5, 9)),  # left padding
    ([[0, 0, 0, 0], [1, 1, 2, 0]], (3, 8, 4 + 1)),  # a row that is all padding
    ([[1, 1, 2, 2, 2, 3], [1, 1, 1, 1, 0, 0], [1, 2, 3, 4, 5, 6]], (16, 18, 4 + 9 + 1 + 16 + 6)),  # several rows
    ([[0, 1, 1, 2, 2, 2, 0, 0]], (5, 8, 4 + 9)),  # left and right padding around two sequences
    ([[1, 1, 3, 3, 3, 0]], (5, 6, 4 + 9)),  # ids need not be consecutive, only never go down
    ([[1, 1, 0, 1, 1]], (4, 5, 16)),  # a 0/1 mask with a hole: one sequence per row, as HF unpads it
    ([[True, True, False], [True, True, True]], (5, 6, 4 + 9)),  # a bool padding mask
    ([[2 ** 62] * 3 + [0]], (3, 4, 9)),  # huge ids are ids
])
def test_a_segment_id_mask_counts_each_sequence(mask, expected):
    mask = torch.tensor(mask)
    batch = {"input_ids": torch.zeros(mask.shape, dtype=torch.long), "attention_mask": mask}
    assert counts(batch) == (tuple(map(float, expected)), "attention_mask")
    for dtype in (torch.int32, torch.uint8) if mask.dtype != torch.bool and mask.max() < 256 else ():
        assert counts({**batch, "attention_mask": mask.to(dtype)}) == (tuple(map(float, expected)), "attention_mask")


def cu(bounds, tokens=(1, 16), key="cu_seqlens"):
    return {"tokens": torch.zeros(tokens, dtype=torch.long), key: torch.as_tensor(bounds)}


def mask(ids):
    ids = torch.as_tensor(ids)
    return {"input_ids": torch.zeros(ids.shape, dtype=torch.long), "attention_mask": ids}


@pytest.mark.parametrize("batch, problems", [
    (cu([[0, 8, 5, 16]]), ORDER),  # not monotonic
    (cu([[0, 8, 16], [0, 9, 3]], tokens=(2, 16)), ORDER),  # in the second row only
    (cu([[-2, 8, 16]]), START | NEGATIVE),  # starts below 0
    (cu([[3, 8, 16]]), START),  # starts above 0
    (cu([[0, 8, 17, -1]]), BEYOND),  # runs past the row's 16 tokens
    (cu([0, 10, 17], tokens=(2, 8)), BEYOND),  # a flat row past all 16 tokens
    (cu([[0, 2 ** 62]]), BEYOND),  # huge
    (cu([[0, -(2 ** 63), 16]]), ORDER | NEGATIVE),
    (cu([[0, 8, -1, 16]]), PAD),  # -1 padding in the middle
    (cu([[-1, 0, 8, 16]]), START | PAD),  # -1 padding first
    (cu([[-1, -1, -1]]), START),  # a row of padding alone
    (cu([[0, -3, 16]]), ORDER | NEGATIVE),
    (cu([[0, 5, 8, 16, -1]], key="cu_seqlens_unpadded") | {"cu_seqlens": torch.tensor([[0, 4, 2, 16, -1]])}, 0),
    (mask([[1, 1, 2, 2, 1, 1]]), IDS_ORDER),  # an id again after another: a sequence split in two
    (mask([[2, 2, 1, 1]]), IDS_ORDER),  # ids going down
    (mask([[1, 1, 0], [1, -1, 0]]), IDS_NEGATIVE),
    (mask([[-5, -5, 0]]), IDS_NEGATIVE),
])
def test_the_device_checks_every_micro_batchs_values(batch, problems):
    """Each bad micro-batch counts once, with the bitmask of what is wrong; the bounds not read are not checked."""
    (*_, bad, found), counter = step_of(batch)
    assert (bad, found, counter.unreadable) == (float(problems != 0), float(problems), None)


def test_bad_micro_batches_of_one_step_are_counted_each_and_their_problems_joined():
    unpadded = "cu_seqlens_unpadded"
    (tokens, slots, _, bad, found), _ = step_of(packed(5, 3), cu([[0, 8, 5, 16]], key=unpadded), packed(16),
                                                cu([[0, 8, 17]], key=unpadded))
    assert (slots, bad, found) == (64.0, 2.0, float(ORDER | BEYOND))
    assert problems_text(int(found), "cu_seqlens") == \
        "cu_seqlens not monotonic; cu_seqlens runs past the sequence (a bound above the row's tokens)"


@pytest.mark.parametrize("batch, why", [
    ({"tokens": torch.zeros(1, 16), "cu_seqlens": [0, 8, 16]}, "cu_seqlens is list"),
    ({"cu_seqlens": torch.tensor([0, 8, 16])}, "without the token rows"),
    ([torch.zeros(1, 16)], "not a mapping"),
    (cu(torch.zeros(0, dtype=torch.long)), "cu_seqlens is empty (shape [0]"),
    (cu(torch.zeros(1, 0, dtype=torch.long)), "cu_seqlens is empty (shape [1, 0]"),
    (cu([[0]]), "fewer than 2 bounds a row"),
    (cu([[0, 8, 16], [0, 8, 16]]), "neither one row of bounds per token row nor one flat row"),  # 2 rows, 1 token row
    (cu([[[0, 16]]]), "neither one row"),
    (cu([[0.0, 8.0, float("nan")]]), "cu_seqlens is torch.float32, not an integer tensor"),
    (cu([[True, True]]), "cu_seqlens is torch.bool"),
    (mask([[1, 1, 0]]) | {"input_ids": torch.zeros(1, 4)}, "does not match the tokens' [1, 4]"),
    (mask([[1, 1, 0], [1, 0, 0]]) | {"input_ids": torch.zeros(3, 3)}, "of shape [2, 3] does not match"),  # rows
    (mask([[1.0, 1.0, 0.0]]), "float32: a padding mask (1: a token) and an additive one (0: a token) cannot be"),
    (mask([[float("nan"), 0.0]]), "cannot be told apart"),
    (mask([[1, 0]]) | {"attention_mask": torch.tensor([[1, 0]]).to_sparse()}, "not a dense integer tensor"),
    (mask(torch.zeros(2, 0, dtype=torch.long)), "attention_mask is empty"),
])
def test_a_micro_batch_the_host_cannot_read_is_refused_and_counted_bad(batch, why):
    """Its step has no counts, and the micro-batch counts as bad (HOST), so the other ranks learn of it;
    later micro-batches are still checked (and counted bad where bad); the first reason stands."""
    counter = TokenCounter()
    counter.add_batch(packed(8))
    counter.add_batch(batch)
    assert counter.step_done().read() == (None, None, None, 1.0, float(HOST)) and why in counter.unreadable
    counter.add_batch(packed(8))
    counter.add_batch(cu([[0, 9, 8, 16]], key="cu_seqlens_unpadded"))
    assert counter.step_done().read()[3:] == (1.0, float(ORDER)) and why in counter.unreadable


def test_lengths_from_another_key_than_the_first_micro_batchs_are_refused():
    counter = TokenCounter()
    counter.add_batch(packed(5, 3))  # cu_seqlens_unpadded
    counter.add_batch(cu([[0, 8, 16]]))
    assert counter.unreadable == "a micro-batch's lengths come from cu_seqlens, the run's first from " \
                                 "cu_seqlens_unpadded"


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
    assert batch_section["uncounted_batches"] == 4  # every micro-batch, each refused
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


# ----------------------------------------------------------------------------- no sync, checked on the CPU
# What reads a device value on the host (or makes a shape that depends on one): none may run in add_batch.
HOST_READS = {"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "__format__", "__repr__", "__str__",
              "nonzero", "argwhere", "masked_select", "unique", "unique_consecutive", "bincount", "numpy", "cpu",
              "equal", "allclose", "is_nonzero"}


class HostReads(torch.Tensor):
    """A tensor that records every torch function called on it (and on what is made from it)."""

    calls: list[str] = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", repr(func))
        indices = args[1] if name == "__getitem__" else ()
        indices = indices if isinstance(indices, tuple) else (indices,)
        if any(isinstance(index, torch.Tensor) for index in indices):  # a boolean mask's result has data's shape
            name = "__getitem__ by a tensor"
        if name == "to" and ("device" in kwargs or any(isinstance(a, (str, torch.device)) for a in args[1:])):
            name = "to a device"
        cls.calls.append(name)
        return super().__torch_function__(func, types, args, kwargs)


def host_read_free(batch):
    return {key: value.as_subclass(HostReads) if isinstance(value, torch.Tensor) else value
            for key, value in batch.items()}


def test_counting_and_checking_a_micro_batch_reads_nothing_on_the_host():
    batches = [nemo_packed_batch(), packed(7, 6, 2), mask([[1, 1, 1, 2, 2, 0, 0], [0, 0, 1, 1, 1, 1, 1]]),
               cu([[0, 8, 5, 16]]), cu([[-1, 8, 17, -1, 3]]), cu([0, 2 ** 62], tokens=(2, 8), key="cu_seqlens_q"),
               mask([[1, 1, 2, 2, 1, 1]]), mask([[True, False]]), mask([[-1, 0]])]
    HostReads.calls = []
    for batch in batches:
        counter = TokenCounter()
        counter.add_batch(host_read_free(batch))
        assert counter.unreadable is None
    assert {"cummax", "cumsum", "any", "where"} <= set(HostReads.calls)  # the checks ran on the recording tensors
    assert not HOST_READS & set(HostReads.calls) and "__getitem__ by a tensor" not in HostReads.calls
    assert "to a device" not in HostReads.calls


# ----------------------------------------------------------------------------- a run with a bad micro-batch
def fit(tmp_path, quiet_trainer_kwargs, caplog, data, steps=8, **trainer):
    """A run on ``data`` (one micro-batch per step unless accumulated): its summary, steps.jsonl rows and
    the warnings that the counts are the config's."""
    rows_of = lambda batch: batch[0] if isinstance(batch, list) else token_rows(batch)  # noqa: E731
    pl, module = tiny_lm(data=data, batch_size=None, vocab_size=128, tokens=rows_of)
    callback = ThroughputCallback(output_dir=str(tmp_path / "throughput"), log_every_n_steps=3, warmup_steps=1,
                                  micro_batch_size=1, seq_length=16, model_spec=SPEC, peak_tflops=1.0,
                                  per_step_jsonl=True)
    with caplog.at_level(logging.WARNING, logger="nemo_throughput"):
        pl.Trainer(max_steps=steps, callbacks=[callback], logger=False, **trainer, **quiet_trainer_kwargs).fit(module)
    rows = [json.loads(line) for line in open(Path(callback.output_dir) / "steps.jsonl")]
    warned = [r.getMessage() for r in caplog.records if "padding included" in r.getMessage()]
    return read_json(callback.summary_path), rows, warned


def assert_config_counted(summary, warned, why, bad):
    """The whole run counts the config's tokens and FLOPs, says why and how many micro-batches were bad,
    warned once."""
    batch, throughput, model = summary["batch"], summary["throughput"], summary["model"]
    assert batch["token_count"] == "config" and batch["counted"] is None
    assert why in batch["uncounted"] and batch["uncounted_batches"] == bad
    step_s = summary["timing"]["step_time_s"]["mean"]
    assert throughput["tokens_per_s"] == pytest.approx(batch["tokens_per_step"] / step_s, rel=1e-12)
    assert throughput["tokens_per_s_with_padding"] is None
    flops = batch["global_batch_size"] * model["flops_per_sample"]
    assert model["flops_count"] == "config" and model["flops_per_step"] == flops
    assert throughput["model_tflops_per_gpu"] == pytest.approx(flops / step_s / 1e12, rel=1e-12)
    assert len(warned) == 1 and why in warned[0]


UNPADDED = "cu_seqlens_unpadded"


@pytest.mark.parametrize("bad_at, batch, why", [
    (6, cu([[0, 8, 5, 16]], key=UNPADDED), "cu_seqlens_unpadded not monotonic (rank 0)"),  # a later, measured step
    (0, cu([[0, 8, 17]], key=UNPADDED), "cu_seqlens_unpadded runs past the sequence"),  # the warm-up step only
    (4, cu([[0, 8, -1, 16]], key=UNPADDED), "-1 padding before its last bound"),
    (6, cu([[-3, 8, 16]], key=UNPADDED), "cu_seqlens_unpadded does not start at 0"),
    (5, {"tokens": torch.randint(128, (1, 16)), "cu_seqlens": [0, 8, 16]}, "cu_seqlens is list"),  # on the host
    (5, cu(torch.zeros(1, 0, dtype=torch.long), key=UNPADDED), "cu_seqlens_unpadded is empty"),
])
def test_a_bad_packed_micro_batch_makes_the_whole_run_count_the_config(tmp_path, quiet_trainer_kwargs, caplog, bad_at,
                                                                       batch, why):
    """Steps 1-8 train on PACKS twice, one of them replaced by ``batch``: found on the device (read with its
    step's counts, intervals later) or on the host, the run's figures are the config's from end to end."""
    data = [*PACKS, *PACKS]
    data[bad_at] = batch | {"tokens": torch.randint(128, (1, 16))}
    summary, rows, warned = fit(tmp_path, quiet_trainer_kwargs, caplog, data)
    assert_config_counted(summary, warned, why, bad=1)
    assert summary["batch"]["layout"] == "packed"
    assert [row["ranks"][0]["bad_batches"] for row in rows] == [float(i == bad_at) for i in range(8)]


@pytest.mark.parametrize("first, later, why", [
    ({"tokens": torch.randint(128, (1, 16))}, PACKS[1], "a micro-batch is packed, the run's first was fixed"),
    (PACKS[1], {"tokens": torch.randint(128, (1, 16))}, "a micro-batch is fixed, the run's first was packed"),
    (mask([[1] * 12 + [0] * 4]), PACKS[1], "a micro-batch is packed, the run's first was padded"),
    (PACKS[1], [torch.randint(128, (1, 16))], "a micro-batch is fixed, the run's first was packed"),
])
def test_a_run_whose_layout_changes_counts_the_config(tmp_path, quiet_trainer_kwargs, caplog, first, later, why):
    """Four steps of one layout, then four of another: each later micro-batch is bad, found on the host."""
    summary, _, warned = fit(tmp_path, quiet_trainer_kwargs, caplog, [first] * 4 + [later] * 4)
    assert_config_counted(summary, warned, why, bad=4)


def test_a_bad_micro_batch_among_a_steps_several_makes_the_run_count_the_config(tmp_path, quiet_trainer_kwargs,
                                                                                caplog):
    """Two micro-batches a step (segment-id masks); the second of step 5 splits a sequence in two."""
    good = mask([[1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 3, 0, 0, 0, 0]])
    data = [good] * 16
    data[9] = mask([[1, 1, 1, 2, 2, 2, 2, 1, 1, 1, 3, 3, 0, 0, 0, 0]])
    summary, rows, warned = fit(tmp_path, quiet_trainer_kwargs, caplog, data, accumulate_grad_batches=2)
    assert_config_counted(summary, warned, "attention_mask's segment ids go down along a row", bad=1)
    assert [row["ranks"][0]["bad_batches"] for row in rows] == [float(step == 5) for step in range(1, 9)]


def test_a_run_on_segment_id_masks_counts_each_packed_sequence(tmp_path, quiet_trainer_kwargs, caplog):
    """Multipack rows (sequences numbered 1, 2, 3 in a row, 0 for padding), left padding, a row of padding."""
    masks = [[1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 3, 0, 0, 0, 0], [0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1],
             [1] * 16, [1, 2, 2, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 5, 0]]
    squares = [9 + 16 + 25, 144, 256, 1 + 4 + 9 + 16 + 25]
    summary, rows, warned = fit(tmp_path, quiet_trainer_kwargs, caplog, [mask([m]) for m in masks] * 2)
    counted = summary["batch"]["counted"]
    # steps 2-8: masks 1, 2, 3, 0, 1, 2, 3
    order = [1, 2, 3, 0, 1, 2, 3]
    tokens = sum(sum(map(bool, masks[i])) for i in order) / 7
    assert counted.pop("source") == "attention_mask"
    assert counted == pytest.approx({"tokens_per_step": tokens, "slots_per_step": 16.0,
                                     "padding_share": 1 - tokens / 16,
                                     "seqlen_sq_per_step": sum(squares[i] for i in order) / 7}, rel=1e-12)
    assert summary["batch"]["layout"] == "padded" and summary["batch"]["uncounted"] is None
    assert summary["batch"]["uncounted_batches"] == 0 and not warned
    assert all(row["ranks"][0]["bad_batches"] == 0 for row in rows)


# ----------------------------------------------------------------------------- two ranks
@pytest.mark.slow
@pytest.mark.parametrize("bad, why", [
    ("order", "cu_seqlens_unpadded not monotonic (rank 1)"),
    ("unreadable", "a micro-batch could not be read (rank 1; its log says why)"),
])
def test_one_ranks_bad_micro_batch_makes_the_run_count_the_config(tmp_path, bad, why):
    """Rank 1's micro-batch of step 6 is bad: found on its device (read with the step's counts) or on its
    host, it reaches rank 0 with the exchanged steps; the summary counts the config's tokens, says why
    and that one micro-batch was bad; rank 0 warns once, rank 1 says why it could not read it."""
    script = Path(__file__).parent / "scripts" / "train_packed.py"
    done = subprocess.run([sys.executable, str(script), "--output-dir", str(tmp_path), "--bad", bad],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    summary = read_json(tmp_path / "summary.json")
    batch = summary["batch"]
    assert batch["layout"] == "packed" and batch["token_count"] == "config" and batch["counted"] is None
    assert batch["uncounted"] == why and batch["uncounted_batches"] == 1
    step_s = summary["timing"]["step_time_s"]["mean"]
    assert summary["throughput"]["tokens_per_s"] == pytest.approx(2 * 16 / step_s, rel=1e-12)
    assert output.count("padding included") == 1 and ("rank 1: cu_seqlens_unpadded is list" in output) == \
        (bad == "unreadable")


@pytest.mark.parametrize("global_batch_size, warned", [(16, False), (8, True), (32, True)])
def test_a_global_batch_is_checked_against_the_first_batch_across_data_parallel_ranks(caplog, global_batch_size,
                                                                                       warned):
    """No micro_batch_size known: 2 rows x 2 accumulated micro-batches x 4 data-parallel ranks train 16."""
    from nemo_throughput.batches import BatchCounting
    from nemo_throughput.run_facts import Learned, RunFacts

    facts = RunFacts(name="run", label="", global_batch_size=global_batch_size, micro_batch_size=None, seq_length=8,
                     model_name="tiny", model_spec=None, flops_formula=None, flops_per_sample=None, gpu_name="cpu",
                     num_gpus=8, num_nodes=1, dtype=None, peak_tflops=None, peak_source=None,
                     parallel={"data": 4, "tensor": 2}, batches_per_step=2)
    with caplog.at_level("WARNING", logger="nemo_throughput"):
        BatchCounting(facts, Learned(), rank=0).seen(torch.zeros(2, 9, dtype=torch.long))
    said = [r.getMessage() for r in caplog.records if "global_batch_size" in r.getMessage()]
    assert bool(said) == warned
    assert not said or f"global_batch_size is {global_batch_size}, where 2 row(s) x 2 micro-batch(es) per step x 4 " \
                       "data-parallel rank(s) train 16" in said[0]
