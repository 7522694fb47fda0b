"""Plain `print()` training loops: the shapes people write by hand, declared as one family.

Writer: no one framework; the loops of tutorials and research code (`print(f"Epoch {e}/{n} - Train Loss:
{l:.4f}")`, `print(f"step {s} loss={l}")`, python `logging` with a prefix). What they share is promised here,
what one framework promises is in that framework's module.
"""

from trainguard.ingest.formats import FormatContract
from trainguard.ingest.formats._text import TextRules, declare_text

declare_text(
    FormatContract(
        name="text log",
        family="plain print / logging",
        writer="hand-written training loops (print, logging, loguru); no single repository",
        files=("*.log", "*.out", "*.err", "*.txt", "output.log"),
        metrics="`name: value` / `name=value` pairs; `*loss` keys beside the total are parts; keys named "
                "val_/eval_/test_ or on a line that says it evaluates are evaluations; `total:` on a step line "
                "is the total loss; `avg_loss` on a step line with no other loss is that step's loss",
        step_axis="`step N`, `iter N`, `Iters: N/T`, `global_step`; a counter that restarts each epoch "
                  "(`Epoch E ... Step S/T`) is made absolute with the epochs before it",
        plan="`/T` after a step; `Epoch E/N`; a config dump's, args Namespace's or command line's epochs/max_steps "
             "(`max_epochs = 300`, `Namespace(... max_epoch=200 ...)`)",
        completion="a 'training complete/finished/done' line; the last planned epoch or step reached; a closing "
                   "summary no training step follows (`Best Epoch 6 ...` after a separator, a final "
                   "`snapshot saved to ...`); `Done` as the last line, stray short lines after it aside",
        parts="sum",
        notes=("a config dump printed first is settings, not metrics or evaluations",
               "an evaluation's own progress (`Sample: 3, Validation mIoU`) is not an evaluation",
               "abbreviated positions: `ep: 0, batch: 20` (epoch, and a batch counter within it)",
               "a two-line record: a line that is only its step (`iter = 43080`, `current step: 58036th step`), "
               "its metrics on the next line (`loss = 0.42, ...`, `batch loss:0.0047`)",
               "a number followed by a sentence's period (`Loss: 0.2154.`) is the number",
               "a shell prompt with a command (`user@host:~/dir$ python infer.py`) starts another launch: the log "
               "is judged on its last launch that trains",
               "a training row back at the log's first position (its epoch and iteration, its printed step, or "
               "its step under an epoch's heading) after the log got past it starts another launch too (a script "
               "run again into the same file); a resumed run goes on from a later position and stays one run",
               "a Hugging Face `logs` dict printed as a logger's message (`... - {'loss': 2.31, ...}`) is read "
               "as the bare dict; a line that is only `name=value,` is a field of a config printed as a repr",
               "glog-prefixed information and warnings (`W0530 14:48:26.433000 123 file.py:12] Traceback ...`) "
               "are never a crash",
               "a plan printed and no training step after it: the run never trained (cut off at its start)"),
    ),
    TextRules(
        format="text log",
        completion=(
            r"training (?:is )?(?:complete|completed|finished|done)", r"finished training", r"done training",
            r"train(?:ing)? complete", r"\ball done\b", r"\brun (?:complete|finished)\b", r"end of training",
            r"\bdone\b[:,]?\s+\d+\s+(?:steps|iterations|iters|epochs)\b", r"\d+ epochs completed in",
            r"done training in", r"early stopping (?:triggered|at epoch)", r"stopping[_ ]early\b",
        ),
        closing=(r"^\W*best epoch\s*[:=]?\s*\d+\b", r"\bsnapshot saved to\b"),
        keys={"ep": "epoch", "batch": "batch"},
        plan_steps=("max_steps", "max_iters", "max_iter", "max_iterations", "total_steps", "num_steps",
                    "num_training_steps", "train_steps", "total_iterations", "total iterations", "total_iters",
                    "num_iterations"),
        plan_epochs=("epochs", "num_epochs", "max_epochs", "n_epochs", "train_epochs", "total_epochs",
                     "num_train_epochs", "epoch_num", "nb_epochs", "max_epoch", "n_epoch"),
        # (a line that is only `name=value,`: one field of a config printed as a Python repr, a dataclass or
        # Namespace pretty-printed one field a line, as nerfstudio and tyro print theirs: a setting)
        not_evaluation=(r"\bsample\s*[:=#]?\s*\d+\s*[,|]", r"^\s*\w*eval\w*_(?:period|interval|freq|steps|every)\b",
                        r"^[A-Za-z_]\w*=[^\s,=()]+,$"),
        sample=("Epoch {epoch}/{epochs} - Train Loss: {loss}, Val Loss: {val}",
                "step {step} loss={loss} lr=0.0001",
                "ep: {epoch}, batch: {batch}, time: 9.17, ntokens: 485.20/513, loss: {loss}",
                "Training Epoch: {epoch}, Loss: {loss}."),
    ),
)
