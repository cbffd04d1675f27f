"""One way to time a PyTorch call on the GPU, for every bench script here: `warmup` calls,
then CUDA events around `iters` calls (the mean; the host never waits between calls)."""


def cuda_ms(call, iters, warmup=3):
    """Milliseconds per call of `call` (which launches work on the current CUDA stream)."""
    import torch

    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        call()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters
