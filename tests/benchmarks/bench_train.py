"""Stage-2 training throughput and peak memory on SmolLM2-135M-Instruct (Q4_1), batch 4 x 128, side by side.

Arms (each in its own process, so peak RSS is the arm's own; the same real Shakespeare batches for all):
  fp                  the unquantized Llama model, plain AdamW loop
  hf_autobitlinear    transformers' replace_with_bitnet_linear (autobitlinear, online), plain loop
  hf_trainer          the same model trained by transformers' Trainer
  wf_bitlinear        wf_nb's converted model (SubLN + BitLinear), plain loop
  wf_trainer          wf_nb's converted model trained by wf_nb's Trainer (Stage 2 loss, metrics, no checkpoints)
  wf_fakequant        wf_bitlinear with the fake-quant forward (WF_NB_INT_FORWARD=0, the transformers-exact path)
  wf_cublas           wf_bitlinear with the GEMM + rescale through cuBLAS `_int_mm` instead of the fused Triton kernel (CUDA)
  fp_compiled, hf_compiled, wf_compiled, wf_trainer_compiled
                      fp / hf_autobitlinear / wf_bitlinear / wf_trainer with each decoder block compiled (wf_nb.trainer.compile_blocks,
                      `training.compile=true`); the compilation happens in the warm-up steps (--warmup 2 at least)
  fp_trainer, fp_trainer_compiled
                      the FP model trained by wf_nb's Trainer (eager / `training.compile=true`): the like-for-like peer of
                      wf_trainer / wf_trainer_compiled, same loop, same loss, same metrics
  wf_nosubln_compiled wf_compiled converted with quant.placement=none: wf_nb's BitLinear in transformers' layout (no SubLN),
                      the like-for-like peer of hf_compiled

    python tests/benchmarks/bench_train.py [--steps 6] [--warmup 2] [--precisions fp32,bf16] [--arms ...] [--repeats 3]
    python tests/benchmarks/bench_train.py --profile wf_bitlinear [--precisions bf16]   # where the time goes
    python tests/benchmarks/bench_train.py --split 4 --precisions bf16   # fp vs wf_nb in one process, fwd / bwd apart
    python tests/benchmarks/bench_train.py --saved --precisions bf16     # tensor memory at the end of the forward
    python tests/benchmarks/bench_train.py --codes-ab 6 --grad-accum 4 --precisions bf16   # weight codes per step vs per micro-batch
    python tests/benchmarks/bench_train.py --device cuda --config DIR --batch-size 16 --seq-len 1024 --precisions bf16
        # on a GPU: the model built from DIR/config.json with random weights and random tokens (no gguf, no text
        # needed), tokens/s (wall, synchronized), MFU against the card's dense bf16 peak, peak CUDA memory

Arms are interleaved: each of `--repeats` rounds runs every arm once (the order rotated per round), so a ratio to
`fp` is taken within a round, against the fp run next to it. Prints a table of median tokens/s (wall) and tokens
per CPU-second (process CPU time, steadier than wall time when other processes share the cores), the ratio to `fp`
at the same precision (median over rounds, and the min-max spread), the process's peak RSS (model conversion
included) and the peak RSS of the training steps alone (counted from after the model is built; Linux only).
Every arm runs without a KV cache (`use_cache=False`), as training does.
`--profile ARM` runs one arm under torch.profiler and prints the time per layer kind (forward, from module hooks)
and the top operators (forward and backward).
`--saved` counts tensor memory where training peaks, at the end of the forward: every storage saved for the backward
(parameters apart) plus the quantization state a model keeps between steps (wf_nb's weight codes). Unlike RSS, it
does not depend on what the allocator kept from building the model.
This is a benchmark, not a test: the machine is shared and noisy, so read the ratios, not the absolutes.
Run with OMP_NUM_THREADS=1 on a loaded machine so CPU time is not inflated by spinning threads."""
import argparse, json, os, statistics, subprocess, sys, tempfile, time
from pathlib import Path

