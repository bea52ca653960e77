"""Reference side of tokenizer-variants.int.test.ts.

Reads {"tinyModelDir": str, "smolModelDir": str | null, "outDir": str, "strings": [str], "chats": [{"messages", "tools"}]}
as JSON on stdin, writes tokenizer variants of the tiny model under outDir (one directory each: added-token flags,
normalisers, a SentencePiece-style byte-fallback BPE), and prints {"models": {name: {"encode":
[[id]], "plain": [[id]], "chats": [{"ids", "sanitizedIds"}], "decode": [str], "random": [{"ids", "text", "skipped"}]}}} on stdout: what transformers gives
for each string (with and without added-token matching, and its ids decoded), random ids
decoded, and each chat (apply_chat_template). SmolLM2-135M-Instruct's directory, where given, is
the variant `smollm2`, read as it is.
"""

import copy
import json
import os
import random
import sys

from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import AutoTokenizer

ADDED = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
NON_SPECIAL = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]


def write(out_dir, name, spec, config, template, tool_use=None):
    """A model directory; `tool_use`: a named template besides the default, as a file or (a list) in the config."""
    path = os.path.join(out_dir, name)
    os.makedirs(path, exist_ok=True)
    if tool_use is not None and tool_use[0] == "config":
        config = {**config, "chat_template": [{"name": "default", "template": template}, {"name": "tool_use", "template": tool_use[1]}]}
    elif tool_use is not None:
        os.makedirs(os.path.join(path, "additional_chat_templates"), exist_ok=True)
        with open(os.path.join(path, "additional_chat_templates", "tool_use.jinja"), "w", encoding="utf-8") as f:
            f.write(tool_use[1])
    with open(os.path.join(path, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(spec, f, ensure_ascii=False)
    config = copy.deepcopy(config)
    keys = ("content", "lstrip", "normalized", "rstrip", "single_word", "special")
    config["added_tokens_decoder"] = {str(t["id"]): {k: t[k] for k in keys} for t in spec["added_tokens"]}
    with open(os.path.join(path, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False)
    if tool_use is None or tool_use[0] != "config":
        with open(os.path.join(path, "chat_template.jinja"), "w", encoding="utf-8") as f:
            f.write(template)
    return path


def flag_variant(base, flags, normalizer):
    """The tiny model with `flags` set on <|im_end|> and <think> (the template writes both), and a normaliser."""
    spec = copy.deepcopy(base)
    spec["normalizer"] = normalizer
    for token in spec["added_tokens"]:
        if token["content"] in ("<|im_end|>", "<think>"):
            token.update(flags)
    return spec


def sentencepiece(corpus, legacy):
    """
    A small SentencePiece-style BPE with byte fallback: a Metaspace prepending "▁" at the start of the
    input only, or (`legacy`, Llama 2's conversion) a normaliser prepending it to every piece and a
    ByteFallback decoder.
    """
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    if legacy:
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
        steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
        tok.decoder = decoders.Sequence(steps)
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
        tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
    bytes_ = [f"<0x{i:02X}>" for i in range(256)]
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=600, special_tokens=["<unk>", "<s>", "</s>", *bytes_]))
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in ADDED])
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in NON_SPECIAL])
    return json.loads(tok.to_str())


def random_decodes(tokenizer, vocab_size, added_ids):
    """Seeded random id lists (byte tokens, added tokens, ids past the vocabulary) and their decodings."""
    rnd = random.Random(7)
    out = []
    for _ in range(300):
        ids = []
        for _ in range(rnd.randint(1, 12)):
            r = rnd.random()
            ids.append(rnd.choice(added_ids) if r < 0.1 else vocab_size + 10_000 if r < 0.12 else rnd.randrange(min(vocab_size, 300)) if r < 0.6 else rnd.randrange(vocab_size))
        out.append({"ids": ids, "text": tokenizer.decode(ids), "skipped": tokenizer.decode(ids, skip_special_tokens=True)})
    return out


