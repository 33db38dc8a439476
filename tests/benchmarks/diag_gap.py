"""Where does a ternary student lose to its FP teacher? The diagnostics behind `nbs/07_stages.ipynb`, "Where the remaining gap is".

Each prints a table for one or more trained students (a `wf pipeline` output, or any checkpoint `wf_nb.load` reads), on
held-out text none of them trained on (`wf_nb.generality.heldout_texts`), against the FP model of the default preset:

  python tests/benchmarks/diag_gap.py quant-parts STUDENT        # perplexity with parts of the quantization switched off
  python tests/benchmarks/diag_gap.py positions STUDENT          # the loss by position in 256-token windows, teacher and student
  python tests/benchmarks/diag_gap.py attention STUDENT...       # per-layer KL between the teacher's and the students' attention maps
  python tests/benchmarks/diag_gap.py row-scale STAGE1           # per-matrix against per-row absmean scales: weight error, perplexity
  python tests/benchmarks/diag_gap.py lambda-kl STUDENT          # KL to the teacher at each lambda of the quantization ramp
  python tests/benchmarks/diag_gap.py blocks STUDENT...          # per-layer distance to the teacher's states: on its own states, and each block on the teacher's input
  python tests/benchmarks/diag_gap.py step STAGE1                # weight error and share of zeros of the ternary step c * mean|W| (quant.weight_scale),
                                                                 # and each matrix's own best step by its weight error
  python tests/benchmarks/diag_gap.py gptq STAGE1                # GPTQ-rounded latent weights: per-layer output error, and the model at lambda 1 and 0

One thread, fp32 (the numbers in the notebook were taken so, beside training jobs)."""
import argparse, contextlib, sys
from pathlib import Path
import torch, torch.nn.functional as F
sys.path.insert(0, str(Path(__file__).parent))
import wf_nb.quant as Q
from wf_nb.convert import load
from wf_nb.assets import load_tokenizer, load_fp_model
from wf_nb.generality import heldout_texts, generality_ppl
from bench_quality import cfg_for

DOMAINS = ['dictionary', 'quotations', 'manuals', 'structured_data']

def windows(tok, domains=DOMAINS, per_domain: int = 8, seq: int = 256) -> torch.Tensor:
    "`per_domain` consecutive `seq`-token windows from each held-out domain: `[len(domains) * per_domain, seq]`."
    texts, rows = heldout_texts(), []
    for d in domains:
        ids = tok('\n\n'.join(texts[d])).input_ids[:seq * per_domain]
        rows += [ids[i:i + seq] for i in range(0, len(ids) - seq + 1, seq)]
    return torch.tensor(rows)

def teacher(): return load_fp_model(cfg_for().model).float().eval()
def student(path): return load(path).float().eval()

def ppl_row(name, m, tok, tokens):
    r = generality_ppl(m, tok, {d: t for d, t in heldout_texts().items() if d in DOMAINS}, max_tokens=tokens, seq_len=256, autocast=False)
    print(f"| {name} | " + ' | '.join(f'{v:.1f}' for v in r.values()) + ' |', flush=True)

def table_head(first): print(f"| {first} | " + ' | '.join(DOMAINS) + ' |\n|' + '---|' * (len(DOMAINS) + 1))

def quant_parts(a, tok):
    "Perplexity as trained, then with int8 activations off, then with the latent weights in place of the ternary ones."
    m, bl = student(a.paths[0]), None
    bl = [x for x in m.modules() if isinstance(x, Q.BitLinear)]
    table_head('student, on held-out text (perplexity)')
    ppl_row('as trained', m, tok, a.tokens)
    Q.BitLinear.int_forward = False   # the fake-quant path, whose parts can be switched off one by one
    for x in bl: x.act_bits = 0
    ppl_row('ternary weights, fp activations', m, tok, a.tokens)
    for x in bl: x.act_bits = 8
    Q.weight_quant_compiled = lambda w, c=1.0: w
    ppl_row('latent fp weights, int8 activations', m, tok, a.tokens)

@torch.no_grad()
def token_nll(m, x, batch: int = 4) -> torch.Tensor:
    "Per-token NLL `[rows, seq - 1]`."
    out = [F.cross_entropy(m(x[i:i + batch]).logits[:, :-1].float().transpose(1, 2), x[i:i + batch, 1:], reduction='none')
           for i in range(0, len(x), batch)]
    return torch.cat(out)

