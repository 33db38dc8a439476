"""Peak training memory and s/step of Stage 3 (BitDistill) on SmolLM2-135M, full vs LoRA (issue 37), one arm per process
(peak RSS is per process): the library's Trainer running `wf_nb.stages.stage3_step` (logits KD + Q/K/V relation from the
FP teacher the stage loads, AdamW, gradient clipping, the stage's callbacks) on random 8 x 128 batches scored on their
last 2 positions (the genre task's answer + EOS; --scored 0: every position), fp32 on CPU (`--precision bf16`: bf16 autocast), glibc's default allocator.
It separates what the peak is made of: RSS after the student, after the teacher, the peak while loading/converting,
and the peak over the training steps (reset when training starts, read after the last step, before the Trainer's final
checkpoint), with the bytes of the state that lives through a step (parameters, buffers, gradients, AdamW moments).

    for arm in full lora-nockpt lora; do OMP_NUM_THREADS=1 python tests/benchmarks/bench_lora_memory.py --arm $arm --steps 3; done

`--start STAGE_OUT --teacher FP_SFT_OUT` loads both from checkpoint folders as `wf train -s 3` does (the adapter arm's base
straight into int8 codes, `wf_nb.lora.load_frozen`); `process_peak_mb` is then the whole process's peak, loading included.

Allocator experiments (adapter arms; issue 37's search for a default, table in nbs/06f_lora.ipynb): `--mmap-threshold-mb N`
(the config's `peft.mmap_threshold_mb`), `--trim-threshold-mb N` (glibc's M_TRIM_THRESHOLD), `--trim` (malloc_trim(0)
after every step), `--trim-blocks` (after every decoder layer's forward), and glibc's environment (`MALLOC_ARENA_MAX=1`),
recorded in the output. Step times of different processes compare only as ratios of runs interleaved in one script:
`--sweep ROUNDS` runs every setting of `SWEEP` once per round (one process each, the order rotated between rounds) and
prints the medians, peaks against the full arm's and s/step against the default adapter run's of the same round:

    OMP_NUM_THREADS=1 python tests/benchmarks/bench_lora_memory.py --sweep 3 --steps 6 --precision bf16
    OMP_NUM_THREADS=1 python tests/benchmarks/bench_lora_memory.py --sweep 3 --steps 6 --precision bf16 --allocators   # tcmalloc, jemalloc

`--kd-delta` instead measures how far a bf16 teacher moves the KD targets (the teacher's log-probs at T = 1 and 5 on
the scored positions of one batch) against the fp32 teacher.
"""
from __future__ import annotations
import argparse, json, resource, sys, tempfile, time
import torch


def rss_mb() -> float:
    return int(open('/proc/self/statm').read().split()[1]) * resource.getpagesize() / 2**20

def peak_mb() -> float:
    "The peak RSS since the last `reset_peak` (VmHWM)."
    return next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM')) / 1024

def reset_peak():
    "Start a new peak RSS (Linux: 5 > /proc/self/clear_refs), so the training peak excludes loading and conversion."
    with open('/proc/self/clear_refs', 'w') as f: f.write('5')

def tensor_mb(ts) -> float: return sum(t.numel() * t.element_size() for t in ts) / 2**20


def batches(a):
    "Endless random batches, `a.scored` labelled positions at the end of each row."
    g = torch.Generator().manual_seed(0)
    while True:
        ids = torch.randint(0, 49152, (a.batch_size, a.seq_len), generator=g)
        labels = ids.clone()
        if a.scored: labels[:, :-a.scored] = -100
        yield {'input_ids': ids, 'labels': labels, 'attention_mask': torch.ones_like(ids)}


def live_at_peak(prof, top: int = 12) -> dict:
    "From a `torch.profiler` run with `profile_memory`: the peak of live tensor bytes, by category, and its largest tensors."
    from torch.profiler._memory_profiler import MemoryProfileTimeline, Action
    tl = MemoryProfileTimeline(prof._memory_profile())
    ev = [e for e in tl.timeline if e[2][0].device.type == 'cpu']
    def replay(upto=None):
        live, tot, best = {}, 0, (0, -1)
        for i, (t, act, (key, ver), nb) in enumerate(ev if upto is None else ev[:upto + 1]):
            if act in (Action.PREEXISTING, Action.CREATE): live[(key, ver)] = nb; tot += nb
            elif act == Action.INCREMENT_VERSION: live[(key, ver + 1)] = live.pop((key, ver), nb)
            elif act == Action.DESTROY: tot -= live.pop((key, ver), 0)
            if tot > best[0]: best = (tot, i)
        return live, best
    _, (peak, at) = replay()
    live, _ = replay(at)
    cat = lambda k: str(getattr(tl.categories.get(*k), 'name', 'UNKNOWN'))
    by = {}
    for k, nb in live.items(): by[cat(k)] = by.get(cat(k), 0) + nb
    big = sorted(live.items(), key=lambda kv: -kv[1])[:top]
    return dict(peak_live_mb=peak / 2**20, by_category_mb={c: round(b / 2**20, 1) for c, b in sorted(by.items(), key=lambda x: -x[1])},
                largest_mb=[(cat(k), round(nb / 2**20, 1)) for k, nb in big])


