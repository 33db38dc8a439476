"""Peak training memory and s/step of one Stage-3 (BitDistill) step loop on SmolLM2-135M, full vs LoRA (issue 37), one arm
per process (peak RSS is per process): the Stage-3 step of wf_nb.stages on random 8 x 128 batches scored on their last
2 positions (the genre task's answer + EOS; --scored 0: every position), AdamW on the trainable parameters, a few steps, fp32 on CPU. It separates what the peak is made of: RSS after
the student, after the teacher, the peak while loading/converting, and the peak over the training steps (reset after
loading, so the conversion's transient fp32 copies do not count).

    for arm in full lora lora-nockpt; do OMP_NUM_THREADS=1 python tests/benchmarks/bench_lora_memory.py --arm $arm; done
"""
from __future__ import annotations
import argparse, json, resource, time
from types import SimpleNamespace
import torch


def rss_mb() -> float:
    return int(open('/proc/self/statm').read().split()[1]) * resource.getpagesize() / 2**20

def peak_mb() -> float:
    "The peak RSS since the last `reset_peak` (VmHWM)."
    return next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM')) / 1024

def reset_peak():
    "Start a new peak RSS (Linux: 5 > /proc/self/clear_refs), so the training peak excludes loading and conversion."
    with open('/proc/self/clear_refs', 'w') as f: f.write('5')


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--arm', choices=['full', 'lora', 'lora-nockpt'], required=True)
    ap.add_argument('--r', type=int, default=16); ap.add_argument('--steps', type=int, default=3)
    ap.add_argument('--batch-size', type=int, default=8); ap.add_argument('--seq-len', type=int, default=128)
    ap.add_argument('--scored', type=int, default=2, help='positions with a label at the end of each row (the genre task: '
                    'the answer and EOS); 0: every position (pretraining-like)')
    a = ap.parse_args(argv)
    from wf_nb.config import get_config
    from wf_nb.assets import load_fp_model
    from wf_nb.convert import convert
    from wf_nb.stages import stage3_step
    from wf_nb.lora import add_lora, trainable_share
    torch.manual_seed(0)
    cfg = get_config(['peft.method=lora', f'peft.r={a.r}', f'peft.alpha={2 * a.r}', 'peft.targets=q,k,v,o,gate,up,down',
                      f"peft.checkpointing={a.arm != 'lora-nockpt'}"], model='smollm2_135m')
    out = dict(arm=a.arm, rss_start_mb=rss_mb())
    fp = load_fp_model(cfg.model)
    model = convert(fp, cfg.quant).train(); del fp
    if a.arm != 'full':
        model = add_lora(model, cfg.peft, seed=0)
        out['share'] = trainable_share(model)
        out['checkpointing'] = bool(getattr(model, 'is_activation_checkpointing', False))
    out['rss_student_mb'] = rss_mb()
    teacher = load_fp_model(cfg.model).eval()
    for p in teacher.parameters(): p.requires_grad_(False)
    out['rss_teacher_mb'] = rss_mb()
    out['load_peak_mb'] = peak_mb()
    reset_peak()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    step, ctx = stage3_step(teacher), SimpleNamespace(cfg=cfg, step=0, max_steps=a.steps)
    ts = []
    for i in range(a.steps):
        ids = torch.randint(0, 49152, (a.batch_size, a.seq_len))
        t0 = time.perf_counter()
        labels = ids.clone()
        if a.scored: labels[:, :-a.scored] = -100
        loss = step(model, {'input_ids': ids, 'labels': labels, 'attention_mask': torch.ones_like(ids)}, ctx)['loss']
        loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
        ts.append(time.perf_counter() - t0)
    out.update(train_peak_mb=peak_mb(), s_per_step=sorted(ts)[len(ts) // 2], step_s=[round(t, 1) for t in ts], loss=float(loss.detach()))
    print(json.dumps(out))


if __name__ == '__main__': main()
