"""A Hugging Face tokenizer made offline: a byte-level BPE trained on the Python docs, ChatML special tokens and a chat
template, saved as a model directory's tokenizer files (``tokenizer.json``, ``tokenizer_config.json``).

With `write_config_dir` (`labkit.models.own`) it makes a learner-shaped model directory with no download: the test
suite's and notebook 11's offline stand-in for a hub model. ``template`` picks the chat template: ``marked`` (ChatML
with ``{% generation %}`` marks around the assistant's turns, which ``return_assistant_tokens_mask`` reads),
``plain`` (the same without marks: labkit then finds the turns itself) or ``none``.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from ..errors import ConfigError
from .bpe import pydoc_documents, train_bpe

CHATML_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
_TURN = "{{ '<|im_start|>' + message['role'] + '\\n' }}"
TEMPLATES = {
    "marked": ("{% for message in messages %}" + _TURN + "{% if message['role'] == 'assistant' %}{% generation %}"
               "{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\\n' }}{% else %}"
               "{{ message['content'] + '<|im_end|>\\n' }}{% endif %}{% endfor %}"
               "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"),
    "plain": ("{% for message in messages %}" + _TURN + "{{ message['content'] + '<|im_end|>\\n' }}{% endfor %}"
              "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"),
    "none": None,
}


def write_tokenizer_dir(path: str | Path, template: str = "marked", vocab_size: int = 512,
                        pad_is_eos: bool = True) -> Path:
    """Train (about a second) and save a tokenizer in ``path`` (see the module); returns ``path``.

    Args:
        path: the model directory. template: ``marked``, ``plain`` or ``none``. vocab_size: tokens, merges included.
        pad_is_eos: the pad token is ``<|endoftext|>``, the EOS too (as in Qwen2.5's and many base models').

    Example:
        >>> write_tokenizer_dir(write_config_dir("Qwen/Qwen2.5-0.5B", "qwen-small", num_hidden_layers=2))
    """
    if template not in TEMPLATES:
        raise ConfigError("template", template, f"one of {list(TEMPLATES)}")
    transformers = importlib.import_module("transformers")
    backend = train_bpe(pydoc_documents(), vocab_size)
    backend.add_special_tokens(list(CHATML_TOKENS))
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="<|endoftext|>", bos_token=None,
        pad_token="<|endoftext|>" if pad_is_eos else "<pad>", unk_token=None)
    if TEMPLATES[template] is not None:
        tokenizer.chat_template = TEMPLATES[template]
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(path))
    return path
