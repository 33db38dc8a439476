"""CPU cost of `wf ablate ... --protocol cpu`, measured per piece, and the projected time of a whole ablation.

The machine this was written on is shared (other jobs hold the cores), so wall time would measure the neighbours;
this script measures process CPU time (`time.process_time`) of each piece under `OMP_NUM_THREADS=1`, which is the
wall time of one idle core, and projects from it:

  stage 1        `run_stage` of Stage 1 (load the FP model, SubLN calibration, convert, save), per arm
  load           student (the Stage-1 output) + FP teacher + data, once per training stage
  step 1.9 / 2   one optimizer step of Stages 1.9 / 2 as the Trainer runs it (bf16 autocast, the stage's distill
                 step with the arm's switches: Haar layers, the saliency curriculum), median of `--steps` after a warm-up
  score          held-out perplexity over the protocol's eval tokens, the export and the packed model's perplexity
                 (measured on `--eval-tokens` and scaled)

Checkpoint writes (every 50 steps) and the kernel start are not in the sum; with two idle cores the matmuls run up to
~1.7x faster than the 1-thread numbers, so the projection is an upper bound for an idle machine.

    OMP_NUM_THREADS=1 python tests/benchmarks/bench_ablate.py [--arms baseline,haar,saliency] [--steps 3] [--seeds 3]
"""
import argparse, json, shutil, statistics, sys, tempfile, time
from pathlib import Path

def cpu(): return time.process_time()

def step_times(student, teacher, cfg, tok, steps) -> list[float]:
    "CPU seconds of `steps + 1` Stage 1.9/2 training steps of `student` (AdamW, the stage's distill step, its precision)."
    import torch
    from wf_nb.stages import distill_step
    from wf_nb.trainer import StepContext
    from wf_nb.stream import get_data
    data = iter(get_data(cfg, tok, 'train', verbose=False))
    opt = torch.optim.AdamW([p for p in student.parameters() if p.requires_grad], lr=cfg.training.lr)
    step_fn, times = distill_step(teacher), []
    for i in range(steps + 1):
        b = next(data); t0 = cpu()
        with torch.autocast('cpu', dtype=torch.bfloat16, enabled=cfg.training.precision == 'bf16'):
            out = step_fn(student, b, StepContext(i, cfg.training.max_steps, torch.device('cpu'), cfg))
        out['loss'].backward(); opt.step(); opt.zero_grad(set_to_none=True)
        times.append(cpu() - t0)
    return times

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--arms', default='baseline,haar,saliency'); ap.add_argument('--steps', type=int, default=3)
    ap.add_argument('--seeds', type=int, default=3); ap.add_argument('--eval-tokens', type=int, default=2048)
    ap.add_argument('--protocol', default='cpu'); ap.add_argument('--out', default=None)
    ap.add_argument('--quick', action='store_true', help='training steps only: the student converted in memory (no Stage 1 run, no scoring)')
    a = ap.parse_args()
    if a.quick: return quick(a)
    import torch
    from wf_nb.ablate import ABLATIONS, PROTOCOLS, arm_configs, heldout_perplexity
    from wf_nb.config import get_config
    from wf_nb.stages import run_stage, distill_step
    from wf_nb.trainer import StepContext
    from wf_nb.convert import load
    from wf_nb.assets import load_fp_model, load_tokenizer
    from wf_nb.stream import get_data
    from wf_nb.export import export_model, load_packed
    torch.manual_seed(0)
    out = Path(a.out or tempfile.mkdtemp(prefix='bench_ablate_')); runs = out/'runs'
    abl_of = {'baseline': 'haar', 'haar': 'haar', 'saliency': 'saliency'}
    P = PROTOCOLS[a.protocol]; rows = {}; stage1_out = {}
    for arm in a.arms.split(','):
        abl = abl_of[arm]; cfgs = arm_configs(abl, arm, 1, a.protocol)
        r = rows[arm] = {}
        key = 'haar' if arm == 'haar' else 'plain'   # the saliency arm's Stage 1 computes the baseline's model
        if key not in stage1_out:
            m, ov = cfgs['1']; t0 = cpu()
            stage1_out[key] = run_stage(get_config(ov, stage='1', model=m), runs, log=lambda *x: None)['output']
            r['stage1'] = cpu() - t0
            print(json.dumps({'arm': arm, 'stage': '1', 'cpu_s': round(r['stage1'], 2)}), flush=True)
        else: r['stage1'] = rows['baseline']['stage1']
        for st in ('1.9', '2'):
            m, ov = cfgs[st]; cfg = get_config(ov, stage=st, model=m)
            t0 = cpu()
            student = load(stage1_out[key]).train(); teacher = load_fp_model(cfg.model).eval()
            for p in teacher.parameters(): p.requires_grad_(False)
            tok = load_tokenizer(cfg.model); r[f'load {st}'] = cpu() - t0
            times = step_times(student, teacher, cfg, tok, a.steps)
            r[f'step {st}'] = statistics.median(times[1:])
            print(json.dumps({'arm': arm, 'stage': st, 'load_cpu_s': round(r[f'load {st}'], 2), 'step_cpu_s': [round(t, 2) for t in times]}), flush=True)
            del student, teacher
        cfg = get_config(cfgs['2'][1], stage='2', model=cfgs['2'][0]); tok = load_tokenizer(cfg.model)
        scale = P['eval_tokens'] / a.eval_tokens
        t0 = cpu(); heldout_perplexity(load(stage1_out[key]), cfg, tok, a.eval_tokens); t_ppl = cpu() - t0
        t0 = cpu(); exp = out/f'export-{arm}'; shutil.rmtree(exp, ignore_errors=True)
        export_model(stage1_out[key], 'hf-bitnet', out=exp); t_exp = cpu() - t0
        t0 = cpu(); heldout_perplexity(load_packed(exp), cfg, tok, a.eval_tokens); t_pk = cpu() - t0
        r['score'] = (t_ppl + t_pk) * scale + t_exp
        steps = P['steps'] if 'haar' not in P['steps'] else P['steps'][abl]
        r['arm total'] = r['stage1'] + r['load 1.9'] + r['load 2'] + steps['1.9'] * r['step 1.9'] + steps['2'] * r['step 2'] + r['score']
        print(json.dumps({'arm': arm, **{k: round(v, 2) for k, v in r.items()}}), flush=True)
    steps = P['steps']
    print(f"\n# bench_ablate: protocol {a.protocol} ({P['model']}, {' '.join(P['overrides'][:3])}), CPU seconds of one thread; "
          f"steps per arm: Stage 1.9 {steps['1.9']}, Stage 2 {steps['2']}")
    keys = ['stage1', 'load 1.9', 'step 1.9', 'load 2', 'step 2', 'score', 'arm total']
    print(f"{'arm':10}" + ''.join(f"{k:>11}" for k in keys))
    for arm, r in rows.items(): print(f"{arm:10}" + ''.join(f"{r[k]:11.1f}" for k in keys))
    for abl, arms in ABLATIONS.items():
        if all(x in rows for x in arms):
            tot = sum(rows[x]['arm total'] for x in arms) * a.seeds
            print(f"projected `wf ablate {abl} --seeds {a.seeds} --protocol {a.protocol}`: {tot / 3600:.2f} h of one idle core")

