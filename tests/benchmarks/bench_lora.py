"""LoRA BitDistill against full BitDistill and direct ternary SFT on the offline Shakespeare genre task (issue 37):
accuracy (uncalibrated and calibrated), trainable parameter share, peak training memory, time per step, side by side;
plus the LoRA adapter merged and re-quantized to ternary, and base + adapter in stock transformers + PEFT against wf_nb.

Every arm is a `wf train` run (the user-facing command) in one runs dir, on the protocol of exp_stage3_genre.py:
  (b) FP-SFT teacher          wf train -s sft data.task=shakespeare_genre
  (c) direct ternary SFT      wf train -s sft training.checkpoint_path=STAGE1
  (d) full BitDistill         wf train -s 3 training.checkpoint_path=START distill.teacher=(b)
  (e) ternary SFT from START   wf train -s sft training.checkpoint_path=START   (no teacher: separates the start from the method)
  (f) LoRA BitDistill         wf train -s 3 training.checkpoint_path=START distill.teacher=(b) peft.method=lora peft.r=8 peft.alpha=16
  (f') (f) merged into the base and re-quantized to ternary (wf_nb.lora.merge_requantize), evaluated the same way
  (g) LoRA SFT from START     wf train -s sft training.checkpoint_path=START peft.method=lora ...   (the adapter without a teacher)
  (z) START itself, zero-shot (no training: the floor every arm's gain is measured from)

    python tests/benchmarks/bench_lora.py --seeds 0 1 2 --steps 400 --teacher-steps 200 --start PIPELINE_OUT --stage1 STAGE1_OUT
    python tests/benchmarks/bench_lora.py --seeds 0 --steps 30 --n-test-per-genre 50 --runs-dir /tmp/lora_runs   # reduced
    python tests/benchmarks/bench_lora.py --task shakespeare_next_line --seeds 0 1 2 ...   # the second task (multiple choice)

Completed runs with the same config in --runs-dir are reused (a rerun only evaluates).
"""
from __future__ import annotations
import argparse, json, os, statistics as st, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parent))
from exp_stage3_genre import sh, find, output_of, metric_rows, pin_commit   # the genre protocol's helpers

MODEL, TASK = 'smollm2_135m', 'shakespeare_genre'


def run_arm(a, name, stage, ov, match, log):
    "Train (or reuse) one arm with `wf train`; returns its Run."
    key = {'data.task': TASK, 'training.max_steps': match.pop('steps', a.steps), 'training.batch_size': a.batch_size,
           'data.seq_len': a.seq_len, 'training.precision': a.precision, **match}
    run = find(a.runs_dir, stage, **key)
    if run is None:
        sh(['train', '-m', MODEL, '-s', stage, '--runs-dir', a.runs_dir, f'data.task={TASK}', f'training.batch_size={a.batch_size}',
            f'data.seq_len={a.seq_len}', f'training.precision={a.precision}', 'logging.interval=1', 'logging.progress=false',
            f'training.max_steps={key["training.max_steps"]}', f'training.save_interval={min(100, key["training.max_steps"])}', *ov], log)
        run = find(a.runs_dir, stage, **key)
    else: log(f"[{name}] reusing completed run {run.id}")
    if run is None: raise SystemExit(f"{name}: no COMPLETED stage-{stage} run matches {key}")
    return run


def train_stats(run) -> dict:
    "Peak memory (max RSS of the training process, MB) and the median seconds per step (logged every step)."
    rows = [r for r in metric_rows(run) if 'loss' in r and 'time' in r]
    dts = [b['time'] - a['time'] for a, b in zip(rows, rows[1:])]
    peft = run.meta().get('peft') or {}
    return {'peak_mem_mb': max(r['peak_mem_mb'] for r in rows), 's_per_step': st.median(dts) if dts else float('nan'),
            'trainable_share': peft.get('share', 1.0), 'trainable': peft.get('trainable')}