class _Done(Exception): pass

def _malloc_trim():
    import ctypes
    ctypes.CDLL('libc.so.6').malloc_trim(0)

M_TRIM_THRESHOLD = -1   # glibc's mallopt parameter number (malloc.h)

def set_trim_threshold(mib: float) -> bool:
    "glibc: give the heap's free top back to the OS once it exceeds `mib` MiB (like setting any mallopt, this fixes the dynamic mmap threshold)."
    import ctypes
    return ctypes.CDLL('libc.so.6').mallopt(M_TRIM_THRESHOLD, int(mib * 2**20)) == 1

def trim_after_blocks(model) -> int:
    "An experiment: glibc's malloc_trim(0) after every decoder layer's forward (checkpointed: also its recompute)."
    layers = [m for n, m in model.named_modules() if n.endswith(tuple(f'layers.{i}' for i in range(1000)))]
    for m in layers: m.register_forward_hook(lambda *_: _malloc_trim())
    return len(layers)

def probe(steps: int, out: dict, profile: bool = False, trim: bool = False):
    "A Trainer callback: each step's time, and after the last step the training peak RSS (before the final checkpoint)."
    from wf_nb.callbacks import Callback
    class Probe(Callback):
        order = 94   # after every callback of the step but PeriodicCheckpoint (95)
        def before_fit(self, tr): self.ts = []; reset_peak()
        def before_step(self, tr):
            if profile and tr.step == steps - 1:   # the last step, profiled (slower: its time is not a step time)
                self.prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True,
                                                   record_shapes=True, with_stack=True)
                self.prof.__enter__()
            self.t0 = time.perf_counter()
        def after_step(self, tr):
            self.ts.append(time.perf_counter() - self.t0)
            out.setdefault('peak_after_step_mb', []).append(round(peak_mb())); out.setdefault('rss_after_step_mb', []).append(round(rss_mb()))
            if trim: _malloc_trim()
            if tr.step < steps: return
            if profile:
                self.prof.__exit__(None, None, None); self.ts.pop()
                out['profile'] = live_at_peak(self.prof)
            opt = tr.raw_optimizer
            out.update(train_peak_mb=peak_mb(), s_per_step=sorted(self.ts)[len(self.ts) // 2], step_s=[round(t, 1) for t in self.ts],
                       loss=tr.last['loss'], rss_end_mb=rss_mb(),
                       state_mb=dict(student=tensor_mb([*tr.model.parameters(), *tr.model.buffers()]),
                                     adam=tensor_mb([v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)])))
            raise _Done
    return Probe()


def kd_delta(a):
    "max |delta| of the teacher's log-probs (T = 1 and 5, scored positions) with bf16 weights against fp32."
    from wf_nb.config import get_config
    from wf_nb.stages import _teacher, _fwd_kw
    cfg = get_config(['training.precision=fp32'], stage='3', model='smollm2_135m')
    b = next(batches(a))
    sel = torch.zeros_like(b['labels'], dtype=torch.bool); sel[:, :-1] = b['labels'][:, 1:] != -100
    t32 = _teacher(cfg, 'smollm2_135m')
    t16 = _teacher(cfg, 'smollm2_135m').to(torch.bfloat16)
    with torch.inference_mode():
        z32, z16 = (m(input_ids=b['input_ids'], **_fwd_kw(b)).logits.float() for m in (t32, t16))
    out = {}
    for T in (1., 5.):
        for name, s in (('scored', sel), ('all', torch.ones_like(sel))):
            l32, l16 = (torch.log_softmax(z[s] / T, -1) for z in (z32, z16))
            p = l32.exp()
            out[f'T{T:g}_{name}'] = dict(max_abs_logp=float((l16 - l32).abs().max()),
                                          max_abs_logp_top10=float((l16 - l32).gather(-1, l32.topk(10, -1).indices).abs().max()),
                                          kl_fp32_bf16=float((p * (l32 - l16)).sum(-1).mean()),
                                          top1_agree=float((l32.argmax(-1) == l16.argmax(-1)).float().mean()))
    print(json.dumps(out))


