"""Each notebook's experiments and the findings worded from their live numbers, one package per notebook.

A lab answers "what does the technique do to time, memory, accuracy and size here"; the technique itself
(what a learner copies into their own loop) is in `labkit.techniques`. Each lab's exercises are in its
``exercises`` module; `labkit.labs.catalog` lists every notebook's lab and exercises. Importing this package
imports no lab.
"""
