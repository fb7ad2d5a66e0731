"""Per-framework packages: import `aikit.lr_finder.Torch` or `aikit.lr_finder.TF`."""
