"""Stage 3 on the offline Shakespeare genre task (3-way comedy/history/tragedy, split by play), SmolLM2-135M-Instruct
(Q4_1): FP zero-shot, FP-SFT (the teacher), direct ternary SFT (from Stage 1), ternary SFT and BitDistill (Stage 3)
from the Stages 1.9 + 2 output (`--start`), over `--seeds`, with uncalibrated and content-free-calibrated accuracy.

Every arm is trained with the user-facing CLI (`wf train ...`, one runs dir so the Stage-3 hand-off finds the
Stage-1 output and the FP-SFT teacher) and evaluated on the same balanced test subsample (plays never seen in
training) with `wf_nb.tasks.task_accuracy` (label-token log-likelihood, accuracy +- standard error).

    python tests/benchmarks/exp_stage3_genre.py --steps 40 --batch-size 8 --lr 1e-4 --runs-dir /tmp/g_runs
    python tests/benchmarks/exp_stage3_genre.py --seeds 0 1 2 --start PIPELINE_OUTPUT --stage1 STAGE1_OUTPUT ...

Completed runs with the same config in --runs-dir are reused (not retrained), so a rerun only evaluates.
"""
from __future__ import annotations
import argparse, json, os, subprocess, time
from pathlib import Path

MODEL, TASK = 'smollm2_135m', 'shakespeare_genre'


def sh(args, log):
    "Run a `wf` command, echoing it; fail loudly with its output."
    cmd = ['wf', *args]
    log(f"$ {' '.join(cmd)}")
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, 'WANDB_MODE': os.environ.get('WANDB_MODE', 'disabled')})
    dt = time.time() - t0
    if p.returncode != 0:
        raise SystemExit(f"command failed ({p.returncode}) after {dt:.0f}s: {' '.join(cmd)}\n--- stdout\n{p.stdout[-3000:]}\n--- stderr\n{p.stderr[-3000:]}")
    log(f"  done in {dt:.0f}s")
    return dt


def pin_commit(folder) -> str:
    """Pin the commit that run fingerprints hash (`$WF_NB_COMMIT`) to the one this experiment started at (kept in
    `folder/.wf_nb_commit`), so that an interrupted run resumes after later commits instead of starting over; the runs'
    metadata then records that commit. An explicit `$WF_NB_COMMIT` wins."""
    f = Path(folder) / '.wf_nb_commit'
    if not os.environ.get('WF_NB_COMMIT'):
        if not f.exists():
            from wf_nb.config import git_info
            from wf_nb.io import atomic_write_text   # two experiments starting at once never read a half-written pin
            f.parent.mkdir(parents=True, exist_ok=True); atomic_write_text(f, git_info()['commit'] or 'unknown')
        os.environ['WF_NB_COMMIT'] = f.read_text().strip()
    return os.environ['WF_NB_COMMIT']


def find(runs_dir, stage, status='COMPLETED', **match):
    from wf_nb.registry import find_runs
    runs = find_runs(runs_dir, status=status, stage=stage, **{'model.name': MODEL, **match})
    return runs[0] if runs else None


def wait_running(runs_dir, stage, log, **match):
    "A matching run another process is training (e.g. an arm started by hand in parallel): wait for it to end."
    run = find(runs_dir, stage, status='RUNNING', **match)
    if run is None: return None
    log(f"  run {run.id} is RUNNING (pid {run.meta().get('pid')}): waiting for it")
    while run.status == 'RUNNING': time.sleep(15)
    log(f"  run {run.id} ended {run.status}")
    return run if run.status in ('COMPLETED', 'INTERRUPTED') else None


def load_interrupted(run, mc):
    "The model of an INTERRUPTED run (stopped by hand for the CPU time limit): its start point + its latest checkpoint, strictly."
    import wf_nb
    from wf_nb.assets import load_fp_model
    from wf_nb.checkpoint import list_checkpoints, load_checkpoint
    lin = run.meta().get('lineage', {})
    parent = Path(run.dir.parent, lin['parent_output']) if lin.get('parent_output') else None   # relative (or absolute) parent
    model = wf_nb.load(parent) if parent else load_fp_model(mc, seed=0)
    ckpt = list_checkpoints(run.dir)[-1]
    load_checkpoint(ckpt, model)
    return model, int(ckpt.name[5:])


