"""Reference renderer for the chat-template parity test.

Reads {"modelDir": str, "cases": [{"id", "modelDir", "messages", "tools", "extra"}]} as JSON on
stdin (a case's modelDir, where given, overrides the request's)
and prints {"results": {id: {"ids": [...], "sanitizedIds": [...], "text": str}}} on stdout:
transformers' apply_chat_template(..., add_generation_prompt=True, tokenize=True), plain and with
sanitize_control_tokens=True; {"error": str} for a case whose template raised.
"""

import json
import sys

from transformers import AutoTokenizer


def main() -> None:
    request = json.loads(sys.stdin.read())
    tokenizers = {}
    results = {}
    for case in request["cases"]:
        model_dir = case.get("modelDir") or request["modelDir"]
        if model_dir not in tokenizers:
            tokenizers[model_dir] = AutoTokenizer.from_pretrained(model_dir)
        tokenizer = tokenizers[model_dir]
        kwargs = dict(case.get("extra") or {})
        common = dict(tools=case.get("tools"), add_generation_prompt=True, **kwargs)
        try:
            text = tokenizer.apply_chat_template(case["messages"], tokenize=False, **common)
        except Exception as e:  # the template refuses this chat (SmolLM2's on a message without content)
            results[case["id"]] = {"error": f"{type(e).__name__}: {e}"}
            continue
        plain = tokenizer.apply_chat_template(case["messages"], tokenize=True, **common)
        sanitized = tokenizer.apply_chat_template(
            case["messages"], tokenize=True, sanitize_control_tokens=True, **common
        )
        results[case["id"]] = {
            "ids": list(plain["input_ids"]),
            "sanitizedIds": list(sanitized["input_ids"]),
            "text": text,
        }
    json.dump({"results": results}, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
