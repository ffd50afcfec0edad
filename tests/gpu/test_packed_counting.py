"""Packed and padded batches counted and checked on the GPU without a host-device synchronization: each
micro-batch's counts and value checks (good batches, segment-id masks, and bad ones of every kind the
device checks) and the step's copy to the host run under torch.cuda.set_sync_debug_mode("error"); the
host reads them once the step's end event completed, and they are exact."""

import torch

from nemo_throughput.batch_checks import BEYOND, IDS_ORDER, ORDER, PAD, START
from nemo_throughput.batches import TokenCounter
from nemo_throughput.bench.syncs import SyncCounter


def test_counting_and_checking_packed_and_padded_steps_never_synchronizes(gpu_results):
    device = torch.device("cuda")

    def on_gpu(**batch):
        return {key: torch.tensor(value, device=device) if isinstance(value, list) else value.to(device)
                for key, value in batch.items()}

    packed = on_gpu(tokens=torch.zeros(1, 16, dtype=torch.long),
                    cu_seqlens=torch.tensor([[0, 5, 8, 16, -1]], dtype=torch.int32),
                    cu_seqlens_unpadded=torch.tensor([[0, 5, 8, 8, -1]], dtype=torch.int32))
    padded = on_gpu(input_ids=torch.zeros(2, 8, dtype=torch.long), attention_mask=[[1] * 5 + [0] * 3, [1] * 8])
    segments = on_gpu(input_ids=torch.zeros(2, 7, dtype=torch.long),
                      attention_mask=[[1, 1, 1, 2, 2, 0, 0], [0, 0, 1, 1, 1, 1, 1]])
    tokens = torch.zeros(1, 16, dtype=torch.long)
    bad = [on_gpu(tokens=tokens, cu_seqlens_unpadded=torch.tensor([[0, 8, 5, 16]], dtype=torch.int32)),
           on_gpu(tokens=tokens, cu_seqlens_unpadded=torch.tensor([[-1, 8, 2 ** 40, -1]]))]
    split = on_gpu(input_ids=torch.zeros(1, 6, dtype=torch.long), attention_mask=[[1, 1, 2, 2, 1, 1]])
    counter, steps = TokenCounter(), []
    with SyncCounter("error") as syncs:
        for batches in ([packed, packed], [padded], [segments]):
            counter = TokenCounter()
            for batch in batches:
                counter.add_batch(batch)
            steps.append(counter.step_done())
        for batches in ([packed, *bad], [split]):
            counter = TokenCounter()
            for batch in batches:
                counter.add_batch(batch)
            steps.append(counter.step_done())
        end = torch.cuda.Event()
        end.record()  # the step's end mark, recorded after the copies were enqueued
    end.synchronize()  # what the timer does, one step later
    gpu_results["packed_counting_syncs"] = syncs.count
    assert syncs.count == 0
    read = [step.read() for step in steps]
    assert read[:3] == [(16.0, 32.0, 68.0, 0.0, 0.0), (13.0, 16.0, 89.0, 0.0, 0.0), (10.0, 14.0, 13.0 + 25, 0.0, 0.0)]
    assert read[3][3:] == (2.0, float(ORDER | START | PAD | BEYOND)) and read[4][3:] == (1.0, float(IDS_ORDER))
