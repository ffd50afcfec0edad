"""Training steps captured in a CUDA graph, or compiled with torch.compile, still time right: the
callback's events are recorded on the stream outside the captured or compiled region."""

import importlib
import statistics
import time

import pytest
import torch
from torch import nn

from nemo_throughput import ThroughputCallback
from nemo_throughput.bench.harness import WindowClock
from nemo_throughput.demo.gpt import gpt_module_class
from nemo_throughput.timing import OPTIMIZER, START, CudaClock, StepTimer

from .workloads import fit, gpt_cfg, lightning_namespace

MAX_INTERVAL_ERROR = 0.01


def graphed_training_step(width: int = 4096, layers: int = 8, tokens: int = 4096):
    """A whole training step (forward, backward, optimizer) captured once, as PyTorch's CUDA graphs
    notes do it: warm-up iterations on a side stream, then capture; each replay is one step. Returns the
    graph and every tensor it reads or writes, which must stay alive as long as it is replayed."""
    torch.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(width, width, bias=False), nn.GELU())])
    model = model.cuda().to(torch.bfloat16)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    static_input = torch.randn(tokens, width, device="cuda", dtype=torch.bfloat16)
    static_target = torch.randn(tokens, width, device="cuda", dtype=torch.bfloat16)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            optimizer.zero_grad(set_to_none=True)
            nn.functional.mse_loss(model(static_input), static_target).backward()
            optimizer.step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    optimizer.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        static_loss = nn.functional.mse_loss(model(static_input), static_target)
        static_loss.backward()
        optimizer.step()
    return graph, (model, optimizer, static_input, static_target, static_loss)


def test_cuda_graph_replays_time_right(gpu_results):
    graph, _alive = graphed_training_step()
    steps, log_every, slow_every = 40, 10, 8
    replays = {s: 10 if s % slow_every == 0 else 1 + s % 3 for s in range(1, steps + 1)}  # slow step: 10 replays
    timer = StepTimer(CudaClock())
    truth, collected = {}, []
    torch.cuda.synchronize()
    before = time.perf_counter()
    timer.anchor()
    for step in range(1, steps + 1):
        timer.mark(START)
        for _ in range(replays[step]):
            graph.replay()
        timer.mark(OPTIMIZER)
        timer.end_step(step)
        torch.cuda.synchronize()
        now = time.perf_counter()
        truth[step], before = now - before, now
        if step % log_every == 0:
            collected += timer.collect(step - 1)
    collected += timer.collect()
    measured = {t.step: t.step_s for t in collected}
    errors = [statistics.fmean(measured[s] for s in range(f, f + log_every))
              / statistics.fmean(truth[s] for s in range(f, f + log_every)) - 1 for f in range(1, steps + 1, log_every)]
    slow = {s for s in replays if replays[s] == 10}
    gpu_results["cuda_graph_steps"] = {"interval_mean_error_pct": [100 * e for e in errors],
                                       "replay_ms": 1e3 * statistics.median(measured[s] / replays[s] for s in measured)}
    assert max(abs(e) for e in errors) <= MAX_INTERVAL_ERROR, errors
    assert set(sorted(measured, key=measured.get, reverse=True)[:len(slow)]) == slow


class CompiledGPT:
    """The demo GPT with its loss computed by a torch.compile'd function (``mode`` as torch.compile's)."""

    def __init__(self, cfg, mode):
        super().__init__(cfg)
        self.compile_mode = mode
        self.compiled_loss = torch.compile(self.loss, mode=mode)

    def loss(self, batch):
        logits = self(batch[:, :-1])
        return nn.functional.cross_entropy(logits.flatten(0, 1).float(), batch[:, 1:].flatten())

    def training_step(self, batch, batch_idx):
        if self.compile_mode == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()  # a new iteration: earlier graph outputs may be reused
        return self.compiled_loss(batch).clone()  # a copy outlives the graph's next replay


@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_compiled_training_steps_time_right(tmp_path, mode, gpu_results):
    namespace = lightning_namespace()
    pl = importlib.import_module(namespace)
    model_class = type("CompiledDemoGPT", (CompiledGPT, gpt_module_class(namespace)), {})
    cfg = gpt_cfg(num_layers=4, hidden_size=1024, ffn_hidden_size=4096, num_attention_heads=16,
                  encoder_seq_length=1024, micro_batch_size=8, global_batch_size=8)
    steps, first = 60, 20  # the first steps compile (and record graphs): left out of both figures
    ours = ThroughputCallback(log_every_n_steps=10, warmup_steps=first, output_dir=str(tmp_path / "throughput"))
    clock = type("WindowClock", (WindowClock, pl.Callback), {})(first, steps, True)
    fit(tmp_path, [clock, ours], steps, model=model_class(cfg, None if mode == "default" else mode))
    ours_s, true_s = ours.stats.mean_step_time_s(), clock.step_time_s
    gpu_results[f"torch_compile_{mode}"] = {"ours_step_s": ours_s, "true_step_s": true_s,
                                            "error_pct": 100 * (ours_s / true_s - 1)}
    assert abs(ours_s / true_s - 1) <= MAX_INTERVAL_ERROR, (ours_s, true_s)
