"""File formats bitfault reads and writes beside fault maps: GGUF files as stored memory
(``gguf_memory``)."""
