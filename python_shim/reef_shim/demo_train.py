"""Pre-training of the demo model: render the corpus, mask to assistant tokens, fit.

Each conversation is rendered with the model's own chat template (the same text the gateway
renders) and tokenized whole; the loss covers every assistant turn's tokens including its
`<|im_end|>`, nothing else. A batch holds conversations with the same system turn (system prompt
and tools block), which runs once per batch, and of similar length (less padding); the batch order
is fixed by the seed; AdamW with warm-up and cosine decay; one thread (set by the caller).
"""

from __future__ import annotations

import math
import random
import time
from typing import Any

from .tiny_model import HERE as TINY_HERE

BATCH = 8
CORPUS_SEED = 20260411
LR, WARMUP, MIN_LR_FRACTION = 4e-3, 20, 0.05


def _renderer(tokenizer: Any) -> Any:
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_object=tokenizer)
    tok.chat_template = (TINY_HERE / "tiny_chat_template.jinja").read_text(encoding="utf-8")
    return tok


def render_text(msgs: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
    """A conversation as the chat template renders it (the tokenizer's training text)."""
    global _TEXT_RENDERER
    if _TEXT_RENDERER is None:
        from tokenizers import Tokenizer, models

        _TEXT_RENDERER = _renderer(Tokenizer(models.BPE()))
    return _TEXT_RENDERER.apply_chat_template(msgs, tools=tools, tokenize=False)


_TEXT_RENDERER: Any = None


def encode_conversation(renderer: Any, tokenizer: Any, msgs: list[dict[str, Any]],
                        tools: list[dict[str, Any]] | None) -> tuple[tuple[int, ...], list[int], list[bool]]:
    """(system-turn ids, the rest's ids, per rest token whether the loss covers it).

    The system turn (with the tools block) ends in `<|im_end|>` and a newline before the next
    special token, so tokenizing it apart gives the same ids as tokenizing the whole text.
    """
    text = renderer.apply_chat_template(msgs, tools=tools, tokenize=False)
    head = len(renderer.apply_chat_template(msgs[:1], tools=tools, tokenize=False))
    spans = []
    for i, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        start = len(renderer.apply_chat_template(msgs[:i], tools=tools, tokenize=False, add_generation_prompt=True))
        end = text.index("<|im_end|>", start) + len("<|im_end|>")
        spans.append((start - head, end - head))
    prefix = tokenizer.encode(text[:head], add_special_tokens=False).ids
    enc = tokenizer.encode(text[head:], add_special_tokens=False)
    mask = [any(s <= a < e for s, e in spans) for a, _ in enc.offsets]
    return tuple(prefix), enc.ids, mask


def _batches(examples: list[tuple[tuple[int, ...], list[int], list[bool]]], rng: random.Random) -> list[list[int]]:
    """Batches of one shared system turn each, of similar lengths, in a seeded order."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, (prefix, ids, _) in enumerate(examples):
        groups.setdefault(prefix, []).append(i)
    batches = []
    for prefix in sorted(groups):
        order = sorted(groups[prefix], key=lambda i: (len(examples[i][1]), i))
        batches += [order[i:i + BATCH] for i in range(0, len(order), BATCH)]
    rng.shuffle(batches)
    return batches


def pretrain(b: Any, steps: int) -> None:
    import torch

    from .demo_corpus import conversations

    started = time.monotonic()
    renderer = _renderer(b.tokenizer)
    pad = b.tokenizer.token_to_id("<|endoftext|>")
    # Enough conversations that no batch repeats within `steps`.
    convs = conversations(steps * BATCH, CORPUS_SEED + b.seed)
    examples = [encode_conversation(renderer, b.tokenizer, m, t) for m, t in convs]
    rng = random.Random(b.seed)
    batches = _batches(examples, rng)
    b.say(f"corpus: {len(examples)} conversations, {sum(len(e[0]) + len(e[1]) for e in examples)} tokens, "
          f"rendered in {time.monotonic() - started:.1f} s")
    model = b.model
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.98), weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: _lr_factor(s, steps))
    torch.manual_seed(b.seed)
    loss_avg = None
    for step in range(steps):
        rows = [examples[i] for i in batches[step % len(batches)]]
        loss = _loss(model, rows, pad)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        loss_avg = loss.item() if loss_avg is None else 0.9 * loss_avg + 0.1 * loss.item()
        if step % 25 == 0 or step == steps - 1:
            b.say(f"step {step}/{steps} loss {loss_avg:.3f} ({time.monotonic() - started:.0f} s)")


def _lr_factor(step: int, steps: int) -> float:
    if step < WARMUP:
        return (step + 1) / WARMUP
    t = (step - WARMUP) / max(1, steps - WARMUP)
    return MIN_LR_FRACTION + (1 - MIN_LR_FRACTION) * 0.5 * (1 + math.cos(math.pi * t))


def _loss(model: Any, rows: list[tuple[tuple[int, ...], list[int], list[bool]]], pad: int) -> Any:
    """Mean loss over the assistant tokens; the shared system turn runs once and its keys and
    values serve every row (a third of the tokens of a conversation are that turn)."""
    import torch

    prefix = torch.tensor([rows[0][0]])
    width = max(len(ids) for _, ids, _ in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    attn = torch.zeros((len(rows), prefix.shape[1] + width), dtype=torch.long)
    attn[:, :prefix.shape[1]] = 1
    for r, (_, row_ids, mask) in enumerate(rows):
        n = len(row_ids)
        ids[r, :n] = torch.tensor(row_ids)
        attn[r, prefix.shape[1]:prefix.shape[1] + n] = 1
        labels[r, :n] = torch.tensor([t if m else -100 for t, m in zip(row_ids, mask)])
    cache = model(input_ids=prefix, use_cache=True).past_key_values
    for layer in cache.layers:
        layer.keys = layer.keys.expand(len(rows), -1, -1, -1)
        layer.values = layer.values.expand(len(rows), -1, -1, -1)
    pos = torch.arange(prefix.shape[1], prefix.shape[1] + width)[None].expand(len(rows), -1)
    logits = model(input_ids=ids, attention_mask=attn, position_ids=pos, past_key_values=cache).logits
    # Position t predicts token t + 1; the first rest token (`<|im_start|>`) never carries loss.
    return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                             labels[:, 1:].reshape(-1), ignore_index=-100)