def positions(a, tok):
    x = windows(tok)
    t, s = token_nll(teacher(), x), token_nll(student(a.paths[0]), x)
    print('| positions | teacher NLL | student NLL | gap |\n|---|---|---|---|')
    for lo, hi in [(0, 32), (32, 64), (64, 127), (127, 160), (160, 200), (200, 255)]:
        print(f'| {lo + 1}-{hi} | {t[:, lo:hi].mean():.2f} | {s[:, lo:hi].mean():.2f} | {s[:, lo:hi].mean() - t[:, lo:hi].mean():.2f} |')

@torch.no_grad()
def attention_maps(m, x) -> list[torch.Tensor]:
    "Each layer's causal attention log-probabilities `[B, H, S, S]`, from its captured post-RoPE q and k."
    from wf_nb.distill import capture_qkv, decoder_layers
    out = []
    with contextlib.ExitStack() as st:
        sinks = [st.enter_context(capture_qkv(m, i)) for i in range(len(decoder_layers(m)))]
        m(x)
        for s in sinks:
            q, k = s['q'].float(), s['k'].float()
            k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)   # GQA
            sc = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
            n = sc.shape[-1]
            out.append(F.log_softmax(sc.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float('-inf')), -1))
    return out

def attention(a, tok):
    x = windows(tok, per_domain=2)
    t = attention_maps(teacher(), x)
    xlogx = lambda p, l: torch.where(p.isinf(), 0., p.exp() * l)   # 0 log 0 = 0 on the masked keys
    ent = [(-xlogx(l, l).sum(-1))[..., 8:].mean().item() for l in t]   # rows with 8+ keys
    print('| model | KL(teacher || model) per layer, nats | mean |\n|---|---|---|')
    for path in a.paths:
        kls = [xlogx(lt, lt - ls).sum(-1)[..., 8:].mean().item() for lt, ls in zip(t, attention_maps(student(path), x))]
        print(f"| {path} | {' '.join(f'{v:.2f}' for v in kls)} | {sum(kls) / len(kls):.2f} |")
    print(f"| teacher's entropy | {' '.join(f'{v:.2f}' for v in ent)} | {sum(ent) / len(ent):.2f} |")

def row_quant(w, c: float = 1.0):
    "Fake-quantized ternary weight with one absmean scale per output row (`c`: the step, as in `weight_quant`)."
    wf = w.float(); s = 1.0 / (c * wf.abs().mean(dim=1, keepdim=True)).clamp(min=1e-5)
    return (wf * s).round().clamp(-1, 1).div(s).to(w.dtype)

def row_scale(a, tok):
    m = student(a.paths[0])
    named = [(n.split('.')[-1], x.weight.detach().float()) for n, x in m.named_modules() if isinstance(x, Q.BitLinear)]
    kinds = list(dict.fromkeys(k for k, _ in named))
    err = lambda q: {k: sum(((w - q(w)).norm() / w.norm()).item() for n, w in named if n == k) / sum(n == k for n, _ in named) for k in kinds}
    print('| scale | ' + ' | '.join(kinds) + ' |\n|' + '---|' * (len(kinds) + 1))
    for name, q in (('per matrix', Q.weight_quant), ('per row', row_quant)):
        print(f'| {name}: relative weight error | ' + ' | '.join(f'{v:.3f}' for v in err(q).values()) + ' |')
    Q.BitLinear.int_forward = False
    table_head('rounded, untrained (perplexity)')
    ppl_row('per-matrix scale', m, tok, a.tokens)
    Q.weight_quant_compiled = row_quant
    ppl_row('per-row scale', m, tok, a.tokens)

def lambda_kl(a, tok):
    x = windows(tok, per_domain=1)[:, :128]
    with torch.no_grad(): tl = teacher()(x).logits.float().log_softmax(-1)
    m = student(a.paths[0])
    print('| lambda | KL(teacher || student), nats/token |\n|---|---|')
    for lam in (0, 0.06, 0.13, 0.25, 0.5, 1.0):
        Q.set_lambda(m, lam)
        with torch.no_grad(): sl = m(x).logits.float().log_softmax(-1)
        print(f'| {lam} | {(tl.exp() * (tl - sl)).sum(-1).mean():.3f} |', flush=True)

