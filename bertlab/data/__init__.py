"""Data for pre-training and fine-tuning: masking, corpus preparation, task datasets."""

from pathlib import Path

SAMPLES = Path(__file__).resolve().parent / "samples"  # small real samples, sources in README


def sample_sentences(n: int, name: str = "sst2_dev.tsv") -> list[str]:
    """The first ``n`` sentences of a bundled SST-2 sample (film reviews; ``samples/README.md``)."""
    lines = (SAMPLES / name).read_text(encoding="utf-8").splitlines()[1:]
    return [line.split("\t")[0] for line in lines][:n]
