"""Data-parallel PPO: how a batch is split across processes and put back together.

Run PPO iterations on 2 processes (CPU, gloo backend), after a single-process warm-up::

    agentr1 train --config conf/train.yaml --stage warmup
    accelerate launch --multi_gpu --num_processes 2 -m cli train --config conf/train.yaml --stage ppo
    agentr1 train --config conf/train.yaml --stage evaluate

``--multi_gpu`` is accelerate's name for its ``torch.distributed`` launcher; with ``device: cpu``
(or no GPU) the processes train on the CPU over gloo. ``accelerate launch --cpu --num_processes 2``
starts ONE process in accelerate 1.x unless MPI is set up (``--mpirun_hostfile``).

What each process does in an iteration (the one loop, :func:`agentr1.trainer.run_ppo`):

1. plays its contiguous share of the iteration's questions (whole GRPO groups), then every
   process receives every trajectory (``gather_object``: token ids, masks and rewards are small);
2. scores its contiguous share of rows (policy and reference forward passes) and the per-token
   results are gathered, so advantages, whitening and group statistics are computed on the
   GLOBAL batch, identically everywhere;
3. updates on the same global minibatches as one process would (one generator, one order); each
   minibatch's rows are dealt out ``mb[rank::world]`` and every process's loss is its share of
   the minibatch's token SUM over the GLOBAL token count, so the all-reduced (summed) gradient
   is the single-process gradient of the token mean. Gradients are summed explicitly (one
   flat all-reduce), not by DDP hooks: a process may hold no row of a small minibatch, and the
   critic-free estimators leave the value head without gradients, both of which DDP refuses;
4. only the main process logs metrics and writes checkpoints and files.

One update on 2 processes equals one on 1 process within float rounding
(``tests/test_data_parallel.py``).
"""
from __future__ import annotations

import torch


def row_shards(n: int, world: int) -> list[slice]:
    """Contiguous, nearly equal slices of ``range(n)``, one per process (the first ``n % world``
    get one more), in process order: concatenating the shards gives ``range(n)`` back."""
    base, extra = divmod(n, world)
    bounds = [0]
    for r in range(world):
        bounds.append(bounds[-1] + base + (r < extra))
    return [slice(bounds[r], bounds[r + 1]) for r in range(world)]


def gather_rows(accelerator, x: torch.Tensor, n: int) -> torch.Tensor:
    """This process's rows ``x`` (its :func:`row_shards` share of ``n``) -> all ``n`` rows, on every
    process. Shards differ in size by at most one row: padded to the largest, then cut back."""
    shards = row_shards(n, accelerator.num_processes)
    most = max(s.stop - s.start for s in shards)
    padded = x.new_zeros((most, *x.shape[1:]))
    padded[: x.shape[0]] = x
    everyone = accelerator.gather(padded)  # (world * most, ...), in process order
    return torch.cat([everyone[r * most: r * most + s.stop - s.start] for r, s in enumerate(shards)])


def sum_gradients(accelerator, params: list[torch.nn.Parameter]) -> None:
    """Replace each parameter's gradient by its sum over processes, in one flat all-reduce.

    A parameter without a gradient on a process (it held no row of the minibatch) counts as
    zeros there; one without a gradient on every process keeps ``None``, as on one process, so
    the optimizer skips it the same way.
    """
    if not params:
        return
    flat = [p.grad.reshape(-1) if p.grad is not None else p.new_zeros(p.numel()) for p in params]
    present = torch.tensor([float(p.grad is not None) for p in params], dtype=flat[0].dtype, device=flat[0].device)
    total = accelerator.reduce(torch.cat([*flat, present]), reduction="sum")
    seen = total[-len(params):] > 0
    offset = 0
    for p, any_grad in zip(params, seen.tolist()):
        n = p.numel()
        p.grad = total[offset: offset + n].view_as(p).clone() if any_grad else None
        offset += n