B, S = 4, 128          # batch and sequence length (--batch-size, --seq-len)
ACCUM = 1              # micro-batches per optimizer step (--grad-accum)
DEVICE, CONFIG = 'cpu', None   # --device; --config: a HF config.json (or its folder) for a random-weight model
ARMS = ['fp', 'hf_autobitlinear', 'hf_trainer', 'wf_bitlinear', 'wf_trainer', 'wf_fakequant']

def watch_optimizer(opt):
    "A fused optimizer updates weights without bumping their versions: have it tell wf_nb's cached weight codes."
    from wf_nb.quant import watch_optimizer as watch
    return watch(opt)

def batches(n, seed=0):
    import torch
    if CONFIG:   # random tokens: speed does not depend on what the tokens say
        g = torch.Generator().manual_seed(seed)
        vocab = fp_model_config().vocab_size
        return [{'input_ids': (x := torch.randint(0, vocab, (B, S), generator=g)), 'labels': x.clone()} for _ in range(n)]
    from wf_nb.assets import load_tokenizer, shakespeare_files
    from wf_nb.config import get_config
    tok = load_tokenizer(get_config().model)
    ids = tok(shakespeare_files()[0].read_text()[:400_000]).input_ids
    g = torch.Generator().manual_seed(seed)
    t = torch.tensor(ids)
    out = []
    for _ in range(n):
        starts = torch.randint(0, len(ids) - S - 1, (B,), generator=g)
        x = torch.stack([t[s:s + S] for s in starts])
        out.append({'input_ids': x, 'labels': x.clone()})
    return out

def peak_rss_mb():
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

def reset_peak_rss():
    "Linux: restart the peak-RSS count (VmHWM), so the training peak is not the model conversion's."
    try: open('/proc/self/clear_refs', 'w').write('5'); return True
    except OSError: return False

def train_peak_rss_mb():
    for line in open('/proc/self/status'):
        if line.startswith('VmHWM:'): return int(line.split()[1]) / 1024

def fp_model_config():
    from transformers import AutoConfig
    return AutoConfig.from_pretrained(Path(CONFIG).parent if Path(CONFIG).is_file() else CONFIG)

def fp_model():
    import torch
    if CONFIG:
        from transformers import AutoModelForCausalLM
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_config(fp_model_config(), dtype=torch.float32).train()
    from wf_nb.assets import load_fp_model
    from wf_nb.config import get_config
    return load_fp_model(get_config().model).train()

def sync():
    import torch
    if DEVICE == 'cuda': torch.cuda.synchronize()

def hf_bitnet(model):
    import torch
    from transformers.integrations.bitnet import replace_with_bitnet_linear
    from transformers import BitNetQuantConfig
    sd = model.state_dict()
    qc = BitNetQuantConfig(linear_class='autobitlinear', quantization_mode='online')
    replace_with_bitnet_linear(model, modules_to_not_convert=['lm_head'], quantization_config=qc)
    model.load_state_dict(sd, assign=True, strict=True)
    model.tie_weights()
    return model.train()

def wf_bitnet(model, placement='paper'):
    from wf_nb.convert import convert
    from wf_nb.config import get_config
    return convert(model, get_config([f'quant.placement={placement}']).quant).train()

def arm_model(arm):
    "The model `arm` trains: FP, transformers' AutoBitLinear or wf_nb's BitLinear, with the arm's forward switches set."
    model = fp_model()
    if arm.startswith('hf_'): model = hf_bitnet(model)
    if arm.startswith('wf_'): model = wf_bitnet(model, 'none' if 'nosubln' in arm else 'paper')
    if arm == 'wf_fakequant':
        from wf_nb.quant import BitLinear; BitLinear.int_forward = False
    if arm == 'wf_cublas':
        from wf_nb.quant import _INT_RESCALE; _INT_RESCALE.pop(DEVICE, None)
    if arm in ('fp_compiled', 'hf_compiled', 'wf_compiled', 'wf_nosubln_compiled'):
        from wf_nb.parallel import compile_blocks; compile_blocks(model, codes_per_step=ACCUM > 1)   # the Trainer's rule
    return model

