"""examples/train_gpt.py: a tiny config trains on the CPU with flashport and with SDPA's math backend from the same
seed (same weights, same batches, so the same losses up to rounding), writes its log, and the plot mode reads
the logs back."""

import importlib.util
import json
import math
import os

import pytest

pytest.importorskip("torch")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = ["--layers", "2", "--width", "64", "--heads", "4", "--seq", "64", "--batch", "4", "--steps", "3",
        "--eval-every", "2", "--eval-batches", "2", "--warmup-steps", "1", "--device", "cpu", "--no-progress"]


@pytest.fixture(scope="module")
def train_gpt():
    spec = importlib.util.spec_from_file_location("train_gpt", os.path.join(ROOT, "examples", "train_gpt.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def records(path, kind):
    with open(path) as f:
        return [r for r in map(json.loads, f) if r["kind"] == kind]


def test_train_gpt_flashport_matches_sdpa_math(train_gpt, tmp_path, capsys):
    logs = {}
    for attn in ("flashport", "flashport-unpacked", "sdpa-math"):
        logs[attn] = str(tmp_path / f"{attn}.jsonl")
        assert train_gpt.main(TINY + ["--attn", attn, "--log", logs[attn]]) == 0
    steps = {attn: [r["loss"] for r in records(path, "step")] for attn, path in logs.items()}
    for attn, losses in steps.items():
        assert len(losses) == 3 and all(math.isfinite(x) for x in losses), (attn, losses)
        assert abs(losses[0] - math.log(train_gpt.VOCAB)) < 0.5, "step 0 should be near uniform over the vocab"
    # Same weights and batch at step 0: only the attention kernel differs, so fp32 losses agree closely.
    assert steps["flashport"][0] == pytest.approx(steps["sdpa-math"][0], abs=1e-5)
    assert steps["flashport"] == pytest.approx(steps["sdpa-math"], abs=1e-4)
    # The packed call's one gradient and the slices' stacked gradients hold the same bits.
    assert steps["flashport-unpacked"] == steps["flashport"]
    evals = records(logs["flashport"], "eval")
    assert [e["step"] for e in evals] == [0, 2, 3]
    final = records(logs["flashport"], "final")[0]
    assert final["tokens_per_s"] > 0 and final["val_loss"] < evals[0]["val_loss"]
    config = records(logs["flashport"], "config")[0]
    assert config["attn"] == "flashport" and config["corpus_bytes"] > 1_000_000

    capsys.readouterr()
    png = tmp_path / "loss.png"
    assert train_gpt.main(["--plot", logs["flashport"], logs["sdpa-math"], "--out", str(png)]) == 0
    table = capsys.readouterr().out
    assert "| flashport.jsonl | flashport | 3 |" in table and "| sdpa-math.jsonl | sdpa-math | 3 |" in table
    if importlib.util.find_spec("matplotlib") is not None:
        assert png.stat().st_size > 1000


def test_train_gpt_rejects_gpu_only_backend_on_cpu(train_gpt):
    with pytest.raises(SystemExit, match="sdpa-cudnn needs a CUDA device"):
        train_gpt.main(TINY + ["--attn", "sdpa-cudnn"])


def test_train_gpt_side_by_side_matches_separate_runs(train_gpt, tmp_path, capsys):
    """Several --attn in one process train in turn, segment by segment: each log holds the same losses
    as that backend's own run, and the summary compares their tokens/s."""
    args = TINY + ["--steps", "5", "--segment-steps", "2"]
    alone = str(tmp_path / "alone.jsonl")
    assert train_gpt.main(args + ["--attn", "flashport", "--log", alone]) == 0
    capsys.readouterr()
    pattern = str(tmp_path / "both_{attn}.jsonl")
    assert train_gpt.main(args + ["--attn", "flashport", "sdpa-math", "--log", pattern]) == 0
    out = capsys.readouterr().out
    assert "final flashport:" in out and "final sdpa-math:" in out and "x the best SDPA" in out
    side = {a: [r["loss"] for r in records(pattern.replace("{attn}", a), "step")] for a in ("flashport", "sdpa-math")}
    assert side["flashport"] == [r["loss"] for r in records(alone, "step")]
    assert side["sdpa-math"] == pytest.approx(side["flashport"], abs=1e-4)
    for a in side:
        final = records(pattern.replace("{attn}", a), "final")[0]
        assert final["attn"] == a and final["tokens_per_s"] > 0 and final["median_segment_tokens_per_s"] > 0
        assert [e["step"] for e in records(pattern.replace("{attn}", a), "eval")] == [0, 2, 4, 5]


@pytest.mark.parametrize("flag", ["--segment-steps", "--eval-every"])
def test_train_gpt_rejects_non_positive_step_counts(train_gpt, flag, capsys):
    with pytest.raises(SystemExit):
        train_gpt.main(TINY + [flag, "0"])
    assert f"{flag} must be at least 1" in capsys.readouterr().err


def test_train_gpt_attention_dropout(train_gpt, tmp_path):
    """--attn-dropout drops attention probabilities while training only: the training losses move away
    from the run without it (step 0 already: same weights and batch, a different forward), stay finite and
    repeat with the seed; the evaluation at step 0 (before any update, no dropout) is unchanged."""
    runs = {}
    for name, extra in (("plain", []), ("drop", ["--attn-dropout", "0.3"]), ("again", ["--attn-dropout", "0.3"])):
        runs[name] = str(tmp_path / f"{name}.jsonl")
        assert train_gpt.main(TINY + ["--attn", "flashport", "--log", runs[name]] + extra) == 0
    losses = {n: [r["loss"] for r in records(p, "step")] for n, p in runs.items()}
    assert all(math.isfinite(x) for x in losses["drop"])
    assert abs(losses["drop"][0] - losses["plain"][0]) > 1e-4
    assert losses["again"] == losses["drop"]
    first_eval = {n: records(p, "eval")[0] for n, p in runs.items()}
    assert first_eval["drop"]["val_loss"] == pytest.approx(first_eval["plain"]["val_loss"], abs=1e-6)
