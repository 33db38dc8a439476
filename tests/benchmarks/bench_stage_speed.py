"""Where a distillation step's time goes: Stages 1.9 and 2 of `wf pipeline` against bench_quality's kd_peer (issue 33).

SmolLM2-135M-Instruct (Q4_1), one real 4 x 128 Shakespeare batch (the same batch for every arm and step), bf16
autocast, the FP teacher in inference mode. Arms, interleaved round by round (the order rotated each round: the
machine is shared, so compare within one run; run with OMP_NUM_THREADS=1):

  peer    bench_quality's kd_peer step: transformers' AutoBitLinear (no SubLN), logits KD (forward KL, T = 1) from
          the FP teacher (fp32 weights under bf16 autocast, as it loads it), AdamW (weight decay 0.01), clip 1, cosine
          schedule; the same code as its loop
  s19     Stage 1.9 through wf_nb's Trainer (`distill_step`, the Stage-1 student, STAGE_DEFAULTS['1.9']): logits KD +
          the layer-wise loss over all 30 layers (both models return their hidden states)
  s2      Stage 2 through wf_nb's Trainer (STAGE_DEFAULTS['2']: logits KD only), the default pipeline's trained stage
  s2c     s2 with `training.compile=true` (the student's and the teacher's decoder blocks compiled, compiled losses)
  s2f     s2 with the teacher's Linear weights left in fp32 (autocast re-casts them to bf16 in every forward): the
          Stage-2 step before `wf_nb.stages._autocast_weights`, bit for bit the same losses
  s2w     s2 on the ternary step `wf pipeline` converts at (`quant.weight_scale`, PIPELINE_WEIGHT_SCALE; measured below at 1.5)
  s2cw    s2c on that step: the default pipeline's compiled Stage-2 step

Per arm: the median step time, tokens/s (B x S input tokens per step, as bench_quality counts them), tokens per CPU
second (process CPU time), and the median split of a step: batch draw, teacher forward, student forward, loss,
backward, gradient clipping, optimizer, the Trainer's callbacks, and the rest. The first steps are warm-up (the
compiled arm compiles in them: their time is printed). Once per wf arm: one checkpoint save (`Trainer.save`, model
+ optimizer, as every `training.save_interval` steps) and one validation (`Trainer.evaluate`, as at the end of a run);
once: Stage 1 (conversion + report, `run_stage1`) and loading the models.

    OMP_NUM_THREADS=1 python tests/benchmarks/bench_stage_speed.py [--rounds 6] [--warmup 2] [--arms peer,s19,s2,s2c]

Measured (issue 33), two runs on the shared 2-core machine under other jobs (load 4-6), 1 thread, 6 rounds after 2
warm-up; median seconds per step, tokens/s of wall time and per CPU second, ratio to the peer in the same rounds:

  --arms peer,s2f,s2,s19   peer 10.74 s (48 tok/s, 114 per CPU-s); s2f 7.69 (67, 145) 1.37x; s2 8.20 (62, 142) 1.34x;
                           s19 9.53 (54, 137) 1.18x. s2 and s2f gave the same losses bit for bit at every step.
  --arms peer,s2,s2c       peer 8.34 s (61, 124); s2 6.66 (77, 154) 1.25x; s2c 5.14 (100, 200) 1.64x. s2c's first
                           step compiled for 75 s (cold inductor cache), its first validation 34 s (4 s eager).
  --arms s2,s2c (quiet, load ~1; warm inductor cache): s2 3.12 s (164 tok/s), s2c 2.48 (207) 1.26x; s2c's first step
                           4.5 s, its first validation 2.6 s.
  --arms s2,s2w,s2c,s2cw (session 55, AVX-512, tcmalloc, beside one other job): s2 2.75 s (186 tok/s), s2w 2.86 (179),
                           s2c 2.52 (203), s2cw 2.45 (209): the ternary step 1.5 x mean|W| costs nothing, eager or compiled.

The allocator (session 40; `training.allocator`, wf_nb.launch): the same benchmark in alternating processes, glibc's
allocator against tcmalloc preloaded (`LD_PRELOAD=libtcmalloc_minimal.so.4`, as `wf train` now runs where it is
installed), 1 thread beside two 1-thread training jobs, medians of 3-4 rounds per process:

  --arms s2 (3 + 3 processes)     glibc 3.79 / 3.32 / 3.58 s; tcmalloc 2.00 / 2.08 / 1.97 s: 0.56x, the same losses
                                  bit for bit; the loss 0.52-1.15 -> 0.08 s, backward 1.57-1.78 -> 0.95-1.01 s
  --arms s2,s2c (2 + 2 processes) s2: glibc 3.89 / 2.95, tcmalloc 1.99 / 1.97; s2c (what `wf pipeline` runs):
                                  glibc 2.43 / 2.39, tcmalloc 1.82 / 1.82 s: 0.76x; peak RSS 6.9-7.1 -> 6.5 GB

glibc hands every freed block over its mmap threshold (at most 32 MiB) back to the OS, so the vocabulary-sized
tensors of each step (a 4 x 128 x 49,152 fp32 logits tensor is 100 MB; the embedding's gradient 113 MB) are mapped
and page-faulted afresh every step; tcmalloc keeps them.

Backward is half of every step (3.3 s of s2's 6.7); the eager loss (KL in fp32 over 49,152 words, plus the logged CE)
0.86 s, compiled 0.12 s; the peer's student forward (AutoBitLinear's fake quantization) 1.9 s against wf_nb's 1.3 s.
A checkpoint save (model + AdamW state) takes 4-9 s, a 4-batch validation 4-8 s.

This is a benchmark, not a test."""
import argparse, contextlib, copy, os, statistics, sys, tempfile, time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
B, S = 4, 128
ARMS = ['peer', 's19', 's2', 's2c', 's2f', 's2w', 's2cw']
PARTS = ['draw', 'teacher fwd', 'student fwd', 'loss', 'backward', 'clip', 'optimizer', 'callbacks', 'rest']

