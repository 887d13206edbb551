"""What the GGUF tests compare w4's files against: transformers' logits on a dense checkpoint,
llama.cpp's logits on a GGUF, and the second-quantization route a user has without w4 (the
dequantized weights as an F16 GGUF, quantized again by llama.cpp's own quantizer)."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

SKIPPED_KEYS = ("GGUF.", gguf.Keys.General.ARCHITECTURE, gguf.Keys.General.FILE_TYPE)


def transformers_logits(dense: Path, ids: list[int]) -> np.ndarray:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(dense, dtype=torch.float32)
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()


def llama_cpp_model(path: Path):
    from llama_cpp import Llama

    return Llama(model_path=str(path), n_ctx=128, logits_all=True, verbose=False, n_threads=2, seed=0)


def llama_cpp_logits(path: Path, ids: list[int]) -> np.ndarray:
    llm = llama_cpp_model(path)
    llm.eval(ids)
    out = np.array(llm.scores[: len(ids)], dtype=np.float32)
    llm.close()
    return out


def dense_copy(source: Path, out: Path) -> Path:
    """`source` with every 4-bit block tensor dequantized by the gguf package and stored as F16:
    the dense model a second quantization starts from."""
    reader = gguf.GGUFReader(source)
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    writer = gguf.GGUFWriter(out, arch)
    for name, field in reader.fields.items():
        if name.startswith(SKIPPED_KEYS):
            continue
        sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), field.types[0], sub_type=sub_type)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    for tensor in reader.tensors:
        if tensor.tensor_type in (gguf.GGMLQuantizationType.Q4_0, gguf.GGMLQuantizationType.Q4_1):
            writer.add_tensor(tensor.name, gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float16))
        else:
            writer.add_tensor(tensor.name, np.array(tensor.data), raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def llama_quantize(source: Path, out: Path, ftype: int) -> Path:
    """llama.cpp's own quantizer (llama_model_quantize) to `ftype`, embeddings and output kept F16
    so the two routes differ only in the quantized linears."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = 2
    params.token_embedding_type = gguf.GGMLQuantizationType.F16
    params.output_tensor_type = gguf.GGMLQuantizationType.F16
    code = llama_cpp.llama_model_quantize(str(source).encode(), str(out).encode(), params)
    assert code == 0, f"llama_model_quantize returned {code}"
    return out


def relative_error(found: np.ndarray, reference: np.ndarray) -> float:
    return float(np.linalg.norm(found - reference) / np.linalg.norm(reference))
