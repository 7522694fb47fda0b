"""LeRobot's training console (lerobot/scripts/train.py, `lerobot-train`): one `logging.info` line per
`log_freq` steps from `MetricsTracker.__str__`, its counts shortened by `format_big_number` (`1K`, `2M`)."""

from trainguard.ingest.formats import FormatContract
from trainguard.ingest.formats._text import TextRules, declare_text

declare_text(
    FormatContract(
        name="lerobot console",
        family="lerobot",
        writer="huggingface/lerobot train.py: logging.info(MetricsTracker) -> 'step:{format_big_number(steps)} "
               "smpl:{format_big_number(samples)} ep:{format_big_number(episodes)} epch:{epochs:.2f} loss:{:.3f} "
               "grdn:{:.3f} lr:{:0.1e} updt_s:{:.3f} data_s:{:.3f}' behind 'INFO <date> <time> <file>:<line> '; "
               "'End of training' when the loop reaches cfg.steps",
        files=("*.txt", "*.log", "*.out"),
        metrics="`loss` (AverageMeter ':.3f'), `grdn` the gradient norm, `lr`, `updt_s`/`data_s` seconds per "
                "update / data wait",
        step_axis="optimizer steps, printed by format_big_number(precision=0): exact below 1000, then rounded "
                  "to the thousand (`step:1K` for 800 < s < 1500, `step:50K`), to the million from 1M",
        plan="cfg.steps in the config dump ('steps': 100000) printed at start",
        completion="'End of training'",
        parts="none",
        notes=("a rounded step (`1K`) is read as the step after the last one plus the log's cadence when the "
               "rounding allows it, else as its nominal value: lines keep their order and their spacing",),
    ),
    TextRules(
        format="lerobot console",
        completion=(r"\bEnd of training\b",),
        keys={"grdn": "grad_norm"},
        keys_when=r"(?:^|\s)step:\d+(?:\.\d+)?[KMBTQ]?\s+smpl:",
        abbreviated=r"(?:^|\s)step:(?P<count>\d+(?:\.\d+)?[KMBTQ]?)\s+smpl:",
        sample=("INFO 2026-05-06 17:15:59 ot_train.py:357 step:{step} smpl:6K ep:18 epch:0.37 loss:{loss} "
                "grdn:97.226 lr:1.0e-05 updt_s:0.510 data_s:0.030",),
    ),
)
