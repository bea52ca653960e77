"""The rule PRM double reads the judge's real prompt templates and answers by its rule table,
over the SGLang-native and the OpenAI API."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from reef_shim.engines.rule_prm_rules import (ANSWER_HINTS, CHECK_HINT, FORMAT_HINTS, SAVE_HINT, STEPS_HINTS, JudgePrompt,
                                              Turn, answer, format_hint, judge)

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ROOT / "recipes" / "openclawrl" / "prompts"
TINY = ROOT / ".cache" / "tiny-model"
BOLD_REPLY = "First, 3 × 4 = 12, so the pencils cost $12. Then 12 + 5 = 17. Maya spends **$17** in all."
PLAIN_REPLY = "First, 3 × 4 = 12, so the pencils cost $12. Then 12 + 5 = 17. Maya spends $17 in all."


def fill(kind: str, reply: str, role: str, next_state: str, context: str = "Help me: Maya buys 3 pencils...") -> str:
    """The judge's rendering (recipes/openclawrl/judge/prompts.ts: one-pass {{name}} replacement)."""
    values = {"context": context, "reply": reply, "next_role": role, "next_state": next_state}
    template = (PROMPTS / f"{kind}.md").read_text(encoding="utf-8")
    return re.sub(r"\{\{(\w+)\}\}", lambda m: values.get(m.group(1), m.group(0)), template)


def chatml(user: str) -> str:
    return f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


def verdict(text: str) -> tuple[int, str | None]:
    box = re.findall(r"\\boxed\{(-?\d)\}", text)[-1]
    hint = re.search(r"\[HINT_START\](.*?)\[HINT_END\]", text, re.S)
    return int(box), hint.group(1) if hint else None


CASES = [  # (next role, next state, reply, score, hint vote)
    ("user", "please don't use bold text, it looks AI-written and my teacher will notice. Can you rewrite it as "
             "normal sentences?", BOLD_REPLY, -1, (1, "FORMAT")),
    ("user", "Hmm, no bullet points or numbered lists please, it has to look like my own work. Can you redo it?",
     PLAIN_REPLY, -1, (1, "FORMAT")),
    ("user", "Can you show the calculations, like 3 × 4 = 12? My teacher wants to see the work.", "It is 17.",
     -1, (1, "STEPS")),
    ("user", "Perfect, that looks like my own work. Please save it for me.", PLAIN_REPLY, 1, (-1, None)),
    ("user", "Thanks, got it! HOMEWORK_DONE", "I saved your homework.", 1, (-1, None)),
    ("tool", "saved 120 characters to homework/s001.txt", '{"name": "save_homework"}', 1, (-1, None)),
    ("tool", 'error: save_homework needs JSON arguments {"content": "<the homework text>"}', "{}", -1, (1, None)),
    ("user", "What is the capital of France?", PLAIN_REPLY, 0, (-1, None)),
    # Two complaints at once: the row higher in the module docstring's table wins.
    ("user", "You didn't save it, and the bold looks AI-written.", BOLD_REPLY, -1, (1, SAVE_HINT)),
    ("user", "That's wrong, rewrite it with the calculations.", PLAIN_REPLY, -1, (1, "STEPS")),
    ("user", "I still need the answer at the end. Can you finish with the number?", PLAIN_REPLY, -1, (1, "ANSWER")),
    ("user", "Hmm, no headings please, it has to look like my own work. Can you redo it? Never mind, I'll fix it "
             "myself. HOMEWORK_DONE", PLAIN_REPLY, -1, (1, "FORMAT")),
    ("user", "That's wrong, thanks anyway.", PLAIN_REPLY, -1, (1, CHECK_HINT)),
]


