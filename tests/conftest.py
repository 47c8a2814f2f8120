"""Tests run on the CPU with tiny seeded work: the `ci` profile, offline, a private data cache."""

import math
import os
import tempfile
import types

import pytest

os.environ["LABKIT_PROFILE"] = "ci"
os.environ["LABKIT_OFFLINE"] = "1"
os.environ["TQDM_DISABLE"] = "1"
os.environ.setdefault("MPLBACKEND", "Agg")
# The cache scripts/test.sh made for this whole test run (nbval fills it): the browser test's kernels use it,
# so that a notebook's runs come from it as the comment there says; the unit tests get a private one.
if os.environ.get("LABKIT_DATA_DIR"):
    os.environ.setdefault("LABKIT_RUN_DATA_DIR", os.environ["LABKIT_DATA_DIR"])
os.environ["LABKIT_DATA_DIR"] = tempfile.mkdtemp(prefix="labkit-test-data-")


@pytest.fixture(autouse=True)
def fresh_notes():
    """Each test starts as a new session would: no labkit note shown yet, no model's tokenizer loaded (a test may
    fake one)."""
    from labkit import messages
    from labkit.kinds import language

    messages.forget_notes()
    language.forget_tokenizers()


@pytest.fixture
def tiny_cfg():
    """A run that takes well under a second on 2 CPU cores."""
    import labkit

    return labkit.RunConfig(model="small_cnn", dataset="shapes10", batch_size=32, max_steps=6, train_size=128,
                            device="cpu")


@pytest.fixture(scope="session")
def small_cnn_bytes():
    """small_cnn's parameter and optimizer-state sizes, worked out by hand from its tensor shapes.

    Its trainable tensors: 23, of which 17 (2,882 parameters) have fewer than 4,096 elements. AdamW keeps
    8 B per parameter and a 4-byte step counter per tensor (on the CPU); 8-bit AdamW keeps fp32 moments
    below 4,096 elements and, above, uint8 moments plus an fp32 absmax per 256 values for each, and the
    two shared 1 KiB quantisation maps.
    """
    params, below = 295_490, 2_882
    large = (6912, 9216, 18432, 36864, 73728, 147456)
    return types.SimpleNamespace(
        params=params,
        below_min_8bit=below,
        adamw_state=8 * params + 4 * 23,
        eight_bit_state=8 * below + 2 * (params - below) + 8 * sum(math.ceil(n / 256) for n in large) + 2048,
    )


class _DigitsBackend:
    """A transformers tokenizer in miniature for the digit tasks: id 100 + a character's place in "0123456789>",
    and one token (id 200) for the pair "12", so that its token counts differ from the character counts."""

    chars = "0123456789>"

    def __init__(self, bos_token_id):
        self.bos_token_id, self.eos_token_id = bos_token_id, 2

    def encode(self, text, add_special_tokens=False):
        assert not add_special_tokens  # labkit adds its own start and end
        ids, i = [], 0
        while i < len(text):
            pair = text.startswith("12", i)
            ids.append(200 if pair else 100 + self.chars.index(text[i]))
            i += 2 if pair else 1
        return ids

    def decode(self, ids, skip_special_tokens=True):
        special = {1: "<s>", 2: "</s>"}
        return "".join("12" if i == 200 else self.chars[i - 100] if i >= 100 else
                       "" if skip_special_tokens else special[i] for i in ids)

    def __len__(self):
        return 201


@pytest.fixture
def fake_hub_tokenizer():
    """A factory: ``fake_hub_tokenizer(bos_token_id=1, name="fake/digits")``, a `HubTokenizer` around `_DigitsBackend`
    (``bos_token_id=None``: no start token, as Qwen2.5's tokenizer)."""
    from labkit import text

    def make(bos_token_id=1, name="fake/digits"):
        return text.HubTokenizer(_DigitsBackend(bos_token_id), name)

    return make
