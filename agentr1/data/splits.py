"""Where a dataset's records go: the one split rule every converter and entry point shares.

A converted record goes into one split (``DEFAULT_SPLIT`` unless told otherwise) or, with
dev/test fractions, into train/dev/test by a hash of its id (:func:`split_of`: stable, so
adding records never moves old ones). ``SYNTHETIC`` names a dataset the environment's own
generator made rather than a converter.
"""
from __future__ import annotations

import hashlib

SYNTHETIC = "synthetic"
DEFAULT_SPLIT = "dev"
HASH_BUCKETS = 10_000
"""Resolution of the id-hash split of converted records."""
DEFAULT_DEV_FRACTION = 0.1
DEFAULT_TEST_FRACTION = 0.2


def split_of(record_id: str, dev_fraction: float, test_fraction: float) -> str:
    """A stable split for a record id (a hash, so adding records never moves old ones)."""
    bucket = int(hashlib.sha256(record_id.encode()).hexdigest(), 16) % HASH_BUCKETS / HASH_BUCKETS
    if bucket < test_fraction:
        return "test"
    return "dev" if bucket < test_fraction + dev_fraction else "train"


def check_fractions(dev: float, test: float) -> None:
    """Raise ValueError unless ``dev``/``test`` shares leave a train split."""
    if not (0 <= dev < 1 and 0 < test < 1 and dev + test < 1):
        raise ValueError(f"split fractions dev={dev}, test={test}: need 0 <= dev, 0 < test and dev + test < 1")
