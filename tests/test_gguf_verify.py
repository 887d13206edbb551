"""`w4 verify OUT.gguf --against SOURCE`: every row passes on a file w4 gguf wrote; a changed code,
d, m, key or token is caught by its row (exit 1, JUnit); a file that is not GGUF is refused."""

from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET

import gguf

from tests.gguf_models import build

ROWS = ["GGUF file", "metadata keys", "tokenizer", "tensor names", "tensors", "provenance"]


def verify(w4, out, source, tmp_path):
    junit = tmp_path / "gguf.xml"
    result = w4("verify", out, "--against", source, "--json", "-", "--junit", junit)
    doc = json.loads(result.stdout)
    return result.exit_code, {c["name"]: c for c in doc["checks"]}, ET.parse(junit).getroot()


def written(w4, tmp_path, *extra):
    source = build(tmp_path / "m", "llama", "gptq", layers=1)
    out = tmp_path / "out.gguf"
    assert w4("gguf", source, out, *extra).exit_code == 0
    return source, out


def test_every_row_passes(w4, tmp_path):
    source, out = written(w4, tmp_path)
    code, checks, junit = verify(w4, out, source, tmp_path)
    assert code == 0, checks
    assert [name for name in checks] == ROWS and all(c["status"] == "PASS" for c in checks.values())
    cases = list(junit.iter("testcase"))
    assert [c.get("name") for c in cases] == ROWS and junit.get("failures") == "0"


def test_outtype_and_split_files_pass(w4, tmp_path):
    source, out = written(w4, tmp_path, "--outtype", "f32", "--split-max-size", "60K")
    parts = sorted(tmp_path.glob("out-*-of-*.gguf"))
    assert len(parts) > 1 and not out.exists()
    first = parts[0]
    code, checks, _ = verify(w4, first, source, tmp_path)
    assert code == 0, checks


def _tensor_offset(path, name: str) -> tuple[int, int]:
    tensor = next(t for t in gguf.GGUFReader(path).tensors if t.name == name)
    return tensor.data_offset, tensor.n_bytes


def _flip(path, offset: int, mask: int = 0x01) -> None:
    with open(path, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)[0]
        handle.seek(offset)
        handle.write(bytes([byte ^ mask]))


def test_a_changed_code_d_or_m_is_caught(w4, tmp_path):
    source, out = written(w4, tmp_path)
    offset, _ = _tensor_offset(out, "blk.0.ffn_up.weight")  # Q4_1: d at 0, m at 2, codes from 4
    for where, part in ((0, "d"), (2, "m"), (20 + 7, "codes")):
        copy = tmp_path / f"changed-{part}.gguf"
        shutil.copyfile(out, copy)
        _flip(copy, offset + where)
        code, checks, junit = verify(w4, copy, source, tmp_path)
        assert code == 1 and checks["tensors"]["status"] == "FAIL"
        expected_block = 1 if part == "codes" else 0
        assert checks["tensors"]["detail"] == f"blk.0.ffn_up.weight: row 0, block {expected_block}: {part} differ"
        assert junit.get("failures") == "1"


def test_a_changed_token_is_caught(w4, tmp_path):
    source, out = written(w4, tmp_path)
    data = out.read_bytes()
    at = data.index(b"<|end_of_text|>")
    changed = tmp_path / "token.gguf"
    changed.write_bytes(data[:at] + b"<|end_of_tExt|>" + data[at + 15:])
    code, checks, _ = verify(w4, changed, source, tmp_path)
    assert code == 1 and checks["tokenizer"]["status"] == "FAIL"
    assert checks["metadata keys"]["status"] == "PASS" and checks["tensors"]["status"] == "PASS"


def test_not_a_gguf_file(w4, tmp_path):
    source, _ = written(w4, tmp_path)
    other = tmp_path / "other.gguf"
    other.write_bytes(b"GGML" + bytes(100))
    code, checks, _ = verify(w4, other, source, tmp_path)
    assert code == 1 and checks["GGUF file"]["status"] == "FAIL" and "is not a GGUF file" in checks["GGUF file"]["detail"]
    assert list(checks) == ["GGUF file"]


def test_a_changed_expert_is_named(w4, tmp_path):
    source = build(tmp_path / "m", "qwen3moe", "awq", layers=1)
    out = tmp_path / "out.gguf"
    assert w4("gguf", source, out).exit_code == 0
    offset, _ = _tensor_offset(out, "blk.0.ffn_up_exps.weight")  # [4 experts, 128 rows, 128 / 32 blocks of 20 bytes]
    expert, row, block = 2, 5, 3
    _flip(out, offset + ((expert * 128 + row) * 4 + block) * 20 + 9)
    code, checks, _ = verify(w4, out, source, tmp_path)
    assert code == 1 and checks["tensors"]["detail"] == f"blk.0.ffn_up_exps.weight: expert {expert}, row {row}, block {block}: codes differ"
