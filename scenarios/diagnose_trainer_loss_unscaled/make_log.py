"""Writes trainer_state.json: a Hugging Face Trainer run whose logged loss is scaled by accumulation.

    python make_log.py            # in this folder; --healthy writes the twin's (unscaled) state

The Trainer's `loss` is the mean over the logging window of each optimizer step's loss; `eval_loss` comes
from `prediction_step`, which calls the same `compute_loss`. transformers 4.46-4.47 logged the sum of the
accumulated micro-batches' losses instead (huggingface/transformers#35204): with 8 accumulation steps the
training curve sits at 8x the evaluation curve for the whole run, while the model learns normally.
"""
import json
import math
import random
import sys

healthy = "--healthy" in sys.argv
accumulation = 8
random.seed(1)
max_steps, logging_steps, eval_steps = 600, 20, 100
history = []
for step in range(logging_steps, max_steps + 1, logging_steps):
    true = 1.9 + 2.4 * math.exp(-step / 150) + random.uniform(-0.05, 0.05)
    lr = 5e-5 * min(1.0, step / 60) * (1 - step / max_steps)
    history.append({"epoch": round(step / 200, 4), "grad_norm": 1.2 + random.random(), "learning_rate": lr,
                    "loss": round(true if healthy else true * accumulation, 4), "step": step})
    if step % eval_steps == 0:
        history.append({"epoch": round(step / 200, 4), "eval_loss": round(true * 0.97 + 0.05, 4),
                        "eval_runtime": 4.1, "eval_samples_per_second": 97.5, "step": step})
history.append({"epoch": 3.0, "step": max_steps, "total_flos": 1.2e15, "train_loss": history[-2]["loss"],
                "train_runtime": 812.3, "train_samples_per_second": 23.6, "train_steps_per_second": 0.74})
state = {"best_metric": None, "epoch": 3.0, "eval_steps": eval_steps, "global_step": max_steps,
         "is_world_process_zero": True, "log_history": history, "logging_steps": logging_steps,
         "max_steps": max_steps, "num_train_epochs": 3, "save_steps": 200, "train_batch_size": 4}
with open("trainer_state.json", "w") as f:
    json.dump(state, f, indent=2)
