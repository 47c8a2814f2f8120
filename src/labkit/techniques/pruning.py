"""Pruning, the mechanism: zero weights (unstructured), or remove whole channels and rebuild the layers (structured).

- `l1_unstructured`: magnitude pruning of every Conv2d/Linear weight with `torch.nn.utils.prune`, per
  layer or globally; `make_permanent` folds the masks into the weights (``prune.remove``); `sparsity`
  counts the zeros, overall and per layer.
- `semi_structured_mask`, `apply_2to4`: the 2:4 pattern (two of every four consecutive weights kept)
  that Ampere+ GPUs' sparse tensor cores run (`to_semi_structured` converts a Linear layer there).
- `sparse_bytes`: what a weight takes in a sparse layout (COO, CSR), to see when sparse storage pays.
- `recalibrate_batchnorm`: re-estimate BatchNorm statistics after pruning (forward passes only).
- `channel_chains`, `prune_channels`: structured pruning. A conv's output channels can be removed when
  they flow, through channel-wise layers only (BatchNorm, ReLU, depthwise convs, pooling), into exactly
  one consumer (a conv or, after global pooling, a Linear); the chains are found on a ``torch.fx``
  trace of the model, so residual additions and concatenations (ResNet, ShuffleNet) are left alone
  automatically. Channels go by the L1 norm of their filters (Li et al. 2017) and every layer of the
  chain is rebuilt smaller and dense.

Zeros stored densely change nothing about memory or speed: only structured pruning (a smaller dense
model) or a sparse format with hardware or kernels that use it does.

`l1_unstructured`'s ``amount`` may be a dict layer name -> fraction (scope ``layer`` only), e.g. chosen from a
sensitivity scan; layers not named keep all their weights. With ``scope="global"`` the smallest weights of the
whole model go, wherever they are (layers with small weights lose more). ``permanent=True`` leaves plain dense
weights with zeros; ``permanent=False`` keeps ``weight_orig`` and ``weight_mask`` (what fine-tuning a pruned
model needs: the mask keeps the zeros at zero), which makes the checkpoint larger, not smaller.

`prune_channels` removes the channels with the smallest filter L1 norms (Li et al. 2017); the conv, the
BatchNorm (and depthwise conv) after it and the input channels of the next layer are rebuilt without them
(`channel_chains`). Convs whose channels feed a residual addition or a concatenation keep them. The copy is
checked on ``example_inputs``: its output has the original's shape. The original model is not changed. A dict
``amount`` maps conv names (see `channel_chains`) to fractions; convs not named keep their channels, and at
least one channel always stays.
"""

from __future__ import annotations

import copy
import io
import warnings
from dataclasses import dataclass, field

import torch
import torch.fx
import torch.nn.utils.prune as prune
from torch import nn

from ..errors import ConfigError
from ..validate import is_number

SCOPES = ("layer", "global")
PRUNABLE = (nn.Conv2d, nn.Linear)
# Modules that act on each channel separately: a channel removed before them is simply absent after them.
_CHANNELWISE_MODULES = (nn.ReLU, nn.ReLU6, nn.SiLU, nn.GELU, nn.Hardswish, nn.Identity, nn.Dropout,
                        nn.MaxPool2d, nn.AvgPool2d)
_CHANNELWISE_FUNCTIONS = {torch.relu, torch.nn.functional.relu, torch.nn.functional.relu6, torch.sigmoid,
                          torch.nn.functional.max_pool2d, torch.nn.functional.avg_pool2d}
_POOLS = (nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool2d)


def check_amount(amount, field_name: str = "amount") -> float:
    """``amount`` as a float in [0, 1), else `ConfigError` naming the field and the value."""
    if not is_number(amount) or not 0 <= amount < 1:
        raise ConfigError(field_name, amount, "a fraction in [0, 1): the share of weights (or channels) to remove; "
                                              "1 would remove them all")
    return float(amount)