def output_of(run) -> Path:
    try: from wf_nb.registry import run_output
    except ImportError: return Path(run.meta().get('output') or run.output)   # runs written before relative lineage
    return run_output(run)


def metric_rows(run):
    p = Path(run.dir)/'metrics.jsonl'
    return [json.loads(l) for l in p.read_text().splitlines() if l.strip()] if p.exists() else []


def linear_probe(model, tok, train, test, seq_len) -> dict:
    """Test accuracy of a logistic regression on the frozen model's last-layer states (the prompt's last position, and
    the mean over its tokens), fit on training-play passages: does the representation carry the genre at all?"""
    import torch, torch.nn.functional as F
    from wf_nb.tasks import GENRE_TASK, encode_classification

    def feats(rows):
        last, mean = [], []
        with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16):
            for e in rows:
                ids = encode_classification(tok, e['text'], GENRE_TASK.labels[0], GENRE_TASK, seq_len, eos=False)['input_ids'][:-1]
                h = model(input_ids=torch.tensor([ids]), use_cache=False, output_hidden_states=True).hidden_states[-1][0].float()
                last.append(h[-1]); mean.append(h.mean(0))
        return {'last': torch.stack(last), 'mean': torch.stack(mean)}

    def fit_score(Xtr, ytr, Xte, yte, wd=1e-2):
        mu, sd = Xtr.mean(0), Xtr.std(0) + 1e-6
        Xtr, Xte = (Xtr - mu) / sd, (Xte - mu) / sd
        W = torch.zeros(Xtr.shape[1], len(GENRE_TASK.labels), requires_grad=True)
        b = torch.zeros(len(GENRE_TASK.labels), requires_grad=True)
        opt = torch.optim.LBFGS([W, b], max_iter=200)
        def closure():
            opt.zero_grad(); l = F.cross_entropy(Xtr @ W + b, ytr) + wd * W.pow(2).sum(); l.backward(); return l
        opt.step(closure)
        return ((Xte @ W + b).argmax(-1) == yte).float().mean().item()

    model.eval()
    y = lambda rows: torch.tensor([GENRE_TASK.labels.index(e['label']) for e in rows])
    ftr, fte = feats(train), feats(test)
    return {k: fit_score(ftr[k], y(train), fte[k], y(test)) for k in ftr}


def summary(results) -> str:
    "Mean +- std over seeds per arm, and BitDistill (d) against direct ternary SFT (c): paired difference and gap closed."
    import statistics as st
    arms = list(dict.fromkeys(r['arm'] for r in results))
    by = {k: {m: [r[k] for r in results if r['arm'] == m] for m in arms} for k in ('accuracy', 'cal_accuracy')}
    ms = lambda v: f"{st.mean(v):.3f} ± {st.stdev(v):.3f}" if len(v) > 1 else f"{v[0]:.3f}"
    out = ['', '| arm | seeds | accuracy (mean ± std) | calibrated (mean ± std) |', '|---|---|---|---|']
    out += [f"| {m} | {len(by['accuracy'][m])} | {ms(by['accuracy'][m])} | {ms(by['cal_accuracy'][m])} |" for m in arms]
    c, d, b = '(c) ternary SFT from Stage 1', '(d) BitDistill (Stage 3)', '(b) FP-SFT (teacher)'
    for k, what in (('accuracy', 'uncalibrated'), ('cal_accuracy', 'calibrated')):
        dd, cc, bb = by[k].get(d, []), by[k].get(c, []), by[k].get(b, [])
        n = min(len(dd), len(cc), len(bb))
        if n == 0: continue
        diff = [x - y for x, y in zip(dd[:n], cc[:n])]
        se = (st.stdev(diff) / n ** .5) if n > 1 else float('nan')
        # per-seed test standard errors (binomial) as the floor of the uncertainty of a single seed
        se_test = max(r[k.replace('accuracy', 'stderr')] for r in results if r['arm'] in (c, d))
        gap = st.mean(bb[:n]) - st.mean(cc[:n])
        closed = (st.mean(dd[:n]) - st.mean(cc[:n])) / gap if gap else float('nan')
        out.append(f"\n{what}: BitDistill - direct ternary SFT = {st.mean(diff):+.3f} (paired over {n} seeds, se {se:.3f}; "
                   f"per-run test se ~{se_test:.3f}); gap to FP-SFT closed: {closed:.0%}")
    return '\n'.join(out)


