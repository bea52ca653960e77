"""python_shim/requirements-gpu.lock (scripts/lock-gpu.sh; `npm run setup -- --gpu`) stays what it
claims to be: SGLang pinned, every line hash-pinned, torch/transformers/tokenizers at the versions
SGLang's own wheel metadata pins (recorded in the lock's header by the regenerate step; nothing is
downloaded here), and everything the CPU lock's inputs (requirements.txt) name. Reads files only."""
from __future__ import annotations

import re
from pathlib import Path

SHIM = Path(__file__).resolve().parents[1]
LOCK = SHIM / "requirements-gpu.lock"
SGLANG_PINNED = ("torch", "transformers", "tokenizers")
# Written by scripts/lock-gpu.sh from SGLang's wheel metadata.
HEADER = re.compile(r"^# sglang==(\S+) pins \(its wheel metadata\): (.+)$", re.M)


def norm(name: str) -> str:
    """PEP 503 normalised name: `Jinja2`, `typing_extensions` → `jinja2`, `typing-extensions`."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements(text: str) -> list[str]:
    """The lock's requirement lines, each with its `\\`-continued hash lines joined, comments dropped."""
    joined = re.sub(r"\\\n", " ", text)
    lines = (line.split("#", 1)[0].strip() for line in joined.splitlines())
    return [line for line in lines if line]


def parse_lock() -> dict[str, tuple[str, list[str]]]:
    """name → (version, [sha256 …]); fails on any line that is not `name==version --hash=sha256:…`."""
    pins: dict[str, tuple[str, list[str]]] = {}
    for line in requirements(LOCK.read_text(encoding="utf-8")):
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)((?:\s+--hash=sha256:[0-9a-f]{64})+)", line)
        assert m, f"not a hash-pinned requirement (name==version --hash=sha256:…): {line[:120]}"
        name = norm(m.group(1))
        assert name not in pins, f"{name} appears twice"
        pins[name] = (m.group(2), re.findall(r"sha256:([0-9a-f]{64})", m.group(3)))
    return pins


def header_pins() -> tuple[str, dict[str, str]]:
    m = HEADER.search(LOCK.read_text(encoding="utf-8"))
    assert m, "the lock's header has no '# sglang==X pins (its wheel metadata): …' line: regenerate it with scripts/lock-gpu.sh"
    return m.group(1), dict(pin.split("==") for pin in m.group(2).split())


def test_every_requirement_is_pinned_with_a_hash() -> None:
    pins = parse_lock()
    assert len(pins) > 100  # SGLang brings some 140 packages beside the shim's
    assert all(hashes for _, hashes in pins.values())


def test_sglang_is_pinned_at_the_version_the_inputs_name() -> None:
    wanted = re.search(r"^sglang==(\S+)$", (SHIM / "requirements-gpu.in").read_text(encoding="utf-8"), re.M)
    assert wanted, "requirements-gpu.in names no sglang==X"
    assert parse_lock()["sglang"][0] == wanted.group(1)


def test_torch_transformers_and_tokenizers_are_the_versions_sglang_pins() -> None:
    sglang, sglang_pins = header_pins()
    pins = parse_lock()
    assert pins["sglang"][0] == sglang, "the header's SGLang pins are of another release: regenerate the lock"
    assert sorted(sglang_pins) == sorted(SGLANG_PINNED)
    for name in SGLANG_PINNED:
        assert pins[name][0] == sglang_pins[name], f"{name}: lock {pins[name][0]}, sglang {sglang} pins {sglang_pins[name]}"


def test_the_lock_holds_everything_the_cpu_lock_inputs_name_at_their_pins() -> None:
    """requirements.txt's packages are all there; its exact pins hold, except the ones SGLang overrides."""
    pins = parse_lock()
    for line in requirements((SHIM / "requirements.txt").read_text(encoding="utf-8")):
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:==\s*(\S+))?", line)
        assert m, f"requirements.txt line this test cannot read: {line}"
        name = norm(m.group(1))
        assert name in pins, f"{name} (requirements.txt) is missing from the GPU lock: regenerate it"
        if m.group(2) and name not in SGLANG_PINNED:
            assert pins[name][0] == m.group(2), f"{name}: requirements.txt pins {m.group(2)}, GPU lock has {pins[name][0]}"
