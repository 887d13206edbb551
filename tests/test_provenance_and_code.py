"""Where an output came from is written into every shard and the --json summary; custom code named
by auto_map is never copied silently dropped: a warning, or --include-code to copy it verbatim
(never imported)."""

from __future__ import annotations

import json
from pathlib import Path

from safetensors import safe_open

from tests.awq_builder import install_hub_cache, small_model
from w4cli import __version__

REPO = "org/tiny-awq"


def shard_metadata(directory: Path) -> list[dict[str, str]]:
    out = []
    for path in sorted(directory.glob("*.safetensors")):
        with safe_open(path, framework="pt") as handle:
            out.append(handle.metadata())
    assert out
    return out


def test_every_shard_says_where_it_came_from_local(tmp_path, w4):
    src = small_model().write(tmp_path / "src")
    result = w4("dequantize", src, tmp_path / "out", "--device", "cpu", "--dtype", "bf16", "--max-shard-size", "4kB",
                "--token", "hf_secret_token_value", "--json")
    assert result.exit_code == 0, result.stderr
    metadata = shard_metadata(tmp_path / "out")
    assert len(metadata) > 1
    for meta in metadata:
        assert meta["format"] == "pt"
        assert meta["w4_source"] == str(src.resolve())
        assert meta["w4_source_revision"] == ""
        assert meta["w4_version"] == __version__
        assert meta["w4_command"].startswith(f"w4 dequantize {src} {tmp_path / 'out'}")
        assert "--dtype bf16" in meta["w4_command"] and "--max-shard-size 4kB" in meta["w4_command"]
        assert "hf_secret_token_value" not in json.dumps(meta)
    summary = json.loads(result.stdout)
    assert summary["provenance"] == {k: v for k, v in metadata[0].items() if k != "format"}
    assert "hf_secret_token_value" not in result.stdout + result.stderr


def test_every_shard_says_where_it_came_from_hub(tmp_path, w4):
    files = small_model().write(tmp_path / "files")
    cache = tmp_path / "hub"
    commit = install_hub_cache(cache, REPO, files)
    result = w4("repack", REPO, tmp_path / "out", "--cache-dir", cache)
    assert result.exit_code == 0, result.stderr
    for meta in shard_metadata(tmp_path / "out"):
        assert meta["w4_source"] == REPO
        assert meta["w4_source_revision"] == commit
        assert meta["w4_command"].startswith(f"w4 repack {REPO} ")


AUTO_MAP = {
    "AutoConfig": "configuration_tiny.TinyConfig",
    "AutoModelForCausalLM": "modeling_tiny.TinyForCausalLM",
    "AutoTokenizer": ["tokenization_tiny.TinyTokenizer", None],
}


def custom_code_model(tmp_path: Path) -> Path:
    """A checkpoint whose code, if anything ever imported it, would leave a marker file."""
    marker = tmp_path / "IMPORTED"
    code = f"open({str(marker)!r}, 'w').write('w4 imported checkpoint code')\n"
    ckpt = small_model()
    ckpt.config["auto_map"] = AUTO_MAP
    return ckpt.write(tmp_path / "src", extra_files={
        "configuration_tiny.py": code, "modeling_tiny.py": code, "tokenization_tiny.py": code, "helpers.py": code,
    })


def test_custom_code_is_named_in_a_warning_and_not_copied(tmp_path, w4):
    src = custom_code_model(tmp_path)
    result = w4("dequantize", src, tmp_path / "out", "--device", "cpu")
    assert result.exit_code == 0, result.stderr
    warning = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(warning) == 1, result.stderr
    for name in ("configuration_tiny.py", "modeling_tiny.py", "tokenization_tiny.py", "--include-code"):
        assert name in warning[0]
    assert not list((tmp_path / "out").glob("*.py"))
    assert not (tmp_path / "IMPORTED").exists()


def test_include_code_copies_the_python_files_verbatim_and_never_imports_them(tmp_path, w4):
    src = custom_code_model(tmp_path)
    result = w4("dequantize", src, tmp_path / "out", "--device", "cpu", "--include-code")
    assert result.exit_code == 0, result.stderr
    assert "warning" not in result.stderr
    for name in ("configuration_tiny.py", "modeling_tiny.py", "tokenization_tiny.py", "helpers.py"):
        assert (tmp_path / "out" / name).read_bytes() == (src / name).read_bytes()
    assert json.loads((tmp_path / "out" / "config.json").read_text())["auto_map"] == AUTO_MAP
    assert not (tmp_path / "IMPORTED").exists()


def test_include_code_from_the_hub(tmp_path, w4):
    src = custom_code_model(tmp_path)
    cache = tmp_path / "hub"
    install_hub_cache(cache, REPO, src)
    result = w4("repack", REPO, tmp_path / "out", "--cache-dir", cache, "--include-code")
    assert result.exit_code == 0, result.stderr
    assert (tmp_path / "out" / "modeling_tiny.py").read_bytes() == (src / "modeling_tiny.py").read_bytes()
    assert not (tmp_path / "IMPORTED").exists()


def test_auto_map_naming_a_file_the_checkpoint_lacks_is_said(tmp_path, w4):
    src = custom_code_model(tmp_path)
    (src / "modeling_tiny.py").unlink()
    result = w4("dequantize", src, tmp_path / "out", "--device", "cpu", "--include-code")
    assert result.exit_code == 0, result.stderr
    assert "modeling_tiny.py, which the checkpoint does not hold" in result.stderr