@torch.no_grad()
def blocks(a, tok):
    """`2 - 2cos` to the teacher's state after each layer, mean over 4 x 256 held-out tokens: the student on its own states
    (what it computes), and every block on the teacher's input (`wf_nb.distill.teacher_inputs`: each block's own error)."""
    from wf_nb.distill import teacher_inputs, hidden_distance
    x = windows(tok, per_domain=1); keep = torch.ones_like(x, dtype=torch.bool); n = keep.sum().item()
    th = teacher()(x, output_hidden_states=True).hidden_states
    dist = lambda hs: [hidden_distance(s, t, keep).item() / n for s, t in zip(hs[1:], th[1:])]
    L = len(th) - 1; cols = list(range(0, L, 3)) + ([L - 1] if (L - 1) % 3 else [])
    print('| student | mode | sum | ' + ' | '.join(f'layer {i}' for i in cols) + ' |\n|' + '---|' * (len(cols) + 3))
    for p in a.paths:
        m = student(p); free = dist(m(x, output_hidden_states=True).hidden_states)
        with teacher_inputs(m, th): own = dist(m(x, output_hidden_states=True).hidden_states)
        for mode, d in (('on its own states', free), ("each block on the teacher's input", own)):
            print(f"| {p} | {mode} | {sum(d):.2f} | " + ' | '.join(f'{d[i]:.3f}' for i in cols) + ' |', flush=True)

def step(a, tok):
    "Relative error ||W - Q(W)|| / ||W|| over every BitLinear of a Stage-1 model, and the share of zero codes, at steps c * mean|W|."
    ws = [x.weight.detach().float() for x in student(a.paths[0]).modules() if isinstance(x, Q.BitLinear)]
    print('| c | relative weight error | share of zeros |\n|---|---|---|')
    for c in (1.0, 1.25, 1.5, 1.75, 2.0):
        err = sum((w - Q.weight_quant(w, c=c)).pow(2).sum().item() for w in ws) / sum(w.pow(2).sum().item() for w in ws)
        zeros = sum((Q.weight_quant_int(w, c=c)[0] == 0).sum().item() for w in ws) / sum(w.numel() for w in ws)
        print(f'| {c} | {err ** 0.5:.3f} | {zeros:.2f} |', flush=True)
    step_per_matrix(student(a.paths[0]), a.weight_scale)

def step_per_matrix(m, c0: float = 1.75, grid=(1.0, 1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 3.0)):
    "Each matrix's own best step (its weight error's minimum on `grid`): how the choices spread per role, and what they save against `c0` for all."
    from collections import Counter, defaultdict
    picks, saved = defaultdict(Counter), defaultdict(list)
    for name, x in m.named_modules():
        if not isinstance(x, Q.BitLinear): continue
        w = x.weight.detach().float()
        err = {c: (w - Q.weight_quant(w, c=c)).pow(2).sum().item() for c in grid}
        best = min(err, key=err.get); role = name.rsplit('.', 1)[-1]
        picks[role][best] += 1; saved[role].append(err[best] / err[c0])
    print(f'\n| matrix | its best step (x mean\\|W\\|): how many layers | squared weight error, its best / {c0} for all |\n|---|---|---|')
    for role in picks:
        print(f"| {role} | {', '.join(f'{c}: {n}' for c, n in sorted(picks[role].items()))} | {sum(saved[role]) / len(saved[role]):.3f} |")

def _input_grams(m, ids, batch: int = 4) -> dict:
    "Per BitLinear: the Gram matrix `X^T X / n` (float64) of its matmul input (after its SubLN), on `ids`, at lambda 0."
    bls = {n: b for n, b in m.named_modules() if isinstance(b, Q.BitLinear)}
    for b in bls.values(): b.lam = 0.0
    grams, plain = {b: 0 for b in bls.values()}, Q.BitLinear._fake_quant_linear
    def record(self, x):
        f = x.detach().reshape(-1, x.shape[-1]).double(); grams[self] = grams[self] + f.T @ f
        return plain(self, x)
    Q.BitLinear._fake_quant_linear = record
    try:
        with torch.no_grad():
            for i in range(0, len(ids), batch): m(ids[i:i + batch])
    finally: Q.BitLinear._fake_quant_linear = plain
    return {n: grams[b] / ids.numel() for n, b in bls.items()}

def gptq_latent(w, h, s, damp: float):
    """GPTQ (Frantar et al. 2022, arXiv 2210.17323) onto the ternary grid of step `s`: columns in order of diag(H), each
    rounded, its error spread over the columns not yet rounded through the inverse Hessian's Cholesky factor. Returns
    the compensated pre-rounding columns: a latent whose ternary rounding is GPTQ's solution."""
    perm = torch.argsort(torch.diag(h), descending=True); inv = torch.argsort(perm)
    w, h = w[:, perm].clone(), h[perm][:, perm].clone()
    h += damp * torch.diag(h).mean() * torch.eye(len(h), dtype=h.dtype)
    u = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
    for j in range(w.shape[1]):
        err = (w[:, j] - (w[:, j] / s).round().clamp(-1, 1) * s) / u[j, j]
        w[:, j + 1:] -= err[:, None] * u[j, j + 1:][None, :]
    return w[:, inv]

