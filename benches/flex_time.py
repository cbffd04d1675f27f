"""PyTorch FlexAttention timed one way for every bench that sets it beside this project
(softcap_bench.py, alibi_bench.py, window_bench.py): torch.compile'd `flex_attention` with the
caller's score_mod and mask_mod, timed by `cuda_time.cuda_ms` (3 warm-up calls, then CUDA
events around `iters` calls).

The backward is timed by calling autograd.grad on one graph repeatedly (retain_graph), which
compiled backwards with donated buffers refuse (seen at d = 128), so donated buffers are off.
"""

from cuda_time import cuda_ms

_compiled = None


def flex_ms(dtype, batch, heads, s, d, backward, iters, score_mod=None, mask_mod=None):
    """Milliseconds per call of FlexAttention on (batch, heads, s, d) tensors of `dtype`
    ("f16" or "bf16"): forward, or with `backward` the gradients of Q, K and V."""
    global _compiled
    import torch
    import torch._functorch.config
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    torch._functorch.config.donated_buffer = False
    _compiled = _compiled or torch.compile(flex_attention)
    dt = {"f16": torch.float16, "bf16": torch.bfloat16}[dtype]
    block_mask = create_block_mask(mask_mod, None, None, s, s, device="cuda") if mask_mod else None
    q, k, v = (torch.randn(batch, heads, s, d, dtype=dt, device="cuda", requires_grad=backward)
               for _ in range(3))
    if backward:
        out = _compiled(q, k, v, score_mod=score_mod, block_mask=block_mask)
        d_o = torch.randn_like(out)
        call = lambda: torch.autograd.grad(out, (q, k, v), d_o, retain_graph=True)
    else:
        call = lambda: _compiled(q, k, v, score_mod=score_mod, block_mask=block_mask)
    return cuda_ms(call, iters)
