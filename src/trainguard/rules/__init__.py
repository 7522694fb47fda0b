"""The rule catalogue: every finding trainguard can produce has a code, a name and a page."""