def main(argv=None):
    global MODEL, TASK
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--steps', type=int, default=400)
    ap.add_argument('--teacher-steps', type=int, default=200)
    ap.add_argument('--batch-size', type=int, default=8)
    ap.add_argument('--seq-len', type=int, default=128)
    ap.add_argument('--lr', type=float, default=1e-4, help='lr of the teacher and the full arms (c, d)')
    ap.add_argument('--lr-lora', type=float, default=1e-3, help='lr of the LoRA arm (f)')
    ap.add_argument('--r', type=int, default=8); ap.add_argument('--alpha', type=float, default=16)   # r = 8: 1.78% trainable (< 2%)
    ap.add_argument('--targets', default='q,k,v,o,gate,up,down')
    ap.add_argument('--loraplus', type=float, default=1.0, help='peft.loraplus_ratio of the LoRA arms (LoRA+: B at this x --lr-lora; 1: plain LoRA)')
    ap.add_argument('--no-checkpointing', action='store_true', help='peft.checkpointing=false in the LoRA arms: faster steps, '
                    'the same gradients (nbs/06f_lora.ipynb), more memory (so their peak_mem_mb is not the memory target\'s)')
    ap.add_argument('--precision', default='fp32', choices=['fp32', 'bf16'])
    ap.add_argument('--seeds', type=int, nargs='+', default=[0])
    ap.add_argument('--start', default=None, help='Stages 1.9 + 2 output: the start of (d) and (f) (default: Stage 1)')
    ap.add_argument('--stage1', default=None, help='Stage 1 output: the start of (c) (default: a Stage-1 run in --runs-dir)')
    ap.add_argument('--arms', default='cdf', help='which of c, d, e, f, g to train, z to evaluate, b to evaluate the teacher (b is trained whenever d or f need it)')
    ap.add_argument('--gamma', type=float, default=None, help="distill.gamma_attn of (d) and (f) (default: the config's, BitDistill's 1e5)")
    ap.add_argument('--distill', nargs='*', default=[], metavar='KEY=VALUE',
                    help='more numeric distill.* overrides of (d) and (f), e.g. distill.temperature=1 distill.lambda_logits=1')
    ap.add_argument('--task', default=TASK, help='data.task of every arm: shakespeare_genre, shakespeare_next_line '
                    '(multiple choice, its 600-item test split) or a JSONL task with a .test sibling')
    ap.add_argument('--n-test-per-genre', type=int, default=0, help='balanced test subsample (0: the whole test split)')
    ap.add_argument('--eval-batch-size', type=int, default=16)
    ap.add_argument('--runs-dir', default=os.environ.get('WF_RUNS_DIR', 'runs'))
    ap.add_argument('--hf-check', action='store_true', help='also load the hf-bitnet export of START + the adapter in transformers + PEFT')
    ap.add_argument('--merge-calibration', type=int, default=128, help="(f'): GPTQ-style merge calibrated on this many train "
                    'prompts (0: nearest ternary rounding)')
    ap.add_argument('--no-merged', action='store_true', help="skip (f'), the merged + re-quantized adapter's eval")
    ap.add_argument('--json', default=None, help='results so far, rewritten after every evaluated arm')
    ap.add_argument('--model', default=MODEL, help='model preset (tiny_llama: a quick smoke test of this script)')
    a = ap.parse_args(argv)
    pin_commit(a.runs_dir)   # an interrupted arm resumes after later commits
    MODEL, TASK = a.model, a.task
    log = lambda *x: print(*x, flush=True)
    import torch
    import wf_nb
    from wf_nb.config import get_config
    from wf_nb.assets import load_tokenizer
    from wf_nb.tasks import load_task, shakespeare_genre, task_accuracy, GENRE_TASK
    from wf_nb.lora import load_adapter, merge_requantize, task_calibration
    import exp_stage3_genre; exp_stage3_genre.MODEL = MODEL
    tok = load_tokenizer(get_config(model=MODEL).model)
    if TASK == 'shakespeare_genre': test, task = shakespeare_genre('test', n_per_genre=a.n_test_per_genre or None), GENRE_TASK
    else: _, test, task = load_task(TASK, 'test')
    calib = task_calibration(TASK, tok, a.merge_calibration, a.seq_len)   # (f')'s merge: the first train examples, prompt + answer
    t0 = time.time()
    if a.stage1: s1 = Path(a.stage1)
    else:
        r1 = find(a.runs_dir, '1')
        if r1 is None: sh(['train', '-m', MODEL, '-s', '1', '--runs-dir', a.runs_dir], log); r1 = find(a.runs_dir, '1')
        s1 = output_of(r1)
    start = Path(a.start) if a.start else s1
    results = []

    def evaluate(arm, seed, load, stats):
        t = time.time()
        with torch.autocast('cpu', dtype=torch.bfloat16):
            r = task_accuracy(load(), tok, test, task, max_len=a.seq_len, batch_size=a.eval_batch_size, calibrate=True)
        row = dict(arm=arm, seed=seed, accuracy=r['accuracy'], stderr=r['stderr'], cal_accuracy=r['calibrated']['accuracy'], n=r['n'],
                   bcal_accuracy=r['batch_calibrated']['accuracy'] if 'batch_calibrated' in r else None,   # classification tasks only
                   predicted={l: r['predictions'].count(l) for l in task.labels}, **stats)   # a label preference shows here
        bcal = '' if row['bcal_accuracy'] is None else f", batch-calibrated {row['bcal_accuracy']:.3f}"
        log(f"[{arm}] seed {seed}: acc {row['accuracy']:.3f} +- {row['stderr']:.3f}, calibrated {row['cal_accuracy']:.3f}{bcal}, "
            f"predicted {row['predicted']} (eval {time.time() - t:.0f}s)")
        results.append(row)
        if a.json:   # after every arm, so a run stopped later keeps what it measured
            from wf_nb.io import write_json
            write_json(a.json, dict(args=vars(a), results=results), indent=1)

    for seed in a.seeds:
        sd, sk = f'training.seed={seed}', {'training.seed': seed}
        teacher = None
        if set(a.arms) & set('bdf'):   # only distillation needs the teacher, so (c), (e), (g) can run beside its training
            rb = run_arm(a, '(b) FP-SFT', 'sft', [sd, f'training.lr={a.lr}'], {'steps': a.teacher_steps, 'training.lr': a.lr,
                         'training.checkpoint_path': '', 'peft.method': '', **sk}, log)
            teacher = output_of(rb)
        if 'b' in a.arms:   # the teacher's own accuracy: what the ternary arms should reach (issue 33: within 1 point)
            evaluate('(b) FP-SFT teacher', seed, lambda: wf_nb.load(teacher), train_stats(rb))
        if 'c' in a.arms:
            rc = run_arm(a, '(c)', 'sft', [sd, f'training.lr={a.lr}', f'training.checkpoint_path={s1}'],
                         {'training.lr': a.lr, 'training.checkpoint_path': str(s1), 'peft.method': '', **sk}, log)
            evaluate('(c) direct ternary SFT (full)', seed, lambda: wf_nb.load(output_of(rc)), train_stats(rc))
        if 'e' in a.arms:
            re_ = run_arm(a, '(e)', 'sft', [sd, f'training.lr={a.lr}', f'training.checkpoint_path={start}'],
                          {'training.lr': a.lr, 'training.checkpoint_path': str(start), 'peft.method': '', **sk}, log)
            evaluate('(e) ternary SFT from START (full, no teacher)', seed, lambda: wf_nb.load(output_of(re_)), train_stats(re_))
        lora = ['peft.method=lora', f'peft.r={a.r}', f'peft.alpha={a.alpha}', f'peft.targets={a.targets}', f'peft.loraplus_ratio={a.loraplus}',
                *(['peft.checkpointing=false'] if a.no_checkpointing else [])]   # not matched: the result is the same
        mlora = {'training.lr': a.lr_lora, 'peft.method': 'lora', 'peft.r': a.r, 'peft.alpha': a.alpha, 'peft.targets': a.targets,
                 'peft.loraplus_ratio': a.loraplus}
        if 'z' in a.arms and seed == a.seeds[0]:   # no training, so one seed
            evaluate('(z) START, zero-shot', seed, lambda: wf_nb.load(start), {})
        if 'g' in a.arms:
            rg = run_arm(a, '(g)', 'sft', [sd, f'training.lr={a.lr_lora}', f'training.checkpoint_path={start}', *lora],
                         {'training.checkpoint_path': str(start), **mlora, **sk}, log)
            evaluate(f'(g) LoRA SFT from START (r={a.r}, no teacher)', seed, lambda: load_adapter(start, output_of(rg)), train_stats(rg))
        gamma = get_config(model=MODEL, stage='3').distill.gamma_attn if a.gamma is None else a.gamma
        d3 = get_config(model=MODEL, stage='3').distill   # matched always, so a run with other values is never reused
        extra = {'distill.temperature': d3.temperature, 'distill.lambda_logits': d3.lambda_logits,
                 **dict(kv.split('=', 1) for kv in a.distill)}   # e.g. distill.temperature=1 distill.lambda_logits=1
        common3 = [sd, f'training.checkpoint_path={start}', f'distill.teacher={teacher}', f'distill.gamma_attn={gamma}',
                   *(f'{k}={v}' for k, v in extra.items())]
        m3 = {'training.checkpoint_path': str(start), 'distill.teacher': str(teacher), 'distill.gamma_attn': gamma, **sk,
              **{k: float(v) for k, v in extra.items()}}
        if 'd' in a.arms:
            rd = run_arm(a, '(d)', '3', [*common3, f'training.lr={a.lr}'], {**m3, 'training.lr': a.lr, 'peft.method': ''}, log)
            evaluate('(d) BitDistill (full)', seed, lambda: wf_nb.load(output_of(rd)), train_stats(rd))
        if 'f' in a.arms:
            rf = run_arm(a, '(f)', '3', [*common3, f'training.lr={a.lr_lora}', *lora], {**m3, **mlora}, log)
            stats = train_stats(rf)
            evaluate(f'(f) LoRA BitDistill (r={a.r})', seed, lambda: load_adapter(start, output_of(rf)), stats)
            if not a.no_merged:
                evaluate(f"(f') LoRA merged + re-quantized ({f'GPTQ on {a.merge_calibration} train prompts' if calib else 'nearest'})",
                         seed, lambda: merge_requantize(load_adapter(start, output_of(rf)), calibration=calib or None), {})
            last = (start, output_of(rf))

    print(table(results, a), flush=True)
    if a.hf_check and 'f' in a.arms:
        try: hf_check(*last, tok, log)
        except Exception as e: log(f"hf check failed: {type(e).__name__}: {e}")
    log(f"wall time {time.time() - t0:.0f}s")


