"""MODEL (a local directory or a Hub repo id) -> a local snapshot directory.

Hub loading goes through huggingface_hub, so the standard cache, HF_TOKEN, HF_HUB_OFFLINE and
HF_ENDPOINT behave as they do for every other tool. config.json comes first, so a checkpoint w4
cannot read is refused before gigabytes are downloaded; then only what a conversion needs is
fetched. Pickles (*.bin, *.pt, *.pth) and code (*.py) are never downloaded, loaded or copied.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from w4cli.errors import UsageError, W4Error

# What a conversion reads or copies: config and index JSON, weights, tokenizer, generation config
# and chat templates. Everything else in a repo (pickles, code, images) stays on the Hub.
CHECKPOINT_PATTERNS = [
    "*.json",
    "*.safetensors",
    "tokenizer.model",
    "*.tiktoken",
    "*.txt",
    "*.jinja",
]
CONFIG_PATTERNS = ["config.json"]


@dataclass(frozen=True)
class Snapshot:
    path: Path
    repo_id: str | None  # None for a local directory
    revision: str | None  # the resolved commit for a Hub snapshot


class FetchFailed(W4Error):
    """The model could not be obtained (not found, no access, offline and not cached, network)."""


def _looks_like_path(model: str) -> bool:
    return model.startswith((".", "/", "~")) or model.count("/") > 1 or Path(model).exists()


def resolve(
    model: str,
    *,
    revision: str | None = None,
    token: str | None = None,
    cache_dir: Path | None = None,
    patterns: list[str] = CHECKPOINT_PATTERNS,
    check_config: Callable[[Path], None] | None = None,
) -> Snapshot:
    """Return the local directory holding MODEL's files.

    check_config, if given, is called with the path of config.json before the weights are
    fetched; it raises to stop the download of a checkpoint that will be refused anyway.
    """
    if _looks_like_path(model):
        path = Path(model).expanduser()
        if not path.exists():
            raise UsageError(f"MODEL '{model}': no such directory")
        if not path.is_dir():
            raise UsageError(f"MODEL '{model}' is a file; give the checkpoint's directory")
        if check_config is not None and (path / "config.json").is_file():
            check_config(path / "config.json")
        return Snapshot(path=path.resolve(), repo_id=None, revision=None)
    return _from_hub(model, revision, token, cache_dir, patterns, check_config)


def _from_hub(
    repo_id: str,
    revision: str | None,
    token: str | None,
    cache_dir: Path | None,
    patterns: list[str],
    check_config: Callable[[Path], None] | None,
) -> Snapshot:
    # imported here: huggingface_hub reads HF_* variables at import, and `w4 --help` needs none of it
    from huggingface_hub import hf_hub_download, snapshot_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError:
        raise UsageError(f"MODEL '{repo_id}' is neither a local directory nor a valid Hub repo id") from None

    where = f"'{repo_id}'" + (f" at revision '{revision}'" if revision else "")
    common = dict(revision=revision, token=token, cache_dir=cache_dir)
    try:
        if check_config is not None:
            check_config(Path(hf_hub_download(repo_id, "config.json", **common)))
        path = Path(snapshot_download(repo_id, allow_patterns=patterns, **common))
    except GatedRepoError:
        raise FetchFailed(f"{where} is gated: accept its terms on the Hub and pass --token or set HF_TOKEN") from None
    except RepositoryNotFoundError:
        raise FetchFailed(f"{where}: no such Hub repo, or no access to it (pass --token or set HF_TOKEN)") from None
    except RevisionNotFoundError:
        raise FetchFailed(f"{where}: no such revision") from None
    except LocalEntryNotFoundError:
        raise FetchFailed(
            f"{where} is not in the local Hub cache and the Hub cannot be reached (offline: HF_HUB_OFFLINE is set or no network)"
        ) from None
    except EntryNotFoundError:
        raise FetchFailed(f"{where} has no config.json") from None
    except OSError as exc:  # network and HTTP errors subclass OSError in huggingface_hub
        raise FetchFailed(f"{where} could not be downloaded: {exc}".splitlines()[0]) from None
    return Snapshot(path=path, repo_id=repo_id, revision=path.name)
