"""Per-framework packages: import `aikit.autolrs.Torch` or `aikit.autolrs.TF`."""