SWEEP = {'full': '--arm full', 'lora': '--arm lora', 'lora mmap 1 MiB': '--arm lora --mmap-threshold-mb 1',
         'lora mmap 4 MiB': '--arm lora --mmap-threshold-mb 4', 'lora mmap 16 MiB': '--arm lora --mmap-threshold-mb 16',
         'lora mmap 64 MiB': '--arm lora --mmap-threshold-mb 64', 'lora trim threshold 1 MiB': '--arm lora --trim-threshold-mb 1',
         'lora trim threshold 64 MiB': '--arm lora --trim-threshold-mb 64', 'lora malloc_trim each step': '--arm lora --trim',
         'lora malloc_trim each layer': '--arm lora --trim-blocks', 'lora MALLOC_ARENA_MAX=1': 'MALLOC_ARENA_MAX=1 --arm lora'}
# other allocators, preloaded as `wf train` does (training.allocator; Debian: libtcmalloc-minimal4, libjemalloc2)
ALLOCATOR_SWEEP = {'full': '--arm full', 'lora': '--arm lora',
                   'full tcmalloc': 'LD_PRELOAD=libtcmalloc_minimal.so.4 --arm full', 'lora tcmalloc': 'LD_PRELOAD=libtcmalloc_minimal.so.4 --arm lora',
                   'full jemalloc': 'LD_PRELOAD=libjemalloc.so.2 --arm full', 'lora jemalloc': 'LD_PRELOAD=libjemalloc.so.2 --arm lora'}

