"""One module per technique. Each transforms a model, an optimizer or a config and reports what it changed."""