def plain_loop(model, data, precision, warmup, opt=None):
    import torch
    opt = opt or watch_optimizer(torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True))
    times = []
    for i in range(len(data) // ACCUM):   # one optimizer step per ACCUM micro-batches
        micro = [{k: v.to(DEVICE) for k, v in b.items()} for b in data[i * ACCUM:(i + 1) * ACCUM]]
        sync(); t0, c0 = time.perf_counter(), time.process_time()
        for b in micro:
            with torch.autocast(DEVICE, dtype=torch.bfloat16, enabled=precision == 'bf16'):
                loss = model(**b, use_cache=False).loss   # training: no KV cache (a compiled block would recompile on its state)
            (loss / ACCUM).backward()
        opt.step(); opt.zero_grad(set_to_none=True)
        sync()
        if i >= warmup: times.append((time.perf_counter() - t0, time.process_time() - c0))
    return times

def hf_trainer_loop(model, data, precision, warmup):
    import torch
    from transformers import Trainer, TrainingArguments, TrainerCallback
    times, t = [], {}
    class Clock(TrainerCallback):
        def on_step_begin(self, *a, **k): t['t0'], t['c0'] = time.perf_counter(), time.process_time()
        def on_step_end(self, args, state, *a, **k):
            if state.global_step > warmup: times.append((time.perf_counter() - t['t0'], time.process_time() - t['c0']))
    class DS(torch.utils.data.Dataset):
        def __len__(self): return len(data) * B
        def __getitem__(self, i): b = data[i // B]; return {k: v[i % B] for k, v in b.items()}
    with tempfile.TemporaryDirectory() as d:
        args = TrainingArguments(output_dir=d, per_device_train_batch_size=B, max_steps=len(data) // ACCUM, learning_rate=1e-5,
                                 gradient_accumulation_steps=ACCUM,
                                 bf16=precision == 'bf16', use_cpu=DEVICE == 'cpu', report_to=[], save_strategy='no', logging_strategy='no',
                                 dataloader_num_workers=0, disable_tqdm=True, optim='adamw_torch_fused')
        Trainer(model=model, args=args, train_dataset=DS(), callbacks=[Clock()]).train()
    return times

def wf_trainer_loop(model, data, precision, warmup, on_step=None, compile=False):
    from wf_nb.config import get_config
    from wf_nb.trainer import Trainer, ListStream
    import torch
    cfg = get_config([f'training.max_steps={len(data) // ACCUM}', f'training.grad_accum={ACCUM}', f'training.batch_size={B}', f'data.seq_len={S}', 'training.lr=1e-5',
                      f'training.precision={precision}', 'training.save_interval=100000', 'logging.interval=1',
                      'logging.progress=false', 'logging.wandb_mode=disabled', f'training.compile={compile}'], stage='2')
    rows = torch.cat([b['input_ids'] for b in data])
    marks = []
    with tempfile.TemporaryDirectory() as d:
        from wf_nb.callbacks import QuantSchedule   # BitNet's lambda warm-up, as the stages add it
        tr = Trainer(cfg, model, ListStream(rows, B), d, log=lambda *a: None, callbacks=[QuantSchedule()])
        tr.save = lambda *a, **k: None   # measure training, not checkpoint writes
        step = tr.train_step
        def timed():   # the time between consecutive step starts = one whole step (optimizer and metrics included)
            sync(); marks.append((time.perf_counter(), time.process_time()))
            if on_step: on_step(len(marks) - 1)
            return step()
        tr.train_step = timed
        tr.fit(resume=False)
        sync(); marks.append((time.perf_counter(), time.process_time()))
    return [(b[0] - a[0], b[1] - a[1]) for a, b in zip(marks, marks[1:])][warmup:]

def one(arm, precision, steps, warmup):
    import torch
    torch.manual_seed(0)
    data = batches((steps + warmup) * ACCUM)
    model = arm_model(arm)
    run = {'fp': plain_loop, 'hf_autobitlinear': plain_loop, 'wf_bitlinear': plain_loop, 'wf_fakequant': plain_loop,
           'wf_cublas': plain_loop, 'hf_trainer': hf_trainer_loop, 'wf_trainer': wf_trainer_loop,
           'fp_compiled': plain_loop, 'hf_compiled': plain_loop, 'wf_compiled': plain_loop, 'wf_nosubln_compiled': plain_loop,
           'wf_trainer_compiled': lambda *a: wf_trainer_loop(*a, compile=True), 'fp_trainer': wf_trainer_loop,
           'fp_trainer_compiled': lambda *a: wf_trainer_loop(*a, compile=True)}[arm]
    flops_per_token = None
    if DEVICE == 'cuda':
        from wf_nb.callbacks import train_flops_per_token, peak_flops
        flops_per_token, peak = train_flops_per_token(model, S), peak_flops('cuda')
        if not arm.startswith(('wf_trainer', 'hf_trainer', 'fp_trainer')): model.to(DEVICE)
    import gc; gc.collect()
    fresh = reset_peak_rss()
    if DEVICE == 'cuda': torch.cuda.reset_peak_memory_stats()
    times = run(model, data, precision, warmup)
    tps = ACCUM * B * S / statistics.median(w for w, c in times)
    print(json.dumps({'train_peak_rss_mb': train_peak_rss_mb() if fresh else None, 'arm': arm, 'precision': precision, 'tokens_per_s': tps,
                      'tokens_per_cpu_s': ACCUM * B * S / statistics.median(c for w, c in times),
                      'steps_timed': len(times), 'peak_rss_mb': peak_rss_mb(), 'threads': torch.get_num_threads(),
                      'cuda_peak_mb': torch.cuda.max_memory_allocated() / 2**20 if DEVICE == 'cuda' else None,
                      'mfu': tps * flops_per_token / peak if DEVICE == 'cuda' and peak else None,
                      'device': torch.cuda.get_device_name() if DEVICE == 'cuda' else 'cpu'}))

def layer_kind(name):
    leaf = name.rsplit('.', 1)[-1]
    return 'lm_head' if leaf == 'lm_head' else leaf if leaf.endswith(('_proj', 'norm', 'embed_tokens')) else None

def _dev_time(e, self_=True):
    "An event's (self) device time in us, across torch versions (`device_time` replaced `cuda_time`)."
    for k in (('self_device_time_total', 'self_cuda_time_total') if self_ else ('device_time_total', 'cuda_time_total')):
        v = getattr(e, k, None)
        if v is not None: return v
    return 0

def profile(arm, precision, steps, warmup):
    "One arm under torch.profiler: forward time per layer kind (module hooks) and the top operators (CPU; and kernels on CUDA)."
    import torch
    from torch.profiler import profile as tprofile, record_function, ProfilerActivity
    torch.manual_seed(0)
    data = batches(warmup + 1)
    model = arm_model(arm)
    open_ = {}
    def pre(name):
        def f(m, a): open_[name] = record_function(f'fwd::{layer_kind(name)}'); open_[name].__enter__()
        return f
    def post(name):
        def f(m, a, o): open_.pop(name).__exit__(None, None, None)
        return f
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEVICE == 'cuda' else [])
    prof = tprofile(activities=acts)
    if arm.startswith(('wf_trainer', 'fp_trainer')):   # the whole Trainer step (metrics, clipping, logging); profile the step after the warm-up
        for n, m in model.named_modules():
            if layer_kind(n): m.register_forward_pre_hook(pre(n)); m.register_forward_hook(post(n))
        def on_step(i):
            if i == warmup: prof.start(); t0[0] = time.perf_counter()
        t0 = [0.0]
        wf_trainer_loop(model, data, precision, warmup, on_step, compile=arm.endswith('_compiled'))   # last mark after a sync: one whole step
        sync(); wall = time.perf_counter() - t0[0]; prof.stop()
    else:
        model.to(DEVICE)
        opt = watch_optimizer(torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True))
        plain_loop(model, data[:warmup], precision, warmup, opt)   # one optimizer: its state is made in the warm-up, not profiled
        for n, m in model.named_modules():
            if layer_kind(n): m.register_forward_pre_hook(pre(n)); m.register_forward_hook(post(n))
        prof.start(); t0 = time.perf_counter()
        plain_loop(model, data[warmup:], precision, 0, opt)
        wall = time.perf_counter() - t0; prof.stop()
    ev = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in ev) / 1e3
    gpu = DEVICE == 'cuda'
    kernels = {}   # GPU kernel name -> [launches, us]: device-side events that are not record_function annotations
    for e in (prof.events() if gpu else []):
        if str(e.device_type).endswith('CUDA') and not getattr(e, 'is_user_annotation', False):
            k = kernels.setdefault(e.name, [0, 0.0]); k[0] += 1; k[1] += e.time_range.elapsed_us()
    kern = sum(us for _, us in kernels.values()) / 1e3
    print(f"\n{arm} / {precision} on {DEVICE}: one training step, {wall * 1e3:.0f} ms wall, {total:.0f} ms CPU in all"
          + (f", {kern:.0f} ms of GPU kernels (the GPU idles {max(0, 1 - kern / (wall * 1e3)):.0%} of the step)" if gpu else '') + "\n")
    # on CUDA each range is also a GPU-side annotation (no CPU time): the span from its first kernel to its last, gaps included
    span = {e.key: _dev_time(e, False) for e in ev if e.key.startswith('fwd::') and e.cpu_time_total == 0}
    print("| forward of layer kind | CPU ms | share |" + (" GPU kernels ms | GPU span ms |" if gpu else '') + "\n|---|---|---|" + ("---|---|" if gpu else ''))
    for e in sorted((e for e in ev if e.key.startswith('fwd::') and e.cpu_time_total > 0), key=lambda e: -e.cpu_time_total):
        print(f"| {e.key[5:]} | {e.cpu_time_total / 1e3:.1f} | {e.cpu_time_total / 1e3 / total:.1%} |"
              + (f" {_dev_time(e, False) / 1e3:.1f} | {span.get(e.key, 0) / 1e3:.1f} |" if gpu else ''))
    print("\n| operator (self time, forward + backward) | calls | CPU ms | share |\n|---|---|---|---|")
    for e in sorted((e for e in ev if not e.key.startswith('fwd::') and e.self_cpu_time_total > 0), key=lambda e: -e.self_cpu_time_total)[:18]:
        print(f"| {e.key} | {e.count} | {e.self_cpu_time_total / 1e3:.1f} | {e.self_cpu_time_total / 1e3 / total:.1%} |")
    if gpu:
        print(f"\n| GPU kernel | calls | GPU ms | share of {kern:.0f} ms |\n|---|---|---|---|")
        for name, (n, us) in sorted(kernels.items(), key=lambda kv: -kv[1][1])[:24]:
            print(f"| {name[:90]} | {n} | {us / 1e3:.2f} | {us / 1e3 / kern:.1%} |")