def sweep(a, argv):
    "Every setting of SWEEP once per round, one process each, rotated; medians: peak RSS vs full, s/step vs lora (same round)."
    import os, statistics, subprocess, sys
    SWEEP = ALLOCATOR_SWEEP if a.allocators else globals()['SWEEP']
    rest = [x for x in argv if x not in ('--sweep', str(a.sweep), '--allocators')]
    env0 = {k: v for k, v in os.environ.items() if k not in ('LD_PRELOAD', 'WF_NB_ALLOCATOR')}   # every setting from glibc's
    res = {k: [] for k in SWEEP}
    for r in range(a.sweep):
        for i in range(len(SWEEP)):
            k = list(SWEEP)[(i + 3 * r) % len(SWEEP)]
            env = dict(env0, **dict(x.split('=') for x in SWEEP[k].split() if '=' in x))
            args = [x for x in SWEEP[k].split() if '=' not in x]
            p = subprocess.run([sys.executable, __file__, *args, *rest], env=env, capture_output=True, text=True)
            res[k].append(json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 else None)
            print(k, r, res[k][-1] and res[k][-1]['train_peak_mb'], file=sys.stderr)
    med = statistics.median
    full = med(x['train_peak_mb'] for x in res['full'] if x)
    print('| setting | peak RSS (MiB) | vs full | s/step | s/step vs lora | s/step vs full |\n|---|---|---|---|---|---|')
    for k, xs in res.items():
        ok = [(x, y, z) for x, y, z in zip(xs, res['lora'], res['full']) if x and y and z]
        print(f"| {k} | {med(x['train_peak_mb'] for x, _, _ in ok):.0f} | {med(x['train_peak_mb'] for x, _, _ in ok) / full:.2f}x | "
              f"{med(x['s_per_step'] for x, _, _ in ok):.2f} | {med(x['s_per_step'] / y['s_per_step'] for x, y, _ in ok):.2f}x | "
              f"{med(x['s_per_step'] / z['s_per_step'] for x, _, z in ok):.2f}x |" if ok else f'| {k} | failed | | | | |')


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--arm', choices=['full', 'lora', 'lora-nockpt'], default='full')
    ap.add_argument('--r', type=int, default=16); ap.add_argument('--steps', type=int, default=3)
    ap.add_argument('--batch-size', type=int, default=8); ap.add_argument('--seq-len', type=int, default=128)
    ap.add_argument('--scored', type=int, default=2, help='positions with a label at the end of each row (the genre task: '
                    'the answer and EOS); 0: every position (pretraining-like)')
    ap.add_argument('--precision', default='fp32', help='training.precision (fp32 | bf16 | auto)')
    ap.add_argument('--teacher-dtype', choices=['fp32', 'bf16'], default='fp32', help='the teacher\'s weights (bf16: an experiment)')
    ap.add_argument('--kd-delta', action='store_true', help='measure the KD targets\' change under a bf16 teacher instead')
    ap.add_argument('--profile', action='store_true', help='profile the last step: live tensor bytes at its peak, by category')
    ap.add_argument('--trim', action='store_true', help="glibc's malloc_trim(0) after every step (an experiment)")
    ap.add_argument('--trim-blocks', action='store_true', help="glibc's malloc_trim(0) after every decoder layer's forward (an experiment)")
    ap.add_argument('--trim-threshold-mb', type=float, default=0, help="glibc's M_TRIM_THRESHOLD in MiB (0: glibc's default; an experiment)")
    ap.add_argument('--mmap-threshold-mb', type=int, default=0, help='peft.mmap_threshold_mb (adapter arms; wf_nb.lora.compact_heap)')
    ap.add_argument('--start', default='', help='a ternary checkpoint folder to start from, loaded as `wf train` loads it (default: '
                    'SmolLM2 converted in this process, no checkpoint read)')
    ap.add_argument('--teacher', default='', help="the teacher's checkpoint folder (default: the FP SmolLM2 preset)")
    ap.add_argument('--sweep', type=int, default=0, help='ROUNDS: every setting of SWEEP once per round, interleaved, and the table')
    ap.add_argument('--allocators', action='store_true', help='--sweep over ALLOCATOR_SWEEP (glibc, tcmalloc, jemalloc) instead')
    a = ap.parse_args(argv)
    if a.sweep: return sweep(a, sys.argv[1:] if argv is None else argv)
    if a.kd_delta: return kd_delta(a)
    from wf_nb.config import get_config
    from wf_nb.assets import load_fp_model
    from wf_nb.convert import convert
    from wf_nb.stages import stage3_step, _teacher, _stage_callbacks
    from wf_nb.trainer import Trainer
    from wf_nb.lora import add_lora, trainable_share, compact_heap
    torch.manual_seed(0)
    peft = [] if a.arm == 'full' else ['peft.method=lora', f'peft.r={a.r}', f'peft.alpha={2 * a.r}', 'peft.targets=q,k,v,o,gate,up,down',
                                       f"peft.checkpointing={a.arm != 'lora-nockpt'}", f'peft.mmap_threshold_mb={a.mmap_threshold_mb}']
    cfg = get_config([*peft, f'training.precision={a.precision}', f'training.max_steps={a.steps}', f'training.batch_size={a.batch_size}',
                      f'data.seq_len={a.seq_len}', 'training.save_interval=100000', 'logging.progress=false',
                      'logging.wandb_mode=disabled', 'training.lr=1e-4'], stage='3', model='smollm2_135m')
    import os
    from wf_nb.launch import loaded_allocator
    out = dict(arm=a.arm, precision=a.precision, teacher_dtype=a.teacher_dtype, rss_start_mb=rss_mb(), trim=a.trim,
               allocator=loaded_allocator() or 'glibc',
               trim_blocks=a.trim_blocks, malloc_env={k: v for k, v in os.environ.items() if k.startswith(('MALLOC_', 'GLIBC_TUNABLES'))})
    if a.trim_threshold_mb: out['trim_threshold_mb'] = a.trim_threshold_mb if set_trim_threshold(a.trim_threshold_mb) else 0
    if a.start:   # the student as `wf train ... training.checkpoint_path=START` loads it (an adapter run: straight into codes)
        from wf_nb.convert import load
        from wf_nb.lora import load_frozen
        model = (load(a.start) if a.arm == 'full' else load_frozen(a.start)).train()
    else:
        fp = load_fp_model(cfg.model)
        model = convert(fp, cfg.quant).train(); del fp
    if a.arm != 'full':
        model = add_lora(model, cfg.peft, seed=0)
        out['mmap_threshold_mb'] = a.mmap_threshold_mb if compact_heap(cfg.peft.mmap_threshold_mb) else 0   # as the stage does
        out['share'] = trainable_share(model)
        out['checkpointing'] = bool(getattr(model, 'is_activation_checkpointing', False) or getattr(model, 'is_gradient_checkpointing', False))
    if a.trim_blocks: out['trim_blocks'] = trim_after_blocks(model)
    out['rss_student_mb'] = rss_mb()
    teacher = _teacher(cfg, a.teacher or 'smollm2_135m')   # the stage's loader of a frozen FP teacher
    if a.teacher_dtype == 'bf16': teacher = teacher.to(torch.bfloat16)
    out['teacher_mb'] = tensor_mb([*teacher.parameters(), *teacher.buffers()])
    out['rss_teacher_mb'] = rss_mb()
    out['load_peak_mb'] = peak_mb()
    with tempfile.TemporaryDirectory() as d:
        tr = Trainer(cfg, model, batches(a), d, step_fn=stage3_step(teacher), log=lambda *x, **k: None,
                     callbacks=[*_stage_callbacks(cfg, model), probe(a.steps, out, a.profile, a.trim)])
        try: tr.fit(resume=False)
        except _Done: pass
    out['process_peak_mb'] = max(out['load_peak_mb'], out['train_peak_mb'])   # loading and training: the whole process's peak
    print(json.dumps(out))


if __name__ == '__main__': main()
