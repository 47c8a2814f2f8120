"""Models by name, their stages (stem ... head) for freezing, and pretrained weights with an offline path.

Where the starting weights come from, in order (`build` reports which in `WeightsInfo`):

1. ImageNet weights from torchvision, when online and torchvision has them for the model;
2. labkit's own checkpoint in `checkpoint_dir()`, pretrained on the ``shapes_source`` task;
3. random weights, with a loud warning.

The classification head is always new: it is sized for, and trained on, the fine-tuning classes.
One module each: `catalog` (names, weights, stages), `architectures` (labkit's own models), `checkpoints`,
`language` (the Llama language models, `build_language_model`; transformers imported only when one is built),
`hub` (hub models by name with their architectures; downloaded weights online, config-built offline).
"""

from ..env import is_online  # whether weights can be downloaded: part of this module's API
from . import own, own_vision
from .architectures import Attention, PatchEmbed, SmallCNN, TinyViT, TokenMean, TransformerBlock
from .catalog import (
    WeightsInfo,
    available,
    block_names,
    build,
    build_for_split,
    build_language_model,
    forward_head,
    has_batchnorm,
    named_stages,
    save_checkpoint,
    unwrap,
)
from .checkpoints import (
    CHECKPOINT_DIR_ENV,
    MANIFEST_NAME,
    SHIPPED_CHECKPOINTS,
    checkpoint_dir,
    load_checkpoint,
)
from .hub import HUB_MODELS, DecoderShape, HubModel, build_hub_model, hub_config, hub_models, hub_tokenizer
from .language import (
    LANGUAGE_MODELS,
    decoder_layers,
    is_language_model,
    language_models,
    max_positions,
    output_layer_tied,
    uncounted_attention_flops,
)

__all__ = ["own", "own_vision",
           "Attention", "CHECKPOINT_DIR_ENV", "MANIFEST_NAME", "PatchEmbed", "SHIPPED_CHECKPOINTS", "SmallCNN",
           "TinyViT", "TokenMean", "TransformerBlock", "WeightsInfo", "available", "block_names", "build",
           "decoder_layers",
           "build_for_split",
           "build_language_model", "LANGUAGE_MODELS", "is_language_model", "language_models", "max_positions",
           "output_layer_tied", "uncounted_attention_flops", "HUB_MODELS", "DecoderShape", "HubModel",
           "build_hub_model", "hub_config", "hub_models", "hub_tokenizer",
           "checkpoint_dir", "forward_head", "has_batchnorm", "is_online", "load_checkpoint", "named_stages",
           "save_checkpoint", "unwrap"]
