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
        plan="`/T` after a step; `Epoch E/N`; a config dump's or command line's epochs/max_steps",
        completion="a 'training complete/finished/done' line; the last planned epoch or step reached",
        parts="sum",
        notes=("a config dump printed first is settings, not metrics or evaluations",
               "an evaluation's own progress (`Sample: 3, Validation mIoU`) is not an evaluation"),
    ),
    TextRules(
        format="text log",
        completion=(
            r"training (?:is )?(?:complete|completed|finished|done)", r"finished training", r"done training",
            r"train(?:ing)? complete", r"\ball done\b", r"\brun (?:complete|finished)\b", r"end of training",
            r"\bdone\b[:,]?\s+\d+\s+(?:steps|iterations|iters|epochs)\b", r"\d+ epochs completed in",
            r"done training in", r"early stopping (?:triggered|at epoch)", r"stopping[_ ]early\b",
        ),
        plan_steps=("max_steps", "max_iters", "max_iter", "max_iterations", "total_steps", "num_steps",
                    "num_training_steps", "train_steps", "total_iterations", "total iterations", "total_iters",
                    "num_iterations"),
        plan_epochs=("epochs", "num_epochs", "max_epochs", "n_epochs", "train_epochs", "total_epochs",
                     "num_train_epochs", "epoch_num", "nb_epochs"),
        not_evaluation=(r"\bsample\s*[:=#]?\s*\d+\s*[,|]", r"^\s*\w*eval\w*_(?:period|interval|freq|steps|every)\b"),
        sample=("Epoch {epoch}/{epochs} - Train Loss: {loss}, Val Loss: {val}",
                "step {step} loss={loss} lr=0.0001"),
    ),
)
