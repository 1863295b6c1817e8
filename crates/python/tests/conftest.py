"""Fixtures of the Python package's tests: the repository, the `transformer` command, the
Multi30k data, and one tiny translation run trained by `transformer.train` (a few seconds).

The engine's CPU pool runs one thread in this process and in the commands it starts
(CANDLE_NUM_THREADS=1, set before the package is imported), so the package's outputs and
the command line's are computed the same way, and two translating threads have a core each.
"""

import gzip
import os
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("CANDLE_NUM_THREADS", "1")
os.environ.setdefault("RAYON_NUM_THREADS", "1")

ROOT = Path(__file__).resolve().parents[3]


def data_dir() -> Path:
    """The shared data folder: $TRANSFORMER_DATA, else ../shared/data beside the checkout."""
    d = Path(os.environ.get("TRANSFORMER_DATA", ROOT.parent / "shared" / "data"))
    if not (d / "multi30k").is_dir():
        pytest.fail(f"no Multi30k under {d}: set TRANSFORMER_DATA to the shared data folder")
    return d


@pytest.fixture(scope="session")
def data() -> Path:
    return data_dir()


@pytest.fixture(scope="session")
def cli() -> Path:
    """The `transformer` command of this checkout (built with cargo if it is not yet)."""
    exe = Path(os.environ.get("TRANSFORMER_BIN", ROOT / "target" / "release" / "transformer"))
    if not exe.exists():
        subprocess.run(
            ["cargo", "build", "--release", "-p", "transformer-cli"], cwd=ROOT, check=True
        )
    return exe


@pytest.fixture(scope="session")
def test_de(data) -> Path:
    return data / "multi30k" / "task1" / "raw" / "test_2016_flickr.de.gz"


@pytest.fixture(scope="session")
def test_en(data) -> Path:
    return data / "multi30k" / "task1" / "raw" / "test_2016_flickr.en.gz"


def read_gz(path: Path):
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


@pytest.fixture(scope="session")
def sources(test_de):
    return read_gz(test_de)


@pytest.fixture(scope="session")
def references(test_en):
    return read_gz(test_en)


# The tiny model: 1 + 1 layers of width 64, a 1,000-piece vocabulary, 80 batches (about 20
# seconds): enough for sentences that differ ("A man in a red shirt is standing on ...").
TINY = {
    "corpus": "multi30k-de-en",
    "d_model": 64,
    "nhead": 4,
    "encoder_layers": 1,
    "decoder_layers": 1,
    "dim_feedforward": 128,
    "vocab_size": 1000,
    "epochs": 1,
    "max_batches": 80,
    "max_valid": 50,
    "warmup": 60,
    "lr_factor": 1.0,
    "average_decay": 0.0,
    "beam": 2,
    "seed": 3,
}


# The log lines of the run_dir fixture's training.
TRAIN_LOG = []


@pytest.fixture(scope="session")
def run_dir(tmp_path_factory, data):
    """A translation run trained through `transformer.train`, with its log lines."""
    import transformer

    out = tmp_path_factory.mktemp("runs") / "tiny"
    lines = []
    config = dict(TINY, data=str(data), out=str(out))
    returned = transformer.train(config, progress=lines.append)
    assert Path(returned) == out
    TRAIN_LOG.extend(lines)
    return out


def run_cli(cli, *args, stdin=None):
    """Runs the command line and returns its stdout (the test fails on an error)."""
    p = subprocess.run(
        [str(cli), *map(str, args)], input=stdin, capture_output=True, text=True
    )
    assert p.returncode == 0, f"{args}: {p.stderr}"
    return p.stdout


sys.path.insert(0, str(Path(__file__).parent))