def gptq(a, tok):
    """Would GPTQ-rounded latent weights start the conversion better than plain rounding? Each BitLinear's relative output
    error sqrt(tr(D H D^T) / tr(W H W^T)) on the calibration inputs (D = W - Q(W); Stage 1's calibration text, the FP
    model's inputs), the latent's distance from the FP weights, and the whole model's perplexity at lambda 1 (PTQ) and
    at lambda 0 (the start of the pipeline's quantization ramp, which is the FP model for plain rounding)."""
    from collections import defaultdict
    from wf_nb.convert import calibration_ids
    m = student(a.paths[0]); c = a.weight_scale
    bls = {n: b for n, b in m.named_modules() if isinstance(b, Q.BitLinear)}
    for b in bls.values(): b.w_scale = c
    grams = _input_grams(m, calibration_ids(tok, n_seq=a.calib_seqs))
    fp = {n: b.weight.detach().double().clone() for n, b in bls.items()}
    rel = lambda w, q, h: (torch.trace((w - q) @ h @ (w - q).T) / torch.trace(w @ h @ w.T)).sqrt().item()
    def by_role(f):   # the mean of f(layer name) over the layers of each role (q_proj, ..., down_proj)
        d = defaultdict(list)
        for n in fp: d[n.split('.')[-1]].append(f(n))
        return {k: sum(v) / len(v) for k, v in d.items()}
    plain_err = by_role(lambda n: rel(fp[n], Q.weight_quant(fp[n], c=c), grams[n]))   # the library's own rounding
    table_head('lambda 1 / 0 (perplexity)')
    rows, latents = {}, {}
    for damp in a.damps:
        for n, w in fp.items():
            lat = w
            for _ in range(2):   # the step follows mean|latent| (absmean of the weights it rounds): a fixed point
                lat = gptq_latent(w, grams[n], c * lat.abs().mean(), damp)
            latents[n] = lat
        err = by_role(lambda n: rel(fp[n], Q.weight_quant(latents[n], c=c), grams[n]))
        drift = by_role(lambda n: ((latents[n] - fp[n]).norm() / fp[n].norm()).item())
        rows[damp] = {k: (err[k], drift[k]) for k in err}
        for lam in (1.0, 0.0):
            with torch.no_grad():
                for n, b in bls.items(): b.weight.copy_(latents[n].float()); b.lam = lam
            ppl_row(f'GPTQ latent (damp {damp}), lambda {lam:g}', m, tok, a.tokens)
    with torch.no_grad():
        for n, b in bls.items(): b.weight.copy_(fp[n].float()); b.lam = 1.0
    ppl_row('plain rounding, lambda 1 (Stage 1 as it is)', m, tok, a.tokens)
    print(f'\nrelative output error on the calibration inputs ({a.calib_seqs} x 256 tokens), plain rounding -> GPTQ; latent drift |L - W| / |W|')
    print('| damp | ' + ' | '.join(plain_err) + ' |\n|' + '---|' * (len(plain_err) + 1))
    print('| (plain rounding) | ' + ' | '.join(f'{v:.3f}' for v in plain_err.values()) + ' |')
    for damp, r in rows.items():
        print(f'| {damp} | ' + ' | '.join(f'{r[k][0]:.3f} (drift {r[k][1]:.2f})' for k in plain_err) + ' |', flush=True)

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('what', choices=['quant-parts', 'positions', 'attention', 'row-scale', 'lambda-kl', 'blocks', 'step', 'gptq'])
    ap.add_argument('paths', nargs='+', help='student checkpoint(s) (row-scale, step, gptq: a Stage-1 output)')
    ap.add_argument('--tokens', type=int, default=4000, help='held-out tokens per domain for perplexities')
    ap.add_argument('--weight-scale', type=float, default=1.75, help="gptq, step: the ternary step, x mean|W| (the pipeline's quant.weight_scale)")
    ap.add_argument('--damps', type=float, nargs='+', default=[0.01, 0.1, 1.0], help="gptq: the Hessian dampings, x mean diag(H)")
    ap.add_argument('--calib-seqs', type=int, default=32, help='gptq: calibration sequences of 256 tokens (Stage 1\'s text)')
    a = ap.parse_args()
    torch.set_num_threads(1)
    tok = load_tokenizer(cfg_for().model)
    {'quant-parts': quant_parts, 'positions': positions, 'attention': attention, 'row-scale': row_scale, 'lambda-kl': lambda_kl,
     'blocks': blocks, 'step': step, 'gptq': gptq}[a.what](a, tok)

if __name__ == '__main__': main()
