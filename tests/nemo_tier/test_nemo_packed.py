"""Packed sequences as NeMo 2 builds them (its packing utilities and GPTSFTPackedDataset's
collate_fn), handed to a real Lightning Trainer: the summary says the batches are packed and the
tokens per step count their padding."""

import json
import logging

import numpy as np

from lightning_modules import tiny_lm
from nemo_throughput import ThroughputCallback
from nemo_throughput.batches import batch_layout

PACK, EOS = 16, 2


class _Tokenizer:  # what GPTSFTPackedDataset.collate_fn reads of a tokenizer
    eos_id = EOS


def nemo_packed_batches(tmp_path, lengths=(6, 9, 4, 11, 7)):
    """Real packs: NeMo's create_hist / create_packing_strategy / fill_packing_strategy on tokenized
    examples, saved as prepare_packed_sequence_data saves them, read back by create_sft_dataset."""
    from nemo.collections.llm.gpt.data.core import create_sft_dataset
    from nemo.utils.sequence_packing_utils import create_hist, create_packing_strategy, fill_packing_strategy

    rng = np.random.default_rng(0)
    examples = [{"input_ids": rng.integers(10, 100, n - 1).tolist() + [EOS], "answer_start_idx": 2} for n in lengths]
    sequences, histogram = create_hist(np.array(examples), truncate_seq_len=PACK)
    assignments, _ = create_packing_strategy(histogram, PACK, "first_fit_decreasing")
    path = tmp_path / f"training_{PACK}.npy"
    np.save(path, fill_packing_strategy(assignments, sequences, PACK, pad_id=EOS))
    dataset = create_sft_dataset(path, tokenizer=_Tokenizer(), seq_length=PACK, pad_to_max_length=True)
    return [dataset.collate_fn([dataset[i]]) for i in range(len(dataset))]  # micro-batch 1, as NeMo packs


def test_nemo_packed_batches_are_named_packed(tmp_path):
    batches = nemo_packed_batches(tmp_path)
    assert batches and all("cu_seqlens" in batch for batch in batches)
    assert {batch_layout(batch) for batch in batches} == {"packed"}


def test_a_run_on_nemo_packed_batches_counts_their_real_tokens_and_squared_lengths(tmp_path, caplog):
    """Every pack trained three times after a warm-up pass over all of them: the mean step holds the
    examples' tokens (each n - 1 long: the collate function trains on all but the last token) and their
    squares, over the packs; NeMo's own token_count says the same of the tokens."""
    lengths = (6, 9, 4, 11, 3)  # packed first-fit-decreasing into 16 slots: 10 + 5, 8 + 3 + 2
    batches = nemo_packed_batches(tmp_path, lengths)
    packs = len(batches)
    assert packs == 2 and sum(batch["token_count"][0] for batch in batches) == sum(n - 1 for n in lengths)
    pl, module = tiny_lm("lightning.pytorch", data=batches * 4, batch_size=None, vocab_size=128,
                         tokens=lambda batch: batch["tokens"])
    callback = ThroughputCallback(output_dir=str(tmp_path / "throughput"), log_every_n_steps=2, warmup_steps=packs,
                                  micro_batch_size=1, seq_length=PACK,
                                  model_spec={"num_layers": 1, "hidden_size": 16, "num_attention_heads": 2,
                                              "vocab_size": 128})
    with caplog.at_level(logging.WARNING, logger="nemo_throughput"):
        pl.Trainer(max_steps=4 * packs, callbacks=[callback], logger=False, accelerator="cpu", devices=1,
                   default_root_dir=tmp_path, enable_progress_bar=False, enable_model_summary=False,
                   enable_checkpointing=False).fit(module)
    summary = json.loads(open(callback.summary_path).read())
    assert summary["batch"]["layout"] == "packed" and summary["batch"]["token_count"] == "batch"
    counted = summary["batch"]["counted"]
    assert counted["source"] == "cu_seqlens_unpadded" and counted["slots_per_step"] == PACK
    assert counted["tokens_per_step"] == 28 / packs and counted["padding_share"] == 1 - 14 / PACK
    assert counted["seqlen_sq_per_step"] == sum((n - 1) ** 2 for n in lengths) / packs
    assert not [r for r in caplog.records if "padding included" in r.getMessage()]


def test_nemo2_finetuning_data_module_with_packed_sequences_reads_as_packed(tmp_path):
    """Under NeMo's Megatron strategy the hooks get no batch: a FineTuningDataModule with
    packed_sequence_specs says the run is packed, of packs of its packed_sequence_size; one without
    says nothing."""
    from types import SimpleNamespace

    from nemo.collections.llm.gpt.data.fine_tuning import FineTuningDataModule
    from nemo.collections.llm.gpt.data.packed_sequence import PackedSequenceSpecs

    from nemo_throughput.adapters.nemo import read_module

    model = SimpleNamespace(config=SimpleNamespace(num_layers=2, hidden_size=64, num_attention_heads=4,
                                                   vocab_size=1024))
    packed = FineTuningDataModule(dataset_root=tmp_path, seq_length=2048, micro_batch_size=1, global_batch_size=8,
                                  packed_sequence_specs=PackedSequenceSpecs(packed_sequence_size=2048))
    unpacked = FineTuningDataModule(dataset_root=tmp_path, seq_length=2048, micro_batch_size=1, global_batch_size=8)
    assert read_module(model, packed).batch_layout == "packed"
    assert read_module(model, unpacked).batch_layout is None
    # Packs longer than seq_length (as NeMo's own error message advises): a step trains 8 packs of 8192
    # token slots, not 8 x 2048 (the rates were 4 times too low).
    longer = FineTuningDataModule(dataset_root=tmp_path, seq_length=2048, micro_batch_size=1, global_batch_size=8,
                                  packed_sequence_specs=PackedSequenceSpecs(packed_sequence_size=8192))
    assert read_module(model, longer).spec_fields["seq_length"] == 8192
    assert read_module(model, unpacked).spec_fields["seq_length"] == 2048
