"""`livemeet eval` end to end through `livemeet.__main__.main` and one real subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from livemeet.__main__ import main

REPO_ROOT = Path(__file__).resolve().parents[2]


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:  # type: ignore[type-arg]
    assert main(["eval", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_all_metrics_on_oracle_vectors(
    shared_data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = shared_data / "oracle-vectors"
    out = run_json(
        capsys, "--ref", str(folder / "cjk_ref.stm"), "--hyp", str(folder / "cjk_hyp.stm")
    )
    assert set(out) == {"cer", "wer", "cpcer", "cpwer", "delta_cer", "der"}
    assert out["cpcer"]["value"] == pytest.approx(0.5, abs=1e-6)
    assert (
        out["cpcer"]["substitutions"],
        out["cpcer"]["deletions"],
        out["cpcer"]["insertions"],
    ) == (1, 2, 2)
    assert out["cpcer"]["sessions"]["m1"]["assignment"] == {"A": "S02", "B": "S01"}
    assert out["cer"]["value"] == pytest.approx(0.1, abs=1e-6)
    assert out["delta_cer"]["value"] == pytest.approx(0.4, abs=1e-6)


def test_cpwer_on_meeteval_stm(shared_data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = shared_data / "meeteval-examples"
    out = run_json(
        capsys,
        "--ref",
        str(folder / "ref.stm"),
        "--hyp",
        str(folder / "hyp.stm"),
        "--metric",
        "cpwer",
        "--normalize",
        "none",
    )
    assert list(out) == ["cpwer"]
    assert out["cpwer"]["value"] == pytest.approx(25 / 92, abs=1e-6)
    assert out["cpwer"]["sessions"]["recordingB"]["errors"] == 23
    out = run_json(
        capsys,
        "--ref",
        str(folder / "ref.stm"),
        "--hyp",
        str(folder / "hyp.stm"),
        "--metric",
        "orcwer",
        "--normalize",
        "none",
    )
    assert out["orcwer"]["value"] == pytest.approx(9 / 92, abs=1e-6)


@pytest.mark.parametrize(("collar", "expected"), [("0", 0.314228), ("0.25", 0.259491)])
def test_der_on_ami_debug(
    shared_data: Path, capsys: pytest.CaptureFixture[str], collar: str, expected: float
) -> None:
    folder = shared_data / "ami-pyannote-debug"
    out = run_json(
        capsys,
        "--ref",
        str(folder / "debug.test.rttm"),
        "--hyp",
        str(folder / "hyp_perturbed.test.rttm"),
        "--uem",
        str(folder / "debug.test.uem"),
        "--collar",
        collar,
    )
    assert list(out) == ["der"]  # RTTM carries no text: "all" falls back to DER
    assert out["der"]["value"] == pytest.approx(expected, abs=1e-6)
    assert out["der"]["collar_s"] == float(collar)


def test_der_with_md_eval_mapping_on_ami_debug(
    shared_data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = shared_data / "ami-pyannote-debug"
    files = ("--ref", str(folder / "debug.test.rttm"), "--hyp")
    files += (str(folder / "hyp_perturbed.test.rttm"), "--uem", str(folder / "debug.test.uem"))
    out = run_json(capsys, *files, "--skip-overlap", "--der-mapping", "md-eval")
    assert out["der"]["value"] == pytest.approx(0.213152, abs=1e-6)  # md-eval-22 -1 -c 0.25
    assert out["der"]["der_mapping"] == "md-eval"
    assert run_json(capsys, *files, "--skip-overlap")["der"]["value"] == pytest.approx(
        0.089034, abs=1e-6
    )


def test_transcript_json_hypothesis_against_stm(
    tmp_path: Path, shared_data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hyp = tmp_path / "hyp.json"
    segments = [
        {"start": 0.1, "end": 2.0, "speaker": "S02", "text": "你好，世介！"},
        {"start": 2.1, "end": 4.0, "speaker": "S01", "text": "今天开会"},
        {"start": 4.1, "end": 6.0, "speaker": "S01", "text": "好的。"},
    ]
    hyp.write_text(json.dumps({"segments": segments}, ensure_ascii=False), encoding="utf-8")
    ref = shared_data / "oracle-vectors" / "cjk_ref.stm"
    out = run_json(capsys, "--ref", str(ref), "--hyp", str(hyp), "--metric", "cpcer")
    assert out["cpcer"]["value"] == pytest.approx(0.5, abs=1e-6)
    assert out["cpcer"]["sessions"]["m1"]["assignment"] == {"A": "S02", "B": "S01"}


def test_table_output(shared_data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = shared_data / "meeteval-examples"
    argv = ["eval", "--ref", str(folder / "ref.rttm"), "--hyp", str(folder / "hyp.rttm")]
    assert main([*argv, "--uem", str(folder / "uem.uem"), "--metric", "der"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:2] == ["metric", "value"]
    assert lines[1].split()[:2] == ["der", "0.375000"]


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--metric", "cer"], "RTTM has no text to score"),
        (["--collar", "-1"], "--collar must be a number >= 0"),
        # nan scored as collar 0 and inf raised from the assignment (a CLI trial)
        (["--collar", "nan"], "--collar must be a number >= 0"),
        (["--collar", "inf"], "--collar must be a number >= 0"),
        (["--uem", "/nonexistent.uem"], "no such file"),
    ],
)
def test_bad_input_exits_2_with_a_message(
    shared_data: Path, capsys: pytest.CaptureFixture[str], extra: list[str], needle: str
) -> None:
    folder = shared_data / "meeteval-examples"
    argv = ["eval", "--ref", str(folder / "ref.rttm"), "--hyp", str(folder / "hyp.rttm"), *extra]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert needle in captured.err and captured.out == ""


def test_subprocess_entry_point(shared_data: Path) -> None:
    folder = shared_data / "meeteval-examples"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "livemeet",
            "eval",
            "--ref",
            str(folder / "ref_siso.stm"),
            "--hyp",
            str(folder / "hyp_siso.stm"),
            "--metric",
            "wer",
            "--json",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO_ROOT,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["wer"]["value"] == pytest.approx(2 / 31, abs=1e-6)


def test_a_kaldi_text_reference_scores_text_metrics_and_skips_der(
    tmp_path: Path, shared_data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The shared data's Kaldi-style `text` references (`utt-id words...`) were "cannot tell
    the format" (found by an independent trial). A transcript JSON with one word changed
    against jfk/text: WER 1/22 (normalized); `all` gives CER and WER only (no times for DER,
    no speakers for the cp metrics), which can still be asked for by name."""
    ref = shared_data / "jfk" / "text"
    words = ref.read_text().split(maxsplit=1)[1].replace("country", "county", 1)
    hyp = tmp_path / "hyp.json"
    hyp.write_text(json.dumps({"segments": [{"start": 0, "end": 11, "speaker": "S01",
                                             "text": words}]}))  # fmt: skip
    out = run_json(capsys, "--ref", str(ref), "--hyp", str(hyp), "--metric", "all")
    assert set(out) == {"cer", "wer"}
    assert out["wer"]["value"] == pytest.approx(1 / 22)
    out = run_json(capsys, "--ref", str(ref), "--hyp", str(hyp), "--metric", "cpwer")
    assert out["cpwer"]["value"] == pytest.approx(1 / 22)
    assert main(["eval", "--ref", str(ref), "--hyp", str(hyp), "--metric", "der"]) == 2
    assert "no times" in capsys.readouterr().err


