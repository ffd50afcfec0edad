"""A small GPT and synthetic token data, shaped like NeMo's Megatron GPT so the callback reads it
exactly as it reads NeMo: ``self.cfg`` is the ``model:`` section with NeMo's key names and
``self.padded_vocab_size`` the padded vocabulary.
"""

from __future__ import annotations

import importlib
import math

import torch
import torch.nn.functional as F
from omegaconf import DictConfig
from torch import nn

from nemo_throughput.megatron_config import padded_vocab_size

GATED = ("swiglu", "fast-swiglu", "geglu", "fast-geglu", "reglu", "fast-reglu")


class SyntheticTokens(torch.utils.data.Dataset):
    """Deterministic random token sequences (like NeMo's mock data): sample i is always the same."""

    def __init__(self, num_samples: int, seq_length: int, vocab_size: int, seed: int = 1234) -> None:
        self.num_samples, self.seq_length, self.vocab_size, self.seed = num_samples, seq_length, vocab_size, seed

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(self.seed + index)
        return torch.randint(self.vocab_size, (self.seq_length + 1,), generator=generator)


class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int, groups: int) -> None:
        super().__init__()
        self.heads, self.groups, self.head_dim = heads, groups, hidden // heads
        self.qkv = nn.Linear(hidden, (heads + 2 * groups) * self.head_dim, bias=False)
        self.out = nn.Linear(hidden, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.qkv(x).split([self.heads * self.head_dim, self.groups * self.head_dim,
                                     self.groups * self.head_dim], dim=-1)
        q = q.view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k, v = (t.view(b, s, self.groups, self.head_dim).transpose(1, 2) for t in (k, v))
        if self.groups != self.heads:  # grouped-query attention: share each K/V head
            k, v = (t.repeat_interleave(self.heads // self.groups, dim=1) for t in (k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    def __init__(self, hidden: int, ffn: int, gated: bool) -> None:
        super().__init__()
        self.gated = gated
        self.up = nn.Linear(hidden, 2 * ffn if gated else ffn, bias=False)
        self.down = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gated:
            gate, up = self.up(x).chunk(2, dim=-1)
            return self.down(F.silu(gate) * up)
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int, groups: int, ffn: int, gated: bool) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.attention = Attention(hidden, heads, groups)
        self.mlp = MLP(hidden, ffn, gated)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class GPTTraining:
    """The LightningModule body of the demo GPT, for either Lightning namespace (see gpt_module_class)."""

    def __init__(self, cfg: DictConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.padded_vocab_size = padded_vocab_size(
            cfg.tokenizer.vocab_size, cfg.make_vocab_size_divisible_by, cfg.tensor_model_parallel_size)
        hidden = cfg.hidden_size
        groups = cfg.get("num_query_groups") or cfg.num_attention_heads
        self.embedding = nn.Embedding(self.padded_vocab_size, hidden)
        self.position = nn.Embedding(cfg.encoder_seq_length, hidden)
        self.blocks = nn.ModuleList(
            Block(hidden, cfg.num_attention_heads, groups, cfg.ffn_hidden_size, cfg.activation in GATED)
            for _ in range(cfg.num_layers)
        )
        self.norm = nn.LayerNorm(hidden)
        nn.init.normal_(self.embedding.weight, std=1 / math.sqrt(hidden))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.embedding(tokens) + self.position(positions)
        for block in self.blocks:
            x = block(x)
        return self.norm(x) @ self.embedding.weight.T  # logits over the tied embedding

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        logits = self(batch[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
        self.log("loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.cfg.optim.lr)

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        samples = self.trainer.max_steps * self.cfg.global_batch_size
        data = SyntheticTokens(samples, self.cfg.encoder_seq_length, self.cfg.tokenizer.vocab_size, self.cfg.seed)
        return torch.utils.data.DataLoader(data, batch_size=self.cfg.micro_batch_size, num_workers=0)


def gpt_module_class(namespace: str = "pytorch_lightning") -> type:
    """The demo GPT as a LightningModule of `lightning.pytorch` or `pytorch_lightning`."""
    lightning_module = importlib.import_module(namespace).LightningModule
    return type("DemoGPT", (GPTTraining, lightning_module), {"__doc__": "Decoder-only transformer trained on "
                                                                        "synthetic tokens; cfg uses NeMo's keys."})


DemoGPT = gpt_module_class("pytorch_lightning")
