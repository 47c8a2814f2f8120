"""The learner's view: every notebook run in JupyterLab in headless Chromium, its panel driven."""