def split(rounds, precision):
    "fp, wf_nb (integer forward) and wf_nb (fake-quant forward) in ONE process, steps alternating: thread CPU-s of forward / backward."
    import torch
    from wf_nb.quant import BitLinear
    torch.manual_seed(0)
    data = batches(2)
    models = {'fp': fp_model(), 'wf': wf_bitnet(fp_model())}
    opts = {k: watch_optimizer(torch.optim.AdamW(m.parameters(), lr=1e-5, fused=True)) for k, m in models.items()}
    res = {'fp': [], 'wf_bitlinear': [], 'wf_fakequant': []}
    for r in range(rounds + 1):   # round 0 warms up
        for arm in res:
            BitLinear.int_forward = arm != 'wf_fakequant'
            m, o = models[arm[:2]], opts[arm[:2]]
            c0 = time.thread_time()
            with torch.autocast('cpu', dtype=torch.bfloat16, enabled=precision == 'bf16'): loss = m(**data[r % 2]).loss
            c1 = time.thread_time(); loss.backward(); c2 = time.thread_time()
            o.step(); o.zero_grad(set_to_none=True)
            if r: res[arm].append((time.thread_time() - c0, c1 - c0, c2 - c1))
    med = lambda arm, i: statistics.median(x[i] for x in res[arm])
    print(f"\nOne process, {rounds} alternating rounds, {precision}: median thread CPU-s per step\n")
    print("| arm | step | forward | backward | vs fp |\n|---|---|---|---|---|")
    for arm in res:
        print(f"| {arm} | {med(arm, 0):.2f} | {med(arm, 1):.2f} | {med(arm, 2):.2f} | {med('fp', 0) / med(arm, 0):.2f}x |")