def hf_check(start, adapter, tok, log) -> float:
    "Max |logit difference| between wf_nb's base + adapter and stock transformers + PEFT on the hf-bitnet export of the base."
    import tempfile, torch
    from wf_nb.export import export_model
    from wf_nb.lora import load_adapter, hf_peft_model
    ids = torch.tensor([tok("To be, or not to be, that is the question: whether 'tis nobler in the mind")['input_ids']])
    with tempfile.TemporaryDirectory() as d, torch.no_grad():
        export_model(Path(start), 'hf-bitnet', Path(d)/'hf', dtype=torch.float32)
        a = load_adapter(start, adapter)(input_ids=ids).logits
        b = hf_peft_model(Path(d)/'hf', adapter)(input_ids=ids).logits
    diff = (a - b).abs().max().item()
    log(f"transformers + PEFT (hf-bitnet export + adapter) vs wf_nb: max |logit diff| {diff:.2e} (logits up to {a.abs().max().item():.1f})")
    return diff


def table(results, a) -> str:
    ms = lambda v: (f"{st.mean(v):.3f} ± {st.stdev(v):.3f}" if len(v) > 1 else f"{v[0]:.3f}") if v else ''
    arms = list(dict.fromkeys(r['arm'] for r in results))
    full = [r for r in results if r['arm'].startswith('(d)')]
    mem_d = st.mean(r['peak_mem_mb'] for r in full) if full else None
    out = [f"\n{MODEL} on {TASK}, {a.steps} steps x {a.batch_size} x {a.seq_len}, teacher {a.teacher_steps} steps, seeds {a.seeds}, "
           f"test n = {results[0]['n'] if results else 0}, {a.precision}, gamma_attn {a.gamma if a.gamma is not None else 'default (1e5)'}"
           f"{(', ' + ' '.join(a.distill)) if a.distill else ''}\n",
           '| arm | seeds | accuracy | calibrated | batch-calibrated | predicted (per label, summed over seeds) | trainable share '
           '| peak train memory (MB) | vs full Stage 3 | s / step |', '|---|---|---|---|---|---|---|---|---|---|']
    for m in arms:
        rs = [r for r in results if r['arm'] == m]
        mem = [r['peak_mem_mb'] for r in rs if 'peak_mem_mb' in r]
        sp = [r['s_per_step'] for r in rs if 's_per_step' in r]
        sh_ = [r['trainable_share'] for r in rs if 'trainable_share' in r]
        bc = [r['bcal_accuracy'] for r in rs if r.get('bcal_accuracy') is not None]
        pr = [r['predicted'] for r in rs if r.get('predicted')]
        pr = ' / '.join(f'{l} {sum(p[l] for p in pr)}' for l in pr[0]) if pr else ''
        out.append(f"| {m} | {len(rs)} | {ms([r['accuracy'] for r in rs])} | {ms([r['cal_accuracy'] for r in rs])} | {ms(bc)} | {pr} | "
                   f"{f'{sh_[0]:.2%}' if sh_ else ''} | {f'{st.mean(mem):.0f}' if mem else ''} | "
                   f"{f'{st.mean(mem) / mem_d:.2f}x' if mem and mem_d else ''} | {f'{st.median(sp):.2f}' if sp else ''} |")
    by = lambda p, key='accuracy': {r['seed']: r[key] for r in results if r['arm'].startswith(p) and r.get(key) is not None}
    c, d, e, f, g, z = (by(p) for p in ('(c)', '(d)', '(e)', '(f)', '(g)', '(z)'))
    def recovered(what, lora, full, base, target=''):
        seeds = sorted(set(lora) & set(full) & set(base))
        if not seeds: return
        gain = st.mean(full[s] - base[s] for s in seeds)
        if gain <= 0:   # a share of a loss is no recovery (two negative gains would give a positive ratio)
            out.append(f"\n{what}: full training has no gain to recover ({gain:+.3f} mean over seeds); LoRA's own: "
                       f"{st.mean(lora[s] - base[s] for s in seeds):+.3f}{target}")
            return
        rec = [(lora[s] - base[s]) / (full[s] - base[s]) if full[s] != base[s] else float('nan') for s in seeds]
        out.append(f"\n{what} recovers {st.mean(rec):.0%} (per seed {', '.join(f'{x:.0%}' for x in rec)}){target}")
    recovered("LoRA BitDistill (f) of full BitDistill's (d) gain over direct ternary SFT (c)", f, d, c, '; target >= 80%')
    for key, what in (('cal_accuracy', 'content-free calibrated'), ('bcal_accuracy', 'batch-calibrated')):   # the same, without label preference
        recovered(f"  {what}: (f) of (d)'s gain over (c)", *(by(p, key) for p in ('(f)', '(d)', '(c)')))
    z0 = {s: next(iter(z.values())) for s in e} if z else {}   # START's zero-shot accuracy does not depend on the seed
    recovered("LoRA SFT (g) of full SFT's (e) gain over START zero-shot (z)", g, e, z0)
    return '\n'.join(out)


if __name__ == '__main__':
    main()
