"""`w4 gguf`: int4 linears as GGUF 4-bit blocks, llama.cpp's architectures, names and tokenizer keys, the streamed .gguf file."""