class Clock:
    "Seconds per named part of the current step."
    def __init__(self): self.parts = {}
    def add(self, name, dt): self.parts[name] = self.parts.get(name, 0.0) + dt
    def wrap(self, name, fn):
        def run(*a, **k):
            t0 = time.perf_counter()
            try: return fn(*a, **k)
            finally: self.add(name, time.perf_counter() - t0)
        return run
    @contextlib.contextmanager
    def part(self, name):
        t0 = time.perf_counter()
        try: yield
        finally: self.add(name, time.perf_counter() - t0)

ACTIVE = [None]   # the clock of the arm stepping now: the arms share one teacher
_HOOKED = set()

def hook_forward(module, name):
    "Time `module`'s forward passes (module hooks) as `name`, on the active clock."
    if id(module) in _HOOKED: return
    _HOOKED.add(id(module)); start = {}
    module.register_forward_pre_hook(lambda m, a: start.__setitem__('t', time.perf_counter()))
    module.register_forward_hook(lambda m, a, o: ACTIVE[0].add(name, time.perf_counter() - start['t']) if ACTIVE[0] else None)

def cfg_for(stage, compile=False, precision='bf16'):
    from wf_nb.config import get_config
    return get_config([f'training.batch_size={B}', f'data.seq_len={S}', f'training.precision={precision}', 'training.total_tokens=153600',
                       f'training.compile={str(compile).lower()}', 'training.save_interval=1000000', 'logging.progress=false',
                       'logging.wandb_mode=disabled'], stage=stage, model='smollm2_135m')

class Same:
    "An endless stream of one batch."
    def __init__(self, b): self.b = b
    def __iter__(self): return self
    def __next__(self): return dict(self.b)

class Peer:
    "bench_quality.kd_peer's loop, one step at a time, its parts timed."
    def __init__(self, teacher, batch, clock, steps=300, lr=1e-3):
        import torch
        from transformers import get_cosine_schedule_with_warmup
        from wf_nb.assets import load_fp_model
        from bench_train import hf_bitnet
        self.model = hf_bitnet(load_fp_model(cfg_for('2').model)).train()
        self.teacher, self.b, self.clock = teacher, batch, clock
        hook_forward(teacher, 'teacher fwd')
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=0.01)
        self.sched = get_cosine_schedule_with_warmup(self.opt, max(1, int(0.1 * steps)), steps)
    def step(self):
        import torch
        from wf_nb.distill import kd_loss
        c, b = self.clock, self.b
        with c.part('draw'): kw = {k: b[k] for k in ('attention_mask', 'position_ids') if k in b}
        with torch.autocast('cpu', dtype=torch.bfloat16):
            with torch.inference_mode(): t_logits = self.teacher(input_ids=b['input_ids'], use_cache=False, **kw).logits
            with c.part('student fwd'): s_logits = self.model(input_ids=b['input_ids'], use_cache=False, **kw).logits
            with c.part('loss'): loss = kd_loss(s_logits, t_logits.clone(), labels=b['labels'], T=1.0)
        with c.part('backward'): loss.backward()
        with c.part('clip'): torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        with c.part('optimizer'): self.opt.step(); self.sched.step(); self.opt.zero_grad(set_to_none=True)
        return float(loss.detach())

