"""One decode step of a model's linear layers, measured as it runs: every layer of every decoder
layer in execution order, each with its own weights (the model's real footprint, so nothing stays
in L2), each layer reading an output of the width it needs, captured as ONE CUDA graph for fp16
cuBLAS and for w4 (`kernels.gemv`, the path it picks per layer) alike. Not included: attention,
norms, activations, residual adds, sampling; the step time is the linear layers' alone. Each
method is timed twice (PASS_ORDER: once before and once after the others) and reported as the mean
of the two.

What differs from the per-shape sum (`results.project`): the seams between kernels (each kernel's
start and drain, which a lone measurement also pays but inside its own graph of one layer repeated)
and the real sequence of shapes. Models whose weights do not fit the GPU are measured on the first
L' decoder layers that do and scaled by L / L' (said in the result). Dense models only: a step of
routed experts depends on the routing, which the per-shape projection models instead.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

from w4cli.gpu import contract
from w4cli.bench.shapes import Linear, ModelShapes

FP16 = "fp16"
W4 = "w4"
W4_PDL = "w4_pdl"  # w4 with programmatic dependent launch (kernels.gemv(pdl=True))
BREAKDOWN_METHODS = (FP16, W4_PDL)  # each layer kind timed on its own: fp16 and w4 at its fastest
PASS_ORDER = (FP16, W4, W4_PDL, W4_PDL, W4, FP16)  # each method twice, once before and once after the others
MEMORY_SHARE = 0.7  # of the free GPU memory, for one method's weights
W4_STD_CODE = 6.5  # std of (q - z) for uniform codes and zero points in 0..15: sqrt(2 * 255 / 12)


@dataclass(frozen=True)
class StepPlan:
    """One decoder layer's linears in execution order, how many decoder layers, and lm_head."""

    layer: tuple[Linear, ...]
    decoder_layers: int
    head: Linear | None


def plan(model: ModelShapes) -> StepPlan | str:
    """The step of a dense model, or why it cannot be measured as one graph (a line for the notes)."""
    body = [lin for lin in model.linears if lin.kind == "dense"]
    others = [lin for lin in model.linears if lin.kind not in ("dense", "lm_head")]
    if others or not body:
        return "the decode step as one graph is measured for dense models only (routed experts depend on the routing)"
    if any(lin.layers != model.num_hidden_layers or lin.per_layer != 1 for lin in body):
        return "the decode step as one graph needs every decoder layer to have the same linears"
    head = next((lin for lin in model.linears if lin.kind == "lm_head"), None)
    hidden = head.k if head is not None else body[0].k
    try:
        wire(tuple(body), hidden, 1)
    except ValueError as exc:
        return f"the decode step as one graph cannot chain this model's layers: {exc}"
    return StepPlan(tuple(body), model.num_hidden_layers, head)


