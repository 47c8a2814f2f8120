"""Each notebook's experiments and the findings worded from their live numbers, one module per notebook.

A lab module answers "what does the technique do to time, memory, accuracy and size here"; the
technique itself (what a learner copies into their own loop) is in `labkit.techniques`.
"""

from . import code_exercises  # noqa: F401 - registers the notebooks' code exercises with labkit.exercises