@pytest.mark.parametrize("role,state,reply,score,hint_vote", CASES)
def test_rule_table_on_the_real_templates(role: str, state: str, reply: str, score: int,
                                          hint_vote: tuple[int, str | None]) -> None:
    prompts = JudgePrompt(PROMPTS)
    turn = prompts.parse(chatml(fill("score", reply, role, state)))
    assert (turn.kind, turn.next_role, turn.next_state, turn.reply) == ("score", role, state, reply)
    assert verdict(answer(turn)) == (score, None)
    hint_turn = prompts.parse(chatml(fill("hint", reply, role, state)))
    assert hint_turn.kind == "hint" and hint_turn.next_state == state
    vote, hint = verdict(answer(hint_turn))
    assert vote == hint_vote[0]
    if hint_vote[1] is not None:
        want = {"FORMAT": format_hint(state), "STEPS": STEPS_HINTS, "ANSWER": ANSWER_HINTS}.get(hint_vote[1], hint_vote[1])
        assert hint in want if isinstance(want, tuple) else hint == want
    assert (hint is None) == (vote == -1)


def test_accept_hint_only_for_plain_accepted_replies() -> None:
    prompts = JudgePrompt(PROMPTS)
    save = "great, please save it"
    plain = prompts.parse(fill("hint", PLAIN_REPLY, "user", save))
    bold = prompts.parse(fill("hint", BOLD_REPLY, "user", save))
    assert verdict(answer(plain, accept_hint="Keep it plain: no bold.")) == (1, "Keep it plain: no bold.")
    assert verdict(answer(bold, accept_hint="Keep it plain: no bold.")) == (-1, None)
    assert judge(plain)[0] == judge(bold)[0] == 1


def test_fallbacks_without_templates() -> None:
    # Sections without the template files: the next state is read after the "What came next" header.
    text = fill("hint", BOLD_REPLY, "user", "No bold please, rewrite it.")
    turn = JudgePrompt(None).parse(chatml(text))
    assert (turn.kind, turn.next_role, turn.next_state) == ("hint", "user", "No bold please, rewrite it.")
    # Not even the header: the last ChatML user block's last paragraph.
    bare = JudgePrompt(None).parse(chatml("Judge this turn.\n\nThanks, that's great!") + "\\boxed{1}?")
    assert (bare.kind, bare.next_state) == ("score", "Thanks, that's great!")


@pytest.fixture(scope="module")
def server() -> str:
    if not (TINY / "tokenizer.json").is_file():
        pytest.skip(f"the tiny model is not built at {TINY} (scripts/setup.sh builds it)")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python_shim")}
    proc = subprocess.Popen([sys.executable, "-m", "reef_shim.engines.rule_prm_server", "--port", "0",
                             "--tokenizer-path", str(TINY), "--log-level", "warning"],
                            stdout=subprocess.PIPE, env=env, text=True)
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        yield json.loads(line)["url"]
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0


def post(url: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_sglang_api_with_text_and_input_ids(server: str) -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(TINY / "tokenizer.json"))
    prompt = chatml(fill("hint", BOLD_REPLY, "user", "Can you rewrite it without bold text?"))
    by_text = post(f"{server}/generate", {"text": prompt, "sampling_params": {"temperature": 0.6}})
    by_ids = post(f"{server}/generate", {"input_ids": tok.encode(prompt, add_special_tokens=False).ids,
                                         "sampling_params": {"max_new_tokens": 256}, "return_logprob": True})
    for status, body in (by_text, by_ids):
        assert status == 200
        assert verdict(body["text"]) == (1, format_hint("Can you rewrite it without bold text?"))
        assert body["meta_info"]["finish_reason"] == {"type": "stop", "matched": tok.token_to_id("<|im_end|>")}
        assert body["output_ids"][-1] == tok.token_to_id("<|im_end|>")
        assert tok.decode(body["output_ids"]) == body["text"]
    assert len(by_ids[1]["meta_info"]["output_token_logprobs"]) == len(by_ids[1]["output_ids"])
    cut = post(f"{server}/generate", {"text": prompt, "sampling_params": {"max_new_tokens": 3}})[1]
    assert cut["meta_info"]["finish_reason"]["type"] == "length" and len(cut["output_ids"]) == 3
    assert post(f"{server}/generate", {"sampling_params": {}})[0] == 400
    with urllib.request.urlopen(f"{server}/model_info", timeout=10) as r:
        info = json.loads(r.read())
    assert info["is_generation"] is True and info["vocab_size"] == tok.get_vocab_size(with_added_tokens=True)
    with urllib.request.urlopen(f"{server}/health", timeout=10) as r:
        assert r.status == 200


