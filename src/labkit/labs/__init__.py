"""Each notebook's experiments, one package per notebook: each returns a result (`labkit.labresult.LabResult`) that
shows its table and the finding worded from its live numbers.

A lab answers "what does the technique do to time, memory, accuracy and size here"; the technique itself
(what a learner copies into their own loop) is in `labkit.techniques`. Each lab's exercises are in its
``exercises`` module; `labkit.labs.catalog` lists every notebook's lab and exercises. Importing this package
imports no lab.
"""
