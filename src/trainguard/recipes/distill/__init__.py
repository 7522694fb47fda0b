"""trainguard.recipes.distill: teacher -> student distillation, across tokenizers, under the guard.

    pip install 'trainguard[distill]'
    trainguard distill bundled                 # the tiny bundled config, CPU, offline
    trainguard distill my.yaml --max-steps 200

Modules, one idea each: `config` (the YAML, checked first), `build` (models and tokenizers),
`tokenize_align` (byte-offset alignment), `vocab_map` (exact-string vocabulary overlap), `kd` (the teacher's
streamed top-k targets; `topk_triton` its CUDA kernel), `fused_head` (the student's LM + KD in one pass),
`cache` / `cache_build` (the offline teacher cache), `losses` (the one forward), `curriculum` (weights), `evaluate`, `checkpoint`, `data`,
`train` (the loop) and `command` (the CLI). Importing this package loads neither torch nor transformers.
"""

from pathlib import Path

BUNDLED_CONFIG = Path(__file__).parent / "tiny.yaml"