def main() -> None:
    request = json.loads(sys.stdin.read())
    tiny = request["tinyModelDir"]
    with open(os.path.join(tiny, "tokenizer.json"), encoding="utf-8") as f:
        base = json.load(f)
    with open(os.path.join(tiny, "tokenizer_config.json"), encoding="utf-8") as f:
        config = json.load(f)
    with open(os.path.join(tiny, "chat_template.jinja"), encoding="utf-8") as f:
        template = f.read()
    variants = {}
    for flag in ("lstrip", "rstrip", "single_word", "normalized"):
        for norm in (None, "Lowercase", "NFKC"):
            name = f"{flag}-{norm or 'none'}"
            variants[name] = flag_variant(base, {flag: True}, norm and {"type": norm})
    variants["all-flags-lowercase"] = flag_variant(
        base, {"lstrip": True, "rstrip": True, "single_word": True, "normalized": True}, {"type": "Lowercase"}
    )
    # Without "<" and ">", no added token is learnt as a piece of the model, and those two fall back to bytes.
    corpus = [s.replace("<", "").replace(">", "") for s in request["strings"]] * 3
    variants["metaspace-first"] = sentencepiece(corpus, legacy=False)
    variants["sentencepiece-legacy"] = sentencepiece(corpus, legacy=True)
    # The same vocabulary (its merges cross "▁") with the Metaspace cutting before each "▁".
    variants["metaspace-split"] = copy.deepcopy(variants["metaspace-first"])
    variants["metaspace-split"]["pre_tokenizer"]["split"] = True
    # Digits before ByteLevel (Falcon's and StarCoder's kind): numbers are every \p{N}, not 0-9 only.
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    for name, individual in (("digits", True), ("digit-runs", False)):
        variants[name] = copy.deepcopy(base)
        digits = {"type": "Digits", "individual_digits": individual}
        variants[name]["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [digits, byte_level]}
    # Whitespace added tokens that the template writes: transformers takes those that are not
    # str.isspace() for control tokens (U+FEFF is one, U+001C and U+0085 are not).
    spaces = copy.deepcopy(base)
    next_id = max(t["id"] for t in spaces["added_tokens"]) + 1
    for i, content in enumerate(["\x1c", "\ufeff", "\x85", "\n\n"]):
        flags = dict(single_word=False, lstrip=False, rstrip=False, normalized=False, special=False)
        spaces["added_tokens"].append({"id": next_id + i, "content": content, **flags})
    variants["whitespace-tokens"] = spaces
    templates = {"whitespace-tokens": template + "{{- '\x1c' + '\ufeff' + '\x85' -}}"}
    # transformers 5 ignores clean_up_tokenization_spaces for a BPE model when it decodes.
    variants["clean-up-spaces"] = base
    # A non-special token named in additional_special_tokens is not skipped by decode(skip_special_tokens=True).
    variants["additional-special-names"] = base
    configs = {
        "clean-up-spaces": {**config, "clean_up_tokenization_spaces": True},
        "additional-special-names": {**config, "additional_special_tokens": ["<|im_start|>", "<|im_end|>", "<think>"]},
    }

    # Named templates: transformers renders a request with tools with `tool_use`.
    tool_use = "{{- 'TOOL USE\\n' -}}" + template
    named = {"tool-use-file": ("file", tool_use), "tool-use-config": ("config", tool_use)}
    for name in named:
        variants[name] = base

    paths = {name: write(request["outDir"], name, spec, configs.get(name, config), templates.get(name, template), named.get(name))
             for name, spec in variants.items()}
    if request.get("smolModelDir"):
        with open(os.path.join(request["smolModelDir"], "tokenizer.json"), encoding="utf-8") as f:
            variants["smollm2"] = json.load(f)
        paths["smollm2"] = request["smolModelDir"]

    results = {}
    for name, spec in variants.items():
        tokenizer = AutoTokenizer.from_pretrained(paths[name])
        chats = []
        for chat in request["chats"]:
            messages = chat["messages"]
            common = dict(tools=chat["tools"], add_generation_prompt=True, tokenize=True)
            plain = tokenizer.apply_chat_template(messages, **common)
            sanitized = tokenizer.apply_chat_template(messages, sanitize_control_tokens=True, **common)
            chats.append({"ids": list(plain["input_ids"]), "sanitizedIds": list(sanitized["input_ids"])})
        results[name] = {
            "encode": [tokenizer.encode(s, add_special_tokens=False) for s in request["strings"]],
            "plain": [tokenizer._encode_without_added_tokens(s) for s in request["strings"]],
            "chats": chats,
            "decode": [tokenizer.decode(tokenizer.encode(s, add_special_tokens=False)) for s in request["strings"]],
            "random": random_decodes(tokenizer, len(spec["model"]["vocab"]), [t["id"] for t in spec["added_tokens"]]),
        }
    json.dump({"models": results}, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
