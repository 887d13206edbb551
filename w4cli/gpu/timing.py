"""GPU timing harness for w4 (`w4 bench`, `w4 gemv`, and the scripts in dev/).

Method:
  * validate, then time: `measure` runs the kernel once per input set and calls the caller's
    `check(out, args)`; if it fails (returns False or raises) no time is reported -- CheckFailed is
    raised instead. The graph's own outputs of the first set are checked again after timing.
  * cold L2: the kernel is captured into ONE CUDA graph that calls it once per input set, over
    enough sets that their inputs total >= 4x the L2 cache (L2 size read from the device), so no
    call finds its inputs in L2 from the previous call; graph replay removes launch gaps.
  * steady state: warm-up replays for at least WARMUP_MS, then timed replays (CUDA events around
    each) for at least `replays` and at least TIMED_MS; per-call time = replay time / number of
    sets. Reported: median, p10, p90, min and spread = (p90-p10)/median. A GPU at its power
    limit lowers its clocks some 50-500 ms into a sustained load (H100 SXM at 700 W: a compute-bound
    call 13-19% slower after 0.5 s than in its first 40 ms, a memory-bound one unchanged;
    dev/probes/clocks_under_load.py) and regains them within 10 ms of idle, so a short warm-up
    would time a compute-bound call at clocks no sustained workload keeps, and a memory-bound one
    as it runs; served batches and prefill run sustained.
  * bytes are counted by the caller, per kernel call, and passed in (`bytes_moved`); GB/s =
    bytes / median. `copy_bandwidth()` measures a large device-to-device copy through the same
    harness (read + write bytes counted) so `pct_of_copy` compares against a ceiling from the same
    process and run.
Random inputs (never zeros) are the caller's job: pass a list of argument tuples, or a factory
`make(i) -> tuple` and let the harness decide how many sets cover 4x L2. w4cli/bench/cases.py holds
them, with each method's check and byte count:

    copy = copy_bandwidth()
    t = cases.W4_GEMV_KERNEL.case(cases.Layer(8192, 28672, 128, seed=1), m=1).measure(copy)
    print(t.median_us, t.gbps, t.pct_of_copy)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence, Union

import torch

from w4cli.errors import CheckFailed

Args = tuple
InputSets = Union[Sequence[Args], Callable[[int], Args]]
CheckFn = Callable[[Any, Args], Union[bool, None]]

L2_MULTIPLE = 4.0  # the rotating input sets total at least this many times the L2 size
WARMUP_MS = 400.0  # replays before the first timed one: past the power limit's settling (module doc)
TIMED_MS = 300.0  # the timed replays span at least this: the settled clock still swings by a few %
MAX_SETS = 256  # kernel calls per graph replay; a layer too small to reach the L2 multiple even so is timed with MAX_SETS, and Timing.working_set_bytes says so


@dataclass(frozen=True)
class Timing:
    """One measured kernel. Times are microseconds per call; gbps uses the median."""

    name: str
    median_us: float
    p10_us: float
    p90_us: float
    min_us: float
    spread: float  # (p90 - p10) / median
    bytes_moved: int  # per call, as counted by the caller
    gbps: float  # bytes_moved / median, 1 GB = 1e9 bytes
    pct_of_copy: float | None  # 100 * gbps / copy gbps, when a copy ceiling was given
    replays: int
    input_sets: int
    working_set_bytes: int  # input bytes over all sets
    l2_bytes: int
    device: str

    def row(self) -> str:
        pct = f"{self.pct_of_copy:6.1f}%" if self.pct_of_copy is not None else "     -"
        return (
            f"{self.name:<40s} {self.median_us:10.2f} us  p10 {self.p10_us:9.2f}  p90 {self.p90_us:9.2f}"
            f"  {self.gbps:8.1f} GB/s  {pct}"
        )


def l2_cache_bytes(device: torch.device | int | None = None) -> int:
    return int(torch.cuda.get_device_properties(_device(device)).L2_cache_size)


def _device(device: torch.device | int | None) -> torch.device:
    if device is None:
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cuda", device) if isinstance(device, int) else device


def _nbytes(args: Args) -> int:
    return sum(a.numel() * a.element_size() for a in args if isinstance(a, torch.Tensor))


def _quantile(sorted_vals: list[float], q: float) -> float:
    # linear interpolation between closest ranks (numpy's default)
    pos = q * (len(sorted_vals) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_vals) - 1)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (pos - lo)


def _run_check(check: CheckFn, out: Any, args: Args, name: str, what: str) -> None:
    try:
        ok = check(out, args)
    except Exception as exc:  # noqa: BLE001 - any failure of the check is a failed check
        raise CheckFailed(f"{name}: {what} failed its check ({type(exc).__name__}: {exc}); no time reported") from exc
    if ok is False:
        raise CheckFailed(f"{name}: {what} failed its check; no time reported")


def make_input_sets(inputs: InputSets, l2_bytes: int, l2_multiple: float = L2_MULTIPLE, min_sets: int = 2) -> list[Args]:
    """Materialise input sets whose inputs total >= l2_multiple * L2.

    A factory is called until that holds (at least `min_sets` times, at most MAX_SETS: a layer so
    small that MAX_SETS copies still fit the multiple is timed over MAX_SETS, and the Timing's
    working_set_bytes shows it). A list is used as given and must already be large enough
    (ValueError otherwise: pass a factory).
    """
    need = l2_multiple * l2_bytes
    if callable(inputs):
        sets = [tuple(inputs(0))]
        per_set = max(1, _nbytes(sets[0]))
        n = min(MAX_SETS, max(min_sets, math.ceil(need / per_set)))
        sets += [tuple(inputs(i)) for i in range(1, n)]
        return sets
    sets = [tuple(a) for a in inputs]
    total = sum(_nbytes(a) for a in sets)
    if not sets or total < need:
        raise ValueError(
            f"input sets total {total} bytes, less than {l2_multiple}x L2 ({int(need)} bytes): "
            "pass a factory make(i) -> args so the harness can rotate over more sets"
        )
    return sets


def measure(
    fn: Callable[..., Any],
    inputs: InputSets,
    bytes_moved: int,
    check: CheckFn,
    *,
    name: str = "kernel",
    copy: "Timing | float | None" = None,
    warmup: int = 3,
    warmup_ms: float = WARMUP_MS,
    replays: int = 30,
    timed_ms: float = TIMED_MS,
    l2_multiple: float = L2_MULTIPLE,
    min_sets: int = 2,
    check_all_sets: bool = False,
) -> Timing:
    """Check `fn` on the inputs, then time it; raise CheckFailed instead of timing a wrong kernel.

    fn(*args) -> output, for each args in the input sets (all tensors on one CUDA device).
    check(out, args) -> True/None to pass, False (or raise) to fail; run on set 0 (every set with
    check_all_sets) before timing and on the graph's set-0 output after timing.
    bytes_moved: bytes one call must move through device memory, counted by the caller.
    copy: a `copy_bandwidth()` Timing (or its GB/s) measured in the same run, for pct_of_copy.
    warm-up: at least `warmup` replays and at least `warmup_ms` of them, so that the clocks have
    settled under the load before the first timed replay whatever the kernel's length; timed: at
    least `replays` replays and at least `timed_ms` of them (Timing.replays says how many).
    """
    first = inputs(0) if callable(inputs) else inputs[0]
    dev = next((a.device for a in first if isinstance(a, torch.Tensor)), None)
    if dev is None or dev.type != "cuda":
        raise ValueError("measure() needs CUDA tensors among the arguments")
    l2 = l2_cache_bytes(dev)
    sets = make_input_sets(inputs, l2, l2_multiple, min_sets)

    with torch.cuda.device(dev):
        # 1. validate eagerly, on the same inputs that will be timed
        for i, args in enumerate(sets if check_all_sets else sets[:1]):
            out = fn(*args)
            torch.cuda.synchronize()
            _run_check(check, out, args, name, f"output on input set {i}")
            del out

        # 2. warm up eagerly on a side stream (lazy inits must not be captured), then capture
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for args in sets:
                fn(*args)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs = [fn(*args) for args in sets]  # kept alive: every call writes its own buffer

        # 3. replay
        begin, finish = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(warmup):
            graph.replay()
        finish.record()
        finish.synchronize()
        warm_ms = begin.elapsed_time(finish)
        more = math.ceil(warmup * (warmup_ms / warm_ms - 1)) if warm_ms < warmup_ms else 0
        more = min(more, 10_000)
        for _ in range(more):
            graph.replay()
        finish.record()
        finish.synchronize()
        replay_ms = begin.elapsed_time(finish) / (warmup + more)  # at the settled clock, mostly
        replays = max(replays, min(math.ceil(timed_ms / replay_ms), 10_000))
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(replays)]
        for start, end in events:
            start.record()
            graph.replay()
            end.record()
        torch.cuda.synchronize()
        per_call = sorted(s.elapsed_time(e) * 1000.0 / len(sets) for s, e in events)

        # 4. the timed graph's own output must pass too
        _run_check(check, outs[0], sets[0], name, "graph output on input set 0")
        del outs, graph

    median = _quantile(per_call, 0.5)
    p10, p90 = _quantile(per_call, 0.1), _quantile(per_call, 0.9)
    gbps = bytes_moved / (median * 1e-6) / 1e9
    copy_gbps = copy.gbps if isinstance(copy, Timing) else copy
    return Timing(
        name=name,
        median_us=median,
        p10_us=p10,
        p90_us=p90,
        min_us=per_call[0],
        spread=(p90 - p10) / median,
        bytes_moved=int(bytes_moved),
        gbps=gbps,
        pct_of_copy=(100.0 * gbps / copy_gbps) if copy_gbps else None,
        replays=replays,
        input_sets=len(sets),
        working_set_bytes=sum(_nbytes(a) for a in sets),
        l2_bytes=l2,
        device=torch.cuda.get_device_name(dev),
    )


def combined(a: Timing, b: Timing) -> Timing:
    """Two measurements of one call as one: the mean of their medians (each was taken in another
    place of a run: `w4 bench` times its two compared methods in the order A, B, B, A), the wider
    of their tails, and both counts of replays."""
    median = (a.median_us + b.median_us) / 2
    p10, p90 = min(a.p10_us, b.p10_us), max(a.p90_us, b.p90_us)
    gbps = a.bytes_moved / (median * 1e-6) / 1e9
    copy_gbps = a.gbps * 100.0 / a.pct_of_copy if a.pct_of_copy else None
    return Timing(
        name=a.name,
        median_us=median,
        p10_us=p10,
        p90_us=p90,
        min_us=min(a.min_us, b.min_us),
        spread=(p90 - p10) / median,
        bytes_moved=a.bytes_moved,
        gbps=gbps,
        pct_of_copy=(100.0 * gbps / copy_gbps) if copy_gbps else None,
        replays=a.replays + b.replays,
        input_sets=a.input_sets,
        working_set_bytes=a.working_set_bytes,
        l2_bytes=a.l2_bytes,
        device=a.device,
    )


def copy_bandwidth(
    nbytes: int | None = None,
    device: torch.device | int | None = None,
    replays: int = 30,
    method: str = "best",
) -> Timing:
    """Device-to-device copy ceiling; bytes_moved = 2 * nbytes (read + write).

    nbytes defaults to max(512 MiB, 8x L2). method:
      "memcpy": `dst.copy_(src)`, which a CUDA graph records as a memcpy node (copy engine);
      "kernel": an SM copy kernel (`torch.bitwise_not(src, out=dst)` on int32: 16-byte loads and
                stores, one read and one write per element, like the kernels we compare);
      "best":   both, and the faster is returned (the more demanding ceiling; its name says which).
    """
    if method == "best":
        a = copy_bandwidth(nbytes, device, replays, "memcpy")
        b = copy_bandwidth(nbytes, device, replays, "kernel")
        return a if a.gbps >= b.gbps else b
    dev = _device(device)
    l2 = l2_cache_bytes(dev)
    n = int(nbytes or max(512 << 20, 8 * l2))
    n -= n % 16
    src = torch.randint(-(2**31), 2**31 - 1, (n // 4,), dtype=torch.int32, device=dev)  # random, never zeros
    dst = torch.empty_like(src)
    if method == "memcpy":

        def fn(s: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
            return d.copy_(s)

        def check(out: torch.Tensor, args: Args) -> bool:
            return torch.equal(out, args[0])

    elif method == "kernel":

        def fn(s: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
            return torch.bitwise_not(s, out=d)

        def check(out: torch.Tensor, args: Args) -> bool:
            return torch.equal(torch.bitwise_not(out), args[0])

    else:
        raise ValueError(f"method must be best, memcpy or kernel, got {method!r}")
    return measure(
        fn,
        [(src, dst)],
        bytes_moved=2 * n,
        check=check,
        name=f"d2d copy ({method}) {n >> 20} MiB",
        replays=replays,
        l2_multiple=2.0,  # one set of src + dst, each well over L2
        min_sets=1,
    )