def codes_ab(rounds, precision):
    "Compiled wf_nb model, ACCUM micro-batches per step: weight codes from the per-step cache against quantized in the graph by every micro-batch, steps alternating in ONE process."
    import torch
    from wf_nb.quant import bitlinears
    from wf_nb.parallel import compile_blocks
    torch.manual_seed(0)
    model = wf_bitnet(fp_model()); compile_blocks(model)
    layers, data = [m for _, m in bitlinears(model)], batches(2 * ACCUM)
    opt = watch_optimizer(torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True))
    def step(cached, k):
        for m in layers: m.codes_per_step = cached   # False: the compiled forward quantizes its weight itself (a second graph)
        c0 = time.thread_time()
        for i in range(ACCUM):
            with torch.autocast(DEVICE, dtype=torch.bfloat16, enabled=precision == 'bf16'):
                loss = model(**data[(k * ACCUM + i) % len(data)], use_cache=False).loss
            (loss / ACCUM).backward()
        opt.step(); opt.zero_grad(set_to_none=True)
        return time.thread_time() - c0
    for k in range(2): step(True, k); step(False, k)   # compiles both variants
    res = {True: [], False: []}
    for k in range(rounds):
        for v in ((True, False) if k % 2 else (False, True)): res[v].append(step(v, k))
    tok, med = ACCUM * B * S, {v: statistics.median(t) for v, t in res.items()}
    print(f"\nWeight codes, compiled, {precision}, {ACCUM} micro-batches of {B} x {S} per step, {rounds} alternating rounds\n")
    ratios = [a / b for a, b in zip(res[False], res[True])]   # paired: each round's two steps ran back to back
    print("| weight codes | tokens per thread CPU-s | vs in-graph (median of the rounds' ratios) | per-round ratios |\n|---|---|---|---|")
    print(f"| in the graph, every micro-batch | {tok / med[False]:.0f} | 1.00x | |")
    print(f"| per optimizer step (cache) | {tok / med[True]:.0f} | {statistics.median(ratios):.3f}x | "
          + ", ".join(f"{r:.2f}" for r in ratios) + " |")

