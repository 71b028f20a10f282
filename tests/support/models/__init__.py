"""Models the tests build: tiny random-weight llama, hybrid and Qwen3 pairs (``tiny_models``,
``tool_models``), GGUF files laid out as llama.cpp writes them (``gguf_models``, ``gguf_writer``), and a
Hugging Face cache holding the README's model ids (``hub``)."""
