"""Any model: FLOPs counted on a real training step (flops_formula measured), samples/s as the rate
where tokens make no sense, and the MFU convention in every summary. Real Lightning fits on CPU."""

import json

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from nemo_throughput import ThroughputCallback
from nemo_throughput.config import ThroughputConfig
from nemo_throughput.measured_flops import MeasuredFlops, StepFlopCounter, flops_per_sample

pl = pytest.importorskip("pytorch_lightning")


# ---------------------------------------------------------------------- three models that are not GPT
class BertLike(nn.Module):
    """An encoder: token embeddings, nn.TransformerEncoder, a masked-LM head."""

    vocab, seq, width = 64, 12, 32

    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(self.vocab, self.width)
        layer = nn.TransformerEncoderLayer(self.width, nhead=4, dim_feedforward=64, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = nn.Linear(self.width, self.vocab)

    def loss(self, batch):
        logits = self.head(self.encoder(self.embedding(batch)))
        return nn.functional.cross_entropy(logits.flatten(0, 1), batch.flatten())

    @classmethod
    def data(cls):
        return torch.randint(cls.vocab, (64, cls.seq))


class TinyUNet(nn.Module):
    """Down, bottleneck, up with a skip connection: convolutions and a transposed convolution."""

    def __init__(self):
        super().__init__()
        self.down = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU())
        self.bottom = nn.Sequential(nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU())
        self.up = nn.ConvTranspose2d(16, 8, 2, stride=2)
        self.out = nn.Conv2d(16, 3, 1)

    def loss(self, batch):
        skip = self.down(batch)
        return nn.functional.mse_loss(self.out(torch.cat([skip, self.up(self.bottom(skip))], dim=1)), batch)

    @staticmethod
    def data():
        return torch.randn(64, 3, 16, 16)


class LoRALinear(nn.Module):
    """A frozen linear layer plus a trainable low-rank update (Hu et al., 2021)."""

    def __init__(self, base: nn.Linear, rank: int = 2):
        super().__init__()
        self.base = base.requires_grad_(False)
        self.a = nn.Parameter(torch.randn(rank, base.in_features) * 0.01)
        self.b = nn.Parameter(torch.zeros(base.out_features, rank))

    def forward(self, x):
        return self.base(x) + x @ self.a.t() @ self.b.t()


class LoRAFineTune(nn.Module):
    """A frozen MLP base; only the low-rank adapters train."""

    width = 64

    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(LoRALinear(nn.Linear(self.width, self.width)), nn.GELU(),
                                    LoRALinear(nn.Linear(self.width, self.width)))

    def loss(self, batch):
        return self.layers(batch).pow(2).mean()

    @classmethod
    def data(cls):
        return torch.randn(64, 8, cls.width)


class Trainee(pl.LightningModule):
    def __init__(self, net, data, micro_batch_size):
        super().__init__()
        self.net, self._data, self.micro_batch_size = net, data, micro_batch_size

    def training_step(self, batch, batch_idx):
        return self.net.loss(batch)

    def configure_optimizers(self):
        return torch.optim.SGD([p for p in self.parameters() if p.requires_grad], lr=0.01)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(self._data, batch_size=self.micro_batch_size)


def counted_independently(net, micro_batch):
    """FlopCounterMode's own count of one micro-batch's forward and backward."""
    with FlopCounterMode(display=False) as forward:
        loss = net.loss(micro_batch)
    with FlopCounterMode(display=False) as backward:
        loss.backward()
    net.zero_grad()
    return forward.get_total_flops(), backward.get_total_flops()


def fit(tmp_path, quiet_trainer_kwargs, net_class, micro=4, accumulate=2, steps=5, **settings):
    torch.manual_seed(0)
    net = net_class()
    callback = ThroughputCallback(output_dir=str(tmp_path / "throughput"), micro_batch_size=micro,
                                  model_name=net_class.__name__,
                                  log_every_n_steps=2, warmup_steps=1, **settings)
    trainer = pl.Trainer(max_steps=steps, accumulate_grad_batches=accumulate, callbacks=[callback], logger=False,
                         **quiet_trainer_kwargs)
    trainer.fit(Trainee(net, net_class.data(), micro))
    expected = counted_independently(net, net_class.data()[:micro])
    return json.loads(open(callback.summary_path).read()), expected


@pytest.mark.parametrize("net_class, extra", [(BertLike, {"seq_length": BertLike.seq}),
                                              (TinyUNet, {}), (LoRAFineTune, {})])
