"""Notebook 10 (language models): what makes language-model fine-tuning fast and small. Its experiments, one module
per notebook section, and one verdict line per finding from their live numbers."""
