"""Tokenizer, train, and a script written for CTranslate2."""

import subprocess
import sys
from pathlib import Path

import pytest

import transformer
from conftest import TINY, TRAIN_LOG


def test_train_wrote_a_run_and_reported_progress(run_dir):
    for name in ["config.toml", "tokenizer.json", "best.safetensors", "metrics.jsonl"]:
        assert (run_dir / name).exists(), name
    log = "\n".join(TRAIN_LOG)
    assert "epoch 1" in log.lower()
    assert "bleu" in log.lower()
    config = (run_dir / "config.toml").read_text()
    assert "d_model = 64" in config and "vocab_size = 1000" in config


def test_train_errors(tmp_path, data):
    with pytest.raises(ValueError, match="d_modell"):
        transformer.train({"d_modell": 32, "out": str(tmp_path / "x")}, progress=False)
    with pytest.raises(ValueError, match="nhead|divide"):
        transformer.train(dict(TINY, data=str(data), nhead=5), out=tmp_path / "y", progress=False)
    with pytest.raises(TypeError, match="dict of settings"):
        transformer.train(42)
    with pytest.raises(FileNotFoundError):
        transformer.train(tmp_path / "missing.toml")
    with pytest.raises(ValueError, match="task='nmt'"):
        transformer.train({}, task="nmt")
    # A TOML file works as the dict does: resuming the fixture's finished run from its own
    # config.toml is refused by nothing and trains no further.


def test_train_from_a_toml_file_resumes(run_dir):
    lines = []
    out = transformer.train(run_dir / "config.toml", out=run_dir, resume=True, progress=lines.append)
    assert Path(out) == run_dir
    assert lines, "resuming says what it does"


def test_tokenizer(run_dir):
    tok = transformer.Tokenizer(str(run_dir))
    same = transformer.Tokenizer(run_dir / "tokenizer.json")
    assert tok.vocab_size == len(tok) == 1000 == same.vocab_size
    text = "Ein Mann fährt Fahrrad."
    pieces = tok.encode(text)
    ids = tok.encode_ids(text)
    assert len(pieces) == len(ids) > 1
    assert [tok.token_to_id(p) for p in pieces] == ids
    assert [tok.id_to_token(i) for i in ids] == pieces
    assert tok.decode(ids) == tok.decode(pieces) == text
    assert tok.encode_batch([text, ""]) == [pieces, []]
    assert tok.token_to_id("no such piece ☃") is None
    assert tok.id_to_token(3) == "<unk>"
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.decode([5, 100000])
    with pytest.raises(TypeError, match="list of ids"):
        tok.decode("Ein")
    with pytest.raises(FileNotFoundError):
        transformer.Tokenizer(run_dir / "nothing.json")


def test_a_ctranslate2_script_runs_with_its_import_changed(run_dir, sources, tmp_path):
    """ct2_script.py is written for ctranslate2; with its import line changed it runs on a
    run directory and prints what the package computes."""
    script = (Path(__file__).parent / "ct2_script.py").read_text(encoding="utf-8")
    assert "import ctranslate2\n" in script
    ported = tmp_path / "ported.py"
    ported.write_text(
        script.replace("import ctranslate2\n", "import transformer as ctranslate2\n"),
        encoding="utf-8",
    )
    t = transformer.Translator(str(run_dir))
    src = tmp_path / "src.tok"
    src.write_text(
        "".join(" ".join(t.tokenizer.encode(s)) + "\n" for s in sources[:30]), encoding="utf-8"
    )
    p = subprocess.run(
        [sys.executable, str(ported), str(run_dir), str(src)],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 0, p.stderr
    out = p.stdout.split("\n")[:-1]
    expected = t.translate(sources[:30], beam_size=4)
    assert [t.tokenizer.decode(line.split("\t")[0].split()) for line in out] == expected
    for line in out:
        score = float(line.split("\t")[1])
        assert score < 0


def test_train_a_language_model(tmp_path, data):
    # WikiText-2 cut to its first 300 lines per split, so that evaluation takes no time.
    small = tmp_path / "wikitext-small"
    small.mkdir()
    for split in ["train", "valid", "test"]:
        with open(data / "wikitext-2" / f"{split}.txt", encoding="utf-8") as f:
            head = [next(f, "") for _ in range(300)]
        (small / f"{split}.txt").write_text("".join(head), encoding="utf-8")
    lines = []
    out = transformer.train(
        {
            "data": str(small),
            "emsize": 16,
            "nhid": 16,
            "nlayers": 1,
            "nhead": 2,
            "epochs": 1,
            "max_batches": 5,
            "average_decay": 0.0,
        },
        task="lm",
        out=tmp_path / "lm",
        progress=lines.append,
    )
    assert Path(out) == tmp_path / "lm"
    assert (tmp_path / "lm" / "vocab.txt").exists()
    assert (tmp_path / "lm" / "best.safetensors").exists()
    assert any("test" in line.lower() and "ppl" in line.lower() for line in lines), lines
    # A language-model run is not a translation run, and the error says so.
    with pytest.raises(ValueError, match="language-model run"):
        transformer.Translator(out)
