"""Packed and padded batches counted on the GPU without a host-device synchronization: each micro-batch's
counts and the step's copy to the host run under torch.cuda.set_sync_debug_mode("error"); the host
reads them once the step's end event completed, and they are exact."""

import torch

from nemo_throughput.batches import TokenCounter
from nemo_throughput.bench.syncs import SyncCounter


def test_counting_a_packed_and_a_padded_step_never_synchronizes(gpu_results):
    device = torch.device("cuda")
    packed = {"tokens": torch.zeros(1, 16, dtype=torch.long, device=device),
              "cu_seqlens": torch.tensor([[0, 5, 8, 16, -1]], dtype=torch.int32, device=device),
              "cu_seqlens_unpadded": torch.tensor([[0, 5, 8, 8, -1]], dtype=torch.int32, device=device)}
    padded = {"input_ids": torch.zeros(2, 8, dtype=torch.long, device=device),
              "attention_mask": torch.tensor([[1] * 5 + [0] * 3, [1] * 8], device=device)}
    counter, steps = TokenCounter(), []
    with SyncCounter("error") as syncs:
        for batches in ([packed, packed], [padded]):
            for batch in batches:
                counter.add_batch(batch)
            steps.append(counter.step_done())
            end = torch.cuda.Event()
            end.record()  # the step's end mark, recorded after the copy was enqueued
    end.synchronize()  # what the timer does, one step later
    gpu_results["packed_counting_syncs"] = syncs.count
    assert syncs.count == 0
    assert [step.read() for step in steps] == [(16.0, 32.0, 68.0), (13.0, 16.0, 89.0)]
