"""`w4 verify [TARGET] [--against SOURCE]`: the release gate (docs/verify.md).

    w4 verify                              kernel self-test (CPU reference checks; GPU checks on a GPU)
    w4 verify MODEL                        one quantized checkpoint: integrity, and its layers on the GPU
    w4 verify OUTPUT --against SOURCE      a dequantize/repack output vs a fresh conversion of SOURCE
    w4 verify OUT.gguf --against SOURCE    a w4 gguf file vs a fresh conversion of SOURCE
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from w4cli import console
from w4cli.errors import UsageError
from w4cli.options import SEED_MAX, CacheDirOpt, JsonOpt, RevisionOpt, TokenOpt, not_empty, writable_file

EXAMPLES = [
    "w4 verify --quick                              # pre-commit: small shapes",
    "w4 verify --require-gpu --junit verify.xml     # CI on a GPU runner",
    "w4 verify Qwen/Qwen2.5-7B-Instruct-AWQ --json report.json",
    "w4 verify ./qwen-fp16 --against Qwen/Qwen2.5-7B-Instruct-AWQ",
    "w4 verify qwen2.5-7b.gguf --against Qwen/Qwen2.5-7B-Instruct-AWQ --junit gguf.xml",
]

TargetArg = Annotated[
    Optional[str],
    typer.Argument(help="Checkpoint to check: a quantized MODEL (Hub id or directory), or with --against the OUTPUT directory or OUT.gguf file. Omit for the kernel self-test.", show_default=False,
                   metavar="TARGET", parser=not_empty),
]
AgainstOpt = Annotated[
    Optional[str],
    typer.Option("--against", help="SOURCE the OUTPUT was converted from (Hub id or directory); --revision/--token/--cache-dir apply to it.", show_default=False,
                 metavar="SOURCE", parser=not_empty),
]
QuickOpt = Annotated[bool, typer.Option("--quick", help="Self-test only: a small subset of shapes (pre-commit).")]
SeedOpt = Annotated[int, typer.Option("--seed", min=0, max=SEED_MAX, help="Seed of every random input; the same seed gives the same report.")]
RequireGpuOpt = Annotated[bool, typer.Option("--require-gpu", help="Exit 3 instead of skipping when the GPU checks cannot run (no GPU, kernel build failed).")]
JunitOpt = Annotated[Optional[Path], typer.Option("--junit", help="Also write JUnit XML (one testcase per check) to FILE.", show_default=False, metavar="FILE", parser=writable_file)]


@console.boundary
def verify(
    target: TargetArg = None,
    against: AgainstOpt = None,
    quick: QuickOpt = False,
    seed: SeedOpt = 0,
    require_gpu: RequireGpuOpt = False,
    junit: JunitOpt = None,
    json_file: JsonOpt = None,
    revision: RevisionOpt = None,
    token: TokenOpt = None,
    cache_dir: CacheDirOpt = None,
) -> None:
    """Say yes or no, and why: kernel self-test, checkpoint integrity, or an output against its source.

    Exit 0 all checks passed (skipped GPU checks allowed unless --require-gpu), 1 a check failed, 2 usage, 3 the GPU checks could not run and --require-gpu was given, 4 MODEL or SOURCE refused.
    """
    from w4cli.verify import report as rep
    from w4cli.verify.environment import Gpu, describe, probe_gpu

    if against is not None and target is None:
        raise UsageError("--against SOURCE needs the OUTPUT directory to compare: w4 verify OUTPUT --against SOURCE")
    if quick and target is not None:
        raise UsageError("--quick selects the self-test's shapes; it does not apply to w4 verify MODEL or OUTPUT")

    if against is not None:
        from w4cli.read.source import resolve
        from w4cli.write import provenance
        from w4cli.verify import compare

        output = Path(target).expanduser()
        if output.is_file():
            from w4cli.verify import gguf_compare

            source = resolve(against, revision, token, cache_dir)
            report = rep.Report(f"w4 verify {target} --against {against}",
                                {"mode": "gguf", "output": str(output), "source": against, "source_revision": source.revision},
                                describe(Gpu(None, "not used: the fresh conversion runs on the CPU"), None))
            gguf_compare.run(report, output, source)
        elif not output.is_dir():
            raise UsageError(f"OUTPUT '{target}' is neither a GGUF file nor a directory (w4 verify OUTPUT --against SOURCE compares a local output)")
        else:
            # an OUTPUT made with --include-code holds SOURCE's *.py files: fetch them to compare
            include_code = provenance.made_with_code(provenance.read(output))
            source = resolve(against, revision, token, cache_dir, include_code)
            report = rep.Report(f"w4 verify {target} --against {against}",
                                {"mode": "compare", "output": str(output), "source": against, "source_revision": source.revision},
                                describe(Gpu(None, "not used: the fresh conversion runs on the CPU reference"), None))
            compare.run(report, output.resolve(), source, include_code)
    elif target is not None:
        from w4cli.read.source import resolve
        from w4cli.verify import integrity

        snapshot = resolve(target, revision, token, cache_dir)
        gpu = probe_gpu()
        report = rep.Report(f"w4 verify {target} (seed {seed})",
                            {"mode": "integrity", "model": target, "revision": snapshot.revision}, describe(gpu, seed))
        integrity.run(report, snapshot.path, gpu, seed, require_gpu)
    else:
        from w4cli.verify import selftest

        gpu = probe_gpu()
        subset = "quick" if quick else "full"
        report = rep.Report(f"w4 verify self-test ({subset}, seed {seed})", {"mode": "selftest", "subset": subset},
                            describe(gpu, seed))
        selftest.run(report, gpu, seed, quick, require_gpu)

    console.result(rep.to_document(report), json_file, lambda: rep.render_table(report, console.stdout))
    if junit is not None:
        rep.write_junit(report, junit)
    rep.raise_for_outcome(report)
