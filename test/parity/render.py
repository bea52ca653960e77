"""Reference renderer for the chat-template parity test.

Reads {"modelDir": str, "cases": [{"id", "messages", "tools", "extra"}]} as JSON on stdin
and prints {"results": {id: {"ids": [...], "sanitizedIds": [...], "text": str}}} on stdout:
transformers' apply_chat_template(..., add_generation_prompt=True, tokenize=True), plain and with
sanitize_control_tokens=True.
"""

import json
import sys

from transformers import AutoTokenizer


def main() -> None:
    request = json.loads(sys.stdin.read())
    tokenizer = AutoTokenizer.from_pretrained(request["modelDir"])
    results = {}
    for case in request["cases"]:
        kwargs = dict(case.get("extra") or {})
        common = dict(tools=case.get("tools"), add_generation_prompt=True, **kwargs)
        text = tokenizer.apply_chat_template(case["messages"], tokenize=False, **common)
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
