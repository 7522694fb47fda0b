"""The pix2pix/CycleGAN template's console (junyanz/pytorch-CycleGAN-and-pix2pix and the many projects
built on its options, datasets and Visualizer): one line of losses per print interval, an end-of-epoch line."""

from trainguard.ingest.formats import FormatContract
from trainguard.ingest.formats._text import TextRules, declare_text

declare_text(
    FormatContract(
        name="cyclegan console",
        family="pytorch-CycleGAN-and-pix2pix template",
        writer="junyanz/pytorch-CycleGAN-and-pix2pix util/visualizer.py (print_current_losses: '(epoch: %d, iters: "
               "%d, time: %.3f, data: %.3f) ' + '%s: %.3f ' per loss) and train.py ('End of epoch %d / %d \\t Time "
               "Taken: %d sec'); 'dataset [%s] was created', 'model [%s] was created'",
        files=("*.out", "loss_log.txt"),
        metrics="every named value after the position is a loss (G_GAN, G_L1, D_real, ...); a `total` value "
                "is their total",
        step_axis="iters counts SAMPLES within the epoch (total_iters += batch_size): a sample counter",
        plan="the `/ N` of 'End of epoch E / N' (n_epochs + n_epochs_decay)",
        completion="'End of epoch N / N'",
        parts="sum",
    ),
    TextRules(
        format="cyclegan console",
        # `(epoch: 3, iters: 400, time: 0.113, data: 0.002) ` (newer versions print `[Rank 0] ` first and `, `
        # between the values): what follows is one value per loss in model.loss_names
        parts_after=r"\(epoch:\s*\d+,\s*iters:\s*\d+,\s*time:\s*[\d.]+,\s*data:\s*[\d.]+\)\s*,?",
        keys={"iters": "batch"},
        keys_when=r"\(epoch:\s*\d+,\s*iters:",
        # (a model whose loss_names hold one loss prints one value: its loss; several print the parts)
        sample=("(epoch: {epoch}, iters: {batch}, time: 0.113, data: 0.002) G: {loss} ",
                "[Rank 0] (epoch: {epoch}, iters: {batch}, time: 1.283, data: 0.862) , G: {loss}",
                "[epoch: {epoch}/{epochs}, iter: {batch}/{batches}] total: {loss}",
                "End of epoch {epoch} / {epochs} \t Time Taken: 393 sec"),
    ),
)