def saved(arms, precision):
    "Tensor memory at the end of one forward: storages saved for the backward (not parameters) + persistent quant state."
    import torch
    rows = []
    for arm in arms:
        torch.manual_seed(0)
        model = arm_model(arm)
        storages = {}
        def pack(t): storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes(); return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            with torch.autocast('cpu', dtype=torch.bfloat16, enabled=precision == 'bf16'): loss = model(**batches(1)[0]).loss
        params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        act = sum(n for ptr, n in storages.items() if ptr not in params)
        state = sum(m._wq_cache[1].nbytes + m._wq_cache[2].nbytes for m in model.modules() if hasattr(m, '_wq_cache'))
        rows.append((arm, act / 2**20, state / 2**20))
        del model, loss
    fp = next((a + s for arm, a, s in rows if arm == 'fp'), None)
    print(f"\nTensor memory at the end of the forward, {precision}, batch {B} x {S} (MiB)\n")
    print("| arm | saved for backward | quant state kept between steps | total | vs fp |\n|---|---|---|---|---|")
    for arm, a, s in rows: print(f"| {arm} | {a:.0f} | {s:.0f} | {a + s:.0f} | {(a + s) / fp:.2f}x |" if fp else f"| {arm} | {a:.0f} | {s:.0f} | {a + s:.0f} | |")