def test_openai_chat_completions(server: str) -> None:
    body = {"model": "prm", "n": 2, "temperature": 0.6, "messages": [
        {"role": "user", "content": fill("score", PLAIN_REPLY, "user", "Nice, please save it.")}]}
    status, reply = post(f"{server}/v1/chat/completions", body)
    assert status == 200 and len(reply["choices"]) == 2
    assert [verdict(c["message"]["content"]) for c in reply["choices"]] == [(1, None), (1, None)]
    assert reply["choices"][0]["finish_reason"] == "stop"
    assert post(f"{server}/v1/chat/completions", {"messages": []})[0] == 400


def test_malformed_bodies_are_answered_400_not_dropped(server: str) -> None:
    for path, body in [("/generate", {"text": "x", "sampling_params": [1]}),
                       ("/generate", {"text": "x", "sampling_params": {"max_new_tokens": "5"}}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": "5"}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "n": 10**9})]:
        status, reply = post(f"{server}{path}", body)
        assert status == 400 and reply["error"]["code"] == "REEF_ERR_INVALID_ARGUMENT", body
    req = urllib.request.Request(f"{server}/generate", b"[" * 100_000 + b"]" * 100_000,
                                 {"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 400


@pytest.mark.parametrize("headers", [b"Content-Length: -1\r\n", b"Content-Length: 12x\r\n",
                                     b"Transfer-Encoding: chunked\r\n"])
def test_a_body_without_a_usable_length_is_400_and_the_connection_closed(server: str, headers: bytes) -> None:
    import socket

    host, port = server.removeprefix("http://").split(":")
    body = b'{"text": "x"}'
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"POST /generate HTTP/1.1\r\nHost: p\r\n" + headers + b"\r\n" + body)
        reply = b""
        while chunk := sock.recv(65536):  # the server closes the connection after its answer
            reply += chunk
    head, _, payload = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400"), reply
    assert json.loads(payload)["error"]["code"] == "REEF_ERR_INVALID_ARGUMENT"


def test_sampling_params_that_is_not_an_object_is_400(server: str) -> None:
    for sp in ([], 0, False, "x"):
        assert post(f"{server}/generate", {"text": "x", "sampling_params": sp})[0] == 400, sp


def test_format_hints_are_paraphrases_that_name_what_the_user_named() -> None:
    states = [f"Could you drop the {x} and write it the way a student would? ({i})"
              for i in range(12) for x in ("bold text", "headings", "bullet points or numbered lists")]
    hints = [judge(Turn("hint", "user", s, None))[1] for s in states]
    assert len(set(hints)) > len(FORMAT_HINTS)  # wordings vary across turns, and with what was named
    assert {h.split(", ")[0] for h in hints} and all(h is not None for h in hints)
    for s, h in zip(states, hints):
        named = "bold text" if "bold" in s else "headings" if "headings" in s else "lists"
        assert named in h and h == judge(Turn("hint", "user", s, None))[1]  # and the same turn, the same hint
    assert format_hint("This looks like a chatbot wrote it.").endswith("markdown formatting.")
    assert format_hint("no bold or headings please") in {t.format(x="bold text or headings") for t in FORMAT_HINTS}


def test_the_hint_prompt_example_is_not_about_the_measured_preference() -> None:
    example = re.search(r"\[HINT_START\](.*?)\[HINT_END\]", (PROMPTS / "hint.md").read_text(encoding="utf-8")).group(1)
    assert not re.search(r"bold|list|heading|header|markdown|format|plain|prose", example, re.I)