def main(argv=None):
    global MODEL
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--steps', type=int, default=40)
    ap.add_argument('--teacher-steps', type=int, default=None, help='steps of the FP-SFT teacher (b); default --steps')
    ap.add_argument('--batch-size', type=int, default=8)
    ap.add_argument('--lr', type=float, default=1e-4, help='lr of every trained arm (b, c, d)')
    ap.add_argument('--lr-ternary', type=float, default=None, help='lr of the two ternary arms (c, d); default --lr')
    ap.add_argument('--seq-len', type=int, default=128, help='data.seq_len (passages are ~100-200 tokens; cut from the start)')
    ap.add_argument('--precision', default='fp32', choices=['fp32', 'bf16'])
    ap.add_argument('--seeds', type=int, nargs='+', default=[0], help='training.seed of every trained arm')
    ap.add_argument('--start', default=None, help='Stages 1.9 + 2 output: the start of arms (d) and (e) (default: Stage 1)')
    ap.add_argument('--stage1', default=None, help='Stage 1 output: the start of arm (c) (default: a Stage-1 run in --runs-dir)')
    ap.add_argument('--save-every', type=int, default=0, metavar='N',
                    help='also checkpoint every N steps, so a killed arm resumes (save_interval is not in the fingerprint); 0: only the end')
    ap.add_argument('--warmup', type=int, default=0, help='training.warmup_steps of every trained arm')
    ap.add_argument('--no-plain-sft', action='store_true', help='skip arm (e), ternary SFT from --start without KD')
    ap.add_argument('--n-test-per-genre', type=int, default=0, help='balanced test subsample (0: the whole test split)')
    ap.add_argument('--eval-batch-size', type=int, default=16)
    ap.add_argument('--eval-precision', default='bf16', choices=['fp32', 'bf16'], help='autocast dtype of the test evaluations')
    ap.add_argument('--runs-dir', default=os.environ.get('WF_RUNS_DIR', 'runs'))
    ap.add_argument('--skip-stage1-eval', action='store_true', help='do not evaluate the untrained Stage-1 ternary model')
    ap.add_argument('--json', default=None, help='also write the results here')
    ap.add_argument('--eval-cache', default=None, help='JSON file caching test results per checkpoint (a rerun skips done evals)')
    ap.add_argument('--stage3', nargs='*', default=[], metavar='KEY=VALUE',
                    help='extra dotted overrides of the Stage-3 arm (d), e.g. distill.gamma_attn=0 (a sweep point)')
    ap.add_argument('--teacher', default=None, help="the FP-SFT teacher of arm (d) for every seed (a model folder); "
                    "default: each seed's own arm (b)")
    ap.add_argument('--arms', default='bcde', help='which trained arms to run (letters of b, c, d, e); default all')
    ap.add_argument('--linear-probe', type=int, default=0, metavar='N',
                    help='also fit a linear probe on the frozen states of FP, Stage 1 and --start (N training passages per genre)')
    ap.add_argument('--model', default=MODEL, help='model preset (tiny_llama for a quick smoke test of this script)')
    a = ap.parse_args(argv)
    pin_commit(a.runs_dir)
    MODEL = a.model
    t_start = time.time()
    log = lambda *x: print(*x, flush=True)
    import torch
    torch.manual_seed(0)
    from wf_nb.config import get_config
    from wf_nb.io import write_json
    from wf_nb.assets import load_fp_model, load_tokenizer
    from wf_nb.tasks import shakespeare_genre, task_accuracy, GENRE_TASK
    import wf_nb
    mc = get_config(model=MODEL).model
    tok = load_tokenizer(mc)
    test = shakespeare_genre('test', n_per_genre=a.n_test_per_genre or None)
    log(f"test set: {len(test)} passages from plays {sorted({e['play'] for e in test})}")
    lr_t = a.lr if a.lr_ternary is None else a.lr_ternary
    common = [f'data.task={TASK}', f'training.max_steps={a.steps}', f'training.batch_size={a.batch_size}',
              f'data.seq_len={a.seq_len}', f'training.precision={a.precision}', 'logging.interval=1',
              f'training.save_interval={a.steps}', f'training.warmup_steps={a.warmup}', 'logging.progress=false']
    rd = ['--runs-dir', a.runs_dir]
    results = []
    cur_seed = [None]   # the seed of the arm being evaluated (None: untrained models)

    cache = json.loads(Path(a.eval_cache).read_text()) if a.eval_cache and Path(a.eval_cache).exists() else {}

    def evaluate(name, model, steps, note, secs=None, key=None):
        "Test accuracy of `model` (a callable that loads it); cached under `key` (the checkpoint) with --eval-cache."
        t0 = time.time()
        ck = json.dumps([key or name, len(test), a.n_test_per_genre, a.seq_len, 'calibrated', a.eval_precision])
        if ck in cache: r = cache[ck]; log(f"[{name}] from --eval-cache {a.eval_cache}")
        else:
            with torch.autocast('cpu', dtype=torch.bfloat16, enabled=a.eval_precision == 'bf16'):
                r = task_accuracy(model(), tok, test, GENRE_TASK, max_len=a.seq_len, batch_size=a.eval_batch_size, calibrate=True)
            r = {**{k: r[k] for k in ('accuracy', 'stderr', 'n', 'correct', 'confusion', 'predictions')},
                 'cal_accuracy': r['calibrated']['accuracy'], 'cal_stderr': r['calibrated']['stderr'], 'cal_confusion': r['calibrated']['confusion'],
                 'cal_predictions': r['calibrated']['predictions']}   # per passage, for paired differences between arms
            if a.eval_cache:
                cache[ck] = r; write_json(a.eval_cache, cache, indent=1)   # atomic: a killed run leaves the old cache, not half of one
        log(f"[{name}] acc {r['accuracy']:.3f} +- {r['stderr']:.3f}, calibrated {r['cal_accuracy']:.3f} +- {r['cal_stderr']:.3f} "
            f"(n={r['n']}), eval {time.time() - t0:.0f}s, confusion {r['confusion']}, calibrated {r['cal_confusion']}")
        results.append(dict(arm=name, steps=steps, accuracy=r['accuracy'], stderr=r['stderr'], n=r['n'],
                            cal_accuracy=r['cal_accuracy'], cal_stderr=r['cal_stderr'],
                            confusion=r['confusion'], train_s=secs, note=note, seed=cur_seed[0]))

    # (a) FP zero-shot
    evaluate('(a) FP zero-shot', lambda: load_fp_model(mc, seed=0), 0, 'SmolLM2-135M-Instruct (Q4_1), no training',
             key=f'fp:{MODEL}')

    # Stage 1 (SubLN + ternary conversion, no training): the start of (c), and of (d)/(e) without --start
    if a.stage1: s1_out, s1_secs = Path(a.stage1), None
    else:
        s1 = find(a.runs_dir, '1')
        s1_secs = None
        if s1 is None:
            s1_secs = sh(['train', '-m', MODEL, '-s', '1', *rd], log); s1 = find(a.runs_dir, '1')
        s1_out = output_of(s1)
    start = Path(a.start) if a.start else s1_out
    log(f"stage 1 output: {s1_out}; start of (d)/(e): {start}")
    if not a.skip_stage1_eval:
        evaluate('(s1) ternary, Stage 1 only', lambda: wf_nb.load(s1_out), 0, 'SubLN+ternary conversion, no training', s1_secs,
                 key=str(s1_out))
        if a.start: evaluate('(s2) ternary, Stages 1.9 + 2', lambda: wf_nb.load(start), 0, 'the pipeline output, no task training',
                             key=str(start))

    if a.linear_probe:
        train = shakespeare_genre('train', n_per_genre=a.linear_probe)
        probes = [('FP', lambda: load_fp_model(mc, seed=0)), ('Stage 1', lambda: wf_nb.load(s1_out))]
        if a.start: probes.append(('Stages 1.9 + 2', lambda: wf_nb.load(start)))
        log(f"\n| frozen model | linear probe, last position | linear probe, mean over tokens |  (fit on {len(train)} "
            f"training-play passages, scored on the {len(test)} test passages)\n|---|---|---|")
        for name, load in probes:
            r = linear_probe(load(), tok, train, test, a.seq_len)
            log(f"| {name} | {r['last']:.3f} | {r['mean']:.3f} |")

    def arm(name, stage, extra, note, steps=None, **match):
        lr, steps = extra[0], steps or a.steps
        ov = [*[c for c in common if not c.startswith('training.max_steps=') and not c.startswith('training.save_interval=')],
              f'training.max_steps={steps}', f'training.save_interval={min(steps, a.save_every or steps)}', f'training.lr={lr}', *extra[1:]]
        key = {'data.task': TASK, 'training.max_steps': steps, 'training.batch_size': a.batch_size,
               'training.lr': lr, 'data.seq_len': a.seq_len, 'training.precision': a.precision, **match}
        run = find(a.runs_dir, stage, **key) or wait_running(a.runs_dir, stage, log, **key)
        secs = None
        if run is None:
            secs = sh(['train', '-m', MODEL, '-s', stage, *rd, *ov], log)
            run = find(a.runs_dir, stage, **key)
        else: log(f"[{name}] reusing completed run {run.id}")
        if run is None: raise SystemExit(f"{name}: the run finished but no COMPLETED stage-{stage} run matches {key}")
        rows = [r for r in metric_rows(run) if 'loss' in r]
        rb = [r for r in metric_rows(run) if r.get('event') == 'rollback']
        note += f"; {len(rb)} loss-spike rollback(s)" if rb else ''
        if run.status == 'INTERRUPTED':   # stopped early (CPU time limit): evaluate its latest checkpoint, and say so
            from wf_nb.checkpoint import list_checkpoints
            k = int(list_checkpoints(run.dir)[-1].name[5:])
            evaluate(name, lambda: load_interrupted(run, mc)[0], k,
                     note + f"; INTERRUPTED at step {k}/{steps} (cosine lr schedule of {steps} steps), latest checkpoint",
                     secs, key=f'{run.dir}/checkpoints/step_{k:08d}')
        else:
            evaluate(name, lambda: wf_nb.load(output_of(run)), run.meta().get('summary', {}).get('step', steps), note, secs,
                     key=str(output_of(run)))
        results[-1].update(run=run.id, loss_first=rows[0]['loss'] if rows else None, loss_last=rows[-1]['loss'] if rows else None)
        return run, rows

    # per seed: (b) FP-SFT (the teacher), (c) direct ternary SFT from Stage 1, (e) ternary SFT from --start,
    # (d) Stage 3 from --start with that seed's (b) as the teacher
    runs3 = []
    for seed in a.seeds:
        cur_seed[0] = seed; sd = f'training.seed={seed}'; sk = {'training.seed': seed}
        if a.teacher: teacher = Path(a.teacher)   # one given teacher for every seed
        else:
            rb = find(a.runs_dir, 'sft', **{'data.task': TASK, 'training.max_steps': a.teacher_steps or a.steps,
                      'training.batch_size': a.batch_size, 'training.lr': a.lr, 'data.seq_len': a.seq_len,
                      'training.precision': a.precision, 'training.checkpoint_path': '', **sk}) if 'b' not in a.arms else None
            if rb is None: rb, _ = arm('(b) FP-SFT (teacher)', 'sft', [a.lr, sd], f'lr {a.lr:g}', steps=a.teacher_steps,
                        **{'training.checkpoint_path': '', **sk})
            teacher = output_of(rb)
        if 'c' in a.arms: arm('(c) ternary SFT from Stage 1', 'sft', [lr_t, sd, f'training.checkpoint_path={s1_out}'], f'lr {lr_t:g}',
            **{'training.checkpoint_path': str(s1_out), **sk})
        if a.start and not a.no_plain_sft and 'e' in a.arms:
            arm('(e) ternary SFT from Stages 1.9+2', 'sft', [lr_t, sd, f'training.checkpoint_path={start}'], f'lr {lr_t:g}',
                **{'training.checkpoint_path': str(start), **sk})
        if 'd' not in a.arms: continue
        s3 = dict(kv.split('=', 1) for kv in a.stage3)
        s3_match = {k: json.loads(v) if v[:1] in '-.0123456789tfn[{' else v for k, v in s3.items()}
        d3 = get_config(stage='3', model=MODEL).distill   # a run with other Stage-3 settings must not match the defaults
        s3_match = {**{f'distill.{k}': getattr(d3, k) for k in ('gamma_attn', 'temperature', 'lambda_logits', 'attn_layer')}, **s3_match}
        r3, rows3 = arm('(d) BitDistill (Stage 3)', '3', [lr_t, sd, f'training.checkpoint_path={start}', f'distill.teacher={teacher}', *a.stage3],
                        f'lr {lr_t:g}' + (', ' + ', '.join(a.stage3) if a.stage3 else ', T=5, lam_ld=10, gamma=1e5 (defaults)'),
                        **{'training.checkpoint_path': str(start), 'distill.teacher': str(teacher), **sk, **s3_match})
        runs3.append((r3, rows3))
    r3, rows3 = runs3[-1] if runs3 else (None, [])
    teacher = r3.meta().get('teacher') if r3 else None
    parent = r3.meta().get('lineage', {}).get('parent_output') if r3 else None

    print(f'\n## Results: Shakespeare genre (3-way, by play), {MODEL}{" = SmolLM2-135M-Instruct (Q4_1)" if MODEL == "smollm2_135m" else ""}\n')
    print(f"steps {a.steps} (teacher {a.teacher_steps or a.steps}), batch {a.batch_size} x seq_len {a.seq_len}, lr {a.lr:g} (FP) / {lr_t:g} (ternary), "
          f"precision {a.precision}, test n = {len(test)} (balanced, plays unseen in training), chance = 0.333\n")
    print('| arm | seed | steps | accuracy ± se | calibrated ± se | n | notes |')
    print('|---|---|---|---|---|---|---|')
    for r in results:
        t = f"; train {r['train_s']:.0f}s" if r.get('train_s') else ''
        print(f"| {r['arm']} | {'' if r['seed'] is None else r['seed']} | {r['steps']} | {r['accuracy']:.3f} ± {r['stderr']:.3f} | "
              f"{r['cal_accuracy']:.3f} ± {r['cal_stderr']:.3f} | {r['n']} | {r['note']}{t} |")
    print(summary(results))
    if r3: print(f"\nStage 3 run {r3.id}: parent {parent}, teacher {teacher}\n")
    if rows3:
        keys = ['loss', 'ce', 'kd', 'kd_weighted', 'attn', 'attn_weighted']
        k = max(1, len(rows3) // 4)
        print('| Stage-3 term | first step | mean first 25% | mean last 25% | last step |')
        print('|---|---|---|---|---|')
        for key in keys:
            if key not in rows3[0]: continue
            f = lambda rs: sum(r[key] for r in rs) / len(rs)
            print(f"| {key} | {rows3[0][key]:.4g} | {f(rows3[:k]):.4g} | {f(rows3[-k:]):.4g} | {rows3[-1][key]:.4g} |")
        print('\n(loss = ce + kd_weighted + attn_weighted; kd_weighted = lambda_logits * kd, kd already includes T^2; '
              'attn_weighted = gamma * attn)')
    print(f"\nwall time {time.time() - t_start:.0f}s")
    if a.json: write_json(a.json, dict(args=vars(a), results=results, stage3_rows=rows3), indent=1)


if __name__ == '__main__':
    main()