def main():
    global B, S, DEVICE, CONFIG, ACCUM
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--steps', type=int, default=6); ap.add_argument('--warmup', type=int, default=2)
    ap.add_argument('--precisions', default='fp32,bf16'); ap.add_argument('--arms', default=','.join(ARMS))
    ap.add_argument('--repeats', type=int, default=1, help='rounds of all arms, interleaved')
    ap.add_argument('--one', nargs=2, metavar=('ARM', 'PRECISION'))
    ap.add_argument('--profile', metavar='ARM')
    ap.add_argument('--split', type=int, metavar='ROUNDS', help='fp / wf_bitlinear / wf_fakequant in one process, forward and backward apart')
    ap.add_argument('--codes-ab', type=int, metavar='ROUNDS', help='weight codes per step vs in the graph, compiled, in one process (use with --grad-accum)')
    ap.add_argument('--saved', action='store_true', help='tensor memory at the end of the forward, per arm (fp, hf_autobitlinear, wf_bitlinear)')
    ap.add_argument('--device', default='cpu', choices=['cpu', 'cuda'])
    ap.add_argument('--config', help='HF config.json (or its folder): a random-weight model and random tokens instead of SmolLM2 + Shakespeare')
    ap.add_argument('--batch-size', type=int, default=B); ap.add_argument('--seq-len', type=int, default=S)
    ap.add_argument('--grad-accum', type=int, default=ACCUM, help='micro-batches of --batch-size per optimizer step (tokens/s counts them all)')
    a = ap.parse_args()
    if a.grad_accum < 1: ap.error(f'--grad-accum must be at least 1, got {a.grad_accum}')
    B, S, DEVICE, CONFIG, ACCUM = a.batch_size, a.seq_len, a.device, a.config, a.grad_accum
    if DEVICE == 'cuda' and a.arms == ','.join(ARMS): a.arms = 'fp,hf_autobitlinear,wf_bitlinear,wf_cublas,wf_fakequant,wf_trainer'
    if a.saved:
        for prec in a.precisions.split(','): saved(['fp', 'hf_autobitlinear', 'wf_bitlinear'], prec)
        return
    if a.codes_ab:
        for prec in a.precisions.split(','): codes_ab(a.codes_ab, prec)
        return
    if a.split:
        for prec in a.precisions.split(','): split(a.split, prec)
        return
    if a.one: return one(*a.one, a.steps, a.warmup)
    if a.profile:
        for prec in a.precisions.split(','): profile(a.profile, prec, a.steps, a.warmup)
        return
    arms, res = a.arms.split(','), []
    for rnd in range(a.repeats):
        for prec in a.precisions.split(','):
            for arm in arms[rnd % len(arms):] + arms[:rnd % len(arms)]:
                r = subprocess.run([sys.executable, __file__, '--one', arm, prec, '--steps', str(a.steps), '--warmup', str(a.warmup),
                                    '--batch-size', str(B), '--seq-len', str(S), '--grad-accum', str(ACCUM), '--device', DEVICE] + (['--config', CONFIG] if CONFIG else []),
                                   capture_output=True, text=True, env={**os.environ, 'WANDB_MODE': 'disabled'})
                line = [l for l in r.stdout.splitlines() if l.startswith('{')]
                if r.returncode or not line: print(f"{arm}/{prec} failed:\n{r.stderr[-2000:]}", file=sys.stderr); continue
                res.append({**json.loads(line[-1]), 'round': rnd})
                r1 = res[-1]
                print(f"  round {rnd} {arm}/{prec}: {r1['tokens_per_s']:.0f} tok/s, {r1['tokens_per_cpu_s']:.0f} tok/CPU-s"
                      + (f", MFU {r1['mfu']:.1%}, peak {r1['cuda_peak_mb']:.0f} MB" if r1.get('mfu') else ''), file=sys.stderr)
    if DEVICE == 'cuda': return gpu_table(res, arms, a)
    print(f"\nStage-2 training step, {CONFIG or 'SmolLM2-135M-Instruct (Q4_1)'}, batch {B} x {S}, median of {a.steps} steps after {a.warmup} warmup, "
          f"{a.repeats} interleaved round(s), CPU {res[0]['threads'] if res else '?'} threads\n")
    print("| arm | precision | tokens/s (wall) | tokens per CPU-s | vs fp (CPU) [min-max] | vs fp (wall) | peak RSS MB | training peak RSS MB |\n|---|---|---|---|---|---|---|---|")
    med = statistics.median
    for prec in a.precisions.split(','):
        for arm in arms:
            rs = [r for r in res if r['arm'] == arm and r['precision'] == prec]
            if not rs: continue
            fp = {r['round']: r for r in res if r['arm'] == 'fp' and r['precision'] == prec}
            cpu = [r['tokens_per_cpu_s'] / fp[r['round']]['tokens_per_cpu_s'] for r in rs if r['round'] in fp]
            wall = [r['tokens_per_s'] / fp[r['round']]['tokens_per_s'] for r in rs if r['round'] in fp]
            ratio = f"{med(cpu):.2f}x [{min(cpu):.2f}-{max(cpu):.2f}]" if cpu else ''
            print(f"| {arm} | {prec} | {med(r['tokens_per_s'] for r in rs):.0f} | {med(r['tokens_per_cpu_s'] for r in rs):.0f} | {ratio} | "
                  f"{med(wall):.2f}x | {med(r['peak_rss_mb'] for r in rs):.0f} | {med(r.get('train_peak_rss_mb') or 0 for r in rs):.0f} |" if wall else '')

