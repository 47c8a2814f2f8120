"""labkit's own small models, sized to train in seconds on a CPU: `SmallCNN` (BatchNorm convolutions) and
`TinyViT` (a small vision transformer: LayerNorm, attention and MLP Linear layers)."""

from __future__ import annotations

import torch
from torch import nn

from ..env import OFFLINE_ENV, is_online  # noqa: F401 - is_online is part of this module's API
from ..errors import ConfigError


def _conv_bn_relu(in_channels: int, out_channels: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False),
                         nn.BatchNorm2d(out_channels), nn.ReLU(inplace=True))


def _block(in_channels: int, out_channels: int) -> nn.Sequential:
    # Downsample first (a strided conv), then work at the lower resolution: a quarter of the FLOPs
    # of convolving at full resolution and pooling afterwards, which keeps CPU runs quick.
    return nn.Sequential(_conv_bn_relu(in_channels, out_channels, stride=2),
                         _conv_bn_relu(out_channels, out_channels))


class SmallCNN(nn.Module):
    """A compact CNN for 32x32 images (~0.29M parameters, ~12M multiply-adds per image).

    Its children are exactly its stages: ``stem`` (conv-bn-relu), ``block1``..``block3`` (a stride-2
    conv-bn-relu then a conv-bn-relu: 32 -> 16 -> 8 -> 4 pixels) and ``head`` (global average pool,
    flatten, Linear).

    Args:
        num_classes: outputs of the head.
        widths: channels of the stem and of each block.

    Example:
        >>> SmallCNN(10)(torch.zeros(2, 3, 32, 32)).shape
        torch.Size([2, 10])
    """

    def __init__(self, num_classes: int, widths: tuple[int, int, int, int] = (24, 32, 64, 128)):
        super().__init__()
        self.stem = _conv_bn_relu(3, widths[0])
        self.block1 = _block(widths[0], widths[1])
        self.block2 = _block(widths[1], widths[2])
        self.block3 = _block(widths[2], widths[3])
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(widths[3], num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block3(self.block2(self.block1(self.stem(x)))))


class PatchEmbed(nn.Module):
    """Cut a 32x32 image into ``patch`` x ``patch`` patches, embed each as a ``dim``-vector, add a learned position."""

    def __init__(self, image_size: int, patch: int, dim: int):
        super().__init__()
        if image_size % patch:
            raise ConfigError("patch", patch, f"a divisor of the image size {image_size}")
        self.proj = nn.Conv2d(3, dim, kernel_size=patch, stride=patch)
        self.position = nn.Parameter(torch.zeros(1, (image_size // patch) ** 2, dim))
        nn.init.trunc_normal_(self.position, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).flatten(2).transpose(1, 2) + self.position  # [B, tokens, dim]


class Attention(nn.Module):
    """Multi-head self-attention with plain ``nn.Linear`` projections (so that int8 quantization reaches them)."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # No shape unpacking, so that torch.fx can trace it (static quantization in notebook 06 does).
        qkv = self.qkv(x).unflatten(-1, (3, self.heads, -1)).permute(2, 0, 3, 1, 4)  # [3, B, heads, tokens, d]
        out = nn.functional.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2])
        return self.proj(out.transpose(1, 2).flatten(2))


class TransformerBlock(nn.Module):
    """A pre-norm transformer block: x + attention(norm(x)), then x + MLP(norm(x))."""

    def __init__(self, dim: int, heads: int, mlp_ratio: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_ratio * dim), nn.GELU(), nn.Linear(mlp_ratio * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class TokenMean(nn.Module):
    """Average over the tokens: [B, tokens, dim] -> [B, dim] (the head's pooling)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=1)


class TinyViT(nn.Module):
    """A small vision transformer for 32x32 images, Linear-heavy: 4x4 patches (64 tokens), width 128, 4 blocks.

    Its children are its stages: ``stem`` (patch embedding and positions), ``block1``..``block4`` (pre-norm
    transformer blocks, each attention and an MLP of plain ``nn.Linear`` layers) and ``head`` (LayerNorm,
    mean over tokens, Linear). Almost all of its multiply-adds are in Linear layers, where int8 pays off.

    Example:
        >>> TinyViT(10)(torch.zeros(2, 3, 32, 32)).shape
        torch.Size([2, 10])
    """

    def __init__(self, num_classes: int, image_size: int = 32, patch: int = 4, dim: int = 128, depth: int = 4,
                 heads: int = 4, mlp_ratio: int = 2):
        super().__init__()
        self.stem = PatchEmbed(image_size, patch, dim)
        for i in range(depth):
            self.add_module(f"block{i + 1}", TransformerBlock(dim, heads, mlp_ratio))
        self.head = nn.Sequential(nn.LayerNorm(dim), TokenMean(), nn.Linear(dim, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for module in self.children():
            x = module(x)
        return x


# `shrunk_resnet`: torchvision's ResNet layouts by name (block, blocks per stage).
RESNET_LAYOUTS = {"resnet18": ("BasicBlock", (2, 2, 2, 2)), "resnet50": ("Bottleneck", (3, 4, 6, 3))}
SHRUNK_WIDTH_DIVISOR = 2  # half: the stem keeps about its real share of the FLOPs (1/4 doubled it)


def shrunk_resnet(name: str, num_classes: int, divisor: int = SHRUNK_WIDTH_DIVISOR) -> nn.Module:
    """torchvision's ResNet ``name`` at 1/``divisor`` of its width: the same stem, stages, blocks, strides, BatchNorm
    layers, shortcuts and module names (``conv1`` ... ``layer4``, ``fc``), a quarter of its parameters at half width.
    The ``full`` profile's ResNet-18 under ``$LABKIT_SHRINK`` (`labkit.env.FULL_SHRUNK`).

    Example:
        >>> sum(p.numel() for p in shrunk_resnet("resnet18", 10).parameters())
        2801450
    """
    if name not in RESNET_LAYOUTS:
        raise ConfigError("model", name, f"one of {list(RESNET_LAYOUTS)}")
    from torchvision.models import resnet

    block_name, layers = RESNET_LAYOUTS[name]
    block = getattr(resnet, block_name)

    class ShrunkResNet(resnet.ResNet):
        def _make_layer(self, block, planes, blocks, stride=1, dilate=False):
            if planes == 64:  # the first stage: its input is the stem's output, narrowed below
                self.inplanes = 64 // divisor
            return super()._make_layer(block, planes // divisor, blocks, stride, dilate)

    model = ShrunkResNet(block, list(layers), num_classes=num_classes)
    width = 64 // divisor
    model.conv1 = nn.Conv2d(3, width, kernel_size=7, stride=2, padding=3, bias=False)
    model.bn1 = nn.BatchNorm2d(width)
    model.fc = nn.Linear(512 // divisor * block.expansion, num_classes)
    nn.init.kaiming_normal_(model.conv1.weight, mode="fan_out", nonlinearity="relu")  # as ResNet initialises
    return model
