"""Where a Stage-3 (BitDistill) step points (issue 37): the gradient of each loss term on the student's weights, for
batches of the genre task's training split, under bf16 autocast and in fp32.

Prints, per batch and as the mean over batches: the norm of the CE + logits-KD gradient and of the relation term's
(gamma_attn * L_AD, the difference of the loss with and without it), the cosine between them, and the cosine of each
between bf16 autocast and fp32 (1.0: autocast does not change the direction). The loss is `wf_nb.stages.stage3_step`'s:
the same scored positions, the same `stage3_loss`, the same captured Q/K/V at `distill.attn_layer`.

    OMP_NUM_THREADS=1 python tests/benchmarks/bench_stage3_grads.py --student START --teacher FP_SFT_RUN/final [--batches 2] [--gamma 1e5]
"""
from __future__ import annotations
import argparse, statistics as st
import torch


def flat_grad(model) -> torch.Tensor:
    return torch.cat([p.grad.flatten().double() for p in model.parameters() if p.grad is not None])


def cos(a, b) -> float: return float(a @ b / (a.norm() * b.norm()))   # float64: 1e8 terms


def step_grad(student, teacher, batch, cfg, bf16: bool, gamma: float) -> torch.Tensor:
    "The flat gradient of Stage 3's loss on `batch` at relation weight `gamma` (stage3_step's positions and terms)."
    from wf_nb.distill import stage3_loss, capture_qkv, real_tokens
    student.zero_grad()
    nxt = batch['labels'][:, 1:] != -100
    sel = torch.cat([nxt, torch.zeros_like(nxt[:, :1])], 1)
    kw = dict(input_ids=batch['input_ids'], attention_mask=batch['attention_mask'])
    with torch.autocast('cpu', dtype=torch.bfloat16, enabled=bf16):
        with torch.no_grad(), capture_qkv(teacher, cfg.attn_layer) as tq: t = teacher(**kw).logits[sel]
        with capture_qkv(student, cfg.attn_layer) as sq: s = student(**kw).logits[sel]
        loss = stage3_loss(s, t, batch['labels'][:, 1:][nxt], real_tokens(batch), sq if gamma else None,
                           tq if gamma else None, cfg=cfg, gamma_attn=gamma)['loss']
    loss.backward()
    return flat_grad(student)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--student', required=True); ap.add_argument('--teacher', required=True)
    ap.add_argument('--batches', type=int, default=2); ap.add_argument('--batch-size', type=int, default=8)
    ap.add_argument('--seq-len', type=int, default=128)
    ap.add_argument('--gamma', type=float, default=None, help="distill.gamma_attn (default: the config's)")
    a = ap.parse_args()
    import wf_nb
    from wf_nb.config import get_config
    from wf_nb.assets import load_tokenizer
    from wf_nb.tasks import shakespeare_genre, encode_classification, collate, GENRE_TASK
    cfg = get_config(model='smollm2_135m', stage='3').distill
    gamma = cfg.gamma_attn if a.gamma is None else a.gamma
    tok = load_tokenizer(get_config(model='smollm2_135m').model)
    torch.manual_seed(0)
    student, teacher = wf_nb.load(a.student).train(), wf_nb.load(a.teacher).eval()
    rows = shakespeare_genre('train')
    g = torch.Generator().manual_seed(0)
    res = []
    for b in range(a.batches):
        pick = torch.randperm(len(rows), generator=g)[:a.batch_size].tolist()
        batch = collate([encode_classification(tok, rows[i]['text'], rows[i]['label'], GENRE_TASK, a.seq_len) for i in pick],
                        tok.pad_token_id, a.seq_len)
        g32, n32 = step_grad(student, teacher, batch, cfg, False, gamma), step_grad(student, teacher, batch, cfg, False, 0.0)
        g16, n16 = step_grad(student, teacher, batch, cfg, True, gamma), step_grad(student, teacher, batch, cfg, True, 0.0)
        r32, r16 = g32 - n32, g16 - n16
        res.append(dict(task=float(n32.norm()), rel=float(r32.norm()), rel_vs_task=cos(r32, n32), total_vs_task=cos(g32, n32),
                        bf16_total=cos(g16, g32), bf16_task=cos(n16, n32), bf16_rel=cos(r16, r32)))
        print(f"batch {b}: " + ', '.join(f'{k} {v:.4g}' for k, v in res[-1].items()), flush=True)
    m = {k: st.mean(r[k] for r in res) for k in res[0]}
    print(f"\nStage-3 gradient at gamma_attn {gamma:g}, {a.batches} genre batches of {a.batch_size} x <= {a.seq_len} (means)\n")
    print('| CE + KD grad norm | relation grad norm | cos(relation, CE + KD) | cos(total, CE + KD) | cos bf16 vs fp32: total / CE + KD / relation |')
    print('|---|---|---|---|---|')
    print(f"| {m['task']:.1f} | {m['rel']:.1f} | {m['rel_vs_task']:.3f} | {m['total_vs_task']:.3f} | "
          f"{m['bf16_total']:.4f} / {m['bf16_task']:.4f} / {m['bf16_rel']:.4f} |")


if __name__ == '__main__':
    main()