def layer_bytes(layer: tuple[Linear, ...], method: str, group: int) -> int:
    """Weight bytes of one decoder layer in this method's format (w4, w4_pdl: int4 + fp16 scales +
    int4 zeros)."""
    if method == FP16:
        return sum(lin.k * lin.n * 2 for lin in layer)
    return sum(lin.k * lin.n // 2 + (lin.k // group) * lin.n * 5 // 2 for lin in layer)


def layers_that_fit(step: StepPlan, method: str, group: int, free_bytes: int) -> int:
    """How many decoder layers' weights fit in MEMORY_SHARE of the free memory (at most all)."""
    return min(step.decoder_layers, int(free_bytes * MEMORY_SHARE) // max(1, layer_bytes(step.layer, method, group)))


def wire(layer: tuple[Linear, ...], hidden: int, decoder_layers: int) -> list[tuple[int, int, int, bool]]:
    """(input, layer index, output, halve) buffer ids for every call of the step: buffer 0 is the
    step's input; a linear reads the newest buffer of its K (as q/k/v and gate/up read the hidden
    state, o_proj the attention's width), else the input; a fused gate_up_proj's output (2K wide)
    is halved first (halve: its first K columns, copied: the stand-in for act(gate) * up).
    Raises ValueError when a linear has no input of its width."""
    newest = {hidden: 0}
    calls = []
    for _ in range(decoder_layers):
        for i, lin in enumerate(layer):
            out = len(calls) + 1
            if lin.k in newest:
                calls.append((newest[lin.k], i, out, False))
            elif 2 * lin.k in newest:
                calls.append((newest[2 * lin.k], i, out, True))
            else:
                raise ValueError(f"{lin.name} reads {lin.k} features and no layer before it writes them")
            newest[lin.n] = out
    return calls


@dataclass(frozen=True)
class KindTime:
    """One layer kind's share of the step: its layers alone, one per measured decoder layer, each
    with its own weights and back to back in one graph, scaled to all decoder layers."""

    name: str
    us: float
    bytes: int  # over all decoder layers: weights, activations in and out

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "us": self.us, "bytes": self.bytes}


@dataclass(frozen=True)
class StepResult:
    """One method's decode step at batch M: the graph's median over the measured decoder layers,
    scaled to all of them, plus lm_head (fp16 in both) measured alone."""

    m: int
    method: str
    layers_measured: int
    layers_total: int
    measured_us: float | None
    head_us: float | None
    bytes_per_step: int
    note: str = ""
    kinds: tuple[KindTime, ...] = ()  # where the step goes (BREAKDOWN_METHODS only)

    @property
    def step_us(self) -> float | None:
        if self.measured_us is None or self.head_us is None:
            return None
        return self.measured_us * self.layers_total / self.layers_measured + self.head_us

    def to_dict(self) -> dict[str, Any]:
        return {"m": self.m, "method": self.method, "layers_measured": self.layers_measured,
                "layers_total": self.layers_total, "measured_us": self.measured_us, "head_us": self.head_us,
                "step_us": self.step_us, "bytes_per_step": self.bytes_per_step, "note": self.note,
                "kinds": [k.to_dict() for k in self.kinds]}


def combined(a: StepResult, b: StepResult) -> StepResult:
    """One method's two passes at one M as one: the mean of the graphs' medians (b's brought to a's
    decoder layers, should the free memory have let it measure another count) and of each kind's
    (already scaled to every layer); the pass without a time (out of memory), where there is one."""
    if a.measured_us is None or b.measured_us is None:
        return a if a.measured_us is None else b
    b_us = b.measured_us * a.layers_measured / b.layers_measured
    kinds = tuple(KindTime(x.name, (x.us + y.us) / 2, x.bytes) for x, y in zip(a.kinds, b.kinds))
    return replace(a, measured_us=(a.measured_us + b_us) / 2, kinds=kinds)


def linear_bytes(lin: Linear, method: str, m: int, group: int) -> int:
    """Bytes one call of `lin` moves at least: its weights in this method's format, activations in
    and out."""
    return layer_bytes((lin,), method, group) + m * (lin.k + lin.n) * 2


def step_bytes(step: StepPlan, method: str, m: int, group: int) -> int:
    """Bytes one step moves at least: every layer's weights, activations in and out, and lm_head."""
    body = step.decoder_layers * sum(linear_bytes(lin, method, m, group) for lin in step.layer)
    head = 0 if step.head is None else step.head.k * step.head.n * 2 + m * (step.head.k + step.head.n) * 2
    return body + head


def measure(model: ModelShapes, batches: list[int], group: int, copy: Any, replays: int,
            step: Callable[[str], None], device: str, gemv: Callable[..., Any]) -> tuple[list[StepResult], str | None]:
    """Every method at every M: the results, or none and why not. `gemv` is w4's entry
    (kernels.gemv); on a CPU device (the tests) memory and L2 are not asked for."""
    import torch

    from w4cli.gpu import timing
    from w4cli.formats import w4_gemv

    cuda = device == "cuda"

    p = plan(model)
    if isinstance(p, str):
        return [], p
    refused = next(((lin, why) for lin in p.layer if (why := contract.gemv_refusal(lin.k, lin.n, group))), None)
    if refused is not None:
        return [], f"the decode step as one graph needs every layer in w4's kernels; {refused[0].name}: {refused[1]}"
    hidden = p.head.k if p.head is not None else p.layer[0].k
    results: list[StepResult] = []
    gen = torch.Generator(device=device).manual_seed(7)

    def fp16_weight(lin: Linear) -> torch.Tensor:
        # unit-variance outputs for unit-variance inputs, so a long chain neither overflows nor vanishes
        return (torch.randn(lin.n, lin.k, generator=gen, device=device) / lin.k**0.5).half()

    def w4_layer(lin: Linear) -> dict[str, torch.Tensor]:
        words = torch.randint(-(2**31), 2**31, (lin.k, lin.n // 8), generator=gen, device=device, dtype=torch.int64)
        zeros = torch.randint(-(2**31), 2**31, (lin.k // group, lin.n // 8), generator=gen, device=device, dtype=torch.int64)
        scales = torch.full((lin.k // group, lin.n), 1.0 / (W4_STD_CODE * lin.k**0.5), device=device).half()
        return w4_gemv.repack_from_awq(words.to(torch.int32), zeros.to(torch.int32), scales)

    head_us: dict[int, float | None] = {m: 0.0 for m in batches}
    if p.head is not None:
        for m in batches:
            step(f"decode step lm_head M={m}")
            head = p.head

            def head_set(i: int, m: int = m, head: Linear = head) -> tuple:
                return (torch.randn(m, head.k, generator=gen, device=device).half(), fp16_weight(head))

            t = timing.measure(torch.nn.functional.linear, head_set, 0, lambda out, args: bool(torch.isfinite(out).all()),
                               name="lm_head", replays=replays)
            head_us[m] = t.median_us
    def measure_method(method: str) -> list[StepResult]:
        """The method at every M, a StepResult each (its weights allocated for this pass alone)."""
        out: list[StepResult] = []
        if cuda:
            torch.cuda.empty_cache()
        free = torch.cuda.mem_get_info()[0] if cuda else 2**33
        count = layers_that_fit(p, method, group, free)
        if count < 1:
            for m in batches:
                out.append(StepResult(m, method, 0, p.decoder_layers, None, head_us.get(m), 0, "one decoder layer does not fit"))
            return out
        make = fp16_weight if method == FP16 else w4_layer
        pdl = {"pdl": True} if method == W4_PDL else {}
        weights = [[make(lin) for lin in p.layer] for _ in range(count)]
        flat = tuple(t for layer in weights for w in layer for t in ((w,) if method == FP16 else tuple(w.values())))
        calls = wire(p.layer, hidden, count)

        def call(x: torch.Tensor, w: Any) -> torch.Tensor:
            return torch.nn.functional.linear(x, w) if method == FP16 else gemv(x, **w, **pdl)

        def run(x: torch.Tensor, *_weights: torch.Tensor) -> torch.Tensor:
            # the weights travel in the arguments only so that the harness counts their bytes
            buffers = [x]
            for c, (inp, i, _out, halve) in enumerate(calls):
                src = buffers[inp][:, : p.layer[i].k].contiguous() if halve else buffers[inp]
                buffers.append(call(src, weights[c // len(p.layer)][i]))
            return buffers[-1]

        def run_kind(i: int) -> Callable[..., torch.Tensor]:
            def run(x: torch.Tensor, *_weights: torch.Tensor) -> torch.Tensor:
                # every decoder layer's copy of linear i reads the same input: no chain, only the
                # kind's own kernels and the seams between them
                out = x
                for layer in weights:
                    out = call(x, layer[i])
                return out
            return run

        l2 = timing.l2_cache_bytes() if cuda else 0
        weight_bytes = sum(t.numel() * t.element_size() for t in flat)
        multiple = timing.L2_MULTIPLE if weight_bytes >= timing.L2_MULTIPLE * l2 else 0.0
        def timed(fn: Callable[..., torch.Tensor], x: torch.Tensor, nbytes: int, name: str) -> float:
            """The graph's median; its replay must give the eager result (w4cli/gpu/timing.py checks)."""
            eager = fn(x)

            def same_as_eager(out: torch.Tensor, args: tuple) -> bool:
                # the chain stays finite, and the graph replays the eager step: bit for bit for w4's
                # deterministic kernels, within 1% of the largest output for cuBLAS (whose algorithm
                # choice may differ under capture)
                if not bool(torch.isfinite(out).all()):
                    return False
                if method != FP16:
                    return torch.equal(out, eager)
                return float((out.float() - eager.float()).abs().max()) <= 0.01 * float(eager.float().abs().max())

            t = timing.measure(fn, [(x, *flat)], nbytes, same_as_eager, name=name, copy=copy, replays=replays,
                               l2_multiple=multiple)
            return t.median_us

        scale = p.decoder_layers / count
        for m in batches:
            step(f"decode step {method} M={m}")
            notes = [] if count == p.decoder_layers else [f"{count} of {p.decoder_layers} decoder layers fit; scaled"]
            if not multiple:
                notes.append(f"weights {weight_bytes / max(1, l2):.1f}x L2: partly served from L2, optimistic")
            note = "; ".join(notes)
            kinds: list[KindTime] = []
            try:
                x = torch.randn(m, hidden, generator=gen, device=device).half()
                measured: float | None = timed(run, x, step_bytes(p, method, m, group), f"decode step {method}")
                for i, lin in enumerate(p.layer if method in BREAKDOWN_METHODS else ()):
                    step(f"decode step {method} M={m} {lin.name}")
                    xi = torch.randn(m, lin.k, generator=gen, device=device).half()
                    nbytes = count * linear_bytes(lin, method, m, group)
                    us = timed(run_kind(i), xi, nbytes, f"decode step {method} {lin.name}")
                    kinds.append(KindTime(lin.name, us * scale, int(nbytes * scale)))
            except torch.cuda.OutOfMemoryError:
                measured, note, kinds = None, "out of GPU memory", []
            out.append(StepResult(m, method, count, p.decoder_layers, measured, head_us.get(m),
                                  step_bytes(p, method, m, group), note, tuple(kinds)))
        del weights, flat
        return out

    # each method twice, in PASS_ORDER, and the mean of the two (as the per-shape runner times fp16
    # and w4: no method always timed after another)
    passes: dict[str, list[list[StepResult]]] = {}
    for method in PASS_ORDER:
        passes.setdefault(method, []).append(measure_method(method))
    for method in (FP16, W4, W4_PDL):
        first, second = passes[method]
        results.extend(combined(a, b) for a, b in zip(first, second))
    if cuda:
        torch.cuda.empty_cache()
    return results, None
