"""Muon for the trunk's weight matrices, AdamW for the rest, in one optimizer.

Muon (Jordan et al., 2024; nanochat's and modded-nanogpt's choice) replaces each hidden 2-D
weight's update by the nearest semi-orthogonal matrix to its momentum, computed with a few
Newton-Schulz iterations. Embeddings (tied to the LM head here), norms, biases and the value
head keep AdamW, as in those recipes. One ``torch.optim.Optimizer`` holds both kinds of group,
so one LR scheduler, ``accelerate`` and the checkpoint code see an ordinary optimizer.
"""
from __future__ import annotations

import math

import torch
from torch import nn

# Quintic Newton-Schulz coefficients tuned for speed of convergence (Keller Jordan's Muon).
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)


def orthogonalize(g: torch.Tensor, steps: int = 5, eps: float = 1e-7) -> torch.Tensor:
    """Approximately U V^T for g = U S V^T: every singular value pushed towards ~1."""
    a, b, c = NS_COEFFICIENTS
    x = g / (g.norm() + eps)
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T
    for _ in range(steps):
        s = x @ x.T
        x = a * x + (b * s + c * s @ s) @ x
    return x.T if tall else x


class MuonWithAdamW(torch.optim.Optimizer):
    """Groups with ``muon=True`` take Muon steps (momentum, Nesterov, orthogonalised update
    scaled by ``sqrt(max(1, rows / cols))``, decoupled weight decay); the others AdamW steps.

    Each group keeps its own ``lr``, so a ``LambdaLR`` scales both kinds by the same factor.
    """

    def __init__(self, groups: list[dict], lr: float = 0.02, weight_decay: float = 0.0, momentum: float = 0.95,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, ns_steps: int = 5):
        for g in groups:
            if g.get("muon") and any(p.ndim != 2 for p in g["params"]):
                raise ValueError("MuonWithAdamW: Muon groups take 2-D weight matrices only")
        defaults = dict(lr=lr, weight_decay=weight_decay, momentum=momentum, betas=betas, eps=eps,
                        ns_steps=ns_steps, muon=False)
        super().__init__(groups, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if group["muon"]:
                    self._muon(p, group)
                else:
                    self._adamw(p, group)
        return loss

    def _muon(self, p: torch.Tensor, group: dict) -> None:
        # torch.optim.Muon's step (adjust_lr_fn="original"), tested against it; written out here
        # because one optimizer carries both kinds of group, and the iteration runs in fp32
        # (torch's casts to bf16; at these 128-wide matrices fp32 costs little).
        state = self.state[p]
        if not state:
            state["momentum_buffer"] = torch.zeros_like(p)
        buf = state["momentum_buffer"]
        buf.lerp_(p.grad, 1 - group["momentum"])
        update = p.grad.lerp(buf, group["momentum"])  # Nesterov
        update = orthogonalize(update.float(), group["ns_steps"]).to(p.dtype)
        p.mul_(1 - group["lr"] * group["weight_decay"])
        p.add_(update, alpha=-group["lr"] * max(1.0, p.shape[0] / p.shape[1]) ** 0.5)

    def _adamw(self, p: torch.Tensor, group: dict) -> None:
        state = self.state[p]
        if not state:
            state["step"] = 0
            state["exp_avg"] = torch.zeros_like(p)
            state["exp_avg_sq"] = torch.zeros_like(p)
        beta1, beta2 = group["betas"]
        state["step"] += 1
        m, v = state["exp_avg"], state["exp_avg_sq"]
        m.lerp_(p.grad, 1 - beta1)
        v.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
        bias1, bias2 = 1 - beta1 ** state["step"], 1 - beta2 ** state["step"]
        p.mul_(1 - group["lr"] * group["weight_decay"])
        p.addcdiv_(m, (v / bias2).sqrt_().add_(group["eps"]), value=-group["lr"] / bias1)


def muon_groups(model: nn.Module, muon_lr: float, adamw_lr: float, weight_decay: float = 0.0) -> list[dict]:
    """Parameter groups: Muon for the 2-D weights inside the transformer blocks, AdamW for
    embeddings / LM head, norms, biases and anything else (the value head)."""
    muon, other = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        in_block = ".layers." in f".{name}"
        (muon if in_block and p.ndim == 2 else other).append(p)
    return [dict(params=muon, lr=muon_lr, weight_decay=weight_decay, muon=True),
            dict(params=other, lr=adamw_lr, weight_decay=weight_decay, muon=False)]


def cosine_schedule(optimizer, warmup: int, total: int, warmdown_ratio: float = 1.0
                    ) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up, constant, then a cosine decay to 0.1x over the last ``warmdown_ratio``
    of the steps (1.0: cosine from the end of warm-up, as before; nanochat's "warmdown").

    Holding the rate matters for a from-scratch model: copying forms abruptly after a few
    hundred steps, and a cosine that has already halved the rate by then delays it
    (docs/experiments/2026-11-30-learning-to-copy.md, item 4).
    """
    decay_start = max(warmup, total - round(warmdown_ratio * total))

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / max(warmup, 1)
        progress = (step - decay_start) / max(total - decay_start, 1)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(max(progress, 0.0), 1.0)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
