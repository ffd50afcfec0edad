"""A tiny LightningModule with no NeMo-style config, for the tests that hand a real Trainer their
own batches: next-token prediction on an embedding and a linear head."""

import importlib

import torch


def tiny_lm(namespace="pytorch_lightning", data=None, batch_size=2, vocab_size=64, tokens=lambda batch: batch):
    """(the Lightning module of ``namespace``, a module training on ``data``): by default 64 random
    rows of 9 tokens, 2 per batch; ``batch_size=None`` hands each item of ``data`` over as a batch
    (dict batches); ``tokens`` picks the token rows out of a batch."""
    pl = importlib.import_module(namespace)
    data = torch.randint(vocab_size, (64, 9)) if data is None else data

    class TinyLM(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.embedding = torch.nn.Embedding(vocab_size, 16)
            self.head = torch.nn.Linear(16, vocab_size)

        def training_step(self, batch, batch_idx):
            rows = tokens(batch)
            return torch.nn.functional.cross_entropy(self.head(self.embedding(rows[:, :-1])).flatten(0, 1),
                                                     rows[:, 1:].flatten())

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def train_dataloader(self):
            return torch.utils.data.DataLoader(data, batch_size=batch_size)

    return pl, TinyLM()
