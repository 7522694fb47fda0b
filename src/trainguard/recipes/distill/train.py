"""The distillation loop: a teacher's knowledge into a student, under the guard.

    trainguard distill CONFIG.yaml            # or: python -m trainguard.recipes.distill CONFIG.yaml
    trainguard distill bundled                # the tiny bundled config: random-init models, CPU, < 1 min

Reads top to bottom: setup (data, tokenizers, models, vocabulary map, projections, optimizer, schedule),
then one loop over micro-batches. One optimizer step = `grad_accum` micro-batches; the LR schedule, the
curriculum, logging, evaluation and checkpoints all count optimizer steps. The guard is one line: it
sees every micro-batch's loss with its parts and weights, and the optimizer through its hooks.
"""

from __future__ import annotations

import contextlib
import math
import time
from pathlib import Path
from typing import Any

import torch

import trainguard
from trainguard.errors import UserError
from trainguard.recipes.distill import checkpoint as ckpt
from trainguard.recipes.distill.build import load_model, load_tokenizer, num_layers
from trainguard.recipes.distill.cache import (
    TeacherCache,
    check_cache,
    check_partial,
    partial_logp_for,
    targets_for,
    text_digest,
)
from trainguard.recipes.distill.config import DistillConfig
from trainguard.recipes.distill.curriculum import Curriculum
from trainguard.recipes.distill.data import (
    eval_batches,
    prepare,
    read_text,
    to_device,
    train_batches,
    windows,
)
from trainguard.recipes.distill.evaluate import evaluate
from trainguard.recipes.distill.kd import GraphedTargets, TeacherTargets
from trainguard.recipes.distill.losses import KDSpec, forward_losses, layer_pairs
from trainguard.recipes.distill.partial import PartialMapper
from trainguard.recipes.distill.routing import StudentRouter, TeacherRouting
from trainguard.recipes.distill.vocab_map import build_vocab_map
from trainguard.recipes.distill.xtok import TeacherToStudent


def lr_lambda(warmup: int, total: int, min_ratio: float) -> Any:
    """Multiplier of the peak LR at optimizer step s (0-based): linear warmup, then cosine to min_ratio
    at the last step. Sized in optimizer steps, and stepped once per optimizer step."""
    def f(s: int) -> float:
        if s < warmup:
            return (s + 1) / warmup
        progress = min(1.0, (s - warmup) / max(1, total - 1 - warmup))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    return f


def torch_device(asked: str) -> torch.device:
    """The config's `device` (cpu, cuda, auto) as a torch device; cuda where torch has none is bad input."""
    if asked == "cuda" and not torch.cuda.is_available():
        raise UserError("device cuda: this torch sees no CUDA device (torch.cuda.is_available() is False); "
                        "use device: cpu or auto")
    return torch.device("cuda" if asked == "cuda" or (asked == "auto" and torch.cuda.is_available()) else "cpu")


def amp_policy(device: torch.device, precision: str) -> Any:
    """The one autocast context used for every forward, training and evaluation alike."""
    if precision == "fp32":
        return contextlib.nullcontext
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return lambda: torch.autocast(device_type=device.type, dtype=dtype)


def open_cache(cfg: DistillConfig) -> TeacherCache:
    """The config's data.teacher_cache; a folder that is not there is named as resolved (a relative path
    resolves against the YAML file's folder, not the working directory)."""
    assert cfg.data.teacher_cache  # config.py refuses an empty one
    folder = cfg.resolve_path(cfg.data.teacher_cache)
    if not folder.is_dir():
        raise UserError(f"data.teacher_cache: no cache folder at {folder.resolve()} (a relative path resolves "
                        f"against the YAML file's folder, {cfg.config_dir}); build one with "
                        "`trainguard distill cache build CONFIG --out DIR` or fix the path")
    return TeacherCache(folder)


