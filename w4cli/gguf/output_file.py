"""OUT.gguf for one run of `w4 gguf`: the file (or, split, its OUT-0000i-of-0000n.gguf parts)
appears only when complete, and never replaces what was not checked.

As for an OUTPUT_DIR (w4cli/output_dir.py, whose claim this reuses): before any work OUT is refused
if it exists and --force was not given, or if --force would replace anything but a GGUF file; it is
locked against other w4 runs (OUT.w4tmp-lock); the files are written into a temporary sibling directory
(OUT.w4tmp-<pid>-<hex>/) and renamed into place at the end, the first part last, so llama.cpp
never finds a first part whose others are missing. Whatever stops the run, the temporary
directory goes with it (or with the next run, after a kill -9).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from w4cli.write import signals
from w4cli.errors import InputRefused, OutputFailed
from w4cli.write.output_dir import OutputDirectory, _fsync, _umask
from w4cli.write.rename import exchange, rename_noreplace

GGUF_MAGIC = b"GGUF"


def is_gguf_file(path: Path) -> bool:
    if path.is_symlink() or not path.is_file():
        return False
    with open(path, "rb") as handle:
        return handle.read(4) == GGUF_MAGIC


def check_output_file(output: Path, inputs: list[Path]) -> None:
    """Refuse, before anything is created, an OUT that is a directory, a dangling link, or inside an
    input checkpoint."""
    if output.is_symlink() and not output.exists():
        raise InputRefused(f"OUT {output} is a symbolic link to {os.readlink(output)}, which does not exist")
    if output.is_dir():
        raise InputRefused(f"OUT {output} is a directory; w4 gguf writes a file (give OUT.gguf)")
    target = output.resolve()
    for source in inputs:
        if source.resolve() in target.parents:
            raise InputRefused(f"OUT {output} is inside the input checkpoint {source}")


class OutputFile(OutputDirectory):
    """OUT claimed for one run, as OutputDirectory claims a directory (the lock, the temporary
    sibling `temp`, the clean-up whatever ends the run); `temp` holds the GGUF files under their
    final names, and commit() moves them into place beside OUT."""

    def _check_replaceable(self) -> None:
        self.check_replaceable([self.target])

    def check_replaceable(self, targets: list[Path]) -> None:
        for target in targets:
            if not os.path.lexists(target):
                continue
            if not self.force:
                raise InputRefused(f"{target.name} exists (pass --force to replace it)")
            if not is_gguf_file(target):
                raise InputRefused(f"--force replaces only a GGUF file, and {target.name} is not one")

    def _interrupted(self) -> str:
        if not self.committed:
            return f"interrupted; {self.output} was not written"
        return f"interrupted after {self.output} was written: it is complete"

    def commit(self, names: list[str]) -> list[Path]:  # type: ignore[override]
        """Move the written files `names` (the first part first) into place beside OUT, the first
        part last; returns their final paths."""
        mode = 0o666 & ~_umask()
        for name in names:
            (self.temp / name).chmod(mode)
            _fsync(self.temp / name)
        finals = [self.target.parent / name for name in names]
        self.check_replaceable(finals)
        with signals.held():
            for name, final in reversed(list(zip(names, finals))):
                self._place_file(self.temp / name, final)
            self.committed = True
        _fsync(self.target.parent)
        shutil.rmtree(self.temp, ignore_errors=True)
        return finals

    def _place_file(self, source: Path, final: Path) -> None:
        try:
            rename_noreplace(source, final)
            return
        except FileExistsError:
            if not self.force:
                raise self._file_changed(final) from None
        if not exchange(source, final):
            if not is_gguf_file(final):
                raise self._file_changed(final)
            os.replace(source, final)
            return
        if not is_gguf_file(source):  # what was swapped out is not the GGUF checked before
            exchange(source, final)
            raise self._file_changed(final)

    def _file_changed(self, final: Path) -> OutputFailed:
        return OutputFailed(f"{final} was created or changed by someone else during the conversion: it was left as it was")
