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
                "--token", "hf_secret_token_value", "--json", "-")
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


def verify_rows(w4, *args) -> tuple[int, dict[str, dict]]:
    result = w4("verify", *args, "--json", "-")
    return result.exit_code, {row["name"]: row for row in json.loads(result.stdout)["checks"]}


def test_verify_expects_the_code_of_an_output_made_with_include_code(tmp_path, w4):
    src = custom_code_model(tmp_path)
    assert w4("dequantize", src, tmp_path / "out", "--device", "cpu", "--include-code").exit_code == 0
    code, rows = verify_rows(w4, tmp_path / "out", "--against", src)
    assert code == 0, rows
    assert rows["provenance"]["status"] == "PASS" and "--include-code" in rows["provenance"]["detail"]
    (tmp_path / "out" / "modeling_tiny.py").write_text("import os\n")
    code, rows = verify_rows(w4, tmp_path / "out", "--against", src)
    assert code == 1 and rows["copied files"]["status"] == "FAIL", rows


def test_verify_fails_an_output_made_from_another_revision(tmp_path, w4):
    files = small_model().write(tmp_path / "files")
    cache = tmp_path / "hub"
    made_from = install_hub_cache(cache, REPO, files)
    assert w4("dequantize", REPO, tmp_path / "out", "--cache-dir", cache, "--device", "cpu").exit_code == 0
    (files / "notes.png").write_bytes(b"a file w4 neither reads nor copies: only the revision changes")
    now = install_hub_cache(cache, REPO, files)
    assert now != made_from
    code, rows = verify_rows(w4, tmp_path / "out", "--against", REPO, "--cache-dir", cache)
    assert code == 1
    assert rows["tensors"]["status"] == "PASS"
    assert rows["provenance"]["status"] == "FAIL"
    assert made_from in rows["provenance"]["detail"] and now in rows["provenance"]["detail"]


def test_verify_fails_shards_that_disagree_on_their_origin(tmp_path, w4):
    src = small_model().write(tmp_path / "src")
    assert w4("dequantize", src, tmp_path / "out", "--device", "cpu", "--max-shard-size", "4kB").exit_code == 0
    from safetensors.torch import load_file, save_file

    last = sorted((tmp_path / "out").glob("model-*.safetensors"))[-1]
    with safe_open(last, framework="pt") as handle:
        metadata = handle.metadata()
    save_file(load_file(last), last, metadata={**metadata, "w4_source": "somewhere/else"})
    code, rows = verify_rows(w4, tmp_path / "out", "--against", src)
    assert code == 1 and rows["provenance"]["status"] == "FAIL", rows


def test_force_replaces_an_output_made_with_include_code(tmp_path, w4):
    src = custom_code_model(tmp_path)
    out = tmp_path / "out"
    assert w4("dequantize", src, out, "--device", "cpu", "--include-code").exit_code == 0
    result = w4("dequantize", src, out, "--device", "cpu", "--include-code", "--force")
    assert result.exit_code == 0, result.stderr
    # without the record of --include-code, a *.py beside the weights may be someone's work
    plain = tmp_path / "plain"
    assert w4("dequantize", src, plain, "--device", "cpu").exit_code == 0
    (plain / "train.py").write_text("someone's work")
    result = w4("dequantize", src, plain, "--device", "cpu", "--include-code", "--force")
    assert result.exit_code == 4 and "would lose train.py" in result.stderr
    assert (plain / "train.py").read_text() == "someone's work"
