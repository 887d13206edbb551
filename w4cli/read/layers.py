"""Split a quantized checkpoint's tensors into quantized linears, activation scales and plain
tensors, checking every shape against the others and against the quantization config, and check
the values (scales, unquantized tensors, w4-gemv padding, GPTQ group maps and zero points). Every
layout w4 reads (AWQ gemm, GPTQ, compressed-tensors pack-quantized and its own w4-gemv) comes
through here, and this is the one validation: every command that reads a quantized checkpoint
refuses on it, and `w4 verify MODEL` reports it row by row.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch

from w4cli.read.checkpoint import DTYPES, FLOAT_CODES, Checkpoint, TensorInfo
from w4cli.errors import InputRefused
from w4cli.formats import compressed_tensors, gptq
from w4cli.formats.awq_gemm import PACK
from w4cli.formats.fuse import SPLIT_SUFFIX
from w4cli.read.quant_config import AWQ_GEMM, COMPRESSED_TENSORS, GPTQ, W4_GEMV, QuantScheme

# each layout's tensors of one linear: the required ones first, the first of them naming the
# linear; then the optional ones
LAYOUT_SUFFIXES = {
    AWQ_GEMM: ("qweight", "qzeros", "scales"),
    W4_GEMV: ("qweight", "qzeros", "scales", "meta", SPLIT_SUFFIX),
    GPTQ: gptq.REQUIRED + gptq.OPTIONAL,
    COMPRESSED_TENSORS: compressed_tensors.REQUIRED + compressed_tensors.OPTIONAL,
}
REQUIRED_SUFFIXES = {AWQ_GEMM: 3, W4_GEMV: 4, GPTQ: len(gptq.REQUIRED), COMPRESSED_TENSORS: len(compressed_tensors.REQUIRED)}
QUANT_SUFFIXES = tuple(dict.fromkeys(suffix for suffixes in LAYOUT_SUFFIXES.values() for suffix in suffixes))
SCALES_SUFFIX = {COMPRESSED_TENSORS: "weight_scale"}  # else "scales"
SCALE_CODES = {"F16", "BF16"}


@dataclass(frozen=True)
class QuantLinear:
    """One quantized linear. AWQ gemm: qweight [K, N/8] int32, qzeros [K/G, N/8] int32,
    scales [K/G, N]; w4-gemv, GPTQ, compressed-tensors: see their modules in w4cli/formats/."""

    prefix: str
    in_features: int  # K
    out_features: int  # N
    group_size: int  # G (K for one group)
    bias: str | None
    layout: str = AWQ_GEMM
    optional: tuple[str, ...] = ()  # the layout's optional tensors this linear has (g_idx, ...)
    parts: tuple[tuple[str, int], ...] = ()  # a fused w4-gemv linear: (part prefix, its N), in order

    @property
    def suffixes(self) -> tuple[str, ...]:
        suffixes = LAYOUT_SUFFIXES[self.layout]
        return suffixes[: REQUIRED_SUFFIXES[self.layout]] + tuple(s for s in suffixes if s in self.optional)

    @property
    def tensor_names(self) -> list[str]:
        return [f"{self.prefix}.{suffix}" for suffix in self.suffixes]

    def tensor(self, suffix: str) -> str:
        return f"{self.prefix}.{suffix}"

    @property
    def qweight(self) -> str:
        return f"{self.prefix}.qweight"

    @property
    def qzeros(self) -> str:
        return f"{self.prefix}.qzeros"

    @property
    def scales(self) -> str:
        return f"{self.prefix}.{SCALES_SUFFIX.get(self.layout, 'scales')}"

    @property
    def weight(self) -> str:
        return f"{self.prefix}.weight"


@dataclass(frozen=True)
class ActScale:
    """AutoAWQ's ScaledActivation: act(x) / scales feeds one linear; `target` is that linear's
    weight name (a quantized prefix's `.weight` or a plain weight tensor)."""

    name: str
    target: str


@dataclass
class QuantModel:
    checkpoint: Checkpoint
    scheme: QuantScheme
    layers: dict[str, QuantLinear]  # by prefix
    act_scales: dict[str, ActScale]  # by target weight name
    plain: list[str]  # tensors copied (cast) as they are
    order: list[tuple[str, str]]  # ("layer", prefix) | ("plain", name), in checkpoint order


def _parent(name: str) -> str:
    return name.rsplit(".", 1)[0] if "." in name else ""


def _expect(cond: bool, message: str) -> None:
    if not cond:
        raise InputRefused(message)


def _check_bias(bias: TensorInfo | None, n: int) -> None:
    if bias is not None:
        _expect(bias.dtype in FLOAT_CODES, f"{bias.name} has dtype {bias.dtype}; expected a float bias")
        _expect(bias.shape == (n,), f"{bias.name} has shape {list(bias.shape)}; expected [{n}]")


def _check_w4_layer(checkpoint: Checkpoint, prefix: str, t: dict[str, TensorInfo], scheme: QuantScheme, bias: TensorInfo | None) -> QuantLinear:
    """w4-gemv: K, N and G live in the layer's `meta` tensor (a few bytes, read here); the format
    module checks every shape against them on meta-device stand-ins, without reading the data."""
    from w4cli.formats import w4_gemv

    meta_info = t["meta"]
    _expect(meta_info.dtype == "I32" and meta_info.shape == (4,), f"{meta_info.name} must be I32 [4]")
    meta = checkpoint.read_one(meta_info.name)
    stand_ins = {
        suffix: torch.empty(t[suffix].shape, dtype=DTYPES[t[suffix].dtype], device="meta")
        for suffix in ("qweight", "qzeros", "scales")
    }
    try:
        k, n, g = w4_gemv.validate(stand_ins["qweight"], stand_ins["qzeros"], stand_ins["scales"], meta)
    except InputRefused as exc:
        raise InputRefused(f"{prefix}: {exc}") from None
    if scheme.group_size != -1:
        _expect(g == scheme.group_size, f"{prefix}: group size {g} in meta but {scheme.group_size} in the config")
    _check_bias(bias, n)
    parts = _fused_parts(checkpoint, prefix, t[SPLIT_SUFFIX], n, scheme) if SPLIT_SUFFIX in t else ()
    return QuantLinear(prefix, k, n, g, bias.name if bias else None, W4_GEMV, (SPLIT_SUFFIX,) if parts else (), parts)


def _fused_parts(checkpoint: Checkpoint, prefix: str, split: TensorInfo, n: int, scheme: QuantScheme) -> tuple[tuple[str, int], ...]:
    """A fused linear's parts (w4cli/formats/fuse.py): their names from quantization_config "fused", their
    N from `split`, which must cover N in multiples of 8."""
    parent, _, name = prefix.rpartition(".")
    fused = scheme.config.get("fused")
    names = fused.get(name) if isinstance(fused, dict) else None
    _expect(
        isinstance(names, list) and len(names) > 1 and all(isinstance(part, str) and part.isidentifier() for part in names),
        f"{split.name}: quantization_config has no \"fused\" entry naming the parts of {name}",
    )
    _expect(split.dtype == "I32" and split.shape == (len(names),), f"{split.name} must be I32 [{len(names)}], one N per part of {name}")
    sizes = [int(v) for v in checkpoint.read_one(split.name).tolist()]
    _expect(
        all(size > 0 and size % PACK == 0 for size in sizes) and sum(sizes) == n,
        f"{split.name} holds {sizes}: the parts' N must be positive multiples of {PACK} adding up to N={n}",
    )
    return tuple((f"{parent}.{part}" if parent else part, size) for part, size in zip(names, sizes))


def _check_layer(prefix: str, t: dict[str, TensorInfo], scheme: QuantScheme, bias: TensorInfo | None) -> QuantLinear:
    qweight, qzeros, scales = t["qweight"], t["qzeros"], t["scales"]
    _expect(qweight.dtype == "I32", f"{qweight.name} has dtype {qweight.dtype}; AWQ qweight is I32")
    _expect(qzeros.dtype == "I32", f"{qzeros.name} has dtype {qzeros.dtype}; AWQ qzeros is I32")
    _expect(scales.dtype in SCALE_CODES, f"{scales.name} has dtype {scales.dtype}; AWQ scales are F16 (or BF16)")
    for info in (qweight, qzeros, scales):
        _expect(len(info.shape) == 2, f"{info.name} has shape {list(info.shape)}; expected 2 dimensions")
    k, words = qweight.shape
    groups, n = scales.shape
    _expect(k > 0 and words > 0, f"{qweight.name} is empty")
    _expect(
        words * PACK == n,
        f"{prefix}: qweight {list(qweight.shape)} packs {words * PACK} output channels but scales {list(scales.shape)} has {n}",
    )
    _expect(
        qzeros.shape == (groups, words),
        f"{prefix}: qzeros {list(qzeros.shape)} does not match scales {list(scales.shape)} (expected [{groups}, {words}])",
    )
    if scheme.group_size == -1:
        _expect(groups == 1, f"{prefix}: group_size -1 means one group, but scales has {groups} rows")
        g = k
    else:
        g = scheme.group_size
        _expect(k % g == 0, f"{prefix}: in_features {k} is not a multiple of group_size {g}")
        _expect(
            groups * g == k,
            f"{prefix}: scales has {groups} rows but in_features {k} / group_size {g} = {k // g}",
        )
    _check_bias(bias, n)
    return QuantLinear(prefix, k, n, g, bias.name if bias else None)


def _stand_in(info: TensorInfo) -> torch.Tensor:
    """A meta-device tensor of the tensor's shape and dtype: format modules check shapes on it
    without reading any data."""
    return torch.empty(info.shape, dtype=DTYPES[info.dtype], device="meta")


def _check_gptq_layer(prefix: str, t: dict[str, TensorInfo], scheme: QuantScheme, bias: TensorInfo | None) -> QuantLinear:
    g_idx = _stand_in(t["g_idx"]) if "g_idx" in t else None
    try:
        k, n, g = gptq.validate(_stand_in(t["qweight"]), _stand_in(t["qzeros"]), _stand_in(t["scales"]), g_idx, scheme.group_size)
    except InputRefused as exc:
        raise InputRefused(f"{prefix}: {exc}") from None
    _check_bias(bias, n)
    return QuantLinear(prefix, k, n, g, bias.name if bias else None, GPTQ, tuple(s for s in gptq.OPTIONAL if s in t))


def _check_ct_layer(checkpoint: Checkpoint, prefix: str, t: dict[str, TensorInfo], scheme: QuantScheme, bias: TensorInfo | None) -> QuantLinear:
    """compressed-tensors: the config group that targets the layer gives its strategy, group size
    and symmetry; weight_shape (two integers, read here) gives N and K."""
    assert scheme.ct is not None
    args = scheme.ct.weights_for(prefix)
    shape_info = t["weight_shape"]
    _expect(
        shape_info.dtype in ("I64", "I32") and shape_info.shape == (2,),
        f"{shape_info.name} is {shape_info.dtype} {list(shape_info.shape)}; expected I64 (or I32) [2]",
    )
    n, k = (int(v) for v in checkpoint.read_one(shape_info.name).tolist())
    optional = {s: _stand_in(t[s]) if s in t else None for s in compressed_tensors.OPTIONAL}
    try:
        k, n, g = compressed_tensors.validate(
            _stand_in(t["weight_packed"]), _stand_in(t["weight_scale"]), optional["weight_zero_point"], optional["weight_g_idx"], (n, k), args
        )
    except InputRefused as exc:
        raise InputRefused(f"{prefix}: {exc}") from None
    _check_bias(bias, n)
    return QuantLinear(prefix, k, n, g, bias.name if bias else None, COMPRESSED_TENSORS, tuple(s for s in compressed_tensors.OPTIONAL if s in t))


def find_layers(checkpoint: Checkpoint, scheme: QuantScheme) -> QuantModel:
    tensors = checkpoint.tensors
    parts: dict[str, dict[str, TensorInfo]] = {}
    for name, info in tensors.items():
        prefix, _, suffix = name.rpartition(".")
        if suffix in QUANT_SUFFIXES:
            parts.setdefault(prefix, {})[suffix] = info

    suffixes = LAYOUT_SUFFIXES[scheme.layout]
    anchor, required = suffixes[0], suffixes[: REQUIRED_SUFFIXES[scheme.layout]]
    layers: dict[str, QuantLinear] = {}
    act_candidates: list[TensorInfo] = []
    for prefix, found in parts.items():
        if anchor in found:
            for suffix in required[1:]:
                _expect(suffix in found, f"{prefix}.{anchor} has no {prefix}.{suffix}")
            bias = tensors.get(f"{prefix}.bias")
            if scheme.layout == W4_GEMV:
                layer = _check_w4_layer(checkpoint, prefix, found, scheme, bias)
            elif scheme.layout == GPTQ:
                layer = _check_gptq_layer(prefix, found, scheme, bias)
            elif scheme.layout == COMPRESSED_TENSORS:
                layer = _check_ct_layer(checkpoint, prefix, found, scheme, bias)
            else:
                layer = _check_layer(prefix, found, scheme, bias)
            _expect(layer.weight not in tensors, f"{prefix} has both {anchor} and weight; which one is the layer?")
            layers[prefix] = layer
        elif set(found) == {"scales"} and len(found["scales"].shape) == 1:
            act_candidates.append(found["scales"])
        else:
            extra = sorted(found)[0]
            raise InputRefused(f"{prefix}.{extra} has no {prefix}.{anchor}: a stray quantization tensor")
    _expect(bool(layers), f"no quantized linear (no *.{anchor} tensor) in the checkpoint")
    for layer in layers.values():
        for part, _ in layer.parts:
            clash = next((name for name in (part, f"{part}.weight", f"{part}.bias") if name in layers or name in tensors), None)
            _expect(clash is None, f"{layer.prefix} is fused from {part}, but the checkpoint also has {clash}")
    _refuse_foreign(tensors, layers, scheme.layout)
    _refuse_quantized_skips(layers, scheme)

    quant_parts = {layer.bias for layer in layers.values() if layer.bias}
    for layer in layers.values():
        quant_parts.update(layer.tensor_names)

    act_scales: dict[str, ActScale] = {}
    for info in act_candidates:
        target = _act_scale_target(info, layers, tensors)
        _expect(target not in act_scales, f"{target} is fed by two activation scales")
        act_scales[target] = ActScale(info.name, target)
    act_names = {a.name for a in act_scales.values()}

    order: list[tuple[str, str]] = []
    plain: list[str] = []
    for name in tensors:
        if name in act_names:
            continue
        prefix = _parent(name)
        if name.endswith(f".{anchor}") and prefix in layers:
            order.append(("layer", prefix))
        elif name not in quant_parts:
            plain.append(name)
            order.append(("plain", name))
    return QuantModel(checkpoint, scheme, layers, act_scales, plain, order)


def _refuse_foreign(tensors: dict[str, TensorInfo], layers: dict[str, QuantLinear], layout: str) -> None:
    """Under a quantized linear's prefix sits only what its layout defines, and a bias. Anything
    else (GPTQ's g_idx, an adapter, a tensor of another format) is data w4 does not understand:
    copying it into the output as a plain tensor would pass it off as part of the model."""
    allowed = set(LAYOUT_SUFFIXES[layout]) | {"bias"}
    for name in tensors:
        owner = name if name in layers else _quantized_owner(name, layers)
        if owner is None or (_parent(name) == owner and name.rpartition(".")[2] in allowed):
            continue
        raise InputRefused(
            f"{name} is not part of a {layout} linear ({owner} may hold only {', '.join(sorted(allowed))}); "
            "w4 refuses tensors it does not understand rather than copying them"
        )


def _quantized_owner(name: str, layers: dict[str, QuantLinear]) -> str | None:
    """The quantized linear `name` sits under at any depth, if any."""
    parent = _parent(name)
    while parent:
        if parent in layers:
            return parent
        parent = _parent(parent)
    return None


def _refuse_quantized_skips(layers: dict[str, QuantLinear], scheme: QuantScheme) -> None:
    """modules_to_not_convert names modules left unquantized: one of them holding a qweight
    contradicts the config, and a loader that trusts the config would read it as a plain linear.
    A name matches whole dotted components ("gate" is not "gate_proj"), as a module path does.
    compressed-tensors' `ignore` list says the same, in its own matching rules (w4cli/read/ct_config.py)."""
    for prefix in layers:
        if scheme.ct is not None:
            entry = scheme.ct.ignored_by(prefix)
            _expect(entry is None, f"{prefix} is quantized but {scheme.source} lists '{entry}' in ignore")
        for module in scheme.modules_to_not_convert:
            _expect(
                f".{module}." not in f".{prefix}.",
                f"{prefix} is quantized but {scheme.source} lists '{module}' in modules_to_not_convert",
            )


def _act_scale_target(info: TensorInfo, layers: dict[str, QuantLinear], tensors: dict[str, TensorInfo]) -> str:
    """The linear that `act(x) / scales` feeds: a sibling of the activation module whose input
    width is the scales' length. Anything but exactly one candidate is refused."""
    _expect(info.dtype in FLOAT_CODES, f"{info.name} has dtype {info.dtype}; activation scales are floats")
    width = info.shape[0]
    module = _parent(info.name)  # e.g. "...mlp.act"
    parent = _parent(module)  # e.g. "...mlp"
    candidates = [
        layer.weight for layer in layers.values() if _parent(layer.prefix) == parent and layer.in_features == width
    ]
    candidates += [
        name
        for name, t in tensors.items()
        if name.endswith(".weight")
        and _parent(_parent(name)) == parent
        and len(t.shape) == 2
        and t.shape[1] == width
        and t.dtype in FLOAT_CODES
    ]
    if len(candidates) != 1:
        found = ", ".join(sorted(candidates)) or "none"
        raise InputRefused(
            f"cannot tell which linear the activation scales {info.name} feed (candidates with {width} inputs under '{parent}': {found})"
        )
    return candidates[0]


# elements tested (and of a stored tensor, about as many read) at a time: the temporaries of a 1 GB
# embedding stay a few MB
FINITE_CHUNK = 1 << 22


def _chunks(values: torch.Tensor, offset: int = 0) -> Iterator[tuple[int, torch.Tensor]]:
    """(flat index of the first element, a flat chunk of at most FINITE_CHUNK elements)."""
    flat = values.reshape(-1)
    for start in range(0, flat.numel(), FINITE_CHUNK):
        yield offset + start, flat[start : start + FINITE_CHUNK]


def _stored_chunks(checkpoint: Checkpoint, name: str) -> Iterator[tuple[int, torch.Tensor]]:
    """A stored tensor's chunks, read a few rows at a time: a 2 GB embedding is never whole in
    memory."""
    info = checkpoint.tensors[name]
    if len(info.shape) < 2 or not info.shape[0]:
        yield from _chunks(checkpoint.read_one(name))
        return
    row = info.nbytes // info.shape[0] // DTYPES[info.dtype].itemsize  # elements per row
    rows = max(1, FINITE_CHUNK // max(1, row))
    for start in range(0, info.shape[0], rows):
        yield from _chunks(checkpoint.read_rows(name, start, min(info.shape[0], start + rows)), start * row)


def _bad_values(chunks: Iterable[tuple[int, torch.Tensor]], shape: tuple[int, ...], zero_is_bad: bool) -> str | None:
    """None if every value is finite (and non-zero when zero_is_bad); else how many are not and
    the first, with its index. The common all-finite chunk costs one min/max pass (they propagate
    NaN), many times faster than isfinite on 16-bit floats; only a failing chunk is looked into."""
    first, first_value, count = None, None, 0
    for start, part in chunks:
        low, high = torch.aminmax(part)
        if bool(torch.isfinite(low) & torch.isfinite(high)) and not (zero_is_bad and bool((part == 0).any())):
            continue
        bad = ~torch.isfinite(part)
        if zero_is_bad:
            bad |= part == 0
        count += int(bad.sum())
        if first is None:
            at = int(bad.nonzero()[0])
            first, first_value = start + at, part[at].item()
    if first is None:
        return None
    where, rest = [], first
    for dim in reversed(shape):
        where.append(rest % dim)
        rest //= dim
    kind = "NaN, inf or zero" if zero_is_bad else "NaN or inf"
    return f"{count} {kind} value{'s' if count != 1 else ''}, first {first_value!r} at {where[::-1]}"


def check_scales(model: QuantModel) -> int:
    """Every scale and activation scale finite and non-zero: a NaN or 0 scale silently poisons
    every output it touches. Returns how many tensors were read."""
    names = [layer.scales for layer in model.layers.values()] + [a.name for a in model.act_scales.values()]
    for name in names:
        values = model.checkpoint.read_one(name)
        bad = _bad_values(_chunks(values), tuple(values.shape), zero_is_bad=True)
        _expect(bad is None, f"{name} holds {bad}")
    return len(names)


def check_unquantized(model: QuantModel) -> int:
    """Every unquantized float tensor (plain tensors and biases) finite: a conversion would copy a
    NaN into the output unnoticed. A few rows in memory at a time. Returns how many were read."""
    tensors = model.checkpoint.tensors
    names = [n for n in model.plain + [layer.bias for layer in model.layers.values() if layer.bias] if tensors[n].dtype in FLOAT_CODES]
    for name in names:
        bad = _bad_values(_stored_chunks(model.checkpoint, name), tensors[name].shape, zero_is_bad=False)
        _expect(bad is None, f"{name} holds {bad}")
    return len(names)


def check_padding(model: QuantModel) -> int:
    """w4-gemv pads K up to a whole tile with code 0; a non-zero code there changes no weight, but
    it is not what `w4 repack` writes, so the file was altered. Only layers with K % 128 != 0 have
    padding to read. Returns how many such layers were read."""
    from w4cli.formats import w4_gemv

    if model.scheme.layout != W4_GEMV:
        return 0
    padded = [layer for layer in model.layers.values() if layer.in_features % w4_gemv.TILE_K]
    for layer in padded:
        qweight = model.checkpoint.read_one(layer.qweight)
        k = layer.in_features
        words = qweight.permute(0, 2, 1, 3).reshape(layer.out_features, -1)  # [N, Kp/8], k order
        padding = words[:, k // w4_gemv.PACK :]
        if bool((padding != 0).any()):
            row, word = (int(i) for i in (padding != 0).nonzero()[0])
            raise InputRefused(f"{layer.qweight}: padding code beyond K={k} is not 0 (row {row}, word {k // w4_gemv.PACK + word})")
    return len(padded)


def check_group_maps(model: QuantModel) -> int:
    """Every g_idx (GPTQ, compressed-tensors weight_g_idx) a map of K / G groups of G columns
    each; with GPTQ desc_act false, the plain grouping k // G (a permutation there contradicts the
    config, and loaders that trust desc_act would ignore it). Returns how many were read."""
    from w4cli.formats.unpacked import group_map_problem, identity_groups

    read = 0
    for layer in model.layers.values():
        suffix = next((s for s in ("g_idx", "weight_g_idx") if s in layer.optional), None)
        if suffix is None:
            continue
        g_idx = model.checkpoint.read_one(layer.tensor(suffix))
        read += 1
        problem = group_map_problem(g_idx, layer.in_features, layer.group_size)
        _expect(problem is None, f"{layer.tensor(suffix)}: {problem}")
        gptq_args = model.scheme.gptq
        if gptq_args is not None and not gptq_args.desc_act:
            _expect(
                identity_groups(g_idx, layer.group_size),
                f"{layer.tensor(suffix)} permutes the groups but {model.scheme.source} says desc_act false",
            )
    return read


def check_zero_points(model: QuantModel) -> int:
    """GPTQ sym true: every zero point is 8, as the quantizer writes it. Some loaders (Marlin
    kernels) ignore qzeros of a symmetric checkpoint and use 8, others read them: any other value
    makes the weights depend on the loader. Returns how many tensors were read."""
    gptq_args = model.scheme.gptq
    if gptq_args is None or not gptq_args.sym:
        return 0
    for layer in model.layers.values():
        stored = model.checkpoint.read_one(layer.qzeros)
        zeros = gptq.unpack_qzeros(stored, gptq_args.v1)
        if bool((zeros != 8).any()):
            n, group = (int(i) for i in (zeros != 8).nonzero()[0])
            raise InputRefused(
                f"{layer.qzeros}: zero point {int(zeros[n, group])} at group {group}, channel {n}, but {model.scheme.source} says sym true (every zero point 8)"
            )
    return len(model.layers)


def check_values(model: QuantModel) -> None:
    """Every value check: what `w4 verify MODEL` reports row by row, and what every command that
    reads a quantized checkpoint refuses on."""
    check_scales(model)
    check_unquantized(model)
    check_padding(model)
    check_group_maps(model)
    check_zero_points(model)