class WfArm:
    "A Stage 1.9 / 2 step through wf_nb's Trainer (its callbacks included, checkpoints apart), its parts timed."
    def __init__(self, stage, compile, student_dir, teacher, batch, val, clock, run_dir, w_scale=1.0):
        from wf_nb.convert import load
        from wf_nb.quant import bitlinears
        from wf_nb.step import RunPlan
        from wf_nb.stages import distill_step, _stage_callbacks
        from wf_nb.trainer import Trainer
        from wf_nb.parallel import make_accelerator
        self.cfg, self.clock = cfg_for(stage, compile), clock
        model = load(student_dir)
        for _, m in bitlinears(model): m.w_scale = w_scale   # the ternary step c x mean|W| (c = 1: BitNet's)
        acc = make_accelerator('bf16')
        tr = self.tr = Trainer(self.cfg, model, Same(batch), run_dir, step_fn=distill_step(teacher), val_data=val, accelerator=acc,
                               log=lambda *a, **k: None, plan=RunPlan(300), callbacks=_stage_callbacks(self.cfg, model))
        from wf_nb.step import lm_step
        tr.eval_step_fn = lm_step
        hook_forward(teacher, 'teacher fwd'); hook_forward(model, 'student fwd')
        tr.step_fn = clock.wrap('step_fn', tr.step_fn)
        tr.acc.backward = clock.wrap('backward', tr.acc.backward)
        for name, attr in (('draw', '_draw'), ('clip', '_clip_gradients'), ('optimizer', '_step_optimizer'), ('callbacks', '_event')):
            setattr(tr, attr, clock.wrap(name, getattr(tr, attr)))
        tr.start_step, tr.status, tr.first_loss, tr.last_loss = 0, 'RUNNING', None, None   # what Trainer.fit sets before its loop
        tr._event('before_fit')
    def step(self):
        self.tr._one_step()
        p = self.clock.parts   # the loss: the step function's time outside the two forwards
        p['loss'] = p.pop('step_fn', 0.0) - p.get('teacher fwd', 0.0) - p.get('student fwd', 0.0)
        return self.tr.last['loss']