def test_measured_flops_are_flop_counter_modes_count_of_one_step(net_class, extra, tmp_path, quiet_trainer_kwargs):
    summary, (forward, backward) = fit(tmp_path, quiet_trainer_kwargs, net_class, flops_formula="measured",
                                       peak_tflops=1.0, **extra)
    model = summary["model"]
    assert summary["status"] == "completed" and model["flops_formula"] == "measured"
    assert model["name"] == net_class.__name__ and model["spec"] is None
    # one optimizer step = 2 micro-batches of 4 samples, every one of them counted
    assert model["measured_flops"] == {"forward": 2 * forward, "backward": 2 * backward,
                                       "total": 2 * (forward + backward), "samples": 8}
    assert model["flops_per_sample"] == pytest.approx((forward + backward) / 4)
    assert forward > 0 and backward > 0
    # and it gives model TFLOPS and MFU as any other FLOPs per sample does
    mean = summary["timing"]["step_time_s"]["mean"]
    assert summary["throughput"]["model_tflops_per_gpu"] == pytest.approx(8 * model["flops_per_sample"] / mean / 1e12)
    assert summary["throughput"]["mfu"] == pytest.approx(summary["throughput"]["model_tflops_per_gpu"] / 1.0)
    assert summary["timing"]["steps_measured"] == 4  # the counted step is the warm-up step


def test_lora_backward_is_less_than_twice_forward_and_full_fine_tune_is_twice(tmp_path, quiet_trainer_kwargs):
    """Frozen weights get no weight gradient: of the 3x-forward rule only the data gradient remains
    for them. Both counts are in the summary (model.measured_flops)."""
    lora, _ = fit(tmp_path / "lora", quiet_trainer_kwargs, LoRAFineTune, flops_formula="measured", steps=2)
    counted = lora["model"]["measured_flops"]
    assert counted["backward"] < 2 * counted["forward"]

    class FullFineTune(LoRAFineTune):
        def __init__(self):
            super().__init__()
            self.requires_grad_(True)

    full, _ = fit(tmp_path / "full", quiet_trainer_kwargs, FullFineTune, flops_formula="measured", steps=2)
    full_counted = full["model"]["measured_flops"]
    assert full_counted["forward"] == counted["forward"]
    # weight gradients of the base come back; the input's data gradient is still not needed
    assert counted["backward"] < full_counted["backward"] <= 2 * full_counted["forward"]
    weight_gradient = 2 * (4 * 8) * 64 * 64  # a 64x64 weight over 4 samples x 8 rows, 2 FLOPs a multiply-add
    assert full_counted["backward"] - counted["backward"] == 2 * 2 * weight_gradient  # 2 micro-batches x 2 layers


def test_live_line_before_the_count_says_n_a_and_other_steps_are_not_counted(tmp_path, quiet_trainer_kwargs,
                                                                              caplog):
    import logging

    caplog.set_level(logging.INFO, logger="nemo_throughput")
    summary, (forward, backward) = fit(tmp_path, quiet_trainer_kwargs, TinyUNet, flops_formula="measured",
                                       steps=6, accumulate=1)
    assert summary["model"]["measured_flops"]["total"] == forward + backward  # one micro-batch: step 1 only
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("[throughput]")]
    assert lines and all("TFLOPS/GPU" in line for line in lines)  # absorbed after the count was known


def test_step_flop_counter_splits_forward_and_backward_of_each_micro_batch():
    net = nn.Linear(8, 8)
    counter = StepFlopCounter()
    counter.start()
    for _ in range(3):
        counter.forward_starts()
        loss = net(torch.randn(2, 8, requires_grad=True)).sum()
        counter.backward_starts()
        loss.backward()
    counted = counter.stop(samples=6)
    assert not counter.counting
    assert counted == MeasuredFlops(forward=3 * 2 * 2 * 8 * 8, backward=3 * 2 * 2 * 2 * 8 * 8, samples=6)
    assert flops_per_sample(counted) == counted.total / 6 and flops_per_sample(counted, 2) == 2 * counted.total / 6


def test_a_step_without_counted_operations_is_an_error_that_says_what_to_do():
    with pytest.raises(ValueError, match="flops_per_sample"):
        flops_per_sample(MeasuredFlops(forward=0, backward=0, samples=4))


@pytest.mark.parametrize("settings, message", [
    ({"flops_formula": "measured", "warmup_steps": 0}, "warmup_steps >= 1"),
    ({"flops_formula": "measured", "flops_per_sample": 1e9}, "give one of them"),
    ({"flops_formula": "palm"}, r"'measured' \(any model"),
])
def test_measured_settings_that_cannot_work_are_refused(settings, message):
    with pytest.raises(ValueError, match=message):
        ThroughputConfig(**settings)