def warn_other_teacher(cache: TeacherCache, cfg: DistillConfig) -> None:
    """In cache mode the config's teacher section is not used: the cache's teacher is distilled. Said when the
    two differ, so an edit there is not believed to change anything."""
    import dataclasses
    import sys

    built = cache.manifest.get("teacher")
    if not isinstance(built, dict):
        return  # a cache written before manifests named their teacher
    mine = dataclasses.asdict(cfg.teacher)
    keys = [k for k in mine if built.get(k) != mine[k]]
    if keys:
        print(f"trainguard distill: warning: teacher.{keys[0]} differs from the teacher {cache.folder} was built "
              "with; with data.teacher_cache the teacher section is not used (the cache's teacher is distilled): "
              "rebuild the cache to distil another teacher", file=sys.stderr)


def write_run_report(run_dir: Path, say: Any) -> None:
    """report.md and report.html, as `trainguard run` writes them; fail-open: a report failure never changes
    the run's result."""
    try:
        from trainguard.report import write_report

        md, _ = write_report(run_dir)
        say(f"report: {md}")
    except Exception as exc:  # the run is done and recorded; the report is a view of it
        say(f"report not written: {type(exc).__name__}: {exc}")


def train(cfg: DistillConfig, *, run_dir: str | Path | None = None, resume: str | Path | None = None,
          stop_after: int | None = None, verbose: bool = True) -> dict[str, Any]:
    """Runs the recipe; returns per-step losses, evaluations and where checkpoints went.

    `stop_after` ends the loop after that many optimizer steps as if the process were killed there (a
    checkpoint is written first): the schedule stays sized for `train.max_steps`. Used by the resume test.
    """
    say = print if verbose else (lambda *a, **k: None)
    t = cfg.train
    # ---------------------------------------------------------------------------------------------
    # setup
    device = torch_device(cfg.device)
    amp = amp_policy(device, cfg.precision)
    if cfg.cpu_threads:
        torch.set_num_threads(cfg.cpu_threads)
    state = ckpt.load(resume) if resume else None

    train_text = read_text(cfg.resolve_path(cfg.data.train))
    eval_text = read_text(cfg.resolve_path(cfg.data.eval))
    saved_toks = state.get("tokenizers", {}) if state else {}
    cache = None
    if cfg.data.teacher_cache:  # KD from the offline cache: the teacher's tokenizer comes with it
        cache = open_cache(cfg)
        check_cache(cache, cfg, train_text)
        warn_other_teacher(cache, cfg)
        cache.preload()  # decompressed once, before the loop, as far as the reader's memory budget goes
        saved_toks = {**saved_toks, "teacher": saved_toks.get("teacher") or cache.manifest["teacher_tokenizer"]}
    t_tok = load_tokenizer("teacher", cfg.teacher, train_text, saved_toks.get("teacher"))
    s_tok = load_tokenizer("student", cfg.student, train_text, saved_toks.get("student"))

    torch.manual_seed(cfg.seed)  # the random-init teacher is rebuilt identically on resume
    teacher = load_model("teacher", cfg.teacher, t_tok) if cache is None else None
    torch.manual_seed(cfg.seed + 1)
    student = load_model("student", cfg.student, s_tok)
    # One dtype policy: the frozen teacher is held in the autocast dtype (bf16/fp16: no master copy is
    # needed for weights that never update); the student and projections keep fp32 master weights; every
    # forward of either runs inside the same `amp()` in training and evaluation.
    t_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[cfg.precision]
    if teacher is not None:
        teacher.to(device=device, dtype=t_dtype).eval().requires_grad_(False)
    student.to(device).train()

    curriculum = Curriculum.from_config(cfg.loss, t.max_steps)
    with_kd, with_hidden = curriculum.ever_on("kd"), curriculum.ever_on("hidden")
    with_routing, with_balance = curriculum.ever_on("routing"), curriculum.ever_on("balance")
    if cache is not None and with_kd and cfg.loss.kd.partial:
        check_partial(cache, cfg, s_tok.backend.to_str())
    if teacher is not None:
        V_t = teacher.get_output_embeddings().weight.shape[0]
    else:
        assert cache is not None  # no teacher is loaded only when the cache stands in for it
        V_t = cache.manifest["teacher_width"]
    # parse_config resolves a null vocab_map/partial; a config built in code may leave them null: strict, off
    vocab_map = build_vocab_map(t_tok.token_bytes, s_tok.token_bytes, V_t, mode=cfg.loss.kd.vocab_map or "strict")
    n_mapped = int((vocab_map >= 0).sum())
    if with_kd and cfg.loss.kd.top_k > V_t:
        raise UserError(f"config: loss.kd.top_k={cfg.loss.kd.top_k} exceeds the teacher vocabulary ({V_t})")
    if cache is not None and cfg.loss.kd.top_k > cache.k:
        raise UserError(f"config: loss.kd.top_k={cfg.loss.kd.top_k} exceeds the cache's k={cache.k}")
    pairs = layer_pairs(cfg.loss.hidden.depths, num_layers(student), num_layers(teacher)) if with_hidden else []
    t_hidden = teacher.config.hidden_size if teacher is not None else 0  # no teacher: no pairs (config.py)
    projs = torch.nn.ModuleList(
        torch.nn.Linear(student.config.hidden_size, t_hidden, bias=False) for _ in pairs
    ).to(device)
    kc = cfg.loss.kd
    spec = KDSpec(vocab_map=vocab_map.to(device), top_k=kc.top_k, temperature=kc.temperature,
                  chunk=kc.chunk, layer_pairs=pairs, hidden_norm=cfg.loss.hidden.norm, method=kc.method,
                  correct_only=kc.correct_only, renormalize=kc.renormalize, merge=kc.vocab_map == "merge",
                  chain=kc.target_prob == "chain", partial=bool(kc.partial))
    xproj = torch.nn.ModuleList()
    if with_kd and kc.method == "t2s":  # teacher hidden -> student hidden, read out by the student's head
        assert teacher is not None  # config.py refuses t2s with a teacher cache
        xproj.append(TeacherToStudent(teacher.config.hidden_size, student.config.hidden_size).to(device))
        spec.t2s = xproj[0]
    router = torch.nn.ModuleList()
    if with_routing:  # the student-aware router learns the MoE teacher's routing (routing.py)
        t_routing = TeacherRouting(teacher)
        if not t_routing.gates or t_routing.num_experts < 2:
            raise UserError("config: loss.routing needs a mixture-of-experts teacher (modules named mlp.gate, "
                            "config.num_experts >= 2)")
        router.append(StudentRouter(student.config.hidden_size, t_routing.num_experts).to(device))
        spec.router, spec.teacher_routing = router[0], t_routing
        spec.route_layers = (max(1, round(cfg.loss.routing.depth * num_layers(student))),
                             t_routing.layer(cfg.loss.routing.depth))
    if with_kd and device.type == "cuda" and teacher is not None:  # the teacher's top-k walk: a few hundred kernels, one replay
        spec.graphed = GraphedTargets(teacher.get_output_embeddings(), spec.vocab_map, spec.top_k, spec.temperature,
                                      student.get_output_embeddings().weight.shape[0], spec.chunk)

    same_next = cfg.loss.kd.positions == "next_token"
    mapper = PartialMapper(t_tok.token_bytes, s_tok.token_bytes) if with_kd and kc.partial else None
    train_ex = prepare(windows(train_text, cfg.data.window_chars), s_tok, t_tok, same_next, mapper)
    eval_ex = prepare(windows(eval_text, cfg.data.window_chars), s_tok, t_tok, same_next, mapper)
    if cfg.data.eval_windows:
        eval_ex = eval_ex[: cfg.data.eval_windows]
    if cache is not None and cache.n_windows < len(train_ex):
        # built with --max-windows: the cache holds the text's first N windows, the same windows of the same
        # text (check_cache compared its digest), so the student trains on exactly those
        say(f"the teacher cache holds {cache.n_windows} of the text's {len(train_ex)} windows (built with "
            f"--max-windows): training on those {cache.n_windows}")
        train_ex = train_ex[: cache.n_windows]
    pad_s, pad_t = s_tok.bos_id, t_tok.bos_id  # any id: padded positions are masked and carry no label

    o = cfg.optim
    decay = [p for p in student.parameters() if p.dim() >= 2]
    no_decay = [p for p in student.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": o.weight_decay, "lr": o.lr},
              {"params": no_decay, "weight_decay": 0.0, "lr": o.lr}]
    if pairs:
        groups.append({"params": list(projs.parameters()), "weight_decay": 0.0, "lr": o.proj_lr})
    if len(router):
        groups.append({"params": list(router.parameters()), "weight_decay": 0.0, "lr": o.proj_lr})
    if len(xproj):
        groups.append({"params": list(xproj.parameters()), "weight_decay": 0.0, "lr": o.proj_lr})
    optimizer = torch.optim.AdamW(groups, betas=(o.betas[0], o.betas[1]))  # two, checked by config.py
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(o.warmup_steps, t.max_steps, o.min_lr_ratio))
    scaler = torch.amp.GradScaler(device.type) if cfg.precision == "fp16" else None
    trainable = torch.nn.ModuleDict({"student": student, "proj": projs, "router": router, "xproj": xproj})

    step, position = 0, (0, 0)  # position: (epoch, index) of the next training window
    best_bpb, evals_since_best = math.inf, 0
    if teacher is not None:
        teacher_print = ckpt.fingerprint(teacher)
    else:
        assert cache is not None
        teacher_print = cache.manifest["teacher_fingerprint"]
    vmap_np = vocab_map.numpy()
    V_s = student.get_output_embeddings().weight.shape[0]

    def with_targets(batch: dict[str, Any], source: TeacherCache | None = cache) -> dict[str, Any]:
        """The batch on the device, with its KD targets read from the offline cache when there is one."""
        b = to_device(batch, device)
        if source is not None and with_kd:
            tt = targets_for(source, batch["windows"], vmap_np, cfg.loss.kd.top_k, V_s)
            b["targets"] = TeacherTargets(*(x.to(device, non_blocking=True) for x in (tt.sid, tt.logp, tt.mapped, tt.tail)))
            if spec.partial and "part_tid" in batch:  # the partial rows' conditioned log-probs, as online
                b["part_logp"] = partial_logp_for(source, batch["partial_windows"], batch["part_tid"]).to(
                    device, non_blocking=True)
        return b

    # A cache student's kd_topk: the cache's targets on the evaluation windows, when it holds them for this text
    eval_cache = cache.eval_view() if cache is not None and with_kd else None
    if eval_cache is not None and (eval_cache.text_sha256 != text_digest(eval_text)
                                   or eval_cache.n_windows < len(eval_ex) or not eval_cache.has_shard(0)):
        eval_cache = None
    if cache is not None and with_kd and eval_cache is None:
        say("kd_topk is not evaluated: the teacher cache holds no targets for this eval text and eval_windows "
            "(rebuild it with this config to add them)")

    guard = trainguard.watch(trainable, optimizer, scheduler, total_steps=t.max_steps, grad_accum=t.grad_accum,
                             scaler=scaler, run_dir=run_dir, name="distill",
                             # vocab_size: the output size of the model whose perplexity is reported (the
                             # student's), so the guard does not guess it from the last Linear (a projection)
                             config={**cfg.to_dict(), "vocab_size": student.get_output_embeddings().weight.shape[0]})
    resume = resume or guard.resume_from
    if resume and state is None:
        state = ckpt.load(resume)
    if state is not None:
        ckpt.check_compatible(state, teacher_print)
        saved = state.get("tokenizers", {})
        if saved and (saved["teacher"], saved["student"]) != (t_tok.backend.to_str(), s_tok.backend.to_str()):
            # only when the guard named the checkpoint after the tokenizers were made (watchdog restart)
            raise UserError(f"resume: {resume} was made with other tokenizers; pass it with --resume")
        student.load_state_dict(state["student"])
        projs.load_state_dict(state["proj"])
        if state.get("router") is not None:
            router.load_state_dict(state["router"])
        if state.get("xproj") is not None:
            xproj.load_state_dict(state["xproj"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        if scaler is not None and state.get("scaler"):
            scaler.load_state_dict(state["scaler"])
        ckpt.set_rng_state(state["rng"])
        step, position = state["step"], tuple(state["data_position"])
        best_bpb, evals_since_best = state["best_bpb"], state["evals_since_best"]
        guard.set_step(step)  # the guard's steps, due() and findings continue from the checkpoint's step
        say(f"resumed from {resume} at step {step}")
    out_dir = Path(guard.run_dir) if guard.run_dir else Path(run_dir or ".")
    for side, tok in (("teacher", t_tok), ("student", s_tok)):
        (out_dir / f"tokenizer-{side}.json").write_text(tok.backend.to_str())
    ratio = sum(len(e.pairs) for e in train_ex) / max(1, sum(len(e.student.ids) - 1 for e in train_ex))
    teacher_name = type(teacher).__name__ if teacher is not None else f"from the cache {cache.folder if cache else ''}"
    say(f"teacher {teacher_name} V={V_t} | student {type(student).__name__} "
        f"V={student.get_output_embeddings().weight.shape[0]} | vocab overlap {n_mapped} ids | "
        f"train windows {len(train_ex)}, aligned positions {ratio:.1%} | run dir {out_dir}")

    def state_dict() -> dict[str, Any]:
        return {
            "student": student.state_dict(), "proj": projs.state_dict(), "router": router.state_dict(),
            "xproj": xproj.state_dict(), "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict() if scaler else None,
            "rng": ckpt.rng_state(), "step": step, "data_position": position, "best_bpb": best_bpb,
            "evals_since_best": evals_since_best, "teacher_fingerprint": teacher_print,
            "tokenizers": {"teacher": t_tok.backend.to_str(), "student": s_tok.backend.to_str()},
            "config": cfg.to_dict(),
        }

    def run_eval() -> dict[str, float]:
        with guard.phase("eval"):
            batches: Any = eval_batches(eval_ex, t.batch_size, pad_s, pad_t)
            if eval_cache is not None:
                batches = (with_targets(b, eval_cache) for b in batches)
            metrics = evaluate(student, teacher, projs, batches, spec, amp, device,
                               with_teacher=(with_kd or with_hidden) and teacher is not None,
                               cached_kd=eval_cache is not None)
            guard.eval(**metrics)
        return metrics

    def save(name: str) -> Path:
        with guard.phase("save"):
            path = ckpt.save(out_dir / name, state_dict())
            guard.checkpoint_saved(path)
        return path

    # ---------------------------------------------------------------------------------------------
    # the loop
    losses: list[torch.Tensor] = []  # per optimizer step, kept on the device; read once at the end
    evals: list[dict[str, float]] = []
    stopped_early = False
    micro, step_loss = 0, None
    t0, c0 = time.time(), time.process_time()
    eval_seconds, tokens_seen = 0.0, []  # the loop's own speed: tokens per second outside evaluations
    eval_cpu = 0.0  # and per CPU second of this process: a shared machine's load does not move it
    data = train_batches(train_ex, t.batch_size, cfg.seed, *position, pad_s, pad_t)
    with guard.phase("train"):
        for data_epoch, data_index, batch in guard.batches(data):
            position = (data_epoch, data_index)  # saved in checkpoints: a resumed run reads the next batch
            if step >= t.max_steps:  # resumed from a finished run: nothing left to do
                break
            w = curriculum.weights(step)
            with amp():
                out = forward_losses(student, teacher, projs, with_targets(batch), spec,
                                     with_kd=with_kd, with_hidden=with_hidden)
            aligned = out["aligned"].clamp(min=1)
            lm = out["lm_sum"] / out["tokens"]
            kd = out["kd_sum"] / out["kd_rows"].clamp(min=1)  # aligned rows (+ partial ones when on)
            hid = out["hidden_sum"] / aligned
            loss = w["lm"] * lm + w["kd"] * kd + w["hidden"] * hid
            if len(xproj):  # the projection's CE trains only the projection; it rides on the KD weight
                proj = out["proj_sum"] / aligned
                loss = loss + w["kd"] * proj
            if with_routing:
                routing = out["routing_sum"] / aligned
                loss = loss + w["routing"] * routing + w["balance"] * out["balance"]
            (scaler.scale(loss / t.grad_accum) if scaler else loss / t.grad_accum).backward()
            parts, weights = {"lm": lm.detach()}, {"lm": w["lm"]}
            if with_kd:
                parts["kd"], weights["kd"] = kd.detach(), w["kd"]
            if len(xproj):
                parts["t2s_proj"], weights["t2s_proj"] = proj.detach(), w["kd"]
            if with_hidden:
                parts["hidden"], weights["hidden"] = hid.detach(), w["hidden"]
            if with_routing:  # both routing terms go through the curriculum and to the guard like the rest
                parts["routing"], weights["routing"] = routing.detach(), w["routing"]
                if with_balance:
                    parts["balance"], weights["balance"] = out["balance"].detach(), w["balance"]
                guard.experts(out["expert_load"], layer="student_router")
            # log() before step(): extra scalars belong to the step that `guard.step` may close right here
            guard.log(align_ratio=out["aligned"] / out["positions"])
            guard.step(loss.detach(), parts=parts, weights=weights)
            tokens_seen.append(out["tokens"])
            step_loss = loss.detach() if step_loss is None else step_loss + loss.detach()
            micro += 1
            if micro % t.grad_accum:
                continue

            # one optimizer step: unscale, clip, update, schedule (once per optimizer step), reset
            if scaler:
                scaler.unscale_(optimizer)
            if o.clip > 0:
                torch.nn.utils.clip_grad_norm_(trainable.parameters(), o.clip)
            if scaler:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(step_loss / t.grad_accum)
            step_loss = None
            step += 1

            if step % t.log_every == 0 or step == 1:
                # .item() syncs with the device: once every log_every steps, never on the hot path
                say(f"step {step:5d}/{t.max_steps} | loss {losses[-1].item():.4f} | lm {lm.item():.4f} | "
                    f"kd {kd.item():.4f} (w {w['kd']:.3f}) | hidden {hid.item():.4f} (w {w['hidden']:.3f}) | "
                    f"lr {scheduler.get_last_lr()[0]:.2e} | {time.time() - t0:.1f}s")
            if guard.due("eval", every=t.eval_every) or step == t.max_steps:
                te, ce = time.time(), time.process_time()
                metrics = run_eval()
                eval_seconds += time.time() - te
                eval_cpu += time.process_time() - ce
                evals.append({"step": step, **metrics})
                say(f"eval step {step}: ppl {metrics['perplexity']:.3f} bpb {metrics['bpb']:.4f}"
                    + "".join(f" {key} {metrics[key]:.4f}" for key in ("kd_topk", "kl_full") if key in metrics))
                # better = lower by more than a relative 1e-4: noise-level changes are not progress
                if metrics["bpb"] < best_bpb * (1 - 1e-4):
                    best_bpb, evals_since_best = metrics["bpb"], 0
                    save("best.pt")
                else:
                    evals_since_best += 1
                if t.patience and evals_since_best >= t.patience:
                    say(f"early stop at step {step}: no better eval bpb in {t.patience} evaluations")
                    stopped_early = True
            if step % t.save_every == 0 or step == t.max_steps or stopped_early or step == stop_after:
                save("last.pt")
            if stopped_early or step >= t.max_steps or step == stop_after:
                break
    if device.type == "cuda":
        torch.cuda.synchronize()
    train_seconds = time.time() - t0 - eval_seconds
    train_cpu = time.process_time() - c0 - eval_cpu
    n_tokens = int(sum(int(x) for x in tokens_seen))
    guard.finish()
    write_run_report(out_dir, say)
    return {
        "train_seconds": train_seconds, "train_tokens": n_tokens, "tokens_per_s": n_tokens / max(1e-9, train_seconds),
        "train_cpu_seconds": train_cpu, "tokens_per_cpu_s": n_tokens / max(1e-9, train_cpu),
        "losses": [float(x) for x in losses], "evals": evals, "step": step, "stopped_early": stopped_early,
        "best_bpb": best_bpb, "run_dir": str(out_dir), "last": str(out_dir / "last.pt"),
        "vocab_overlap": n_mapped, "align_ratio_train": ratio,
    }