def prunable_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The Conv2d and Linear layers, by qualified name, whose ``weight`` magnitude pruning may zero.

    Example:
        >>> [name for name, _ in prunable_layers(model)][:2]
        ['stem.0', 'block1.0.0']
    """
    layers = [(name, m) for name, m in model.named_modules() if isinstance(m, PRUNABLE)]
    if not layers:
        raise ConfigError("model", type(model).__name__, "a model with Conv2d or Linear layers (nothing else is "
                                                         "pruned): this one has none")
    return layers


def _amounts(model: nn.Module, amount) -> dict[str, float]:
    """Per-layer amounts: one fraction for every prunable layer, or a dict naming some of them."""
    names = [name for name, _ in prunable_layers(model)]
    if isinstance(amount, dict):
        unknown = [k for k in amount if k not in names]
        if unknown:
            raise ConfigError("amount key", unknown[0], f"a prunable layer of this model ({', '.join(names)})")
        return {name: check_amount(value, f"amount[{name!r}]") for name, value in amount.items()}
    value = check_amount(amount)
    return dict.fromkeys(names, value)


def l1_unstructured(model: nn.Module, amount, scope: str = "layer", permanent: bool = True) -> nn.Module:
    """Zero the smallest-magnitude weights of every Conv2d and Linear layer (in place), with `torch.nn.utils.prune`.

    Args:
        model: the model (changed in place and returned).
        amount: the fraction of weights to zero, in [0, 1), or a dict layer name -> fraction (scope ``layer``).
        scope: ``layer`` (each layer loses ``amount`` of its own) or ``global`` (the smallest of the whole model).
        permanent: fold the masks into the weights (``prune.remove``); False keeps ``weight_orig``/``weight_mask``.

    Example:
        >>> l1_unstructured(model, 0.5, scope="global")
        >>> sparsity(model).overall
        0.5
    """
    if scope not in SCOPES:
        raise ConfigError("scope", scope, f"one of {list(SCOPES)}")
    amounts = _amounts(model, amount)
    modules = dict(prunable_layers(model))
    if scope == "global":
        if isinstance(amount, dict):
            raise ConfigError("amount", amount, "a single fraction with scope='global' (a dict of per-layer "
                                                "fractions needs scope='layer')")
        prune.global_unstructured([(m, "weight") for m in modules.values()], pruning_method=prune.L1Unstructured,
                                  amount=float(amount))
    else:
        for name, value in amounts.items():
            prune.l1_unstructured(modules[name], "weight", amount=value)
    if permanent:
        make_permanent(model)
    return model


def make_permanent(model: nn.Module) -> nn.Module:
    """Fold every pruning mask into its weight (``prune.remove``): the zeros stay, the mask buffers go."""
    for module in model.modules():
        for hook in list(module._forward_pre_hooks.values()):
            if isinstance(hook, prune.BasePruningMethod):
                prune.remove(module, hook._tensor_name)
    return model


@dataclass
class Sparsity:
    """How many weights of the prunable layers are zero.

    Attributes:
        overall: zeros / weights over every Conv2d and Linear weight. zeros, total: the counts.
        per_layer: layer name -> its own fraction of zeros.
    """

    overall: float
    zeros: int
    total: int
    per_layer: dict = field(default_factory=dict)


def sparsity(model: nn.Module) -> Sparsity:
    """The fraction of zero weights in every Conv2d and Linear layer, overall and per layer (masks applied).

    Example:
        >>> sparsity(model).per_layer["stem.0"]
        0.5
    """
    per_layer, zeros, total = {}, 0, 0
    for name, module in prunable_layers(model):
        weight = module.weight.detach()
        z = int((weight == 0).sum())
        per_layer[name] = z / weight.numel()
        zeros, total = zeros + z, total + weight.numel()
    return Sparsity(zeros / total, zeros, total, per_layer)


# --- 2:4 semi-structured ---------------------------------------------------------------------------


def semi_structured_mask(weight: torch.Tensor) -> torch.Tensor:
    """The 2:4 mask of a weight: the 2 largest magnitudes of every 4 consecutive values along the input dimension.

    Exactly half the weights go, in the pattern sparse tensor cores skip.

    Example:
        >>> semi_structured_mask(torch.tensor([[1., -4., 3., 2.]]))
        tensor([[False,  True,  True, False]])
    """
    flat = weight.detach().reshape(weight.shape[0], -1)
    if flat.shape[1] % 4:
        raise ConfigError("weight", tuple(weight.shape), "a weight whose inputs per output (in_features x kernel "
                                                          "size) are a multiple of 4, for groups of 4")
    groups = flat.abs().reshape(flat.shape[0], -1, 4)
    keep = groups.topk(2, dim=-1).indices
    mask = torch.zeros_like(groups, dtype=torch.bool).scatter_(-1, keep, True)
    return mask.reshape(weight.shape)


def apply_2to4(model: nn.Module) -> list[str]:
    """Zero weights in the 2:4 pattern (in place) in every layer whose shape allows it; returns those layers."""
    done = []
    with torch.no_grad():
        for name, module in prunable_layers(model):
            if module.weight[0].numel() % 4 == 0:
                module.weight.mul_(semi_structured_mask(module.weight))
                done.append(name)
    return done


def to_semi_structured(linear: nn.Linear) -> nn.Linear:
    """Swap a Linear layer's weight for torch's 2:4 compressed format (needs an Ampere+ CUDA GPU, fp16/bf16).

    The weight must already follow the 2:4 pattern (`apply_2to4`); `torch.sparse.to_sparse_semi_structured`
    keeps the nonzero half plus 2-bit indices and runs the matmul on sparse tensor cores.
    """
    from torch.sparse import to_sparse_semi_structured

    if linear.weight.device.type != "cuda":
        raise ConfigError("device", str(linear.weight.device),
                          "a CUDA GPU of compute capability 8.0+ (Ampere or newer): torch's 2:4 kernels run there only")
    linear.weight = nn.Parameter(to_sparse_semi_structured(linear.weight.detach()), requires_grad=False)
    return linear


def to_csr(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` as a CSR matrix (outputs x everything else).

    torch's beta-state warning is left out: the format works for what labkit does with it (storing, matmul).
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta state")
        return weight.detach().reshape(weight.shape[0], -1).to_sparse_csr()


LAYOUTS = ("dense", "coo", "csr")


def sparse_bytes(weight: torch.Tensor, layout: str, saved: bool = False) -> int:
    """Bytes that ``weight`` takes in ``layout``: ``dense``, ``coo`` or ``csr`` (as a matrix, outputs x the rest).

    In memory (default): the sum of the layout's tensors. COO keeps, per nonzero, its value and one int64 index
    per dimension; CSR a value and an int64 column index per nonzero, plus a row pointer per row; dense every
    value, zero or not. ``saved=True``: the size of what ``torch.save`` writes for it instead.

    Example:
        >>> sparse_bytes(torch.zeros(100, 100), "coo")
        0
    """
    if layout not in LAYOUTS:
        raise ConfigError("layout", layout, f"one of {list(LAYOUTS)}")
    w = weight.detach()
    if layout == "dense":
        parts = [w.contiguous()]
    elif layout == "coo":
        coo = w.to_sparse().coalesce()
        parts = [coo.indices(), coo.values()]
    else:
        csr = to_csr(w)
        parts = [csr.crow_indices(), csr.col_indices(), csr.values()]
    if not saved:
        return sum(t.numel() * t.element_size() for t in parts)
    buffer = io.BytesIO()
    torch.save(parts[0] if layout == "dense" else (coo if layout == "coo" else csr), buffer)
    return buffer.tell()


# --- structured: channel chains ---------------------------------------------------------------------


@dataclass
class ChannelChain:
    """The layers whose channels move together when the output channels of conv ``name`` are removed.

    Attributes:
        name: the producing Conv2d (its output channels are the ones pruned).
        followers: channel-wise layers in between that carry per-channel weights: BatchNorm2d and
            depthwise convs (their channels are removed too).
        consumer: the one layer reading those channels (a Conv2d's input channels or a Linear's inputs).
        channels: how many channels the producer has now.
    """

    name: str
    followers: list
    consumer: str
    channels: int


def _is_depthwise(m: nn.Module) -> bool:
    return isinstance(m, nn.Conv2d) and m.groups == m.in_channels == m.out_channels and m.groups > 1


def _follow(graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> tuple[list, str] | None:
    """From a conv node, walk its single-user path through channel-wise ops to one consumer; None if it forks or
    reaches anything that mixes channels with other tensors (an add, a cat, a reshape)."""
    followers, pooled, current = [], False, node
    while True:
        users = list(current.users)
        if len(users) != 1:
            return None
        user = users[0]
        if user.op == "call_module":
            module = graph_module.get_submodule(user.target)
            if isinstance(module, nn.BatchNorm2d) or _is_depthwise(module):
                if pooled:
                    return None
                followers.append(user.target)
            elif isinstance(module, nn.Conv2d) and module.groups == 1 and not pooled:
                return followers, user.target
            elif isinstance(module, nn.Linear) and pooled:
                return followers, user.target
            elif isinstance(module, _POOLS) and module.output_size in (1, (1, 1)):
                pooled = True
            elif isinstance(module, nn.Flatten) and pooled:
                pass
            elif not isinstance(module, _CHANNELWISE_MODULES):
                return None
        elif user.op == "call_function" and user.target in _CHANNELWISE_FUNCTIONS:
            pass
        elif user.op == "call_function" and user.target is torch.flatten and pooled:
            pass
        elif user.op == "call_method" and user.target == "mean" and list(user.args[1:2]) in ([[2, 3]], [(2, 3)]):
            pooled = True  # x.mean([2, 3]): global average pooling (torchvision's ShuffleNetV2)
        else:
            return None
        current = user


def channel_chains(model: nn.Module) -> list[ChannelChain]:
    """Every conv whose output channels can be removed by rebuilding a few layers, found on a ``torch.fx`` trace.

    Example:
        >>> [c.name for c in channel_chains(model)]
        ['stem.0', 'block1.0.0', 'block1.1.0', ...]
    """
    try:
        traced = torch.fx.symbolic_trace(model)
    except Exception as exc:  # noqa: BLE001 - data-dependent control flow: say what to do
        raise ConfigError("model", type(model).__name__, f"a model torch.fx can trace ({type(exc).__name__}: {exc}); "
                                                         "for others use a dependency-graph library such as "
                                                         "torch-pruning") from exc
    chains = []
    for node in traced.graph.nodes:
        if node.op != "call_module":
            continue
        module = traced.get_submodule(node.target)
        if not isinstance(module, nn.Conv2d) or module.groups != 1:
            continue
        found = _follow(traced, node)
        if found is not None and module.out_channels > 1:
            chains.append(ChannelChain(node.target, found[0], found[1], module.out_channels))
    return chains


def filter_norms(conv: nn.Conv2d) -> torch.Tensor:
    """The L1 norm of each output channel's filter: the ranking `prune_channels` removes channels by."""
    return conv.weight.detach().abs().sum(dim=(1, 2, 3))


