"""Hugging Face Trainer and the trainers built on it (TRL, LLaMA-Factory, ms-swift): their JSON files.

Read from: huggingface/transformers `src/transformers/trainer_callback.py` (`TrainerState`: `log_history`,
`global_step`, `max_steps`, `num_train_epochs`, `logging_steps`, `eval_steps`, `save_steps`, saved by
`save_to_json`) and `trainer.py` (`_maybe_log_save_evaluate` logs `loss`, `grad_norm`, `learning_rate`,
`epoch` every `logging_steps`; `log` appends `{**logs, "step": global_step}`; the end of `train` logs the
`train_runtime` summary; `_save_checkpoint` writes `checkpoint-N/trainer_state.json`, the output folder's
own copy is written only by `save_state` after training). TRL's trainers log through the same `log`
(`rewards/*`, `logps/*`, `kl`...). LLaMA-Factory `src/llamafactory/train/callbacks.py` (`LogCallback.on_log`
appends `current_steps`, `total_steps`, `loss`, `lr`, `epoch`, `percentage`, `elapsed_time`... to
`trainer_log.jsonl`). ms-swift `swift/trainers/callback.py` / `swift/utils` (`logging.jsonl`: each logged dict
with its floats rounded to 8 decimals, `global_step/max_steps` as "N/M" in newer versions, `global_step` in
older; the last record of a finished run is the summary with `last_model_checkpoint` and the whole
`log_history`).
"""

from trainguard.ingest.formats import FormatContract, declare

declare(
    FormatContract(
        name="hugging face trainer_state.json", family="Hugging Face Trainer (and TRL)",
        writer="huggingface/transformers src/transformers/trainer_callback.py TrainerState.save_to_json; "
               "trainer.py Trainer.log, _maybe_log_save_evaluate",
        files=("trainer_state.json", "checkpoint-*/trainer_state.json"),
        metrics="log_history rows: loss, grad_norm, learning_rate (train rows); eval_* (eval rows); TRL's "
                "rewards/*, logps/*, kl beside them",
        step_axis="`step` = global_step, optimizer updates (a micro-batch is not a step)",
        plan="max_steps (num_train_epochs beside it); logging_steps, eval_steps, save_steps",
        completion="a last log_history row with train_runtime (the summary `train` logs at its end); "
                   "or global_step reaching max_steps in a checkpoint's copy",
        parts="independent",
        notes=("a checkpoint-N/trainer_state.json is a snapshot: it never holds the summary",
               "the file is rewritten whole at each save: read it streaming, one log_history record at a time"),
        plan_keys=("max_steps",),
        eval_same_loss=True,  # prediction_step computes eval_loss with compute_loss itself
    ),
    FormatContract(
        name="llama-factory trainer_log.jsonl", family="LLaMA-Factory",
        writer="hiyouga/LLaMA-Factory src/llamafactory/train/callbacks.py LogCallback.on_log",
        files=("trainer_log.jsonl", "an output_dir holding trainer_log.jsonl"),
        metrics="loss, lr, eval_loss, predict_loss, reward, accuracy per record",
        step_axis="current_steps, optimizer updates",
        plan="total_steps in every record",
        completion="current_steps reaching total_steps; or a last record with no loss, eval_loss, predict_loss, "
                   "reward or lr: the closing train() summary (its values are not copied), written when training "
                   "returned, whose current_steps may be one short of total_steps (max_steps as planned)",
        parts="none",
        notes=("a resumed run appends to the same file: steps may restart below the last one",),
        plan_keys=("total_steps",),
        eval_same_loss=True,  # prediction_step computes eval_loss with compute_loss itself
    ),
    FormatContract(
        name="ms-swift logging.jsonl", family="ms-swift",
        writer="modelscope/ms-swift swift/trainers/callback.py (on_log), swift/utils append_to_jsonl",
        files=("logging.jsonl", "an output_dir holding logging.jsonl"),
        metrics="loss, acc, grad_norm, learning_rate; eval_loss, eval_acc; the train_runtime summary",
        step_axis="global_step (older) or `global_step/max_steps` \"N/M\" (newer), optimizer updates",
        plan="M of `global_step/max_steps`; in older files none, except the step of the closing summary",
        completion="a record with train_runtime (then one with last_model_checkpoint and the log_history)",
        parts="none",
        notes=("every float is rounded to 8 decimals: a learning_rate of 0.0 is below 5e-9, not zero",
               "two writers (main process and a callback) may write every record twice"),
        plan_keys=("global_step/max_steps",),
        eval_same_loss=True,  # prediction_step computes eval_loss with compute_loss itself
    ),
)
