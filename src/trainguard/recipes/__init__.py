"""Training recipes that run under the guard. Each recipe is a subpackage with its own optional extra."""
