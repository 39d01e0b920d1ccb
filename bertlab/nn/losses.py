"""The losses of the heads and of the training objectives, in one place."""

from __future__ import annotations

IGNORE_INDEX = -100  # a label that every loss skips (as torch's cross_entropy and transformers)
