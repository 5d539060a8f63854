"""The names of an evaluation's headline metrics, in the order every table, CSV column and plot
reports them (``agentr1.evaluate`` computes ``{mode}/{metric}`` for each mode). Nothing heavy is
imported here: the report, the plots and the steering rules read these too."""
from __future__ import annotations

MODES = ("greedy", "sampled")
"""The decoding modes of every evaluation, in the order every table reports them."""
EM_KEYS = tuple(f"{m}/em" for m in MODES)
"""The headline numbers: exact match, greedy and sampled."""
HEADLINE_KEYS = (*EM_KEYS, *(f"{m}/f1" for m in MODES))
"""Exact match then token F1, each greedy and sampled: a run's gain and its summary's first rows."""
CURVE_KEYS = tuple(f"{m}/{k}" for m in MODES for k in ("em", "f1"))
"""The same four, mode by mode: an ablation's learning-curve points and its CSV columns."""
