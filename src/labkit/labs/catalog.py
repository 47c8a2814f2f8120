"""Which lab belongs to which notebook, and every notebook's exercises in one place (`labkit solutions`)."""

from __future__ import annotations

from ..exercises import Exercises
from .batch_size import exercises as batch_size
from .distributed import exercises as distributed
from .freezing import exercises as freezing
from .language import exercises as language
from .lora import exercises as lora
from .memory_savers import exercises as memory_savers
from .mixed_precision import exercises as mixed_precision
from .pruning import exercises as pruning
from .quantization import exercises as quantization
from .recipe import exercises as recipe
from .start_here import exercises as start_here
from .your_finetune import exercises as your_finetune

# notebook file stem -> its lab's exercises module, in the notebooks' order
NOTEBOOKS = {
    "00_start_here": start_here, "01_mixed_precision": mixed_precision, "02_batch_size": batch_size,
    "03_memory_savers": memory_savers, "04_pruning": pruning, "05_freezing": freezing,
    "06_quantization": quantization, "07_distributed": distributed, "08_lora": lora, "09_recipe": recipe,
    "10_language_models": language, "11_your_finetune": your_finetune,
}


def all_exercises() -> Exercises:
    """Every notebook's exercises, in the notebooks' order."""
    combined = Exercises()
    for module in NOTEBOOKS.values():
        combined = combined + module.EXERCISES
    return combined