def quick(a):
    "Seconds (CPU, one thread) per training step of Stages 1.9 and 2 for each arm; the student is converted in memory."
    import torch
    from wf_nb.ablate import arm_configs
    from wf_nb.config import get_config
    from wf_nb.stages import distill_step
    from wf_nb.trainer import StepContext
    from wf_nb.convert import convert
    from wf_nb.assets import load_fp_model, load_tokenizer
    from wf_nb.stream import get_data
    torch.manual_seed(0)
    abl_of = {'baseline': 'haar', 'haar': 'haar', 'saliency': 'saliency'}
    teacher = tok = None; res = {}
    for arm in a.arms.split(','):
        for st in ('1.9', '2'):
            m, ov = arm_configs(abl_of[arm], arm, 1, a.protocol)[st]; cfg = get_config(ov, stage=st, model=m)
            if teacher is None:
                teacher = load_fp_model(cfg.model).eval(); tok = load_tokenizer(cfg.model)
                for p in teacher.parameters(): p.requires_grad_(False)
            student = convert(teacher, cfg.quant).train()
            for p in student.parameters(): p.requires_grad_(True)
            times = step_times(student, teacher, cfg, tok, a.steps)
            res[(arm, st)] = statistics.median(times[1:])
            print(json.dumps({'arm': arm, 'stage': st, 'step_cpu_s': [round(t, 2) for t in times]}), flush=True)
            del student
    print(f"\n# bench_ablate --quick: CPU seconds (one thread) per training step, protocol {a.protocol}, median of {a.steps} after a warm-up step")
    print(f"{'arm':10} {'stage 1.9':>10} {'stage 2':>10}")
    for arm in a.arms.split(','): print(f"{arm:10} {res[(arm, '1.9')]:10.2f} {res[(arm, '2')]:10.2f}")

if __name__ == '__main__':
    sys.exit(main())
