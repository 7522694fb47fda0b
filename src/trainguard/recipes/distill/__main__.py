"""python -m trainguard.recipes.distill CONFIG.yaml [--max-steps N] [--run-dir DIR] [--resume CKPT]"""

from trainguard.recipes.distill.command import main

main()
