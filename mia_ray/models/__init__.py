"""Loading Hugging Face models and tokenizers (no Ray here)."""
