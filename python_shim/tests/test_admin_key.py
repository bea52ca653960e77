"""The engines' admin key on an SGLang command line: in a 0600 config file, never on argv."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from reef_shim.engines.admin_key import authorized, sglang_admin_args


def test_sglang_gets_the_key_in_a_private_config_file(tmp_path: Path) -> None:
    args = sglang_admin_args(["--mem-fraction-static", "0.8"], "k3y", str(tmp_path / "logs"), "rollout", 30000, "rollout")
    assert args[0] == "--config" and "k3y" not in " ".join(args)
    path = Path(args[1])
    assert path.suffix == ".yaml"  # SGLang 0.5.23 refuses another (srt/utils/server_args_config_parser.py)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_text()) == {"admin-api-key": "k3y"}


@pytest.mark.parametrize("arg", ["--api-key", "--api-key=x", "--admin-api-key", "--admin", "--config", "--tokenizer-worker-num=2",
                                 "--tokenizer-w"])
def test_flags_that_would_undo_the_key_are_refused_with_their_key_path(tmp_path: Path, arg: str) -> None:
    with pytest.raises(ValueError, match=r"cluster\.prm\.extra_args\[1\]"):
        sglang_admin_args(["--dtype=bfloat16", arg], "k", str(tmp_path), "prm-0", 30001, "prm")


def test_a_bearer_key_is_compared_whole() -> None:
    assert authorized("Bearer abc", "abc")
    assert not authorized("Bearer abcd", "abc") and not authorized("abc", "abc") and not authorized(None, "abc")
    assert authorized(None, None)
