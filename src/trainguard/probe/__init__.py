"""The in-process probe: `Guard` and its helpers. Imported only when `trainguard.watch` is called."""