def channels_to_keep(conv: nn.Conv2d, amount: float) -> torch.Tensor:
    """Indices (ascending) of the channels of ``conv`` kept when ``amount`` of them go, smallest filter norms first."""
    channels = conv.out_channels
    keep = max(1, channels - int(amount * channels))
    return filter_norms(conv).argsort(descending=True)[:keep].sort().values


def _set(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, module)


def _copy(new: nn.Module, old: nn.Module) -> nn.Module:
    """``new`` on the device and dtype of ``old``, in its training mode."""
    new = new.to(device=old.weight.device, dtype=old.weight.dtype)
    return new.train(old.training)


def _slim_conv(conv: nn.Conv2d, keep_out: torch.Tensor | None = None, keep_in: torch.Tensor | None = None) -> nn.Conv2d:
    out_idx = keep_out if keep_out is not None else torch.arange(conv.out_channels)
    in_idx = keep_in if keep_in is not None else torch.arange(conv.in_channels)
    depthwise = _is_depthwise(conv)
    new = nn.Conv2d(len(in_idx), len(out_idx), conv.kernel_size, conv.stride, conv.padding, conv.dilation,
                    groups=len(out_idx) if depthwise else 1, bias=conv.bias is not None, padding_mode=conv.padding_mode)
    new = _copy(new, conv)
    with torch.no_grad():
        weight = conv.weight[out_idx.to(conv.weight.device)]
        new.weight.copy_(weight if depthwise else weight[:, in_idx.to(conv.weight.device)])
        if conv.bias is not None:
            new.bias.copy_(conv.bias[out_idx.to(conv.weight.device)])
    return new