def test_a_kaldi_text_by_another_name_is_read_as_one(
    tmp_path: Path, shared_data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Only a file named exactly `text` was read as Kaldi (a CLI trial): `jfk.txt` scored its
    utterance id as a word (WER 2/22), `text.ref` was "cannot tell the format". Now a Kaldi
    name (`text.*`, `*.text`) says so, and --ref-format/--hyp-format name any file's format."""
    kaldi = (shared_data / "jfk" / "text").read_text()
    hyp = tmp_path / "hyp.json"
    hyp.write_text(json.dumps({"text": kaldi.split(maxsplit=1)[1].replace("country", "county")}))
    for name, extra in (("text.ref", []), ("jfk.text", []), ("jfk.txt", ["--ref-format", "kaldi"])):
        ref = tmp_path / name
        ref.write_text(kaldi)
        out = run_json(capsys, "--ref", str(ref), "--hyp", str(hyp), "--metric", "wer", *extra)
        assert out["wer"]["value"] == pytest.approx(2 / 22), name  # both "country"s changed
    # both sides named: a Kaldi hypothesis against a Kaldi reference, neither called `text`
    hyp_kaldi = tmp_path / "hyp.trn"
    hyp_kaldi.write_text(kaldi)
    argv = ["--ref", str(tmp_path / "jfk.txt"), "--hyp", str(hyp_kaldi), "--metric", "wer"]
    out = run_json(capsys, *argv, "--ref-format", "kaldi", "--hyp-format", "kaldi")
    assert out["wer"]["value"] == 0.0 and list(out["wer"]["sessions"]) == ["jfk"]
    assert main(["eval", *argv, "--ref-format", "kaldi"]) == 2
    err = capsys.readouterr().err
    assert "hyp.trn: cannot tell the format" in err and "--hyp-format" in err


def test_meeteval_example_kaldi_texts(
    shared_data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """meeteval's `text_ref`/`text_hyp` (keyed text, 6 utterances) were "cannot tell the
    format". Counts as jiwer gives them on the same utterances: S=2 D=7 I=0 of 92 words."""
    folder = shared_data / "meeteval-examples"
    argv = ["--ref", str(folder / "text_ref"), "--hyp", str(folder / "text_hyp")]
    out = run_json(capsys, *argv, "--metric", "all", "--normalize", "none")
    assert set(out) == {"cer", "wer"} and len(out["wer"]["sessions"]) == 6
    wer = out["wer"]
    counts = (wer["substitutions"], wer["deletions"], wer["insertions"], wer["ref_length"])
    assert counts == (2, 7, 0, 92)


def test_sessions_without_a_common_id_are_refused_and_lone_ones_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No reference session id in the hypothesis scored everything as deletions and
    insertions without a word (a CLI trial): CER 1.0 about the ids, not the words. It is an
    error now; sessions on one side only are scored and named on stderr, at most
    MAX_LISTED_SESSIONS of them."""
    ref, hyp = tmp_path / "ref.stm", tmp_path / "hyp.stm"
    ref.write_text("".join(f"m{i:02} 1 A 0 1 hello world\n" for i in range(12)))
    hyp.write_text("".join(f"M{i:02} 1 A 0 1 hello world\n" for i in range(12)))
    for metric in ("cer", "der"):
        assert main(["eval", "--ref", str(ref), "--hyp", str(hyp), "--metric", metric]) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err.count("\n") == 1
        assert (
            "no session id of the reference ('m00', 'm01', 'm02', 'm03', 'm04' and 7 more) "
            "is in the hypothesis ('M00'" in captured.err
        )
    hyp.write_text("m00 1 A 0 1 hello world\nx 1 A 0 1 hello\n")
    argv = ["eval", "--ref", str(ref), "--hyp", str(hyp), "--metric", "wer", "--json"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert out["wer"]["deletions"] == 22 and out["wer"]["insertions"] == 1
    assert captured.err.splitlines() == [
        "livemeet eval: warning: reference sessions not in the hypothesis (11 of 12; they count "
        "as all deletions / missed speech): 'm01', 'm02', 'm03', 'm04', 'm05' and 6 more",
        "livemeet eval: warning: hypothesis sessions not in the reference (1 of 2; they count "
        "as all insertions / false alarm): 'x'",
    ]
    hyp.write_text(ref.read_text())
    assert main(["eval", "--ref", str(ref), "--hyp", str(hyp)]) == 0
    assert capsys.readouterr().err == ""  # every session matched: nothing to say


@pytest.mark.parametrize("form", ["json", "txt"])
def test_a_json_or_text_response_scores_the_text_metrics(
    tmp_path: Path, shared_data: Path, capsys: pytest.CaptureFixture[str], form: str
) -> None:
    """`transcribe --format json` (`{"text": ...}`) and `--format text` (.txt) outputs were
    refused as hypotheses ("needs a 'segments' list"; found by a trial), though WER against
    a Kaldi `text` needs no segments. Now they score CER/WER; DER says they have no times."""
    ref = shared_data / "jfk" / "text"
    words = ref.read_text().split(maxsplit=1)[1].replace("country", "county", 1)
    hyp = tmp_path / f"hyp.{form}"
    hyp.write_text(json.dumps({"text": words, "usage": {}}) if form == "json" else words + "\n")
    out = run_json(capsys, "--ref", str(ref), "--hyp", str(hyp), "--metric", "all")
    assert set(out) == {"cer", "wer"}
    assert out["wer"]["value"] == pytest.approx(1 / 22)
    assert main(["eval", "--ref", str(ref), "--hyp", str(hyp), "--metric", "der"]) == 2
    assert "has no times" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"usage": {}}))
    assert main(["eval", "--ref", str(ref), "--hyp", str(bad)]) == 2
    assert "needs a 'segments' list or a 'text'" in capsys.readouterr().err
