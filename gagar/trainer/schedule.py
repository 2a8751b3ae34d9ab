"""The learning-rate schedule: linear warm-up, then constant or cosine decay, per RL step.

The rate is a pure function of the RL step's index (as verl steps its scheduler once per RL step,
however many optimizer steps the step takes), so a resumed run, which restores the step from its
checkpoint, continues the sequence exactly. With peak ``lr``, ``W`` warm-up steps, ``T`` total
steps and step index ``s`` (0-based):

    s < W:              lr · (s + 1) / W                     (the W-th step reaches the peak)
    constant:           lr
    cosine:             min_lr + (lr − min_lr) · ½ (1 + cos(π · (s − W) / (T − W)))

Cosine starts at the peak on step ``W`` and approaches ``min_lr`` on the last step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

Schedule = Literal["constant", "cosine"]


@dataclass(frozen=True)
class LRSchedule:
    lr: float
    warmup_steps: int = 0
    schedule: Schedule = "constant"
    min_lr: float = 0.0
    total_steps: int = 1

    def __post_init__(self) -> None:
        if not (0 <= self.min_lr <= self.lr) or self.warmup_steps < 0 or self.total_steps < 1:
            raise ValueError(f"bad learning-rate schedule: {self}")

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        if self.schedule == "constant":
            return self.lr
        progress = (step - self.warmup_steps) / max(1, self.total_steps - self.warmup_steps)
        cosine = 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
        return self.min_lr + (self.lr - self.min_lr) * cosine
