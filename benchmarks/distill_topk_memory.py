"""Peak memory and tokens/s of one training step: sparse top-k KD vs full-vocabulary KD.

    python benchmarks/distill_topk_memory.py --out topk_memory.json          # CUDA if available
    python benchmarks/distill_topk_memory.py --device cpu --batch 1 --seq 256 --layers 2

At the real vocabulary sizes (teacher 151,936 -> student 49,152) with random-init models of the real
shapes (a Qwen2-MoE teacher with hidden 1024 and 24 layers; a SmolLM-135M shaped Llama student: hidden
576, 30 layers, 9 heads). A step = teacher forward (no grad) + student forward/backward through the
recipe's own `forward_losses`, LM + KD, in the recipe's dtype policy (bf16 autocast on CUDA, fp32 on CPU).

- topk: the recipe's own `forward_losses`: teacher top-k (default 256) kept per position, teacher and
  student logits made `chunk` rows at a time (student chunks recomputed in backward);
- full: full-vocabulary KD the usual way: the whole batch's teacher logits [B*T, V_t] and student logits
  [B*T, V_s] at once, log-softmax over both, dense KL over the overlap plus the unmapped tail (the same
  quantity as the recipe's KD with k = V_t), LM cross-entropy from the same student logits.

Both map teacher ids into student ids through a one-to-one overlap of `--overlap` ids (random positions:
the benchmark needs the sizes, not real tokenizers); every position is aligned. Each mode runs in its own
process so peaks do not mix. CPU peaks are the process's max RSS growth over the loaded models, CUDA peaks
are `max_memory_allocated` growth over the loaded models (and totals). One JSON line on stdout (and --out).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

TEACHER_SHAPE = dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, num_key_value_heads=4,
                     intermediate_size=2816, moe_intermediate_size=512, shared_expert_intermediate_size=1024,
                     num_experts=8, num_experts_per_tok=2, max_position_embeddings=4096, vocab_size=151_936)
STUDENT_SHAPE = dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                     intermediate_size=1536, max_position_embeddings=2048, vocab_size=49_152,
                     tie_word_embeddings=True)


def one_mode(args: argparse.Namespace) -> dict:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from trainguard.recipes.distill.kd import GraphedTargets, teacher_targets
    from trainguard.recipes.distill.losses import KDSpec, forward_losses
    from trainguard.recipes.distill.train import amp_policy

    dev = torch.device(args.device)
    if dev.type == "cpu":
        torch.set_num_threads(1)  # steadier timings on a shared machine; both modes alike
    torch.manual_seed(0)
    t_shape, s_shape = dict(TEACHER_SHAPE), dict(STUDENT_SHAPE)
    if args.layers:
        t_shape["num_hidden_layers"] = s_shape["num_hidden_layers"] = args.layers
    precision = "bf16" if dev.type == "cuda" else "fp32"
    if args.experts:  # the teacher's MoE experts implementation (transformers' own), both modes alike
        t_shape["experts_implementation"] = args.experts
    with dev:
        teacher = AutoModelForCausalLM.from_config(AutoConfig.for_model("qwen2_moe", **t_shape))
        student = AutoModelForCausalLM.from_config(AutoConfig.for_model("llama", **s_shape))
    teacher.to(device=dev, dtype=torch.bfloat16 if precision == "bf16" else torch.float32).eval().requires_grad_(False)
    student.to(dev).train()
    V_t, V_s = t_shape["vocab_size"], s_shape["vocab_size"]
    g = torch.Generator().manual_seed(1)
    vmap = torch.full((V_t,), -1, dtype=torch.long)
    vmap[torch.randperm(V_t, generator=g)[: args.overlap]] = torch.randperm(V_s, generator=g)[: args.overlap]
    B, T = args.batch, args.seq
    k = args.k if args.mode == "topk" else V_t
    chunk = args.chunk if args.mode == "topk" else B * T  # full: one "chunk", the whole batch
    spec = KDSpec(vocab_map=vmap.to(dev), top_k=k, temperature=2.0, chunk=chunk, layer_pairs=[], hidden_norm="cosine")
    pos = torch.arange(B * T - B)  # every position but the last of each row: aligned one to one
    pos = (pos // (T - 1)) * T + pos % (T - 1)
    amp = amp_policy(dev, precision)
    if args.mode == "topk" and args.graph and dev.type == "cuda":
        spec.graphed = GraphedTargets(teacher.get_output_embeddings(), spec.vocab_map, k, spec.temperature, V_s, chunk)
    if args.compile:  # the student's decoder stack compiled in both modes alike (the teacher stays eager)
        student.model = torch.compile(student.model)
    if args.compile_teacher:
        teacher.model = torch.compile(teacher.model)
    opt = torch.optim.AdamW(student.parameters(), lr=1e-5)

    def batch() -> dict:
        s_ids = torch.randint(0, V_s, (B, T), generator=g)
        labels = torch.cat([s_ids[:, 1:], torch.full((B, 1), -100)], 1)
        # pinned and non-blocking, as a DataLoader with pin_memory gives: a pageable copy would wait for the
        # device to finish the previous step, serialising host and device in both modes
        pin = dev.type == "cuda"
        return {k_: (v.pin_memory() if pin else v).to(dev, non_blocking=pin) for k_, v in {
            "s_ids": s_ids, "s_mask": torch.ones(B, T, dtype=torch.long), "labels": labels,
            "t_ids": torch.randint(0, V_t, (B, T), generator=g), "t_mask": torch.ones(B, T, dtype=torch.long),
            "s_pos": pos, "t_pos": pos}.items()}

    t_ids = (vmap >= 0).nonzero().squeeze(-1).to(dev)
    s_ids_mapped = vmap[vmap >= 0].to(dev)
    s_unmapped = torch.ones(V_s, dtype=torch.bool, device=dev)
    s_unmapped[s_ids_mapped] = False
    t_unmapped = (vmap < 0).to(dev)

    def dense_losses(b: dict) -> torch.Tensor:
        T_ = spec.temperature
        with torch.no_grad():
            zt = teacher(input_ids=b["t_ids"], attention_mask=b["t_mask"]).logits.flatten(0, 1)[b["t_pos"]].float()
            lt = torch.log_softmax(zt / T_, -1)  # [N, V_t] for the whole batch
        zs = student(input_ids=b["s_ids"], attention_mask=b["s_mask"]).logits.flatten(0, 1).float()
        lm = torch.nn.functional.cross_entropy(zs, b["labels"].flatten())
        ls = torch.log_softmax(zs[b["s_pos"]] / T_, -1)  # [N, V_s]
        lt_m, ls_m = lt[:, t_ids], ls[:, s_ids_mapped]
        body = (lt_m.exp() * (lt_m - ls_m)).sum(-1)
        tail_t = torch.logsumexp(lt[:, t_unmapped], -1)
        tail_s = torch.logsumexp(ls[:, s_unmapped], -1)
        kd = (body + tail_t.exp() * (tail_t - tail_s)) * T_**2
        return lm + 0.5 * kd.mean()

    def teacher_signal(b: dict) -> dict:
        """Memory of the teacher's signal alone, per stage, over the teacher's hidden states (CUDA)."""
        with torch.no_grad(), amp():
            ht = teacher.model(input_ids=b["t_ids"], attention_mask=b["t_mask"]).last_hidden_state.flatten(0, 1)[b["t_pos"]]
            torch.cuda.synchronize()
            base_ = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            if args.mode == "full":
                zt = teacher.lm_head(ht).float()
                lt = torch.log_softmax(zt / spec.temperature, -1)
                held = lt.numel() * lt.element_size()
                del zt, lt
            else:
                tt = teacher_targets(ht, teacher.lm_head, spec.vocab_map, k, spec.temperature, V_s, chunk)
                held = tt.nbytes()
                del tt
            torch.cuda.synchronize()
            build_peak = torch.cuda.max_memory_allocated() - base_
            res = {"signal_build_peak_bytes": build_peak, "signal_held_bytes": held,
                   "full_fp32_logits_bytes": ht.shape[0] * V_t * 4}
            if args.mode == "topk" and dev.type == "cuda":  # time of the walk: eager vs graph replay
                for name, fn in (("eager", lambda h: teacher_targets(h, teacher.lm_head, spec.vocab_map, k,
                                                                     spec.temperature, V_s, chunk)),
                                 ("graph", GraphedTargets(teacher.lm_head, spec.vocab_map, k, spec.temperature, V_s,
                                                          chunk))):
                    fn(ht)
                    torch.cuda.synchronize()
                    t0_ = time.perf_counter()
                    for _ in range(5):
                        fn(ht)
                    torch.cuda.synchronize()
                    res[f"targets_{name}_ms"] = (time.perf_counter() - t0_) / 5 * 1e3
        return res

    def step() -> None:
        with amp():
            if args.mode == "full":
                loss = dense_losses(batch())
            else:
                out = forward_losses(student, teacher, torch.nn.ModuleList(), batch(), spec, with_hidden=False)
                loss = out["lm_sum"] / out["tokens"] + 0.5 * out["kd_sum"] / out["aligned"]
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()  # warm-up (allocates optimizer state: counted in the baseline, not in the step's peak)
    step()
    signal = teacher_signal(batch()) if dev.type == "cuda" else {}
    sampler = None
    if dev.type == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    else:
        # CPU: the process's resident memory sampled every millisecond during the timed steps (max RSS
        # over the process's life would include model loading)
        import threading

        import psutil

        proc, stop, seen = psutil.Process(), threading.Event(), [0]
        base = proc.memory_info().rss

        def sample() -> None:
            while not stop.wait(0.001):
                seen[0] = max(seen[0], proc.memory_info().rss)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
    # per-step times without a host-device sync between steps (a sync would take away the overlap of the
    # host's next step with the device's current one): CUDA events recorded on the stream at each step's
    # start, read once at the end; on the CPU the wall clock per step
    marks: list = []
    t0 = time.perf_counter()
    for _ in range(args.iters):
        if dev.type == "cuda":
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            marks.append(ev)
        else:
            marks.append(time.perf_counter())
        step()
    if dev.type == "cuda":
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        marks.append(end)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
        per_step = [marks[i].elapsed_time(marks[i + 1]) / 1000 for i in range(args.iters)]
    else:
        marks.append(time.perf_counter())
        stop.set()
        sampler.join()
        peak = max(seen[0], base)
        per_step = [marks[i + 1] - marks[i] for i in range(args.iters)]
    secs = time.perf_counter() - t0
    ordered = sorted(per_step)
    spread = {"step_s_median": statistics.median(per_step), "step_s_min": ordered[0], "step_s_max": ordered[-1],
              "step_s_p10": ordered[len(ordered) // 10], "step_s_p90": ordered[(len(ordered) * 9) // 10],
              "tokens_per_s_median_step": B * T / statistics.median(per_step)}
    if args.profile_dir and dev.type == "cuda":  # where a step's time goes: top operators by CPU and CUDA time
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            step()
            torch.cuda.synchronize()
        name = (f"profile_{args.mode}{'_graph' if args.graph else ''}{'_compile' if args.compile else ''}"
                f"{'_tc' if args.compile_teacher else ''}{'_' + args.experts if args.experts else ''}.txt")
        table = prof.key_averages()
        Path(args.profile_dir, name).write_text(
            table.table(sort_by="cpu_time_total", row_limit=25) + "\n" + table.table(sort_by="cuda_time_total", row_limit=25))
    if args.mode == "topk" and spec.graphed is not None:
        # the teacher signal alive inside a training step, from the tensors themselves: the graph's own
        # outputs (kept between steps) plus `forward_losses`' per-row copy of them ([B*T] rows: ids, log-probs,
        # mask, tail, has-KD flag), the only copy the fused head keeps for its backward
        static = sum(o.nbytes() for _, _, o in spec.graphed.graphs.values())
        rows = B * T * (k * (4 + 4 + 1) + 4 + 1)
        signal["step_signal_bytes"] = static + rows
        signal["step_signal_ratio"] = signal["full_fp32_logits_bytes"] / (static + rows)
        # counted whole: the graphs' static inputs (the teacher's hidden states copied in) and every block of
        # the graphs' private memory pools (their outputs and the intermediates a replay reuses: memory
        # that stays reserved between steps), read from the allocator's segments, plus the per-row copy
        inputs = sum(x.numel() * x.element_size() for _, x, _ in spec.graphed.graphs.values())
        pools = sum(int(seg["total_size"]) for seg in torch.cuda.memory_snapshot()
                    if tuple(seg.get("segment_pool_id", (0, 0))) != (0, 0))
        whole = inputs + pools + rows
        signal.update({"graph_inputs_bytes": inputs, "graph_pool_bytes": pools, "step_signal_whole_bytes": whole,
                       "step_signal_whole_ratio": signal["full_fp32_logits_bytes"] / whole})
    return {"mode": args.mode, "k": k, "chunk": chunk, "peak_bytes": peak, "baseline_bytes": base,
            "step_peak_bytes": max(0, peak - base), "tokens_per_s": B * T * args.iters / secs,
            "seconds_per_step": secs / args.iters, "graph": bool(args.graph), **spread, **signal}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    ap.add_argument("--batch", type=int, default=None, help="sequences per step (default: 4 on cuda, 1 on cpu)")
    ap.add_argument("--seq", type=int, default=None, help="tokens per sequence (default: 512 on cuda, 256 on cpu)")
    ap.add_argument("--layers", type=int, default=None, help="override both models' depth (default: real depth "
                    "on cuda, 2 on cpu); vocabularies and widths stay real")
    ap.add_argument("--k", type=int, default=256, help="teacher top-k")
    ap.add_argument("--chunk", type=int, default=None, help="positions per logit chunk, top-k mode "
                    "(default: 512 on cuda, 64 on cpu: a quarter of the batch's positions on both)")
    ap.add_argument("--overlap", type=int, default=40_000, help="ids shared by the two vocabularies")
    ap.add_argument("--iters", type=int, default=None, help="timed steps (default: 20 on cuda, 2 on cpu)")
    ap.add_argument("--modes", default="topk,full", help="comma-separated: topk, topk-eager (no CUDA graph), full")
    ap.add_argument("--compile", action="store_true", help="torch.compile the student's decoder stack (all modes)")
    ap.add_argument("--experts", default=None, help="teacher experts implementation: eager (HF default loop), "
                    "grouped_mm or batched_mm (both modes)")
    ap.add_argument("--compile-teacher", action="store_true", help="torch.compile the teacher's decoder stack (all modes)")
    ap.add_argument("--graph", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--profile-dir", default=None, help="CUDA: write a profiler table of one step per mode here")
    ap.add_argument("--mode", choices=["topk", "full"], help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help="write the JSON result here too")
    args = ap.parse_args()
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    cuda = args.device == "cuda"
    args.batch = args.batch or (4 if cuda else 1)
    args.seq = args.seq or (512 if cuda else 256)
    args.layers = args.layers if args.layers is not None else (0 if cuda else 2)
    args.iters = args.iters or (20 if cuda else 2)
    args.chunk = args.chunk or (512 if cuda else 64)
    if args.mode:  # child: one mode, one process
        print(json.dumps(one_mode(args)))
        return
    results = {}
    for name in args.modes.split(","):
        mode = "full" if name == "full" else "topk"
        cmd = [sys.executable, __file__, "--mode", mode, f"--graph={int(name == 'topk')}"] + (
            ["--compile"] if args.compile else []) + (["--compile-teacher"] if args.compile_teacher else []) + (
            [f"--experts={args.experts}"] if args.experts else []) + ([f"--profile-dir={args.profile_dir}"] if args.profile_dir else []) + [
            f"--{k}={v}" for k, v in (("device", args.device), ("batch", args.batch), ("seq", args.seq),
                                      ("layers", args.layers), ("k", args.k), ("chunk", args.chunk),
                                      ("overlap", args.overlap), ("iters", args.iters))]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            results[name] = {"mode": name, "error": proc.stderr.strip().splitlines()[-3:]}
            continue
        results[name] = json.loads(proc.stdout.strip().splitlines()[-1])
    out = {"benchmark": "distill_topk_memory", "device": args.device, "batch": args.batch, "seq": args.seq,
           "compile_student": args.compile, "compile_teacher": args.compile_teacher, "experts": args.experts or "eager",
           "layers": args.layers or "real (teacher 24, student 30)", "teacher_vocab": TEACHER_SHAPE["vocab_size"],
           "student_vocab": STUDENT_SHAPE["vocab_size"], "k": args.k, **results}
    if "step_peak_bytes" in results.get("topk", {}) and "step_peak_bytes" in results.get("full", {}):
        out["step_peak_ratio_full_over_topk"] = results["full"]["step_peak_bytes"] / max(1, results["topk"]["step_peak_bytes"])
        out["speed_ratio_topk_over_full"] = results["topk"]["tokens_per_s"] / results["full"]["tokens_per_s"]
        out["speed_ratio_median_step"] = results["full"]["step_s_median"] / results["topk"]["step_s_median"]
    if args.device == "cuda":
        import torch

        out["gpu"] = torch.cuda.get_device_name()
    line = json.dumps(out)
    print(line)
    if args.out:
        Path(args.out).write_text(line + "\n")


if __name__ == "__main__":
    main()
