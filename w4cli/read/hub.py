"""MODEL (a local directory or a Hub repo id) -> a local snapshot directory.

Hub loading goes through huggingface_hub, so the standard cache, HF_TOKEN, HF_HUB_OFFLINE and
HF_ENDPOINT behave as they do for every other tool. config.json comes first, so a checkpoint w4
cannot read is refused before gigabytes are downloaded; then only what a conversion needs is
fetched. Pickles (*.bin, *.pt, *.pth) are never downloaded or loaded; code (*.py) is downloaded
only for --include-code, to be copied verbatim, and never imported.

Without HF_HUB_OFFLINE, one short connection attempt to the Hub (or the proxy that reaches it)
comes first: when it fails, w4 answers from the local cache at once instead of sitting through
huggingface_hub's retries (about 26 s of them for a repo that is not cached).
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from w4cli.errors import InputRefused, UsageError, W4Error
from w4cli.read.safe_files import read_regular

# What a conversion reads or copies: config and index JSON, weights, tokenizer, generation config,
# chat templates, and the model card and license terms that must travel with the weights.
# Everything else in a repo (pickles, code, images) stays on the Hub.
CHECKPOINT_PATTERNS = [
    "*.json",
    "*.safetensors",
    "tokenizer.model",
    "*.tiktoken",
    "*.txt",
    "*.jinja",
    "README.md",
    "LICENSE*",
    "LICENCE*",
    "NOTICE*",
    "USE_POLICY.md",
]
CONFIG_PATTERNS = ["config.json"]
# custom modelling code (config.json's auto_map): fetched and copied only for --include-code
CODE_PATTERNS = ["*.py"]
PROBE_SECONDS = 3.0
COMMIT_HASH = re.compile(r"[0-9a-f]{40}")  # what huggingface_hub writes into a cache's refs/ files
REF_MAX_BYTES = 1024


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
    _check_cached_ref(repo_id, revision or "main", cache_dir, where)
    common = dict(revision=revision, token=token, cache_dir=cache_dir)
    if not _offline() and not _reachable(_endpoint()):
        # what HF_HUB_OFFLINE=1 would do, without the retries: the cached snapshot or one line
        common["local_files_only"] = True
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
        if _offline():
            raise FetchFailed(f"{where} is not in the local Hub cache (HF_HUB_OFFLINE is set)") from None
        raise FetchFailed(
            f"{where} is not in the local cache and the Hub cannot be reached; set HF_HUB_OFFLINE=1 to use only the cache"
        ) from None
    except EntryNotFoundError:
        raise FetchFailed(f"{where} has no config.json") from None
    except OSError as exc:  # network and HTTP errors subclass OSError in huggingface_hub
        raise FetchFailed(f"{where} could not be downloaded: {exc}".splitlines()[0]) from None
    return Snapshot(path=path, repo_id=repo_id, revision=path.name)


def _check_cached_ref(repo_id: str, revision: str, cache_dir: Path | None, where: str) -> None:
    """The cache's refs/<revision>, if there is one, names a commit: huggingface_hub joins its
    content to the snapshots/ path when it answers from the cache (offline, or the Hub down), so a
    tampered ref ("../../../evil", "/etc") would point it outside the cache."""
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    if COMMIT_HASH.fullmatch(revision):
        return  # a commit is looked up in snapshots/ directly, never through refs/
    repo = Path(cache_dir or constants.HF_HUB_CACHE) / repo_folder_name(repo_id=repo_id, repo_type="model")
    ref = repo / "refs" / revision
    if not os.path.lexists(ref):
        return
    content = read_regular(ref, repo, REF_MAX_BYTES).decode("utf-8", errors="replace")
    if not COMMIT_HASH.fullmatch(content):
        raise InputRefused(f"{where}: the Hub cache's refs/{revision} holds {content!r}, not a commit hash; w4 will not follow it ({repo})")


def _offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def _endpoint() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT


def _reachable(endpoint: str) -> bool:
    """One TCP connection to the endpoint, or to the proxy that the environment routes it
    through, within PROBE_SECONDS. It says nothing about authorisation or the repo, only whether
    asking is worth it."""
    url = urlsplit(endpoint)
    proxy = None
    if not _bypasses_proxy(url.hostname or ""):
        for name in (f"{url.scheme}_proxy", "all_proxy"):
            proxy = os.environ.get(name) or os.environ.get(name.upper())
            if proxy:
                break
    if proxy and "://" not in proxy:
        proxy = f"http://{proxy}"
    target = urlsplit(proxy) if proxy else url
    host = target.hostname
    if not host:
        return True  # an endpoint w4 cannot parse: let huggingface_hub say what is wrong
    port = target.port or (443 if target.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=PROBE_SECONDS):
            return True
    except OSError:
        return False


def _bypasses_proxy(host: str) -> bool:
    no_proxy = os.environ.get("no_proxy") or os.environ.get("NO_PROXY") or ""
    entries = [entry.strip().lstrip(".") for entry in no_proxy.split(",") if entry.strip()]
    return "*" in entries or any(host == entry or host.endswith("." + entry) for entry in entries)
