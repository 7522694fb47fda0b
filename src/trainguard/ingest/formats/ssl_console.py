"""facebookresearch's self-supervised consoles: SwAV's 'Epoch: [E][I]' lines (and its args dump printed
first), DINO's MetricLogger 'Epoch: [E/N]  [i/n]' lines, and I-JEPA's '[E, I]' lines under logging."""

from trainguard.ingest.formats import FormatContract
from trainguard.ingest.formats._text import TextRules, declare_text

declare_text(
    FormatContract(
        name="swav/dino/ijepa console",
        family="facebookresearch self-supervised (SwAV, DINO, I-JEPA)",
        writer="facebookresearch/swav main_swav.py ('Epoch: [{0}][{1}]\\tTime ... Loss {loss.val:.4f} ({loss.avg:.4f})"
               "\\tLr: {lr:.4f}'; src/utils.py initialize_exp prints 'key: value' for every argument first); "
               "facebookresearch/dino utils.py MetricLogger.log_every ('Epoch: [E/N]  [i/n]  eta: ... loss: X (avg)'); "
               "facebookresearch/ijepa src/train.py ('[%d, %5d] loss: %.3f ... [wd: %.2e] [lr: %.2e] [mem: %.2e] (%.1f ms)')",
        files=("*.log", "*.out"),
        metrics="`Loss X (avg)`, `Lr:`; I-JEPA's `loss:`, `[lr: X]`",
        step_axis="[epoch][iteration within the epoch]: absolute with the epochs before (iterations per epoch "
                  "from `/n` where printed, else the largest seen)",
        plan="SwAV: 'epochs: N' in the args dump (epochs run 0..N-1); DINO: the `/N` after the epoch",
        completion="none printed by SwAV: the last planned epoch (N-1) reached",
        parts="none",
        notes=("relaunches append: the args dump is printed again at each",),
    ),
    TextRules(
        format="swav/dino/ijepa console",
        plan_epochs=("epochs",),
        sample=("INFO - 09/02/20 13:55:22 - 0:00:00 - Epoch: [{epoch}][{batch}]\tTime 0.700 (0.700)\tData 0.010 "
                "(0.020)\tLoss {loss} (4.0000)\tLr: 0.6000",
                "INFO:root:[{epoch}, {batch:5d}] loss: {loss} [wd: 4.00e-02] [lr: 1.00e-04] [mem: 6.50e+04] (1200.0 ms)"),
    ),
)
