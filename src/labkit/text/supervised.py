"""A learner's records as token ids and labels, the loss where they expect it (``loss_on``).

- text segments (``text``, ``prompt`` + ``completion``, Alpaca): each segment encoded in turn, so a label boundary is
  exactly the prompt's end; labels are -100 on the segments the loss is not on;
- chat messages (``messages``, ShareGPT): through the tokenizer's chat template. A template with ``{% generation %}``
  marks gives the assistant tokens itself (``return_assistant_tokens_mask``); for one without, labkit finds each
  assistant turn by rendering the conversation up to it (with the generation prompt) and up to its end, and says so
  loudly; a template whose rendering of earlier turns changes when a turn is added (one that drops earlier reasoning)
  has no such span, and is refused. A tokenizer with no template gets ChatML (``<|im_start|>role ... <|im_end|>``);
- every example ends with the EOS token, in the labels wherever the end is trained, also where the tokenizer's pad
  equals its EOS (padding is masked by the attention mask and the labels, never by the pad id);
- the first token never has a label (nothing in its document predicts it).
"""

from __future__ import annotations

import re

from ..errors import ConfigError
from .records import Example
from .tasks import IGNORE_INDEX

GENERATION_MARK = re.compile(r"\{%-?\s*generation\s*-?%\}")
CHATML = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def chat_template(tokenizer) -> str | None:
    """The tokenizer's chat template (None: it has none, so `chat_pieces` renders ChatML)."""
    template = getattr(getattr(tokenizer, "backend", None), "chat_template", None)
    return template if isinstance(template, str) else None


def has_generation_marks(tokenizer) -> bool:
    template = chat_template(tokenizer)
    return template is not None and GENERATION_MARK.search(template) is not None


def _render(tokenizer, messages, add_generation_prompt: bool = False) -> str:
    backend, template = getattr(tokenizer, "backend", None), chat_template(tokenizer)
    if template is None:  # ChatML, rendered here: no template engine needed
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")
    return backend.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=add_generation_prompt)


def chat_pieces(tokenizer, messages, where: str) -> list[tuple[str, bool]]:
    """A conversation as text pieces, each with whether it is an assistant turn (its text and end marker), found by
    rendering the conversation up to each assistant turn and up to its end (see the module)."""
    pieces, done = [], ""
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = _render(tokenizer, messages[:index], add_generation_prompt=True)
        upto = _render(tokenizer, messages[:index + 1])
        if not before.startswith(done) or not upto.startswith(before):
            raise ConfigError("loss_on", "assistant", "a chat template with {% generation %} marks, or one whose "
                              "rendering of a conversation starts with its rendering of every earlier turn",
                              f"{where}: this template renders turn {index + 1} differently once later turns are "
                              "added (it may drop earlier reasoning); use loss_on='all' or a template with marks")
        pieces += [(before[len(done):], False), (upto[len(before):], True)]
        done = upto
    whole = _render(tokenizer, messages)
    if not whole.startswith(done):
        raise ConfigError("loss_on", "assistant", "a template that renders a conversation as its turns in order",
                          f"{where}: the whole conversation does not start with its turns rendered one by one")
    return [*pieces, (whole[len(done):], False)]


def _marked_ids(tokenizer, messages) -> tuple[list[int], list[bool]]:
    out = tokenizer.backend.apply_chat_template(list(messages), tokenize=True, return_dict=True,
                                                return_assistant_tokens_mask=True)
    return list(out["input_ids"]), [bool(m) for m in out["assistant_masks"]]


def encode_example(tokenizer, example: Example, loss_on: str, where: str) -> tuple[list[int], list[int]]:
    """``example``'s token ids and labels (-100 where no loss is taken), ended by EOS (see the module); the EOS is
    trained where the example ends with what is trained (a completion, even an empty one; an assistant turn)."""
    if example.messages:
        end_trained = loss_on == "all" or example.messages[-1]["role"] == "assistant"
        if loss_on == "assistant" and has_generation_marks(tokenizer):
            ids, trained = _marked_ids(tokenizer, example.messages)
        elif loss_on == "assistant":
            ids, trained = _encode_pieces(tokenizer, chat_pieces(tokenizer, example.messages, where))
        else:
            ids, trained = _encode_pieces(tokenizer, [(_render(tokenizer, example.messages), True)])
    else:
        end_trained = loss_on == "all" or example.segments[-1][1]
        start = [] if tokenizer.bos_id is None else [tokenizer.bos_id]
        ids, trained = _encode_pieces(tokenizer, example.segments)
        ids, trained = start + ids, [False] * len(start) + trained
    if loss_on == "all":
        trained = [True] * len(ids)
    if not ids or ids[-1] != tokenizer.eos_id:
        ids, trained = [*ids, tokenizer.eos_id], [*trained, end_trained]
    labels = [i if t else IGNORE_INDEX for i, t in zip(ids, trained, strict=True)]
    labels[0] = IGNORE_INDEX
    return ids, labels


def _encode_pieces(tokenizer, pieces) -> tuple[list[int], list[bool]]:
    ids, trained = [], []
    for text, on in pieces:
        encoded = tokenizer.encode(text) if text else []
        ids += encoded
        trained += [on] * len(encoded)
    return ids, trained
