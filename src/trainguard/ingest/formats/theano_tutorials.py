"""The Theano Deep Learning Tutorials' printers (SdA.py, DBN.py, mlp.py, logistic_sgd.py) and the research code
built on them: a validation error per epoch, a closing 'Optimization complete' line."""

from trainguard.ingest.formats import FormatContract
from trainguard.ingest.formats._text import TextRules, declare_text

declare_text(
    FormatContract(
        name="theano tutorials console",
        family="Theano Deep Learning Tutorials",
        writer="lisa-lab/DeepLearningTutorials code/SdA.py, mlp.py, logistic_sgd.py (print 'epoch %i, minibatch "
               "%i/%i, validation error %f %%'; '     epoch %i, minibatch %i/%i, test error of best model %f %%'; "
               "'Pre-training layer %i, epoch %d, cost %f'; 'Optimization complete with best validation score of "
               "%f %%, ...')",
        files=("*.log", "*.out"),
        metrics="`validation error X %` is an evaluation (per epoch, at the end of its minibatches); `test error of "
                "best model` repeats the best model's test score (no new evaluation); pre-training `cost` is another "
                "phase's per-layer loss",
        step_axis="epochs; `minibatch i/n` counts within the epoch",
        plan="none printed (n_epochs / training_epochs are arguments of the script)",
        completion="'Optimization complete with best validation score of ...' after the loop (patience ran out or the "
                   "epochs are done)",
        parts="none",
        notes=("a validation error is a count over a fixed set printed as a percentage: equal values at "
               "consecutive epochs are the same count, not a frozen evaluation",),
    ),
    TextRules(
        format="theano tutorials console",
        completion=(r"optimization complete with best validation score",),
        keys={"minibatch": "batch"},
        not_evaluation=(r"test error of best model",),
        sample=("epoch {epoch}, minibatch {batches}/{batches}, validation error {val} %",),
    ),
)