def rss_mb():
    try: return int(next(l for l in open('/proc/self/status') if l.startswith('VmRSS')).split()[1]) // 1024
    except Exception: return 0

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--rounds', type=int, default=6); ap.add_argument('--warmup', type=int, default=2)
    ap.add_argument('--arms', default=','.join(ARMS)); ap.add_argument('--out', default='')
    a = ap.parse_args()
    arms = a.arms.split(',')
    bad = [x for x in arms if x not in ARMS]
    if bad: raise SystemExit(f"bench_stage_speed: error: unknown arm(s) {bad}; arms: {', '.join(ARMS)}")
    import torch
    os.environ.setdefault('WANDB_MODE', 'disabled')
    from wf_nb.assets import load_tokenizer, load_fp_model
    from wf_nb.stream import get_data
    from wf_nb.convert import run_stage1
    from wf_nb.stages import _teacher
    torch.manual_seed(0)
    tmp = Path(a.out or tempfile.mkdtemp(prefix=f'bench_stage_speed_{os.getpid()}_'))
    cfg = cfg_for('2'); tok = load_tokenizer(cfg.model)
    batch = next(get_data(cfg, tok, 'train', verbose=False))
    val = get_data(cfg, tok, 'val', verbose=False)
    once = {}
    t0 = time.perf_counter(); teacher = _teacher(cfg); once['load FP teacher'] = time.perf_counter() - t0
    teacher32 = _teacher(cfg_for('2', precision='fp32'))   # as bench_quality's kd_peer loads it: fp32 weights under bf16 autocast
    student_dir = tmp/'stage1'
    if not (student_dir/'config.json').exists():
        t0 = time.perf_counter(); run_stage1(cfg_for('1'), student_dir); once['Stage 1 (convert + report + save)'] = time.perf_counter() - t0
    clocks, steppers = {}, {}
    for arm in arms:
        clocks[arm] = Clock()
        t0 = time.perf_counter()
        if arm == 'peer': steppers[arm] = Peer(teacher32, batch, clocks[arm])
        else:
            from wf_nb.stages import PIPELINE_WEIGHT_SCALE
            compiled = arm in ('s2c', 's2cw')
            t = (_teacher(cfg_for('2', compile=True)) if compiled else   # compiled in place: its own copy
                 teacher32 if arm == 's2f' else teacher)
            steppers[arm] = WfArm('1.9' if arm == 's19' else '2', compiled, student_dir, t, batch, val, clocks[arm], tmp/f'run_{arm}',
                                  w_scale=PIPELINE_WEIGHT_SCALE if arm in ('s2w', 's2cw') else 1.0)
        once[f'{arm}: build (student load, optimizer{", teacher load" if arm in ("s2c", "s2cw") else ""})'] = time.perf_counter() - t0
    print(f"# bench_stage_speed: arms {arms}, batch {B} x {S}, {torch.get_num_threads()} thread(s), RSS {rss_mb()} MB after building", flush=True)
    rows = {arm: [] for arm in arms}
    for r in range(a.warmup + a.rounds):
        order = arms[r % len(arms):] + arms[:r % len(arms)]
        for arm in order:
            clocks[arm].parts = {}; ACTIVE[0] = clocks[arm]
            w0, c0 = time.perf_counter(), time.process_time()
            loss = steppers[arm].step()
            wall, cpu = time.perf_counter() - w0, time.process_time() - c0
            parts = dict(clocks[arm].parts); parts['rest'] = wall - sum(parts.values())
            rows[arm].append((wall, cpu, parts, loss))
            print(f"round {r}{' (warm-up)' if r < a.warmup else ''} {arm}: {wall:.2f} s wall, {cpu:.2f} s CPU, loss {loss:.3f}", flush=True)
    n = B * S
    print(f"\n| arm | step s (median) | tokens/s | tokens per CPU-s | ratio to peer (median of rounds) | warm-up steps s | "
          + ' | '.join(PARTS) + ' |')
    print('|' + '---|' * (6 + len(PARTS)))
    for arm in arms:
        rs = rows[arm][a.warmup:]
        wall, cpu = statistics.median(x[0] for x in rs), statistics.median(x[1] for x in rs)
        ratio = (f"{statistics.median(p[0] / x[0] for p, x in zip(rows['peer'][a.warmup:], rs)):.2f}x"
                 if 'peer' in rows and arm != 'peer' else '')
        parts = ' | '.join(f"{statistics.median(x[2].get(k, 0.0) for x in rs):.3f}" for k in PARTS)
        warm = ', '.join(f"{x[0]:.1f}" for x in rows[arm][:a.warmup])
        print(f"| {arm} | {wall:.2f} | {n / wall:.0f} | {n / cpu:.0f} | {ratio} | {warm} | {parts} |")
    print('\nparts: median seconds per step (rest = the step wall time outside the timed parts)')
    for arm in arms:   # what a run adds outside its steps
        if arm == 'peer': continue
        tr = steppers[arm].tr
        t0 = time.perf_counter(); tr.save(); once[f'{arm}: one checkpoint save (Trainer.save)'] = time.perf_counter() - t0
        t0 = time.perf_counter(); tr.evaluate(); once[f'{arm}: one validation (Trainer.evaluate, {tr.t.eval_batches} batches)'] = time.perf_counter() - t0
    print('\n| once | seconds |\n|---|---|')
    for k, v in once.items(): print(f"| {k} | {v:.1f} |")
    print(f"\npeak RSS {int(next(l for l in open('/proc/self/status') if l.startswith('VmHWM')).split()[1]) // 1024} MB")

if __name__ == '__main__':
    import shutil, sys
    mine = '--out' not in sys.argv   # a temporary folder of its own (2 GB of checkpoints): removed, whatever happens
    try: main()
    finally:
        if mine: [shutil.rmtree(p, ignore_errors=True) for p in Path(tempfile.gettempdir()).glob(f'bench_stage_speed_{os.getpid()}_*')]