# ---------------------------------------------------------------------- samples/s where tokens make no sense
def test_images_without_a_sequence_length_are_rated_in_samples_per_s(tmp_path, quiet_trainer_kwargs, caplog):
    import logging

    caplog.set_level(logging.INFO, logger="nemo_throughput")
    summary, _ = fit(tmp_path, quiet_trainer_kwargs, TinyUNet, flops_formula="measured", peak_tflops=2.0)
    throughput, mean = summary["throughput"], summary["timing"]["step_time_s"]["mean"]
    assert throughput["primary"] == "samples_per_s"
    assert throughput["samples_per_s"] == pytest.approx(8 / mean)
    assert throughput["tokens_per_s"] is None and throughput["tokens_per_s_per_gpu"] is None
    assert throughput["days_to_train_1t_tokens"] is None
    assert summary["batch"] == {"global_batch_size": 8, "micro_batch_size": 4, "seq_length": None,
                                "tokens_per_step": None, "token_count": None, "layout": None,
                                "counted": None, "uncounted": None, "uncounted_batches": None, "rampup": None}
    # model TFLOPS and MFU still come from the FLOPs per sample
    flops = summary["model"]["flops_per_sample"]
    assert throughput["model_tflops_per_gpu"] == pytest.approx(8 * flops / mean / 1e12)
    assert throughput["mfu"] == pytest.approx(throughput["model_tflops_per_gpu"] / 2.0)
    assert summary["model"]["mfu_convention"] == {"formula": "measured", "causal_attention": "full"}
    assert (summary["hardware"]["peak_tflops"], summary["hardware"]["peak_source"]) == (2.0, "user")
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("[throughput]")]
    assert lines and all("samples/s" in line and "tok/s" not in line for line in lines)


@pytest.mark.parametrize("rate, primary", [("auto", "tokens_per_s"), ("tokens", "tokens_per_s"),
                                           ("samples", "samples_per_s")])
def test_rate_setting_names_the_primary_rate(rate, primary, tmp_path, quiet_trainer_kwargs):
    summary, _ = fit(tmp_path, quiet_trainer_kwargs, BertLike, flops_formula="measured", seq_length=BertLike.seq,
                     rate=rate, steps=2)
    assert summary["throughput"]["primary"] == primary
    assert summary["batch"]["tokens_per_step"] == 8 * BertLike.seq  # known either way
    assert summary["throughput"]["tokens_per_s"] is not None


def test_rate_tokens_without_a_sequence_length_is_refused(tmp_path, quiet_trainer_kwargs):
    with pytest.raises(ValueError, match=r"missing \['seq_length'\]"):
        fit(tmp_path, quiet_trainer_kwargs, TinyUNet, flops_formula="measured", rate="tokens", steps=1)
    with pytest.raises(ValueError, match="Unknown rate 'images'"):
        ThroughputConfig(rate="images")


@pytest.mark.parametrize("formula, causal", [("megatron", "half"), ("dgxc", "full"), ("measured", "full"),
                                             ("user", None)])
def test_every_summary_records_its_mfu_convention(formula, causal):
    from nemo_throughput.run_stats import RunStats
    from nemo_throughput.run_facts import RunFacts
    from nemo_throughput.summary import build_summary

    facts = RunFacts(name="run", label="", global_batch_size=8, micro_batch_size=1, seq_length=None, rate="samples",
                     model_name="unet", model_spec=None, flops_formula=formula, flops_per_sample=1e9,
                     gpu_name="NVIDIA H100 80GB HBM3", num_gpus=8, num_nodes=1, dtype="bf16", peak_tflops=989.5,
                     peak_source="table:H100 SXM")
    summary = build_summary(facts, RunStats(8, 1), "running")
    assert summary["model"]["mfu_convention"] == {"formula": formula, "causal_attention": causal}
    assert summary["throughput"]["primary"] == "samples_per_s"


# ---------------------------------------------------------------------- several ranks
@pytest.mark.slow
def test_two_ddp_ranks_count_their_own_samples_and_stop_together_at_the_target(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).parent / "scripts" / "train_any_model.py"
    done = subprocess.run([sys.executable, str(script), str(tmp_path), "2"], capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    forward, backward = counted_independently(TinyUNet(), TinyUNet.data()[:4])
    # global batch 8 = 4 per rank x 2 ranks; rank 0 counted its own 4 samples
    assert summary["batch"]["global_batch_size"] == 8 and summary["parallel"]["data"] == 2
    assert summary["model"]["measured_flops"] == {"forward": forward, "backward": backward,
                                                  "total": forward + backward, "samples": 4}
    assert summary["model"]["flops_per_sample"] == pytest.approx((forward + backward) / 4)
    assert summary["time_to_target"]["status"] == "target_reached" and summary["time_to_target"]["step"] == 6
    # the stop was decided across ranks: both left training after the same step
    assert "rank 0 stopped at step 6" in done.stdout and "rank 1 stopped at step 6" in done.stdout


class ElementWise(nn.Module):
    """No matmul, convolution or attention: nothing FlopCounterMode has a formula for."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(8))

    def loss(self, batch):
        return (batch * self.scale).pow(2).mean()

    @staticmethod
    def data():
        return torch.randn(64, 8)


def test_a_step_with_nothing_to_count_leaves_mfu_null_and_training_goes_on(tmp_path, quiet_trainer_kwargs, caplog):
    summary, _ = fit(tmp_path, quiet_trainer_kwargs, ElementWise, flops_formula="measured", peak_tflops=1.0)
    assert summary["status"] == "completed" and summary["timing"]["steps_measured"] == 4
    assert summary["model"]["flops_per_sample"] is None and summary["throughput"]["mfu"] is None
    assert summary["model"]["measured_flops"]["total"] == 0
    assert "set flops_per_sample=... instead" in caplog.text
