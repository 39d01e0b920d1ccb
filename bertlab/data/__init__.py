"""Data for pre-training and fine-tuning: masking, corpus preparation, task datasets."""

from pathlib import Path

SAMPLES = Path(__file__).resolve().parent / "samples"  # small real samples, sources in README


def sample_sentences(n: int | None = None, name: str = "sst2_dev.tsv") -> list[str]:
    """The first ``n`` sentences (all: None) of a bundled SST-2 sample (film reviews;
    ``samples/README.md``), without the space the sample ends each with."""
    lines = (SAMPLES / name).read_text(encoding="utf-8").splitlines()[1:]
    return [t for line in lines if (t := line.split("\t")[0].strip())][:n]
