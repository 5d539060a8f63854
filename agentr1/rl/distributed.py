"""Data-parallel PPO: how a batch is split across processes and put back together.

Run PPO iterations on 2 processes (CPU, gloo backend), after a single-process warm-up::

    agentr1 train --config conf/train.yaml --stage warmup
    accelerate launch --multi_gpu --num_processes 2 -m cli train --config conf/train.yaml --stage ppo
    agentr1 train --config conf/train.yaml --stage evaluate

``--multi_gpu`` is accelerate's name for its ``torch.distributed`` launcher; with ``device: cpu``
(or no GPU) the processes train on the CPU over gloo. ``accelerate launch --cpu --num_processes 2``
starts ONE process in accelerate 1.x unless MPI is set up (``--mpirun_hostfile``).

What each process does in an iteration (the one loop, :func:`agentr1.recipe.ppo.run_ppo`):

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

import logging
import os

import torch
from accelerate import Accelerator
from accelerate.utils import get_int_from_env

from agentr1.device import native_bf16

log = logging.getLogger("agentr1.train")


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


# ----------------------------------------------------------------------------- processes and precision


def launched_processes() -> int:
    """How many processes the launcher started (torchrun or MPI), read as accelerate reads it,
    without starting the process group."""
    return get_int_from_env(["PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE", "WORLD_SIZE"], 1)


def training_precision(setting: str, device: torch.device) -> str:
    """``ppo.mixed_precision`` as accelerate takes it: ``auto`` is ``bf16`` where
    :func:`native_bf16`, else ``no``; ``bf16`` and ``no`` are kept as the user set them."""
    if setting != "auto":
        return setting
    chosen = "bf16" if native_bf16(device) else "no"
    log.info("mixed precision auto -> %s (%s)", chosen, "native bf16 on this device" if chosen == "bf16"
             else "no native bf16 on this device: fp32")
    return chosen


def make_accelerator(device: torch.device, mixed_precision: str) -> Accelerator:
    """The accelerator of a training stage at ``mixed_precision`` (:func:`training_precision`; the
    precision it chose is ``acc.mixed_precision``)."""
    # Accelerate keeps process-wide state; reset it so several runs in one process
    # (tests, ablations) can each choose their own precision.
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    # Gradient accumulation is the PPO update's own (ppo.grad_accum: micro-batches of a minibatch),
    # not accelerate's, which would count whole minibatches as its steps.
    acc = Accelerator(cpu=device.type == "cpu", mixed_precision=training_precision(mixed_precision, device))
    if acc.num_processes == 1 and "MASTER_ADDR" in os.environ and launched_processes() == 1:
        # accelerate's simple launcher sets MASTER_ADDR for --num_processes > 1 but starts one process
        log.warning("accelerate launch started one process only: for data-parallel PPO on CPUs use "
                    "`accelerate launch --multi_gpu --num_processes N` (see this module)")
    return acc