def gpu_table(res, arms, a):
    "The GPU table: wall tokens/s (synchronized per step), ratio to fp in the same round, MFU, peak CUDA memory."
    med = statistics.median
    print(f"\nTraining step on {res[0]['device'] if res else '?'}, {CONFIG or 'SmolLM2-135M'} (random weights), batch {B} x {S}, "
          f"median of {a.steps} steps after {a.warmup} warmup, {a.repeats} interleaved round(s)\n")
    print("| arm | precision | tokens/s | vs fp [min-max] | MFU | peak CUDA memory MB |\n|---|---|---|---|---|---|")
    for prec in a.precisions.split(','):
        fp = {r['round']: r for r in res if r['arm'] == 'fp' and r['precision'] == prec}
        for arm in arms:
            rs = [r for r in res if r['arm'] == arm and r['precision'] == prec]
            if not rs: continue
            q = [r['tokens_per_s'] / fp[r['round']]['tokens_per_s'] for r in rs if r['round'] in fp]
            mfu = med(r['mfu'] for r in rs) if rs[0]['mfu'] is not None else None
            print(f"| {arm} | {prec} | {med(r['tokens_per_s'] for r in rs):.0f} | " + (f"{med(q):.2f}x [{min(q):.2f}-{max(q):.2f}]" if q else '')
                  + f" | {f'{mfu:.1%}' if mfu is not None else ''} | {med(r['cuda_peak_mb'] for r in rs):.0f} |")

if __name__ == '__main__':
    main()