def _slim_batchnorm(bn: nn.BatchNorm2d, keep: torch.Tensor) -> nn.BatchNorm2d:
    new = _copy(nn.BatchNorm2d(len(keep), eps=bn.eps, momentum=bn.momentum, affine=bn.affine,
                               track_running_stats=bn.track_running_stats), bn)
    idx = keep.to(bn.weight.device if bn.affine else bn.running_mean.device)
    with torch.no_grad():
        for name in ("weight", "bias", "running_mean", "running_var"):
            old = getattr(bn, name)
            if old is not None:
                getattr(new, name).copy_(old[idx])
        if bn.num_batches_tracked is not None:
            new.num_batches_tracked.copy_(bn.num_batches_tracked)
    return new


def _slim_linear(linear: nn.Linear, keep_in: torch.Tensor) -> nn.Linear:
    new = _copy(nn.Linear(len(keep_in), linear.out_features, bias=linear.bias is not None), linear)
    with torch.no_grad():
        new.weight.copy_(linear.weight[:, keep_in.to(linear.weight.device)])
        if linear.bias is not None:
            new.bias.copy_(linear.bias)
    return new


def prune_channels(model: nn.Module, amount, example_inputs: torch.Tensor) -> nn.Module:
    """A smaller, dense copy of ``model`` with ``amount`` of the output channels of each prunable conv removed.

    Args:
        model: the model (e.g. from ``labkit.models.build``; torch.fx must be able to trace it).
        amount: the fraction of channels to remove from every prunable conv, in [0, 1), or a dict conv name -> fraction.
        example_inputs: a batch the model accepts (shape check only; 2 samples are enough).

    Example:
        >>> small = prune_channels(model, 0.5, torch.randn(2, 3, 32, 32))
        >>> labkit.measure.count_parameters(small)[0] < labkit.measure.count_parameters(model)[0]
        True
    """
    chains = {chain.name: chain for chain in channel_chains(model)}
    if not chains:
        raise ConfigError("model", getattr(model, "labkit_name", type(model).__name__),
                          "a model with a conv whose channels flow into one other layer (conv -> BatchNorm -> conv); "
                          "this one has no such conv, so no channel can be removed")
    if isinstance(amount, dict):
        unknown = [k for k in amount if k not in chains]
        if unknown:
            raise ConfigError("amount key", unknown[0], f"a conv with prunable channels ({', '.join(chains)})")
        amounts = {name: check_amount(value, f"amount[{name!r}]") for name, value in amount.items()}
    else:
        amounts = dict.fromkeys(chains, check_amount(amount))
    if not torch.is_tensor(example_inputs):
        raise ConfigError("example_inputs", type(example_inputs).__name__, "a tensor batch the model accepts")
    was_training = model.training
    model.eval()
    with torch.no_grad():
        expected = model(example_inputs).shape
    model.train(was_training)
    # Every choice is made on the original weights first: rebuilding one layer changes the next one's filters.
    keeps = {name: channels_to_keep(model.get_submodule(name), value) for name, value in amounts.items()}
    slim = copy.deepcopy(model)
    for name, keep in keeps.items():
        chain = chains[name]
        conv = slim.get_submodule(name)
        if len(keep) == conv.out_channels:
            continue
        _set(slim, name, _slim_conv(conv, keep_out=keep))
        for follower in chain.followers:
            layer = slim.get_submodule(follower)
            _set(slim, follower, _slim_batchnorm(layer, keep) if isinstance(layer, nn.BatchNorm2d)
                 else _slim_conv(layer, keep_out=keep, keep_in=keep))
        consumer = slim.get_submodule(chain.consumer)
        _set(slim, chain.consumer, _slim_linear(consumer, keep) if isinstance(consumer, nn.Linear)
             else _slim_conv(consumer, keep_in=keep))
    slim.eval()
    with torch.no_grad():
        shape = slim(example_inputs).shape
    slim.train(was_training)
    if shape != expected:  # a chain the tracer misread: never hand back a model that computes something else
        raise ConfigError("model", type(model).__name__,
                          f"a model whose pruned copy keeps its output shape {tuple(expected)}; "
                          f"it became {tuple(shape)}")
    return slim


@torch.no_grad()
def recalibrate_batchnorm(model: nn.Module, batches) -> nn.Module:
    """Re-estimate every BatchNorm layer's running mean and variance from ``batches`` (forward passes, no training).

    Pruning changes what each layer receives, so the statistics BatchNorm collected before describe another
    network; in eval mode it then normalises with the wrong mean and variance. A few forward passes in training
    mode, averaging over all of them (``momentum=None``), give statistics that fit the pruned model.

    Args:
        model: the model (changed in place and returned, in the training mode it had).
        batches: an iterable of input tensors (e.g. a few training batches, on the model's device).

    Example:
        >>> recalibrate_batchnorm(slim, [x for x, _ in itertools.islice(loader, 8)])
    """
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats]
    was_training = model.training
    momenta = [m.momentum for m in norms]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # a cumulative average over the batches, not a moving one
    model.train()
    seen = 0
    for x in batches:
        model(x)
        seen += 1
    for m, momentum in zip(norms, momenta, strict=True):
        m.momentum = momentum
    model.train(was_training)
    if norms and not seen:
        raise ConfigError("batches", "an empty iterable", "at least one batch of inputs to estimate statistics from")
    return model
